"""Bad input to Train and Tune, as a table: every invalid value is an error of the stated type whose
message names the field, raised before any trial or worker starts (the trainable never runs, nothing
is written under storage_path), and the runtime still runs a normal experiment and fit afterwards."""
from __future__ import annotations

import math
import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("optuna")

import raylite as ray  # noqa: E402
from raylite import train, tune  # noqa: E402
from raylite.train.torch import TorchConfig, TorchTrainer  # noqa: E402

MARKER = "ran"   # what the trainable and the training loop write when they start


def trainable(config):
    open(os.path.join(config["dir"], MARKER), "a").close()
    tune.report({"score": 1.0})


def loop(config):
    open(os.path.join(config["dir"], MARKER), "a").close()
    train.report({"loss": 0.5})


def tune_run(fn=trainable, **kw):
    kw.setdefault("verbose", 0)
    return lambda d: tune.run(fn, config={"dir": d}, storage_path=d, **kw)


def tuner(**kw):
    return lambda d: tune.Tuner(trainable, param_space={"dir": d}, **kw).fit()


def tuner_fit(fn=trainable, **run_kw):
    """Tuner(...).fit() whose results would go to the case's directory."""
    return lambda d: tune.Tuner(fn, param_space={"dir": d},
                                run_config=tune.RunConfig(storage_path=d, verbose=0, **run_kw)).fit()


def fit(loop_fn=loop, train_loop_config=None, run_config=None, **kw):
    def call(d):
        rc = run_config if run_config is not None else train.RunConfig()
        if isinstance(rc, train.RunConfig):
            rc.storage_path = d
        TorchTrainer(loop_fn, train_loop_config=train_loop_config or {"dir": d}, run_config=rc, **kw).fit()
    return call


def make(cls, **kw):
    return lambda d: cls(**kw)


def sc(**kw):
    return make(train.ScalingConfig, **kw)


