"""Snippets of Ray Tune's documentation that must run unchanged on raylite.tune (imports rewritten):
Ray's import paths, `train.report` inside a Tune trainable, exact stops, the stopper classes,
`fail_fast`, search spaces inside lists, ConcurrencyLimiter and OptunaSearch's define-by-run space,
`Tuner.restore(resume_errored=/restart_errored=)`, resource dicts, auto-filled metrics and the
ExperimentAnalysis accessors. Trainables are defined inside the tests (cloudpickle ships them by value)."""
from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("optuna")

from raylite import train, tune  # noqa: E402

pytestmark = pytest.mark.timeout(90)


def run_config(tmp_path, name, **kw):
    return tune.RunConfig(name=name, storage_path=str(tmp_path), verbose=0, **kw)


def checkpoints(path) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.startswith("checkpoint_"))


# ---------------------------------------------------------------------------- import paths
def test_ray_import_paths_resolve_to_raylite_classes():
    from raylite.tune.experiment import Trial
    from raylite.tune.integration.ray_train import TuneReportCallback
    from raylite.tune.schedulers import ASHAScheduler
    from raylite.tune.search import BasicVariantGenerator, ConcurrencyLimiter, OptunaSearch
    from raylite.tune.search.basic_variant import BasicVariantGenerator as BasicFromModule
    from raylite.tune.search.optuna import OptunaSearch as OptunaFromModule
    from raylite.tune.stopper import (CombinedStopper, ExperimentPlateauStopper, FunctionStopper,  # noqa: F401
                                      MaximumIterationStopper, NoopStopper, Stopper, TimeoutStopper,
                                      TrialPlateauStopper)

    assert OptunaFromModule is OptunaSearch is tune.OptunaSearch
    assert BasicFromModule is BasicVariantGenerator is tune.search.BasicVariantGenerator
    assert ConcurrencyLimiter is tune.ConcurrencyLimiter and Stopper is tune.Stopper
    assert tune.schedulers.ASHAScheduler is ASHAScheduler and Trial is tune.Trial
    assert callable(TuneReportCallback.after_report)
    with pytest.raises(RuntimeError, match="inside a Tune trial"):
        TuneReportCallback()
    from raylite.tune import session
    session._warned.discard("get_trial_id")
    with pytest.warns(UserWarning, match="only be called inside"):   # as Ray: a warning and None
        assert tune.get_context().get_trial_id() is None


# ---------------------------------------------------------------------------- Ray 2.x trainable APIs
def test_train_report_checkpoint_and_context_inside_a_trainable(ray_module, tmp_path):
    """Ray 2.x's Tune docs call train.report / train.get_checkpoint / train.get_context from a
    function trainable, with ray.train.Checkpoint: they are the trial's (retried from its checkpoint)."""
    marker = str(tmp_path / "failed_once")

    def trainable(config):
        import tempfile
        ckpt = train.get_checkpoint()
        start = 0
        if ckpt:
            with ckpt.as_directory() as d:
                start = int(open(os.path.join(d, "epoch")).read()) + 1
        for epoch in range(start, 4):
            if epoch == 2 and not os.path.exists(marker):
                open(marker, "w").close()
                raise RuntimeError("first attempt fails at epoch 2")
            with tempfile.TemporaryDirectory() as d:
                open(os.path.join(d, "epoch"), "w").write(str(epoch))
                ctx = tune.get_context()
                train.report({"epoch": epoch, "start": start, "trial_dir": train.get_context().get_trial_dir(),
                              "trial_id": ctx.get_trial_id(), "experiment": ctx.get_experiment_name(),
                              "rank": train.get_context().get_world_rank()},
                             checkpoint=train.Checkpoint.from_directory(d))

    result = tune.Tuner(trainable, run_config=run_config(tmp_path, "exp",
                                                         failure_config=tune.FailureConfig(max_failures=1))).fit()[0]
    m = result.metrics
    assert result.error is None and m["epoch"] == 3 and m["start"] == 2      # resumed after epoch 1's checkpoint
    assert [r["epoch"] for r in result.metrics_history] == [0, 1, 2, 3]
    assert m["trial_dir"] == result.path and os.path.basename(result.path).startswith(f"trainable_{m['trial_id']}_")
    assert m["experiment"] == "exp" and m["rank"] == 0
    with result.checkpoint.as_directory() as d:
        assert open(os.path.join(d, "epoch")).read() == "3"


