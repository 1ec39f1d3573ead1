"""raylite.train: distributed training on torch.distributed, with Ray Train's API (1.x and 2.x).

    from raylite import train
    from raylite.train import Trainer

    def train_func(config):
        ...                                   # torch.distributed is initialised (gloo / NCCL)
        train.report({"loss": loss}, checkpoint=train.Checkpoint.from_directory(d))

    with Trainer(num_workers=2, use_gpu=False) as trainer:
        per_worker = trainer.run(train_func, config={"lr": 1e-3})

    result = train.torch.TorchTrainer(train_func, train_loop_config={...},
                                      scaling_config=train.ScalingConfig(num_workers=2)).fit()

Start-up: each worker of a fresh group imports torch (and, with several workers, torch._dynamo,
which DistributedDataParallel needs): seconds of CPU per worker. ``train.init_with_preload(**kw)``
is ``ray.init(**kw)`` with raylite's zygote importing both once (``RAYLITE_PRELOAD``), so workers
start with them already imported.

Workers are raylite actors; only the public raylite API is used here. ``raylite.train.torch``
(prepare_model, prepare_data_loader, get_device) imports torch; this package itself does not.
"""
from raylite.train.callback import UserCallback
from raylite.train.checkpoint import Checkpoint
from raylite.train.config import (BackendConfig, CheckpointConfig, CheckpointStrategy, DataConfig, FailureConfig,
                                  RunConfig, ScalingConfig, TorchConfig)
from raylite.train.result import Result
from raylite.train.session import (TrainContext, get_checkpoint, get_context, get_dataset_shard, load_checkpoint,
                                   local_rank, report, save_checkpoint, world_rank, world_size)
from raylite.train.trainer import Trainer, TorchTrainer, TrainingFailedError, WorkerGroupError


PRELOAD_MODULES = ("torch", "torch._dynamo")   # what a worker imports in setup (see worker_group)


def init_with_preload(**init_kwargs):
    """``ray.init(**init_kwargs)`` with the runtime's zygote importing torch and torch._dynamo once
    (``RAYLITE_PRELOAD``, only for this ``init``; names already there are kept), so the workers of
    every group start with them. Call it early: the zygote imports while the driver goes on; the
    first group started before it has finished waits for it (not for longer than importing itself)."""
    import os

    import raylite as ray
    prev = os.environ.get("RAYLITE_PRELOAD")
    names = [n.strip() for n in (prev or "").split(",") if n.strip()]
    os.environ["RAYLITE_PRELOAD"] = ",".join(names + [m for m in PRELOAD_MODULES if m not in names])
    try:
        return ray.init(**init_kwargs)
    finally:
        if prev is None:
            os.environ.pop("RAYLITE_PRELOAD", None)
        else:
            os.environ["RAYLITE_PRELOAD"] = prev


def __getattr__(name):   # `train.torch` without importing torch up front
    if name in ("torch", "prepare_optimizer"):   # the latter is Ray 1.x's train.prepare_optimizer too
        import importlib
        module = importlib.import_module("raylite.train.torch")
        return module if name == "torch" else module.prepare_optimizer
    raise AttributeError(f"module 'raylite.train' has no attribute {name!r}")


__all__ = ["BackendConfig", "Checkpoint", "CheckpointConfig", "CheckpointStrategy", "DataConfig", "FailureConfig",
           "Result", "RunConfig", "ScalingConfig", "TorchConfig", "TorchTrainer", "TrainContext", "Trainer", "TrainingFailedError",
           "UserCallback", "WorkerGroupError", "get_checkpoint", "get_context", "get_dataset_shard",
           "init_with_preload", "load_checkpoint", "local_rank", "report", "save_checkpoint", "world_rank",
           "world_size"]
