"""tune.Tuner / TuneConfig / RunConfig / with_resources / PlacementGroupFactory / ResultGrid: Ray 2's
current API over tune.run. Trainables are defined inside the tests (cloudpickle ships them by value);
concurrency is checked with the trials' own (start, end) windows."""
from __future__ import annotations

import datetime
import os

import pytest

pytest.importorskip("optuna")

from raylite import tune  # noqa: E402

pytestmark = pytest.mark.timeout(90)


def max_overlap(windows) -> int:
    events = sorted([(s, 1) for s, _ in windows] + [(e, -1) for _, e in windows])
    best = cur = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def run_config(tmp_path, name, **kw):
    return tune.RunConfig(name=name, storage_path=str(tmp_path), verbose=0, **kw)


# ---------------------------------------------------------------------------- fit and ResultGrid
def test_fit_finds_best_config_and_result_grid(ray_module, tmp_path):
    def trainable(config):
        x = config["x"]
        tune.report({"loss": (x - 3) ** 2, "acc": x}, checkpoint=tune.Checkpoint.from_dict({"it": 1}))
        tune.report({"loss": (x - 3) ** 2, "acc": -x}, checkpoint=tune.Checkpoint.from_dict({"it": 2}))

    space = {"x": tune.grid_search([1, 2, 3, 4, 5])}
    tuner = tune.Tuner(trainable, param_space=space, tune_config=tune.TuneConfig(metric="loss", mode="min"),
                       run_config=run_config(tmp_path, "exp"))
    results = tuner.fit()

    assert isinstance(results, tune.ResultGrid) and len(results) == 5
    assert results.experiment_path == str(tmp_path / "exp")
    assert results.num_terminated == 5 and results.num_errors == 0 and results.errors == []
    assert sorted(r.config["x"] for r in results) == [1, 2, 3, 4, 5]
    assert isinstance(results[0], tune.Result) and results[0].error is None

    best = results.get_best_result()
    assert best.config == {"x": 3} and best.metrics["config"] == {"x": 3}
    assert best.metrics["loss"] == 0 and best.metrics["training_iteration"] == 2
    assert best.checkpoint.to_dict() == {"it": 2} and len(best.best_checkpoints) == 2
    assert os.path.isdir(best.path) and os.path.dirname(best.path) == results.experiment_path
    df = best.metrics_dataframe
    assert list(df["acc"]) == [3, -3] and list(df["training_iteration"]) == [1, 2]

    # metric/mode override and scope: acc is x, then -x
    assert results.get_best_result(metric="acc", mode="max").config["x"] == 1              # last: -1 is best
    assert results.get_best_result(metric="acc", mode="max", scope="all").config["x"] == 5
    assert results.get_best_result(metric="acc", mode="min", scope="all").config["x"] == 5  # -5 ever
    assert results.get_best_result(metric="acc", mode="max", scope="avg").config["x"] in (1, 2, 3, 4, 5)
    with pytest.raises(ValueError, match="scope"):
        results.get_best_result(scope="best")
    with pytest.raises(RuntimeError, match="nope"):
        results.get_best_result(metric="nope", mode="min")

    table = results.get_dataframe()
    assert len(table) == 5 and sorted(table["config/x"]) == [1, 2, 3, 4, 5]
    assert set(table["acc"]) == {-1, -2, -3, -4, -5}
    assert set(results.get_dataframe(filter_metric="acc", filter_mode="max")["acc"]) == {1, 2, 3, 4, 5}
    with pytest.raises(ValueError, match="filter_mode"):
        results.get_dataframe(filter_metric="acc", filter_mode="maximize")

    assert tune.Tuner.can_restore(results.experiment_path)
    assert len(tuner.get_results()) == 5
    with pytest.raises(ValueError, match="already exists"):   # a Tuner runs once; restore continues
        tuner.fit()


def test_result_grid_reads_each_history_when_asked(ray_module, tmp_path):
    """A ResultGrid reads a trial's history from its result.json on demand, not all of them up front:
    10 trials of 5,000 reports took 56 MB and 0.7 s to load, which thousands of trials multiply."""
    def trainable(config):
        for i in range(3):
            tune.report({"i": i, "x": config["x"]})

    grid = tune.Tuner(trainable, param_space={"x": tune.grid_search([1, 2])},
                      run_config=run_config(tmp_path, "lazy")).fit()
    assert [r["i"] for r in grid[0].metrics_history] == [0, 1, 2]
    grid = tune.ResultGrid(tune.ExperimentAnalysis(grid.experiment_path))
    with open(os.path.join(grid[1].path, "result.json"), "a") as f:   # written after the grid was built
        f.write('{"i": 3, "x": 2}\n')
    assert [r["i"] for r in grid[1].metrics_history] == [0, 1, 2, 3]
    assert len(grid[1].metrics_dataframe) == 4