def test_auto_filled_metrics(ray_module, tmp_path):
    def trainable(config):
        tune.report({"v": config["x"]})

    results = tune.Tuner(trainable, param_space={"x": tune.grid_search([1.23456, 2.0]), "const": 5},
                         run_config=run_config(tmp_path, "auto")).fit()
    tags = sorted(r.metrics["experiment_tag"] for r in results)
    assert tags == ["0_x=1.235", "1_x=2"]
    m = results[0].metrics
    assert m["hostname"] and m["node_ip"] and time.strptime(m["date"], "%Y-%m-%d_%H-%M-%S")
    assert m["done"] is True and m["config"]["const"] == 5


# ---------------------------------------------------------------------------- stopping
def test_stop_function_and_stopper_end_trials_at_the_deciding_result(ray_module, tmp_path):
    """A trial reporting in a tight loop runs past the stop decision before it sees it; its record
    (metrics, history, checkpoints) still ends at the result that decided, as in Ray."""
    def my_trainable(config):
        import tempfile
        i = 1
        while True:
            with tempfile.TemporaryDirectory() as d:
                tune.report({"mean_accuracy": min(i / 10, 1.0)}, checkpoint=tune.Checkpoint.from_directory(d))
            i += 1

    def stop_fn(trial_id, result):
        return result["mean_accuracy"] >= 0.8 or result["training_iteration"] >= 10

    result = tune.Tuner(my_trainable, run_config=run_config(tmp_path, "fn", stop=stop_fn)).fit()[0]
    assert result.metrics["training_iteration"] == 8
    assert len(result.metrics_history) == 8
    assert checkpoints(result.path)[-1] == "checkpoint_000007"   # the 8th, numbered from 0 as in Ray

    class CustomStopper(tune.Stopper):
        def __init__(self):
            self.should_stop = False

        def __call__(self, trial_id, result):
            if not self.should_stop and result["mean_accuracy"] >= 0.8:
                self.should_stop = True
            return self.should_stop

        def stop_all(self):
            return self.should_stop

    grid = tune.Tuner(my_trainable, tune_config=tune.TuneConfig(num_samples=2),
                      run_config=run_config(tmp_path, "cls", stop=CustomStopper())).fit()
    assert all(r.metrics.get("training_iteration", 0) <= 8 for r in grid)


def test_builtin_stoppers(ray_module, tmp_path):
    from raylite.tune.stopper import (CombinedStopper, ExperimentPlateauStopper, MaximumIterationStopper,
                                      TimeoutStopper, TrialPlateauStopper)

    def trainable(config):
        for i in range(15):
            tune.report({"m": config["m"], "i": i})

    stopper = CombinedStopper(MaximumIterationStopper(max_iter=10), TrialPlateauStopper(metric="m"))
    grid = tune.Tuner(trainable, param_space={"m": tune.grid_search([1.0])},
                      run_config=run_config(tmp_path, "plateau", stop=stopper)).fit()
    assert grid[0].metrics["training_iteration"] == 4      # constant: plateaued after grace_period=4 results
    grid = tune.Tuner(trainable, param_space={"m": 1.0},
                      run_config=run_config(tmp_path, "maxiter", stop=MaximumIterationStopper(3))).fit()
    assert grid[0].metrics["training_iteration"] == 3

    plateau = ExperimentPlateauStopper("m", top=3, patience=2)
    assert [plateau("t", {"m": 1.0}) for _ in range(4)] == [False, False, False, True]
    with pytest.raises(ValueError, match="top"):
        ExperimentPlateauStopper("m", top=1)
    with pytest.raises(ValueError, match="metric_threshold"):
        TrialPlateauStopper("m", metric_threshold=0.5)

    def silent(config):   # never reports: only stop_all(), checked between results too, can end it
        time.sleep(30)

    start = time.monotonic()
    grid = tune.Tuner(silent, run_config=run_config(tmp_path, "timeout", stop=TimeoutStopper(0.5))).fit()
    assert time.monotonic() - start < 15 and grid[0].error is None


