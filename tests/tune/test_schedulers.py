"""Schedulers and searchers on Optuna: ASHA and the median rule stop bad trials early (for real:
they run fewer iterations), pruned trials end TERMINATED; OptunaSearch (TPE) beats random search."""
from __future__ import annotations

import statistics

import pytest

optuna = pytest.importorskip("optuna")

from raylite import tune  # noqa: E402

pytestmark = pytest.mark.timeout(90)


def curve(config):
    """loss = 1/(i+1) + q: a lower q is better at every step."""
    import time
    for i in range(config.get("steps", 1000)):
        time.sleep(config.get("sleep", 0.04))
        tune.report({"loss": 1.0 / (i + 1) + config["q"]})


def test_asha_keeps_its_rungs_across_a_resume(ray_start, tmp_path):
    """The finished trials' rung records come back on resume: without them the next trials compete
    only with each other, and a resumed week-long sweep stops pruning the bad ones."""
    def trainable(config):
        for _ in range(4):
            tune.report({"loss": config["x"]})

    kw = dict(config={"x": tune.grid_search([4, 3, 2, 1])}, metric="loss", mode="min", max_concurrent_trials=1,
              scheduler=tune.ASHAScheduler(max_t=4, grace_period=1, reduction_factor=2),
              storage_path=str(tmp_path), name="asha", verbose=0)
    a = tune.run(trainable, **kw)   # each trial is the best so far: none pruned
    assert [t.last_result["training_iteration"] for t in a.trials] == [4, 4, 4, 4]
    b = tune.run(trainable, num_samples=2, resume=True, **kw)
    again = {t.config["x"]: t for t in b.trials[4:]}
    assert again[4].early_stopped and not again[1].early_stopped   # x=4 is worse than 3 of the 4 at rung 0


def test_asha_stops_bad_trials_early(ray_start, tmp_path):
    max_t = 24
    qs = [0.5, 0.0, 0.9, 0.3, 0.7, 0.1, 0.8, 0.6]
    sched = tune.ASHAScheduler(max_t=max_t, grace_period=2, reduction_factor=2)
    a = tune.run(curve, config={"q": tune.grid_search(qs)}, metric="loss", mode="min", scheduler=sched,
                 storage_path=str(tmp_path), verbose=0)
    iters = {t.config["q"]: t.last_result["training_iteration"] for t in a.trials}
    assert all(t.status == "TERMINATED" for t in a.trials)            # pruned is not an error
    best = next(t for t in a.trials if t.config["q"] == 0.0)
    assert iters[0.0] == max_t and not best.early_stopped              # max_t ends the best one, exactly
    stopped = [t for t in a.trials if t.early_stopped]
    assert len(stopped) >= 4
    assert all(iters[t.config["q"]] < max_t for t in stopped)          # stopped for real, before max_t
    assert sum(iters.values()) < 0.6 * max_t * len(qs)
    assert a.best_config["q"] == 0.0
    assert sched.num_pruned == len(stopped)
    study_states = {t.user_attrs["trial_id"]: t.state.name for t in a.study.trials}
    assert {study_states[t.trial_id] for t in stopped} == {"PRUNED"}


def test_asha_hands_optuna_only_the_rung_steps():
    """Optuna's per-report cost grows with the values a trial holds; successive halving decides only
    at the first report at or past each rung, so a trial reporting every step feeds it only those."""
    import types

    sched = tune.ASHAScheduler(metric="loss", mode="min", max_t=10_000, grace_period=2, reduction_factor=4)
    study = optuna.create_study(pruner=sched.make_pruner())
    trial = types.SimpleNamespace(optuna={}, optuna_trial=study.ask())
    for step in range(1, 300):
        assert sched.on_result(trial, {"training_iteration": step, "loss": 1.0 / step}) == "CONTINUE"
    assert sorted(int(s) for s in trial.optuna["intermediate"]) == [2, 8, 32, 128]
    assert sorted(trial.optuna_trial.storage.get_trial(trial.optuna_trial._trial_id).intermediate_values) == \
        [2, 8, 32, 128]
    assert trial.optuna["next_rung"] == 512


def test_median_stopping_rule(ray_start, tmp_path):
    qs = [0.0, 0.1, 1.0, 2.0, 0.02]
    # Two good trials complete first (max_concurrent_trials=2), then the median rule has its samples.
    a = tune.run(curve, config={"q": tune.grid_search(qs), "steps": 20, "sleep": 0.05}, metric="loss", mode="min",
                 scheduler=tune.MedianStoppingRule("training_iteration", grace_period=2, min_samples_required=2),
                 max_concurrent_trials=2, storage_path=str(tmp_path), verbose=0)
    by_q = {t.config["q"]: t for t in a.trials}
    for q in (0.0, 0.1, 0.02):
        assert not by_q[q].early_stopped and by_q[q].last_result["training_iteration"] == 20
    for q in (1.0, 2.0):
        assert by_q[q].early_stopped and by_q[q].status == "TERMINATED"
        assert by_q[q].last_result["training_iteration"] < 20


