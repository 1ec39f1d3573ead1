"""Checks that Tune and Train each wrote more than once, now one rule each (tune/_validate.py,
tune/search/searcher.py, train/config.py): every caller's whole message, with its own field name,
so a caller that words a rule its own way again fails here. All raise before any trial starts."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("optuna")

from raylite import train, tune  # noqa: E402
from raylite.tune.search import ConcurrencyLimiter  # noqa: E402
from raylite.tune.search.repeater import Repeater  # noqa: E402


def never_runs(config):
    raise AssertionError("the trainable ran: the argument was not checked first")


def run(**kw):
    return lambda: tune.run(never_runs, verbose=0, **kw)


SEARCHER = "must be a tune searcher (OptunaSearch, BasicVariantGenerator), got str"
MAX_FAILURES = "must be an integer >= -1 (-1: no limit), got -2"
NUM_SAMPLES = "must be a positive integer (or -1: until stopped), got 0"
NAMER = "must be a function trial -> str, got int"
BUDGET = "must be positive (None: no budget), got 0"

# (case id, call, exception type, the whole message)
CASES = [
    ("searcher-limiter", lambda: ConcurrencyLimiter("tpe", 2), TypeError, f"ConcurrencyLimiter(searcher=...) {SEARCHER}"),
    ("searcher-repeater", lambda: Repeater("tpe"), TypeError, f"Repeater(searcher=...) {SEARCHER}"),
    ("searcher-tune-config", lambda: tune.TuneConfig(search_alg="tpe"), TypeError, f"TuneConfig.search_alg {SEARCHER}"),
    ("searcher-run", run(search_alg="tpe"), TypeError, f"search_alg {SEARCHER}"),
    ("max-failures-failure-config", lambda: train.FailureConfig(max_failures=-2), ValueError,
     f"FailureConfig.max_failures {MAX_FAILURES}"),
    ("max-failures-trainer", lambda: train.Trainer(max_failures=-2), ValueError, f"max_failures {MAX_FAILURES}"),
    ("max-failures-run", run(max_failures=-2), ValueError, f"max_failures {MAX_FAILURES}"),
    ("num-samples-tune-config", lambda: tune.TuneConfig(num_samples=0), ValueError,
     f"TuneConfig.num_samples {NUM_SAMPLES}"),
    ("num-samples-run", run(num_samples=0), ValueError, f"num_samples {NUM_SAMPLES}"),
    ("namer-tune-config", lambda: tune.TuneConfig(trial_name_creator=5), TypeError,
     f"TuneConfig.trial_name_creator {NAMER}"),
    ("dirnamer-run", run(trial_dirname_creator=5), TypeError, f"trial_dirname_creator {NAMER}"),
    ("budget-tune-config", lambda: tune.TuneConfig(time_budget_s=0), ValueError, f"TuneConfig.time_budget_s {BUDGET}"),
    ("budget-run", run(time_budget_s=0), ValueError, f"time_budget_s {BUDGET}"),
]


@pytest.mark.parametrize("call, error, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_shared_rule_reads_alike_for_every_caller(call, error, message):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        call()
