"""``ray.train.data_parallel_trainer``'s import path: the framework-agnostic trainer (workers without
a process group unless its ``backend_config`` is a TorchConfig)."""
from raylite.train.trainer import DataParallelTrainer

__all__ = ["DataParallelTrainer"]
