"""`ray.train.lightning` for raylite: Ray Train 2.x's way to run a Lightning ``pl.Trainer`` inside
``TorchTrainer`` workers, so the code from Ray's "Train with PyTorch Lightning" guide runs as is:

    from raylite.train.lightning import (RayDDPStrategy, RayLightningEnvironment,
                                         RayTrainReportCallback, prepare_trainer)

    def train_func():
        trainer = pl.Trainer(devices="auto", accelerator="auto", strategy=RayDDPStrategy(),
                             plugins=[RayLightningEnvironment()], callbacks=[RayTrainReportCallback()],
                             enable_checkpointing=False)
        trainer = prepare_trainer(trainer)
        trainer.fit(model, train_dataloaders=loader)

    result = TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=2)).fit()

The workers' process group is raylite.train's (Lightning sees it up and joins it); ranks come
from ``train.get_context()``. For ``pl.Trainer(strategy=RayStrategy(num_workers=N))`` in a plain
driver, see ``raylite.plugins``. DeepSpeed is not provided.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from raylite.plugins._compat import Callback, DDPStrategy, FSDPStrategy
from raylite.plugins.environment import RayEnvironment
from raylite.train import session
from raylite.train.checkpoint import Checkpoint


def _device():
    from raylite.train.torch import get_device   # imports torch, which Lightning has loaded already
    return get_device()


def _sampler_kwargs() -> dict[str, Any]:
    """Split the data over the whole worker group, whatever ``devices`` Lightning was given."""
    ctx = session.get_context()
    return {"num_replicas": ctx.get_world_size(), "rank": ctx.get_world_rank()}


class _OnWorkerGroup:
    """What both Ray strategies change: the worker's device, and samplers over the whole group."""

    @property
    def root_device(self):
        return _device()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return _sampler_kwargs()


class RayDDPStrategy(_OnWorkerGroup, DDPStrategy):
    """Lightning's DDP on the raylite.train worker group."""


class RayFSDPStrategy(_OnWorkerGroup, FSDPStrategy):
    """Lightning's FSDP on the raylite.train worker group."""


class RayLightningEnvironment(RayEnvironment):
    """Ranks and world size from the raylite.train context. Unlike ``RayEnvironment`` it accepts
    any ``devices``/``num_nodes`` (``devices="auto"`` in Ray's examples): the Ray strategies size
    the samplers from the worker group instead."""

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        pass


def prepare_trainer(trainer):
    """Check that ``trainer`` uses a Ray strategy and environment (what Ray's does); returns it."""
    strategy = trainer.strategy
    if not isinstance(strategy, (RayDDPStrategy, RayFSDPStrategy)):
        raise RuntimeError(f"prepare_trainer: pl.Trainer(strategy=...) must be RayDDPStrategy or RayFSDPStrategy "
                           f"from raylite.train.lightning, got {type(strategy).__name__}")
    env = getattr(strategy, "cluster_environment", None)
    if env is not None and not isinstance(env, RayLightningEnvironment):
        raise RuntimeError(f"prepare_trainer: pl.Trainer(plugins=[...]) must include RayLightningEnvironment() "
                           f"from raylite.train.lightning, got {type(env).__name__}")
    return trainer


class RayTrainReportCallback(Callback):
    """At each training epoch's end: ``train.report`` of the trainer's ``callback_metrics`` (plus
    ``epoch`` and ``step``) with a checkpoint directory holding ``checkpoint.ckpt`` (load it with
    ``LightningModule.load_from_checkpoint``). Every rank reports, as ``train.report`` expects."""

    CHECKPOINT_NAME = "checkpoint.ckpt"

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        metrics = {k: (v.item() if hasattr(v, "item") and getattr(v, "numel", lambda: 1)() == 1 else v)
                   for k, v in trainer.callback_metrics.items()}
        metrics["epoch"], metrics["step"] = trainer.current_epoch, trainer.global_step
        tmpdir = tempfile.mkdtemp(prefix=f"raylite-lightning-rank{session.get_context().get_world_rank()}-")
        try:
            trainer.save_checkpoint(os.path.join(tmpdir, self.CHECKPOINT_NAME))   # every rank: may be collective
            session.report(metrics, checkpoint=Checkpoint.from_directory(tmpdir))   # copied before it returns
            trainer.strategy.barrier()
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