def test_fail_fast(ray_module, tmp_path):
    def trainable(config):
        if config["should_fail"]:
            raise RuntimeError("Failing (on purpose)!")
        time.sleep(20)
        tune.report({"mean_accuracy": 0.9})

    start = time.monotonic()
    grid = tune.Tuner(trainable, param_space={"should_fail": tune.grid_search([True, False])},
                      run_config=run_config(tmp_path, "ff", failure_config=tune.FailureConfig(fail_fast=True))).fit()
    assert time.monotonic() - start < 15
    assert grid.num_errors == 1 and all(not r.metrics.get("training_iteration") for r in grid)

    with pytest.raises(RuntimeError, match="on purpose"):
        tune.Tuner(trainable, param_space={"should_fail": tune.grid_search([True, False])},
                   run_config=run_config(tmp_path, "ffr", failure_config=tune.FailureConfig(fail_fast="raise"))).fit()
    with pytest.raises(ValueError, match="max_failures must be 0"):
        tune.FailureConfig(max_failures=1, fail_fast=True)
    with pytest.raises(ValueError, match="fail_fast"):
        tune.FailureConfig(fail_fast="sometimes")


# ---------------------------------------------------------------------------- search
def test_search_spaces_inside_lists(ray_module, tmp_path):
    def trainable(config):
        tune.report({"layers": config["nn_layers"], "opt": config["opts"][0]["lr"]})

    grid = tune.Tuner(trainable,
                      param_space={"nn_layers": [tune.grid_search([16, 64]), tune.grid_search([8, 32]), 4],
                                   "opts": [{"lr": tune.uniform(0.1, 0.2)}]},
                      run_config=run_config(tmp_path, "lists")).fit()
    assert sorted(tuple(r.metrics["layers"]) for r in grid) == [(16, 8, 4), (16, 32, 4), (64, 8, 4), (64, 32, 4)]
    assert all(0.1 <= r.metrics["opt"] <= 0.2 for r in grid)
    with pytest.raises(ValueError, match="tuple"):
        tune.Tuner(trainable, param_space={"t": (tune.uniform(0, 1),)}, run_config=run_config(tmp_path, "t")).fit()


def test_concurrency_limiter_and_define_by_run_space(ray_module, tmp_path):
    from raylite.tune.search import ConcurrencyLimiter
    from raylite.tune.search.optuna import OptunaSearch

    def objective(config):
        start = time.time()
        time.sleep(0.1)
        tune.report({"loss": config["model"]["width"] + (10 if config["activation"] == "relu" else 0),
                     "steps": config["steps"], "window": (start, time.time())})

    def define_by_run(trial):
        trial.suggest_categorical("activation", ["relu", "tanh"])
        trial.suggest_float("model/width", 0, 20)
        return {"steps": 5}

    searcher = OptunaSearch(space=define_by_run, metric="loss", mode="min",
                            points_to_evaluate=[{"activation": "tanh", "model": {"width": 1.5}}])
    grid = tune.Tuner(objective, tune_config=tune.TuneConfig(search_alg=ConcurrencyLimiter(searcher, max_concurrent=1),
                                                             num_samples=3),
                      run_config=run_config(tmp_path, "dbr")).fit()
    assert grid[0].config == {"activation": "tanh", "model": {"width": 1.5}, "steps": 5}
    assert all(r.metrics["steps"] == 5 and 0 <= r.config["model"]["width"] <= 20 for r in grid)
    windows = sorted(tuple(r.metrics["window"]) for r in grid)
    assert all(a[1] <= b[0] for a, b in zip(windows, windows[1:]))     # one trial at a time
    with pytest.raises(ValueError, match="define-by-run"):
        tune.Tuner(objective, param_space={"x": tune.uniform(0, 1)},
                   tune_config=tune.TuneConfig(search_alg=OptunaSearch(space=define_by_run, metric="loss",
                                                                       mode="min")),
                   run_config=run_config(tmp_path, "bad")).fit()
    with pytest.raises(NotImplementedError, match="batch"):
        ConcurrencyLimiter(searcher, max_concurrent=2, batch=True)
    assert OptunaSearch(metric=["a", "b"], mode=["min", "max"]).objectives == [("a", "min"), ("b", "max")]


