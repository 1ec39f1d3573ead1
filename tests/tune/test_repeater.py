"""tune.search.Repeater as Ray's: the searcher hears of each suggested config once, told the mean
of its repeats (those without a value left out; none: it failed), while each repeat is a trial of
its own; a resumed experiment recomputes the told groups and finishes the others as one."""
from __future__ import annotations

import json
import os
import shutil

import pytest

optuna = pytest.importorskip("optuna")

from raylite import tune  # noqa: E402
from raylite.tune.search import OptunaSearch, Repeater  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def noisy(config):
    if config["__trial_index__"] == 1 and config.get("fail"):
        raise RuntimeError("this repeat errors before reporting")
    tune.report({"loss": config["x"] + config["__trial_index__"]})


def broken(config):
    raise RuntimeError("no repeat reports")


def by_index(a):
    return sorted(a.trials, key=lambda t: t.index)


def test_the_study_has_one_trial_per_config_told_the_repeats_mean(ray_start, tmp_path):
    a = tune.run(noisy, config={"x": tune.uniform(0, 1)}, num_samples=6, metric="loss", mode="min",
                 search_alg=Repeater(OptunaSearch(seed=1), repeat=3), storage_path=str(tmp_path), verbose=0)
    trials = by_index(a)
    assert [t.config["__trial_index__"] for t in trials] == [0, 1, 2, 0, 1, 2]   # set_index
    assert len({t.path for t in trials}) == 6 and all(t.status == "TERMINATED" for t in trials)
    study = a.study.trials
    assert len(study) == 2 and all(t.state.name == "COMPLETE" for t in study)
    for ot, group in zip(sorted(study, key=lambda t: t.number), (trials[:3], trials[3:])):
        assert ot.params["x"] == group[0].config["x"]
        assert ot.value == pytest.approx(sum(t.last_result["loss"] for t in group) / 3)
        assert ot.value == pytest.approx(ot.params["x"] + 1)


def test_an_errored_repeat_is_left_out_of_the_mean_and_a_config_with_no_value_fails(ray_start, tmp_path):
    a = tune.run(noisy, config={"x": tune.uniform(0, 1), "fail": True}, num_samples=3, metric="loss", mode="min",
                 search_alg=Repeater(OptunaSearch(seed=2), repeat=3), storage_path=str(tmp_path), verbose=0,
                 raise_on_failed_trial=False)
    assert [t.status for t in by_index(a)] == ["TERMINATED", "ERROR", "TERMINATED"]
    (ot,) = a.study.trials
    assert ot.state.name == "COMPLETE" and ot.value == pytest.approx(ot.params["x"] + 1)   # (x + x+2) / 2

    b = tune.run(broken, config={"x": tune.uniform(0, 1)}, num_samples=2, metric="loss", mode="min",
                 search_alg=Repeater(OptunaSearch(seed=2), repeat=2), storage_path=str(tmp_path), verbose=0,
                 raise_on_failed_trial=False)
    assert [t.state.name for t in b.study.trials] == ["FAIL"]


def test_a_seeded_tpe_sampler_is_told_the_means(ray_start, tmp_path):
    """The configs TPE suggests are those it gives when told each config's mean, one trial each."""
    def trainable(config):
        tune.report({"loss": (config["x"] - 0.3) ** 2 + 0.2 * config["__trial_index__"]})

    sampler = optuna.samplers.TPESampler(seed=3, n_startup_trials=2)
    a = tune.run(trainable, config={"x": tune.uniform(0, 1)}, num_samples=10, metric="loss", mode="min",
                 search_alg=Repeater(OptunaSearch(sampler=sampler), repeat=2), max_concurrent_trials=1,
                 storage_path=str(tmp_path), verbose=0)
    xs = [t.config["x"] for t in by_index(a)][::2]
    dist = optuna.distributions.json_to_distribution(a.trials[0].optuna["distributions"]["x"])
    reference = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=3, n_startup_trials=2))
    expected = []
    for _ in range(5):
        ot = reference.ask({"x": dist})
        expected.append(ot.params["x"])
        reference.tell(ot, (ot.params["x"] - 0.3) ** 2 + 0.1)   # the mean of the two repeats
    assert xs == pytest.approx(expected)


def test_resume_recomputes_told_groups_and_finishes_the_others_as_one(ray_start, tmp_path):
    search = dict(config={"x": tune.uniform(0, 1)}, num_samples=6, metric="loss", mode="min",
                  storage_path=str(tmp_path), name="rep", verbose=0)
    a = tune.run(noisy, search_alg=Repeater(OptunaSearch(seed=4), repeat=3), **search)
    trials = by_index(a)
    x1 = trials[3].config["x"]
    path = os.path.join(trials[4].path, "trial.json")   # as a driver killed mid-group left it: the second
    state = json.loads(open(path).read())                 # group's middle repeat running, its last not created
    state["status"] = "RUNNING"
    with open(path, "w") as f:
        json.dump(state, f)
    shutil.rmtree(trials[5].path)

    b = tune.run(noisy, search_alg=Repeater(OptunaSearch(seed=4), repeat=3), resume=True, **search)
    trials = by_index(b)
    assert len(trials) == 6 and all(t.status == "TERMINATED" for t in trials)
    assert [t.config["x"] for t in trials[3:]] == [x1] * 3   # the new repeat joined its group
    assert [t.config["__trial_index__"] for t in trials] == [0, 1, 2, 0, 1, 2]
    study = b.study.trials
    assert len(study) == 2 and all(t.state.name == "COMPLETE" for t in study)
    told = {t.params["x"]: t.value for t in study}
    assert told == pytest.approx({trials[0].config["x"]: trials[0].config["x"] + 1, x1: x1 + 1})
