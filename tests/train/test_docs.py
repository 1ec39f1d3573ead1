"""Snippets of Ray Train's documentation that must run unchanged on raylite.train (imports rewritten):
FailureConfig(max_failures) recovering from an error in the training function, Result.best_checkpoints,
Ray 2.x run callbacks (after_report), and a TorchTrainer tuned by Tune, either as the Tuner's trainable
(param_space={"train_loop_config": ..., "scaling_config": ...}) or fitted inside a trainable with
TuneReportCallback."""
from __future__ import annotations

import os
import sys

import cloudpickle
import pytest

pytest.importorskip("torch")
pytest.importorskip("optuna")

from raylite import train, tune  # noqa: E402
from raylite.train import (Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig,  # noqa: E402
                           TrainingFailedError)
from raylite.train.torch import TorchTrainer  # noqa: E402

pytestmark = pytest.mark.timeout(150)
cloudpickle.register_pickle_by_value(sys.modules[__name__])   # workers need not import this module


def report_epochs(config):
    """Reports `epochs` rounds with a checkpoint each from rank 0; resumes from train.get_checkpoint();
    raises once at `fail_at` (when that marker file does not exist yet)."""
    import tempfile
    ckpt = train.get_checkpoint()
    start = 0
    if ckpt:
        with ckpt.as_directory() as d:
            start = int(open(os.path.join(d, "epoch")).read()) + 1
    for epoch in range(start, config["epochs"]):
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if train.get_context().get_world_rank() == 0:
                open(os.path.join(d, "epoch"), "w").write(str(epoch))
                checkpoint = Checkpoint.from_directory(d)
            train.report({"epoch": epoch, "start": start, "loss": config.get("losses", [0] * 10)[epoch],
                          "x": config.get("x"), "world_size": train.get_context().get_world_size()},
                         checkpoint=checkpoint)
        marker = config.get("fail_marker")
        if marker and epoch == config.get("fail_at") and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("Intentional error to showcase restoration!")


def test_failure_config_restarts_a_failed_train_func_from_its_checkpoint(ray_module, tmp_path):
    config = {"epochs": 4, "fail_at": 1, "fail_marker": str(tmp_path / "failed")}
    result = TorchTrainer(report_epochs, train_loop_config=config, scaling_config=ScalingConfig(num_workers=1),
                          run_config=RunConfig(name="ft", storage_path=str(tmp_path),
                                               failure_config=FailureConfig(max_failures=1))).fit()
    assert result.error is None and result.metrics["epoch"] == 3 and result.metrics["start"] == 2
    assert [m["epoch"] for m in result.metrics_history] == [0, 1, 2, 3]

    config["fail_marker"] = str(tmp_path / "failed_again")      # no restart left: the error is the run's
    with pytest.raises(TrainingFailedError) as exc:
        TorchTrainer(report_epochs, train_loop_config=config, scaling_config=ScalingConfig(num_workers=1),
                     run_config=RunConfig(name="ft0", storage_path=str(tmp_path))).fit()
    assert isinstance(exc.value.__cause__, RuntimeError) and "Intentional error" in str(exc.value)
    assert isinstance(exc.value, train.WorkerGroupError) and list(exc.value.worker_failures) == [0]


def test_best_checkpoints_and_after_report_callbacks(ray_module, tmp_path):
    rounds = []

    class MyCallback:   # Ray Train 2.x's UserCallback hook
        def after_report(self, run_context, metrics, checkpoint):
            rounds.append(([m["epoch"] for m in metrics], checkpoint and os.path.basename(checkpoint.path)))

    result = TorchTrainer(report_epochs, train_loop_config={"epochs": 3, "losses": [0, 1, 2]},
                          scaling_config=ScalingConfig(num_workers=2),
                          run_config=RunConfig(name="best", storage_path=str(tmp_path), callbacks=[MyCallback()],
                                               checkpoint_config=CheckpointConfig(
                                                   num_to_keep=2, checkpoint_score_attribute="loss",
                                                   checkpoint_score_order="min"))).fit()
    # the best two by loss, worst to best; the latest stays on disk for resuming, as in Ray
    assert [(os.path.basename(c.path), m["loss"]) for c, m in result.best_checkpoints] == \
        [("checkpoint_000001", 1), ("checkpoint_000000", 0)]
    assert result.best_checkpoints[1][1]["training_iteration"] == 1
    assert sorted(n for n in os.listdir(result.path) if n.startswith("checkpoint_")) == \
        ["checkpoint_000000", "checkpoint_000001", "checkpoint_000002"]
    assert rounds == [([0, 0], "checkpoint_000000"), ([1, 1], "checkpoint_000001"), ([2, 2], "checkpoint_000002")]
    with pytest.raises(ValueError, match="checkpoint_frequency"):
        TorchTrainer(report_epochs, run_config=RunConfig(checkpoint_config=CheckpointConfig(
            checkpoint_frequency=2))).fit()


