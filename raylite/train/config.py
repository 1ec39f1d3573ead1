"""Configuration objects with Ray Train's names: ScalingConfig, RunConfig, CheckpointConfig,
FailureConfig and TorchConfig."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

DEFAULT_STORAGE_ENV = "RAYLITE_RESULTS_DIR"


def default_storage_path() -> str:
    """``$RAYLITE_RESULTS_DIR``, else ``~/raylite_results``."""
    return os.path.expanduser(os.environ.get(DEFAULT_STORAGE_ENV) or "~/raylite_results")


@dataclass
class ScalingConfig:
    """How many workers and what each one holds.

    ``use_gpu``: True (one GPU per worker, NCCL), False (CPU, gloo) or ``"auto"`` (GPUs when the
    runtime has enough usable ones, else CPU). ``resources_per_worker`` uses Ray's keys:
    ``{"CPU": 2, "GPU": 1, "custom": 1}``; the default is one CPU (plus one GPU with ``use_gpu``).
    ``trainer_resources`` and ``placement_strategy`` are accepted for compatibility: on one machine
    the driver itself coordinates and every worker lands on the same node.
    """

    num_workers: int = 1
    use_gpu: bool | str = False
    resources_per_worker: dict | None = None
    trainer_resources: dict | None = None
    placement_strategy: str = "PACK"

    def __post_init__(self):
        if not isinstance(self.num_workers, int) or isinstance(self.num_workers, bool) or self.num_workers < 1:
            raise ValueError(f"num_workers must be an integer >= 1, got {self.num_workers!r}")
        if self.use_gpu not in (True, False, "auto"):
            raise ValueError(f"use_gpu must be True, False or 'auto', got {self.use_gpu!r}")
        if self.resources_per_worker is not None:
            if not isinstance(self.resources_per_worker, dict):
                raise TypeError("resources_per_worker must be a dict such as {'CPU': 1, 'GPU': 1}")
            for key, value in self.resources_per_worker.items():
                if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                    raise ValueError(f"resources_per_worker[{key!r}] must be a number >= 0, got {value!r}")
            if self.resources_per_worker.get("GPU", 0) > 0 and self.use_gpu is False:
                raise ValueError("use_gpu is False but GPU was found in resources_per_worker. Either set "
                                 "use_gpu to True (or 'auto') or remove GPU from resources_per_worker.")

    def worker_request(self, use_gpu: bool) -> dict:
        """The per-worker actor options: num_cpus, num_gpus, resources."""
        res = dict(self.resources_per_worker or {})
        num_cpus = res.pop("CPU", 1)
        num_gpus = res.pop("GPU", 1 if use_gpu else 0)
        if not use_gpu:
            num_gpus = 0
        elif num_gpus <= 0:
            raise ValueError("use_gpu=True but resources_per_worker asks for 'GPU': 0")
        return {"num_cpus": num_cpus, "num_gpus": num_gpus, "resources": res}


@dataclass
class CheckpointConfig:
    """Which persisted checkpoints to keep.

    ``num_to_keep=None`` keeps all of them. With ``checkpoint_score_attribute`` the best
    ``num_to_keep`` by that reported metric are kept (``checkpoint_score_order`` "max" or "min"),
    otherwise the most recent ones. The latest checkpoint is always kept, for resuming.
    """

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: str = "max"

    def __post_init__(self):
        if self.num_to_keep is not None and (not isinstance(self.num_to_keep, int) or self.num_to_keep < 1):
            raise ValueError(f"num_to_keep must be None or an integer >= 1, got {self.num_to_keep!r}")
        if self.checkpoint_score_order not in ("max", "min"):
            raise ValueError(f"checkpoint_score_order must be 'max' or 'min', got {self.checkpoint_score_order!r}")


CheckpointStrategy = CheckpointConfig   # Ray Train 1.x name


@dataclass
class FailureConfig:
    """``max_failures``: how many times a dead worker group is restarted (-1: without limit)."""

    max_failures: int = 0


@dataclass
class RunConfig:
    """Where results go: ``storage_path/name/`` (metrics history, checkpoints).

    ``callbacks``: objects with ``handle_result(results: list[dict])``, called in the driver with
    every worker's metrics for each round of ``report`` (Ray Train 1.x's TrainingCallback).
    """

    name: str | None = None
    storage_path: str | None = None
    checkpoint_config: CheckpointConfig | None = None
    failure_config: FailureConfig | None = None
    callbacks: list | None = None
    verbose: int = 1
    stop: Any = None


@dataclass
class TorchConfig:
    """The process group: ``backend`` None picks NCCL on GPU workers and gloo on CPU ones;
    ``timeout_s`` bounds every collective (torch's default is 30 minutes, as in Ray)."""

    backend: str | None = None
    init_method: str = "env"
    timeout_s: float = 1800

    def __post_init__(self):
        if self.backend not in (None, "gloo", "nccl"):
            raise ValueError(f"TorchConfig.backend must be None, 'gloo' or 'nccl', got {self.backend!r}")
        if self.init_method != "env":
            raise ValueError("TorchConfig.init_method: only 'env' (MASTER_ADDR/MASTER_PORT) is supported")


def torch_config_from(backend) -> TorchConfig:
    if backend in ("torch", None):
        return TorchConfig()
    if isinstance(backend, TorchConfig):
        return backend
    if backend in ("gloo", "nccl"):
        return TorchConfig(backend=backend)
    raise ValueError(f"backend={backend!r}: raylite.train supports backend='torch' (or a TorchConfig)")
