"""Multi-objective search: OptunaSearch(metric=[...], mode=[...]) on Optuna's multi-objective
samplers, no single best result (as in Ray), the Pareto front and Optuna's plot of it."""
from __future__ import annotations

import os

import pytest

optuna = pytest.importorskip("optuna")

from raylite import tune  # noqa: E402
from raylite.tune.search import OptunaSearch  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def tradeoff(config):
    """loss falls and latency rises with x: every x is on the Pareto front unless it is dominated."""
    x = config["x"]
    tune.report({"loss": (1 - x) ** 2 + config["waste"], "latency": x + config["waste"]})


SPACE = {"x": tune.uniform(0, 1), "waste": tune.choice([0.0, 0.5])}


@pytest.mark.parametrize("sampler", [None, "nsga2"])
def test_pareto_front_of_two_objectives(ray_start, tmp_path, sampler):
    search = OptunaSearch(metric=["loss", "latency"], mode=["min", "min"], seed=3,
                          sampler=optuna.samplers.NSGAIISampler(seed=3, population_size=4) if sampler else None)
    grid = tune.Tuner(tradeoff, param_space=SPACE, tune_config=tune.TuneConfig(search_alg=search, num_samples=12),
                      run_config=tune.RunConfig(storage_path=str(tmp_path), name="mo", verbose=0)).fit()
    assert len(grid) == 12 and not grid.errors
    with pytest.raises(ValueError, match=r"2 objectives \(loss, latency\).*no trial is the single best"):
        grid.get_best_result()
    assert grid.get_best_result(metric="loss", mode="min").metrics["loss"] == min(r.metrics["loss"] for r in grid)
    front = grid.pareto_front()
    points = [(r.metrics["loss"], r.metrics["latency"]) for r in grid]
    for r in front:   # nothing dominates a front point, and every non-dominated point is on the front
        p = (r.metrics["loss"], r.metrics["latency"])
        assert not any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in points)
    nondominated = [p for p in points if not any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in points)]
    assert len(front) == len(nondominated) >= 1
    assert all(r.config["waste"] == 0.0 for r in front)     # waste only adds to both
    study = grid._analysis.study
    assert len(study.directions) == 2 and len(study.best_trials) == len(front)
    png = grid._analysis.plot_pareto_front()
    assert os.path.getsize(png) > 1000
    stored = tune.ExperimentAnalysis(str(tmp_path / "mo"))   # from disk too, with its SQLite study
    assert sorted(t.trial_id for t in stored.pareto_front()) == sorted(r.metrics["trial_id"] for r in front)
    with pytest.raises(ValueError, match="no trial is the single best"):
        stored.get_best_trial()


def test_multi_objective_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match="same length"):
        OptunaSearch(metric=["loss", "latency"], mode=["min"])
    with pytest.raises(ValueError, match="'fast'"):
        OptunaSearch(metric=["loss", "latency"], mode=["min", "fast"])
    with pytest.raises(ValueError, match="evaluated_rewards"):
        OptunaSearch(metric=["a", "b"], mode=["min", "min"], points_to_evaluate=[{"x": 1}], evaluated_rewards=[1])
    with pytest.raises(ValueError, match="cannot prune a multi-objective search"):
        tune.run(tradeoff, config=SPACE, search_alg=OptunaSearch(metric=["loss", "latency"], mode=["min", "min"]),
                 scheduler=tune.ASHAScheduler(metric="loss", mode="min"), storage_path=str(tmp_path), verbose=0)
    single = tune.ExperimentAnalysis([], "loss", "min")
    with pytest.raises(ValueError, match="one objective"):
        single.pareto_front()