class _T:
    def __init__(self, trial_id):
        self.trial_id = trial_id


def test_median_stopping_rule_is_rays():
    """Ray's rule: the trial's best so far against the median of the others' running means over
    [grace_period, t], among trials that reached t; min_samples_required of them; hard_stop=False
    lets the trial go on (Ray pauses it, then lets it finish)."""
    rule = tune.MedianStoppingRule(time_attr="t", metric="loss", mode="min", grace_period=2, min_samples_required=2)
    for tid, losses in (("a", [9, 1, 1, 1]), ("b", [9, 3, 3, 3])):    # running means from t=2: 1 and 3
        for t, loss in enumerate(losses, 1):
            assert rule.on_result(_T(tid), {"t": t, "loss": loss}) == "CONTINUE"
    assert rule.on_result(_T("c"), {"t": 1, "loss": 2.5}) == "CONTINUE"    # in the grace period
    assert rule.on_result(_T("c"), {"t": 2, "loss": 4.0}) == "PRUNE"      # best 2.5 worse than median(1, 3)
    assert rule.on_result(_T("d"), {"t": 2, "loss": 1.5}) == "CONTINUE"   # best 1.5 < median 2
    assert rule.on_result(_T("e"), {"t": 9, "loss": 5.0}) == "CONTINUE"   # no other trial reached t=9
    soft = tune.MedianStoppingRule(time_attr="t", metric="acc", mode="max", grace_period=0, min_samples_required=1,
                                   hard_stop=False)
    soft.on_result(_T("a"), {"t": 1, "acc": 0.9})
    assert soft.on_result(_T("b"), {"t": 1, "acc": 0.1}) == "CONTINUE" and soft.stopped_trials == {"b"}
    assert tune.MedianStoppingRule().time_attr == "time_total_s" and tune.MedianStoppingRule().grace_period == 60


def test_optuna_pruner_as_scheduler(ray_start, tmp_path):
    a = tune.run(curve, config={"q": tune.grid_search([0.0, 0.1, 5.0]), "steps": 20, "sleep": 0.05},
                 metric="loss", mode="min", max_concurrent_trials=2,
                 scheduler=optuna.pruners.ThresholdPruner(upper=2.0), storage_path=str(tmp_path), verbose=0)
    by_q = {t.config["q"]: t for t in a.trials}
    assert by_q[5.0].early_stopped and by_q[5.0].last_result["training_iteration"] < 20
    assert not by_q[0.0].early_stopped


def quadratic(config):
    tune.report({"loss": (config["x"] - 0.3) ** 2 + (config["y"] + 0.2) ** 2})


SPACE = {"x": tune.uniform(-2.0, 2.0), "y": tune.uniform(-2.0, 2.0)}


def test_optuna_search_tpe_beats_random_on_a_quadratic(ray_start, tmp_path):
    n = 40
    kw = dict(config=SPACE, num_samples=n, metric="loss", mode="min", max_concurrent_trials=1,
              storage_path=str(tmp_path), verbose=0)
    tpe = tune.run(quadratic, search_alg=tune.OptunaSearch(seed=1), name="tpe", **kw)
    rnd = tune.run(quadratic, search_alg=tune.BasicVariantGenerator(random_state=1), name="random", **kw)

    def losses(a):
        return [t.last_result["loss"] for t in sorted(a.trials, key=lambda t: t.index)]

    # After TPE's 10 random start-up trials it samples near the optimum far more often.
    late_tpe, late_rnd = losses(tpe)[n // 2:], losses(rnd)[n // 2:]
    assert statistics.median(late_tpe) < 0.75 * statistics.median(late_rnd), (late_tpe, late_rnd)
    assert sum(v < 0.25 for v in late_tpe) > sum(v < 0.25 for v in late_rnd)
    assert tpe.best_result["loss"] < 0.05
    assert type(tpe.study.sampler).__name__ == "TPESampler"


def test_optuna_search_with_another_sampler_and_its_own_metric(ray_start, tmp_path):
    search = tune.OptunaSearch(metric="loss", mode="min", sampler=optuna.samplers.NSGAIISampler(seed=0))
    a = tune.run(quadratic, config=SPACE, num_samples=8, search_alg=search, storage_path=str(tmp_path), verbose=0)
    assert len(a.trials) == 8 and a.best_trial is not None
    assert type(a.study.sampler).__name__ == "NSGAIISampler"
    with pytest.raises(ValueError, match="metric"):
        tune.run(quadratic, config=SPACE, search_alg=tune.OptunaSearch(), storage_path=str(tmp_path), verbose=0)