# ---------------------------------------------------------------------------- restore, resources, configs
def test_restore_resumes_or_restarts_errored_trials(ray_module, tmp_path):
    flag = str(tmp_path / "crash")

    def trainable(config):
        import tempfile
        ckpt = train.get_checkpoint()
        start = int(open(os.path.join(ckpt.path, "epoch")).read()) + 1 if ckpt else 0
        for epoch in range(start, 5):
            if epoch == 3 and os.path.exists(flag):
                os.remove(flag)
                raise RuntimeError("simulated crash")
            with tempfile.TemporaryDirectory() as d:
                open(os.path.join(d, "epoch"), "w").write(str(epoch))
                train.report({"epoch": epoch, "start": start}, checkpoint=train.Checkpoint.from_directory(d))

    for name, option, first_start in (("resume", "resume_errored", 3), ("restart", "restart_errored", 0)):
        open(flag, "w").close()
        grid = tune.Tuner(trainable, run_config=run_config(tmp_path, name)).fit()
        assert grid.num_errors == 1 and grid[0].metrics["epoch"] == 2
        grid = tune.Tuner.restore(str(tmp_path / name), trainable=trainable, **{option: True}).fit()
        assert grid.num_errors == 0 and grid[0].metrics["epoch"] == 4
        assert [r["epoch"] for r in grid[0].metrics_history] == [0, 1, 2, 3, 4]
        assert grid[0].metrics["start"] == first_start
        assert not os.path.exists(os.path.join(grid[0].path, "error.txt"))
    with pytest.raises(ValueError, match="exclude each other"):
        tune.Tuner.restore(str(tmp_path / "resume"), trainable=trainable, resume_errored=True, restart_errored=True)


def test_resource_dicts_custom_resources_and_memory(ray_module, tmp_path):
    from raylite.tune.resources import normalize_resources

    assert normalize_resources({"cpu": 2, "gpu": 0.5, "custom_resources": {"hdd": 80}}) == \
        {"CPU": 2.0, "GPU": 0.5, "hdd": 80.0}
    with pytest.raises(ValueError, match="given twice"):
        normalize_resources({"hdd": 1, "custom_resources": {"hdd": 80}})

    def trainable(config):
        tune.report({"res": tune.get_trial_resources()})

    grid = tune.Tuner(tune.with_resources(trainable, {"cpu": 1, "memory": 10 * 2**20}),
                      run_config=run_config(tmp_path, "mem")).fit()
    assert grid[0].metrics["res"] == {"CPU": 1.0, "memory": 10.0 * 2**20}


def test_unsupported_options_are_errors_not_ignored(tmp_path):
    with pytest.raises(TypeError, match="trial_dirname_creator"):
        tune.TuneConfig(trial_dirname_creator="x")
    with pytest.raises(ValueError, match="checkpoint_frequency"):
        tune.run(lambda config: None, storage_path=str(tmp_path), verbose=0,
                 checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=2))
    with pytest.raises(ValueError, match="RESTART_ERRORED"):
        tune.run(lambda config: None, storage_path=str(tmp_path), name="x", verbose=0, resume="AUTO+ERRORED_ONLY")


def test_experiment_analysis_accessors(ray_module, tmp_path):
    def trainable(config):
        for i in range(3):
            tune.report({"score": config["x"] * i}, checkpoint=tune.Checkpoint.from_dict({"i": i}))

    analysis = tune.run(trainable, config={"x": tune.grid_search([1, 2])}, metric="score", mode="max",
                        storage_path=str(tmp_path), name="ea", verbose=0)
    best = analysis.best_trial
    assert best.config == {"x": 2} and list(analysis.best_dataframe["score"]) == [0, 2, 4]
    assert analysis.get_last_checkpoint(best).to_dict() == {"i": 2}
    assert analysis.get_last_checkpoint().to_dict() == {"i": 2}
    assert sorted(c["config/x"] for c in analysis.get_all_configs(prefix=True).values()) == [1, 2]