def test_failed_trials_land_in_errors_without_raising(ray_module, tmp_path):
    marker = str(tmp_path / "failed_once")

    def trainable(config):
        if config["x"] == 2:
            raise ValueError("boom-2")
        if config["x"] == 3 and not os.path.exists(marker):   # fails on its first attempt only
            open(marker, "w").close()
            raise ValueError("first attempt")
        tune.report({"score": config["x"]})

    results = tune.Tuner(trainable, param_space={"x": tune.grid_search([1, 2, 3])},
                         run_config=run_config(tmp_path, "fail",
                                               failure_config=tune.FailureConfig(max_failures=1))).fit()
    by_x = {r.config["x"]: r for r in results}
    assert results.num_errors == 1 and results.num_terminated == 2
    assert len(results.errors) == 1 and isinstance(results.errors[0], tune.TuneError)
    assert "boom-2" in str(by_x[2].error) and by_x[2].error is results.errors[0]
    assert by_x[1].error is None and by_x[3].error is None and by_x[3].metrics["score"] == 3
    # no metric in TuneConfig: get_best_result needs one (several trials)
    with pytest.raises(ValueError, match="metric"):
        results.get_best_result()
    assert results.get_best_result(metric="score", mode="max").config == {"x": 3}


def test_single_trial_is_best_without_metric(ray_module, tmp_path):
    results = tune.Tuner(lambda config: {"v": 1}, run_config=run_config(tmp_path, "one")).fit()
    assert len(results) == 1 and results.get_best_result().metrics["v"] == 1


# ---------------------------------------------------------------------------- resources
def windowed(config):
    import time
    start = time.time()
    time.sleep(0.5)   # long enough for two trials to overlap on a busy machine
    tune.report({"start": start, "end": time.time(), "resources": tune.get_trial_resources(),
                 "offset": config.get("offset", 0)})


def test_with_resources_runs_whole_machine_trials_one_at_a_time(ray_module, tmp_path):
    results = tune.Tuner(tune.with_resources(windowed, {"cpu": 2}), tune_config=tune.TuneConfig(num_samples=3),
                         run_config=run_config(tmp_path, "res")).fit()
    assert results.num_terminated == 3
    assert max_overlap([(r.metrics["start"], r.metrics["end"]) for r in results]) == 1
    assert all(r.metrics["resources"] == {"CPU": 2.0} for r in results)
    # the control: one CPU each runs two at a time on the 2-CPU runtime
    results = tune.Tuner(tune.with_resources(windowed, {"cpu": 1}), tune_config=tune.TuneConfig(num_samples=4),
                         run_config=run_config(tmp_path, "res1")).fit()
    assert max_overlap([(r.metrics["start"], r.metrics["end"]) for r in results]) == 2


def test_placement_group_factory_is_the_sum_of_its_bundles(ray_module, tmp_path):
    pgf = tune.PlacementGroupFactory([{"CPU": 1}, {"CPU": 1}])
    assert pgf.required_resources == {"CPU": 2.0}
    assert tune.PlacementGroupFactory([{"CPU": 1, "GPU": 1}, {"CPU": 2, "custom": 1}, {}]).required_resources == \
        {"CPU": 3.0, "GPU": 1.0, "custom": 1.0}

    def trainable(config, offset):
        windowed({"offset": offset})

    # with_resources inside with_parameters keeps both
    results = tune.Tuner(tune.with_parameters(tune.with_resources(trainable, pgf), offset=7),
                         tune_config=tune.TuneConfig(num_samples=2), run_config=run_config(tmp_path, "pgf")).fit()
    assert results.num_terminated == 2
    assert all(r.metrics["resources"] == {"CPU": 2.0} and r.metrics["offset"] == 7 for r in results)
    assert max_overlap([(r.metrics["start"], r.metrics["end"]) for r in results]) == 1
    # tune.run takes with_resources too (and a PlacementGroupFactory as resources_per_trial)
    a = tune.run(tune.with_resources(windowed, {"cpu": 2}), storage_path=str(tmp_path), name="run_wr", verbose=0)
    assert a.trials[0].last_result["resources"] == {"CPU": 2.0}
    with pytest.raises(ValueError, match="given twice"):
        tune.run(tune.with_resources(windowed, {"cpu": 2}), resources_per_trial={"cpu": 1}, verbose=0)


def test_resource_a_machine_lacks_is_an_error_naming_it(ray_module, tmp_path):
    tuner = tune.Tuner(tune.with_resources(windowed, {"cpus": 2}), run_config=run_config(tmp_path, "typo"))
    with pytest.raises(ValueError, match="cpus"):
        tuner.fit()