# (case id, call(storage dir), exception type, text the message must contain: the field)
CASES = [
    # tune.run
    ("run-gpu-finer-than-grid", tune_run(resources_per_trial={"gpu": 0.00001}), ValueError, "resources_per_trial['gpu']"),
    ("run-cpu-off-grid", tune_run(resources_per_trial={"cpu": 0.33333}), ValueError, "resources_per_trial['cpu']"),
    ("run-cpu-negative", tune_run(resources_per_trial={"cpu": -1}), ValueError, "resources_per_trial['cpu']"),
    ("run-pgf-finer-than-grid", tune_run(resources_per_trial=tune.PlacementGroupFactory([{"CPU": 0.00001}])),
     ValueError, "resources_per_trial"),
    ("run-resources-str", tune_run(resources_per_trial="abc"), TypeError, "resources_per_trial"),
    ("run-resources-too-big", tune_run(resources_per_trial={"cpu": 64}), ValueError, "resources_per_trial"),
    ("run-stop-str-bound", tune_run(stop={"score": "x"}), TypeError, "stop['score']"),
    ("run-stop-nan-bound", tune_run(stop={"score": math.nan}), ValueError, "stop['score']"),
    ("run-stop-int", tune_run(stop=5), TypeError, "stop"),
    ("run-verbose-str", tune_run(verbose="loud"), ValueError, "verbose"),
    ("run-verbose-7", tune_run(verbose=7), ValueError, "verbose"),
    ("run-time-budget-negative", tune_run(time_budget_s=-1), ValueError, "time_budget_s"),
    ("run-time-budget-zero", tune_run(time_budget_s=0), ValueError, "time_budget_s"),
    ("run-time-budget-str", tune_run(time_budget_s="10"), TypeError, "time_budget_s"),
    ("run-num-samples-0", tune_run(num_samples=0), ValueError, "num_samples"),
    ("run-num-samples-str", tune_run(num_samples="3"), ValueError, "num_samples"),
    ("run-max-concurrent-0", tune_run(max_concurrent_trials=0), ValueError, "max_concurrent_trials"),
    ("run-max-failures--2", tune_run(max_failures=-2), ValueError, "max_failures"),
    ("run-mode-word", tune_run(metric="score", mode="maximize"), ValueError, "mode"),
    ("run-metric-without-mode", tune_run(metric="score"), ValueError, "mode"),
    ("run-name-dotdot", tune_run(name="../../x"), ValueError, "name"),
    ("run-name-slash", tune_run(name="a/b"), ValueError, "name"),
    ("run-resume-word", tune_run(resume="sometimes"), ValueError, "resume"),
    ("run-fail-fast-word", tune_run(fail_fast="yes"), ValueError, "fail_fast"),
    ("run-checkpoint-config-dict", tune_run(checkpoint_config={"num_to_keep": 1}), TypeError, "checkpoint_config"),
    ("run-trial-name-creator-str", tune_run(trial_name_creator="x"), TypeError, "trial_name_creator"),
    ("run-search-alg-str", tune_run(search_alg="optuna"), TypeError, "search_alg"),
    ("run-trainable-int", tune_run(fn=5), TypeError, "trainable"),
    # Tuner / TuneConfig / tune.RunConfig
    ("tuner-param-space-int", lambda d: tune.Tuner(trainable, param_space=5), ValueError, "param_space"),
    ("tuner-tune-config-dict", tuner(tune_config={"metric": "score"}), TypeError, "tune_config"),
    ("tuner-run-config-dict", tuner(run_config={"name": "x"}), TypeError, "run_config"),
    ("tuner-stop-str-bound", tuner_fit(stop={"score": "x"}), TypeError, "stop['score']"),
    ("with-resources-finer-than-grid", lambda d: tune.with_resources(trainable, {"gpu": 0.00001}), ValueError,
     "with_resources(resources=...)['gpu']"),
    ("tuner-name-dotdot", tuner_fit(name="../x"), ValueError, "name"),
    ("tuneconfig-mode", make(tune.TuneConfig, mode="up"), ValueError, "mode"),
    ("tuneconfig-num-samples", make(tune.TuneConfig, num_samples=0), ValueError, "num_samples"),
    ("tuneconfig-time-budget", make(tune.TuneConfig, time_budget_s=-1), ValueError, "time_budget_s"),
    ("tuneconfig-max-concurrent", make(tune.TuneConfig, max_concurrent_trials=-1), ValueError,
     "max_concurrent_trials"),
    ("tuneconfig-metric-int", make(tune.TuneConfig, metric=5), TypeError, "metric"),
    ("tuneconfig-search-alg-str", make(tune.TuneConfig, search_alg="tpe"), TypeError, "search_alg"),
    ("tune-runconfig-log-to-file", make(tune.RunConfig, log_to_file=5), (TypeError, ValueError), "log_to_file"),
    # RunConfig
    ("runconfig-name-dotdot", make(train.RunConfig, name="../../x"), ValueError, "name"),
    ("runconfig-name-dotdot-alone", make(train.RunConfig, name=".."), ValueError, "name"),
    ("runconfig-name-empty", make(train.RunConfig, name=""), ValueError, "name"),
    ("runconfig-name-int", make(train.RunConfig, name=5), TypeError, "name"),
    ("runconfig-storage-int", make(train.RunConfig, storage_path=5), TypeError, "storage_path"),
    ("runconfig-storage-s3", make(train.RunConfig, storage_path="s3://bucket/x"), ValueError, "storage_path"),
    ("runconfig-failure-dict", make(train.RunConfig, failure_config={"max_failures": 1}), TypeError,
     "failure_config"),
    ("runconfig-checkpoint-int", make(train.RunConfig, checkpoint_config=3), TypeError, "checkpoint_config"),
    ("runconfig-callbacks-object", make(train.RunConfig, callbacks=object()), TypeError, "callbacks"),
    ("runconfig-verbose-str", make(train.RunConfig, verbose="loud"), ValueError, "verbose"),
    # CheckpointConfig / FailureConfig
    ("ckpt-num-to-keep-0", make(train.CheckpointConfig, num_to_keep=0), ValueError, "num_to_keep"),
    ("ckpt-num-to-keep-bool", make(train.CheckpointConfig, num_to_keep=True), ValueError, "num_to_keep"),
    ("ckpt-score-order", make(train.CheckpointConfig, checkpoint_score_order="best"), ValueError,
     "checkpoint_score_order"),
    ("ckpt-score-attribute-int", make(train.CheckpointConfig, checkpoint_score_attribute=5), TypeError,
     "checkpoint_score_attribute"),
    ("ckpt-frequency-negative", make(train.CheckpointConfig, checkpoint_frequency=-1), ValueError,
     "checkpoint_frequency"),
    ("ckpt-at-end-str", make(train.CheckpointConfig, checkpoint_at_end="yes"), ValueError, "checkpoint_at_end"),
    ("failure-max-failures--2", make(train.FailureConfig, max_failures=-2), ValueError, "max_failures"),
    ("failure-max-failures-float", make(train.FailureConfig, max_failures=1.5), ValueError, "max_failures"),
    ("failure-fail-fast-word", make(train.FailureConfig, fail_fast="yes"), ValueError, "fail_fast"),
    ("failure-fail-fast-with-retries", make(train.FailureConfig, max_failures=1, fail_fast=True), ValueError,
     "max_failures"),
    # ScalingConfig / TorchConfig
    ("scaling-workers-negative", sc(num_workers=-1), ValueError, "num_workers"),
    ("scaling-workers-float", sc(num_workers=1.5), ValueError, "num_workers"),
    ("scaling-workers-str", sc(num_workers="2"), ValueError, "num_workers"),
    ("scaling-use-gpu-word", sc(use_gpu="yes"), ValueError, "use_gpu"),
    ("scaling-resources-list", sc(resources_per_worker=[1]), TypeError, "resources_per_worker"),
    ("scaling-resources-negative", sc(resources_per_worker={"CPU": -1}), ValueError, "resources_per_worker['CPU']"),
    ("scaling-resources-nan", sc(resources_per_worker={"CPU": math.nan}), ValueError, "resources_per_worker['CPU']"),
    ("scaling-resources-off-grid", sc(resources_per_worker={"CPU": 0.33333}), ValueError,
     "resources_per_worker['CPU']"),
    ("scaling-gpu-without-use-gpu", sc(resources_per_worker={"GPU": 1}), ValueError, "use_gpu"),
    ("scaling-trainer-resources-str", sc(trainer_resources={"CPU": "x"}), ValueError, "trainer_resources['CPU']"),
    ("scaling-placement-strategy", sc(placement_strategy="DENSE"), ValueError, "placement_strategy"),
    ("scaling-accelerator-type-empty", sc(accelerator_type=""), ValueError, "accelerator_type"),
    ("torchconfig-timeout-negative", make(TorchConfig, timeout_s=-1), ValueError, "timeout_s"),
    ("torchconfig-timeout-nan", make(TorchConfig, timeout_s=math.nan), ValueError, "timeout_s"),
    ("torchconfig-timeout-str", make(TorchConfig, timeout_s="30"), ValueError, "timeout_s"),
    ("torchconfig-backend", make(TorchConfig, backend="mpi"), ValueError, "backend"),
    ("torchconfig-init-method", make(TorchConfig, init_method="tcp"), ValueError, "init_method"),
    # TorchTrainer
    ("trainer-scaling-dict", fit(scaling_config={"num_workers": 2}), ValueError, "scaling_config"),
    ("trainer-run-config-dict", fit(run_config={"name": "x"}), ValueError, "run_config"),
    ("trainer-loop-config-str", fit(train_loop_config="notadict"), ValueError, "train_loop_config"),
    ("trainer-torch-config-dict", fit(torch_config={"backend": "gloo"}), ValueError, "torch_config"),
    ("trainer-resume-str", fit(resume_from_checkpoint="/tmp/x"), ValueError, "resume_from_checkpoint"),
    ("trainer-loop-int", fit(loop_fn=5), TypeError, "train_loop_per_worker"),
    ("trainer-too-many-workers", fit(scaling_config=train.ScalingConfig(num_workers=5)), ValueError,
     "num_workers"),
    ("trainer-class-trainable-checkpointing",
     fit(run_config=train.RunConfig(checkpoint_config=train.CheckpointConfig(checkpoint_frequency=2))),
     ValueError, "checkpoint_frequency"),
]

assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("call, error, field", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_value_is_a_clear_error_before_anything_runs(ray_module, tmp_path, call, error, field):
    with pytest.raises(error) as info:
        call(str(tmp_path))
    assert field in str(info.value), f"the message does not name {field!r}: {info.value}"
    assert os.listdir(tmp_path) == [], "a trial or worker started, or something was written, before the error"


def test_a_normal_experiment_and_fit_still_run_after_the_table(ray_module, tmp_path):
    analysis = tune.run(trainable, config={"dir": str(tmp_path)}, storage_path=str(tmp_path / "tune"),
                        verbose=0, stop={"score": 1})
    assert [t.last_result["score"] for t in analysis.trials] == [1.0]
    os.remove(tmp_path / MARKER)
    result = TorchTrainer(loop, train_loop_config={"dir": str(tmp_path)},
                          scaling_config=train.ScalingConfig(num_workers=2),
                          run_config=train.RunConfig(storage_path=str(tmp_path / "train"), name="ok")).fit()
    assert result.metrics["loss"] == 0.5 and (tmp_path / MARKER).exists()
    assert ray.available_resources().get("CPU") == 2   # the workers are gone


def test_a_metric_error_in_the_trainable_is_not_called_an_interruption(ray_module, tmp_path, capsys):
    with pytest.raises(ValueError, match="did not include the specified metric"):
        tune.run(trainable, config={"dir": str(tmp_path)}, storage_path=str(tmp_path), metric="accuracy", mode="max")
    out = capsys.readouterr()
    assert "interrupted" not in out.out + out.err and "resume=True" not in out.out + out.err