def test_tuner_with_a_torch_trainer(ray_module, tmp_path):
    trainer = TorchTrainer(report_epochs, train_loop_config={"epochs": 4, "x": 0},
                           scaling_config=ScalingConfig(num_workers=1))
    grid = tune.Tuner(trainer,
                      param_space={"train_loop_config": {"x": tune.grid_search([1, 2])},
                                   "scaling_config": ScalingConfig(num_workers=tune.grid_search([1]))},
                      tune_config=tune.TuneConfig(metric="loss", mode="min"),
                      run_config=tune.RunConfig(name="tt", storage_path=str(tmp_path), verbose=0,
                                                stop={"training_iteration": 2})).fit()
    assert grid.num_errors == 0 and sorted(r.metrics["x"] for r in grid) == [1, 2]
    for r in grid:
        assert r.metrics["training_iteration"] == 2 and r.metrics["epoch"] == 1   # stopped by Tune
        assert r.config["train_loop_config"] == {"x": r.metrics["x"]} and r.metrics["world_size"] == 1
        with r.checkpoint.as_directory() as d:
            assert open(os.path.join(d, "epoch")).read() == "1"
    with pytest.raises(ValueError, match="not TorchTrainer arguments"):
        tune.Tuner(trainer, param_space={"lr": 0.1})


def test_result_return_value_is_rank_zeros(ray_module, tmp_path):
    def loop(config):
        train.report({"rank": train.get_context().get_world_rank()})
        return f"rank {train.get_context().get_world_rank()}"

    result = TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=2),
                          run_config=RunConfig(name="rv", storage_path=str(tmp_path), verbose=0)).fit()
    assert result.return_value == "rank 0" and result.metrics["rank"] == 0


def test_tuner_with_a_data_parallel_trainer(ray_module, tmp_path):
    """A framework-free trainer is tuned the same way (Ray's key-concepts pages)."""
    from raylite.train.data_parallel_trainer import DataParallelTrainer

    def loop(config):
        train.report({"score": config["x"] * 10})

    trainer = DataParallelTrainer(loop, train_loop_config={"x": 0}, scaling_config=ScalingConfig(num_workers=1))
    grid = tune.Tuner(trainer, param_space={"train_loop_config": {"x": tune.grid_search([1, 2])}},
                      run_config=tune.RunConfig(name="dp", storage_path=str(tmp_path), verbose=0)).fit()
    assert grid.num_errors == 0 and sorted(r.metrics["score"] for r in grid) == [10, 20]
    with pytest.raises(ValueError, match=r"not DataParallelTrainer arguments.*'backend_config'"):
        tune.Tuner(trainer, param_space={"torch_config": None})
    local = DataParallelTrainer(loop, train_loop_config={"x": 0}, scaling_config=ScalingConfig(num_workers=0))
    grid = tune.Tuner(local, param_space={"train_loop_config": {"x": tune.grid_search([3])}},
                      run_config=tune.RunConfig(name="local", storage_path=str(tmp_path), verbose=0)).fit()
    assert grid.num_errors == 0 and grid[0].metrics["score"] == 30   # local mode: trained in the trial


def test_torch_trainer_inside_a_trainable_with_tune_report_callback(ray_module, tmp_path):
    from raylite.tune.integration.ray_train import TuneReportCallback

    def train_driver_fn(config):
        TorchTrainer(report_epochs, train_loop_config=config["train_loop_config"],
                     scaling_config=ScalingConfig(num_workers=1),
                     run_config=RunConfig(name=f"train-trial_id={tune.get_context().get_trial_id()}",
                                          storage_path=str(tmp_path / "runs"),
                                          callbacks=[TuneReportCallback()])).fit()

    grid = tune.Tuner(train_driver_fn, param_space={"train_loop_config": {"epochs": 2, "x": 7}},
                      run_config=tune.RunConfig(name="drv", storage_path=str(tmp_path), verbose=0)).fit()
    m = grid[0].metrics
    assert grid.num_errors == 0 and m["x"] == 7 and m["epoch"] == 1 and m["training_iteration"] == 2
    assert m["checkpoint_path"].endswith("checkpoint_000001") and os.path.isdir(m["checkpoint_path"])
