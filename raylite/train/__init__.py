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

Workers are raylite actors; only the public raylite API is used here. ``raylite.train.torch``
(prepare_model, prepare_data_loader, get_device) imports torch; this package itself does not.
"""
from raylite.train.checkpoint import Checkpoint
from raylite.train.config import (CheckpointConfig, CheckpointStrategy, FailureConfig, RunConfig, ScalingConfig,
                                  TorchConfig)
from raylite.train.result import Result
from raylite.train.session import (TrainContext, get_checkpoint, get_context, load_checkpoint, local_rank, report,
                                   save_checkpoint, world_rank, world_size)
from raylite.train.trainer import Trainer, TorchTrainer, TrainingFailedError


def __getattr__(name):   # `train.torch` without importing torch up front
    if name == "torch":
        import importlib
        return importlib.import_module("raylite.train.torch")
    raise AttributeError(f"module 'raylite.train' has no attribute {name!r}")


__all__ = ["Checkpoint", "CheckpointConfig", "CheckpointStrategy", "FailureConfig", "Result", "RunConfig",
           "ScalingConfig", "TorchConfig", "TorchTrainer", "TrainContext", "Trainer", "TrainingFailedError",
           "get_checkpoint", "get_context", "load_checkpoint", "local_rank", "report", "save_checkpoint",
           "world_rank", "world_size"]
