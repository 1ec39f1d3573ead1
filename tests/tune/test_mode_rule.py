"""Tune's one "min or max" rule (tune/_validate.check_mode), as every caller words it: the caller,
the field and its value, then the rule (``HyperBandScheduler(mode='mn'): mode must be 'min' or
'max'``). Each case is checked for the whole message, so a caller that words it its own way fails."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("optuna")

from optuna import pruners  # noqa: E402

from raylite import tune  # noqa: E402
from raylite.tune.analysis import ExperimentAnalysis  # noqa: E402
from raylite.tune.schedulers import ASHAScheduler, MedianStoppingRule, OptunaPruner  # noqa: E402
from raylite.tune.schedulers.hyperband import HyperBandScheduler  # noqa: E402
from raylite.tune.schedulers.pbt import PopulationBasedTraining  # noqa: E402
from raylite.tune.search import OptunaSearch  # noqa: E402
from raylite.tune.stopper import ExperimentPlateauStopper, TrialPlateauStopper  # noqa: E402
from raylite.tune.tuner import ResultGrid  # noqa: E402

RULE = "must be 'min' or 'max'"


def never_runs(config):
    raise AssertionError("the trainable ran: the mode was not checked first")


# (case id, call, the whole message)
CASES = [
    ("optuna-pruner", lambda: OptunaPruner(pruners.NopPruner(), mode="mn"), f"OptunaPruner(mode='mn'): mode {RULE}"),
    ("asha", lambda: ASHAScheduler(mode="mn"), f"ASHAScheduler(mode='mn'): mode {RULE}"),
    ("median-stopping", lambda: MedianStoppingRule(mode="mn"), f"MedianStoppingRule(mode='mn'): mode {RULE}"),
    ("hyperband", lambda: HyperBandScheduler(mode="mn"), f"HyperBandScheduler(mode='mn'): mode {RULE}"),
    ("pbt", lambda: PopulationBasedTraining(mode="mn", hyperparam_mutations={"lr": [1, 2]}),
     f"PopulationBasedTraining(mode='mn'): mode {RULE}"),
    ("trial-plateau-threshold", lambda: TrialPlateauStopper("loss", metric_threshold=0.5),
     f"TrialPlateauStopper(mode=None): mode {RULE} with metric_threshold=0.5"),
    ("experiment-plateau", lambda: ExperimentPlateauStopper("loss", mode="mn"),
     f"ExperimentPlateauStopper(mode='mn'): mode {RULE}"),
    ("optuna-search", lambda: OptunaSearch(metric="loss", mode=1), f"OptunaSearch(mode=1): mode {RULE}"),
    ("optuna-search-objective", lambda: OptunaSearch(metric=["loss", "ms"], mode=["min", "up"]),
     f"OptunaSearch(mode[1]='up'): mode[1] {RULE}"),
    ("tune-config", lambda: tune.TuneConfig(mode="minimize"), f"TuneConfig(mode='minimize'): mode {RULE}"),
    ("tune-run", lambda: tune.run(never_runs, metric="score", mode="maximize", verbose=0),
     f"tune.run(mode='maximize'): mode {RULE}"),
    ("analysis-default", lambda: ExperimentAnalysis([], default_mode="up"),
     f"ExperimentAnalysis(default_mode='up'): default_mode {RULE}"),
    ("analysis-best-trial", lambda: ExperimentAnalysis([]).get_best_trial("score", "up"),
     f"ExperimentAnalysis.get_best_trial(mode='up'): mode {RULE}"),
    ("result-grid-dataframe", lambda: ResultGrid(ExperimentAnalysis([])).get_dataframe("score", "up"),
     f"ResultGrid.get_dataframe(filter_mode='up'): filter_mode {RULE} with filter_metric"),
]


@pytest.mark.parametrize("call, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_caller_words_the_mode_rule_alike(call, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call()


@pytest.mark.parametrize("call", [
    lambda: ASHAScheduler(mode=None), lambda: HyperBandScheduler(mode="max"), lambda: tune.TuneConfig(mode="min"),
    lambda: TrialPlateauStopper("loss", mode="sideways"),   # no threshold: Ray ignores the mode
    lambda: OptunaSearch(metric=["loss", "ms"], mode=["min", "max"]),
], ids=["none", "max", "min", "unused-without-threshold", "objectives"])
def test_valid_modes_pass(call):
    call()