# ---------------------------------------------------------------------------- restore
def test_restore_continues_an_interrupted_experiment(ray_module, tmp_path):
    flag, runs = tmp_path / "interrupt", tmp_path / "runs"
    flag.touch()
    runs.mkdir()

    class Interrupt(tune.Callback):
        def on_trial_complete(self, iteration, trials, trial, **info):
            if flag.exists():
                raise KeyboardInterrupt

    def trainable(config):
        import uuid
        open(os.path.join(str(runs), f"{config['x']}-{uuid.uuid4().hex}"), "w").close()
        tune.report({"score": config["x"]})

    tuner = tune.Tuner(trainable, param_space={"x": tune.grid_search([1, 2, 3, 4])},
                       tune_config=tune.TuneConfig(metric="score", mode="max", max_concurrent_trials=1),
                       run_config=run_config(tmp_path, "resume", callbacks=[Interrupt()]))
    with pytest.raises(KeyboardInterrupt):
        tuner.fit()
    path = str(tmp_path / "resume")
    assert tune.Tuner.can_restore(path) and not tune.Tuner.can_restore(str(tmp_path))
    assert tuner.get_results().num_terminated == 1          # interrupted once the first trial ended

    flag.unlink()
    results = tune.Tuner.restore(path, trainable).fit()
    assert results.num_terminated == 4 and sorted(r.config["x"] for r in results) == [1, 2, 3, 4]
    assert results.get_best_result().config == {"x": 4}           # metric and mode came back from tuner.pkl
    assert sum(n.startswith("1-") for n in os.listdir(runs)) == 1   # the finished trial did not run again

    with pytest.raises(ValueError, match="same trainable"):
        tune.Tuner.restore(path, windowed)
    with pytest.raises(NotImplementedError, match="resume_unfinished"):   # errored trials: tests/tune/test_docs.py
        tune.Tuner.restore(path, trainable, resume_unfinished=False)
    with pytest.raises(FileNotFoundError, match="tuner.pkl"):
        tune.Tuner.restore(str(tmp_path / "nothing"), trainable)


# ---------------------------------------------------------------------------- bad input
def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match=r"TuneConfig\(mode='minimize'\): mode must be"):
        tune.TuneConfig(mode="minimize")
    with pytest.raises(ValueError, match=r"TuneConfig\.num_samples.*0"):
        tune.TuneConfig(num_samples=0)
    with pytest.raises(ValueError, match=r"TuneConfig\.max_concurrent_trials.*-1"):
        tune.TuneConfig(max_concurrent_trials=-1)
    with pytest.raises(ValueError, match=r"TuneConfig\.time_budget_s"):
        tune.TuneConfig(time_budget_s=0)
    assert tune.TuneConfig(time_budget_s=datetime.timedelta(minutes=1)).time_budget_s == 60.0
    with pytest.raises(TypeError, match=r"TuneConfig\.search_alg.*str"):
        tune.TuneConfig(search_alg="tpe")
    with pytest.raises(TypeError, match="scheduler"):
        tune.TuneConfig(scheduler="asha")

    def fn(config):
        pass

    with pytest.raises(ValueError, match=r"param_space.*5"):
        tune.Tuner(fn, param_space=5)
    with pytest.raises(TypeError, match=r"tune_config must be a tune\.TuneConfig, got dict"):
        tune.Tuner(fn, tune_config={"metric": "loss"})
    with pytest.raises(TypeError, match=r"failure_config must be a tune\.FailureConfig"):
        tune.Tuner(fn, run_config=tune.RunConfig(failure_config={"max_failures": 2}))
    with pytest.raises(ValueError, match="max_failures"):
        tune.Tuner(fn, run_config=tune.RunConfig(failure_config=tune.FailureConfig(max_failures=-2)))
    with pytest.raises(TypeError, match="not a tune.Trainable subclass"):
        tune.Tuner(type("T", (), {}))
    with pytest.raises(TypeError, match=r"checkpoint_config must be a tune\.CheckpointConfig"):
        tune.Tuner(fn, run_config=tune.RunConfig(checkpoint_config={"num_to_keep": 1}))

    with pytest.raises(ValueError, match=r"with_resources\(resources=\.\.\.\)\['gpu'\].*-1"):
        tune.with_resources(fn, {"gpu": -1})
    with pytest.raises(TypeError, match="with_resources.*int"):
        tune.with_resources(fn, 4)
    with pytest.raises(ValueError, match="non-empty list"):
        tune.PlacementGroupFactory([])
    with pytest.raises(ValueError, match=r"bundle 1\['CPU'\].*'x'"):
        tune.PlacementGroupFactory([{"CPU": 1}, {"CPU": "x"}])
    with pytest.raises(TypeError, match="bundle 0"):
        tune.PlacementGroupFactory([None])
    with pytest.raises(ValueError, match="strategy"):
        tune.PlacementGroupFactory([{"CPU": 1}], strategy="SQUEEZE")
