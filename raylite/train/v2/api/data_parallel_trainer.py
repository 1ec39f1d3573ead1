"""``ray.train.v2.api.data_parallel_trainer``'s import path (Ray's "key concepts" docs use it)."""
from raylite.train.trainer import DataParallelTrainer

__all__ = ["DataParallelTrainer"]
