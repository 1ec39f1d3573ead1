"""A raylite.train `TorchTrainer` (or `DataParallelTrainer`) as a Tune trainable:
`Tuner(trainer, param_space={"train_loop_config": {...}})`.

Ray 2.x runs one Train run per trial. Here each trial is a function trainable that builds the trial's
TorchTrainer (the base trainer with the trial's `train_loop_config` merged in and, if searched, its
`scaling_config`) and fits it inside the trial's process. Its workers reserve their own resources as
one placement group, so the trial task itself holds no CPU. Each of rank 0's reports reaches Tune with
its checkpoint as the Train run records it, so schedulers, stoppers and `ResultGrid` see the run as
Ray's do; a stop decision tears the run down when its next report is recorded. A retried or resumed
trial starts its Train run from the trial's latest checkpoint (`train.get_checkpoint()` in the workers).
"""
from __future__ import annotations

import copy
import dataclasses
import math

from raylite.train.checkpoint import Checkpoint
from raylite.train.config import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from raylite.train.trainer import DataParallelTrainer, TorchTrainer

# What a param_space may set on the trainer, as in Ray (its constructor's tunable arguments).
TUNABLE = ("train_loop_config", "scaling_config", "torch_config", "backend_config", "resume_from_checkpoint")
_TRAIN_AUTO = ("training_iteration", "time_total_s", "timestamp", "checkpoint_dir_name")


def prepare_param_space(trainer: DataParallelTrainer, param_space: dict | None) -> dict:
    """The param_space with a `ScalingConfig` turned into a dict (so search spaces in its fields are
    resolved per trial, as in Ray) and unknown keys refused."""
    space = dict(param_space or {})
    tunable = [k for k in TUNABLE if k != ("backend_config" if isinstance(trainer, TorchTrainer) else "torch_config")]
    unknown = sorted(set(space) - set(tunable))
    if unknown:
        kind = type(trainer).__name__
        raise ValueError(f"Tuner({kind}, param_space=...): {unknown} are not {kind} arguments; a "
                         f"trainer's param_space may set {tunable} (put hyperparameters under "
                         f"'train_loop_config')")
    if isinstance(space.get("scaling_config"), ScalingConfig):
        sc = space["scaling_config"]
        space["scaling_config"] = {f.name: getattr(sc, f.name) for f in dataclasses.fields(sc)}
    return space


def default_concurrency(trainer: DataParallelTrainer, total: dict) -> int:
    """How many trials' worker groups fit at once (by the base trainer's scaling config): the bound
    on concurrent trials when the TuneConfig sets none, since the trial tasks hold no CPU."""
    request = trainer.scaling_config.worker_request(use_gpu=trainer.scaling_config.use_gpu is True)
    asks = {"CPU": request["num_cpus"], "GPU": request["num_gpus"], **request["resources"]}
    n = max(1, trainer.scaling_config.num_workers)   # local mode (0 workers): the trial process trains
    fits = [math.floor(total.get(k, 0) / (n * v) + 1e-9) for k, v in asks.items() if v]
    return max(1, min(fits, default=1))


class TrainerTrainable:
    """The function trainable that runs `trainer` with a trial's config."""

    def __init__(self, trainer: DataParallelTrainer):
        self.trainer = trainer
        self.__name__ = type(trainer).__name__

    def __call__(self, config: dict) -> None:
        from raylite import tune
        base = self.trainer
        loop_config = _merge(base.train_loop_config or {}, config.get("train_loop_config") or {})
        scaling = config.get("scaling_config", base.scaling_config)
        if isinstance(scaling, dict):
            scaling = ScalingConfig(**scaling)
        resume = tune.get_checkpoint()
        backend = ({"torch_config": config.get("torch_config", base.torch_config)} if isinstance(base, TorchTrainer)
                   else {"backend_config": config.get("backend_config", base.backend_config)})
        trainer = type(base)(
            base.train_loop_per_worker, train_loop_config=loop_config or None, **backend,
            scaling_config=scaling,
            run_config=RunConfig(name="train", storage_path=tune.get_trial_dir(), verbose=0,
                                 checkpoint_config=CheckpointConfig(num_to_keep=1), failure_config=FailureConfig(),
                                 callbacks=[*(base.run_config.callbacks or []), _ReportToTune()]),
            resume_from_checkpoint=(Checkpoint(resume.path) if resume is not None and resume.path
                                    else config.get("resume_from_checkpoint", base.resume_from_checkpoint)))
        trainer.fit()


class _ReportToTune:
    """Run callback: each rank-0 report becomes one `tune.report` (with its checkpoint), as soon as
    the trial's Train run records it. Nothing more is forwarded once the trial was stopped."""

    def __init__(self):
        self.stopped = False

    def on_rank0_report(self, metrics: dict, checkpoint: Checkpoint | None) -> None:
        if self.stopped:
            return
        from raylite import tune
        result = {k: v for k, v in metrics.items() if k not in _TRAIN_AUTO}
        try:
            tune.report(result, checkpoint=checkpoint)
        except BaseException:
            self.stopped = True
            raise


def _merge(base: dict, override: dict) -> dict:
    """`override` deep-merged into a copy of `base` (Ray merges a trainer's train_loop_config so)."""
    out = copy.copy(base)
    for key, value in override.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
