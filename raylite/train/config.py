"""Configuration objects with Ray Train's names: ScalingConfig, RunConfig, CheckpointConfig,
FailureConfig, BackendConfig and TorchConfig; and the worker-group rules the plugins share with
Train (``check_num_workers``, ``check_placeable``), one rule per meaning."""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("raylite.train")

DEFAULT_STORAGE_ENV = "RAYLITE_RESULTS_DIR"
ACCELERATOR_TYPE_PREFIX = "accelerator_type:"
ACCELERATOR_TYPE_AMOUNT = 0.001


def default_storage_path() -> str:
    """``$RAYLITE_RESULTS_DIR``, else ``~/raylite_results``."""
    return os.path.expanduser(os.environ.get(DEFAULT_STORAGE_ENV) or "~/raylite_results")


def local_storage_path(path: str | os.PathLike) -> str:
    """``storage_path`` as a local path: a ``file://`` URI is its path (as in Ray); any other
    scheme (``s3://``, ``gs://``, ...) is a ValueError, as storage is local here (else it would
    become a ``./s3:/...`` directory)."""
    path = os.fspath(path)
    scheme, sep, rest = path.partition("://")
    if not sep:
        return path
    if scheme.lower() == "file":
        return rest
    raise ValueError(f"storage_path={path!r}: raylite stores results on the local filesystem only; pass a local "
                     f"directory or a file:// URI (for cloud storage, sync that directory yourself)")


def check_name(name, what: str = "RunConfig.name") -> None:
    """A run's or experiment's name is one directory under storage_path: no path separator, no ``..``
    (``name="../../x"`` would write outside storage_path)."""
    if name is None:
        return
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str (one directory name under storage_path), got {name!r}")
    if name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ValueError(f"{what}={name!r} must be one directory name under storage_path, without '/', '\\' "
                         f"or '..' (results would be written outside storage_path)")


@dataclass
class ScalingConfig:
    """How many workers and what each one holds.

    Fields may hold Tune search spaces (``ScalingConfig(num_workers=tune.grid_search([1, 2]))`` in a
    Tuner's param_space); such a config is checked once a trial has resolved them.

    Args:
        num_workers: training processes; 0 is Ray V2's local mode (``fit`` runs the training
            function in the calling process, see DataParallelTrainer).
        use_gpu: True (one GPU per worker, NCCL), False (CPU, gloo) or ``"auto"`` (GPUs when the
            runtime has enough usable ones, else CPU).
        resources_per_worker: Ray's keys, ``{"CPU": 2, "GPU": 1, "custom": 1}``; default one CPU
            (plus one GPU with ``use_gpu``).
        trainer_resources: accepted for compatibility: the driver itself coordinates here.
        placement_strategy: accepted for compatibility: every worker lands on this one node.
        accelerator_type: e.g. ``"A100"``: adds Ray's tiny ``accelerator_type:A100`` resource to each
            worker, so workers run only where that type is (an error at once where it is not).
    """

    num_workers: int = 1
    use_gpu: bool | str = False
    resources_per_worker: dict | None = None
    trainer_resources: dict | None = None
    placement_strategy: str = "PACK"
    accelerator_type: str | None = None

    def __post_init__(self):
        if any(_is_search_space(getattr(self, f)) for f in ("num_workers", "use_gpu", "resources_per_worker")):
            return
        check_num_workers(self.num_workers, "ScalingConfig", minimum=0, why=" (0: local mode)")
        if self.num_workers == 0:
            logger.info("Running in local mode. The training function will run in the same process.")
        if self.accelerator_type is not None and (not isinstance(self.accelerator_type, str)
                                                  or not self.accelerator_type):
            raise ValueError(f"accelerator_type must be a non-empty str such as 'A100', got {self.accelerator_type!r}")
        if self.use_gpu not in (True, False, "auto"):
            raise ValueError(f"use_gpu must be True, False or 'auto', got {self.use_gpu!r}")
        for field in ("resources_per_worker", "trainer_resources"):
            check_resources(getattr(self, field), f"ScalingConfig.{field}")
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(f"ScalingConfig.placement_strategy must be one of {', '.join(PLACEMENT_STRATEGIES)}, "
                             f"got {self.placement_strategy!r}")
        if self.resources_per_worker is not None:
            if self.resources_per_worker.get("GPU", 0) > 0 and self.use_gpu is False:
                raise ValueError("use_gpu is False but GPU was found in resources_per_worker. Either set "
                                 "use_gpu to True (or 'auto') or remove GPU from resources_per_worker.")

    def worker_request(self, use_gpu: bool) -> dict:
        """The per-worker actor options: num_cpus, num_gpus, resources."""
        res = dict(self.resources_per_worker or {})
        if self.accelerator_type:   # Ray's marker: a tiny amount of the node's accelerator_type:<T> resource
            res.setdefault(ACCELERATOR_TYPE_PREFIX + self.accelerator_type, ACCELERATOR_TYPE_AMOUNT)
        num_cpus = res.pop("CPU", 1)
        num_gpus = res.pop("GPU", 1 if use_gpu else 0)
        if not use_gpu:
            num_gpus = 0
        elif num_gpus <= 0:
            raise ValueError("use_gpu=True but resources_per_worker asks for 'GPU': 0")
        return {"num_cpus": num_cpus, "num_gpus": num_gpus, "resources": res}


def check_num_workers(num_workers, where: str, minimum: int = 1, why: str = "") -> None:
    """How many workers a group has: an integer (not a bool) of at least ``minimum``."""
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < minimum:
        raise ValueError(f"{where}(num_workers={num_workers!r}): num_workers must be an integer >= {minimum}{why}")


def check_placeable(who: str, num_workers: int, per_worker: dict, total: dict, cpu_field: str) -> None:
    """A group that could never be placed whole (more than the runtime has in total, not only free
    now) would wait forever: an error before any worker starts, saying what was asked and what exists.
    ``per_worker``: resource -> amount each worker holds; ``cpu_field``: the caller's argument for the
    CPUs of a worker, named with a share that fits."""
    short = [(name, each) for name, each in per_worker.items()
             if each and num_workers * each > total.get(name, 0) + 1e-9]
    if not short:
        return
    what = "; ".join(f"{num_workers} workers x {each:g} {name} = {num_workers * each:g} {name}, but the runtime has "
                     f"{total.get(name, 0):g} {name} in total" for name, each in short)
    hint = ""
    if any(name == "CPU" for name, _ in short):
        units = math.floor(round(total.get("CPU", 0) / num_workers / RESOURCE_GRID, 6))   # a share on the grid
        hint = f"{cpu_field}={units * RESOURCE_GRID:.4f}".rstrip("0").rstrip(".") + ", " if units > 0 else ""
    raise ValueError(f"{who}(num_workers={num_workers}) can never be placed: {what}. Pass fewer num_workers, "
                     f"less per worker ({hint}resources_per_worker=...), or ray.init(...) with more")


PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
RESOURCE_GRID = 1e-4   # raylite counts resources in units of 1e-4


def check_resources(resources, what: str) -> None:
    """A dict of resource name -> amount: finite numbers >= 0 on raylite's grid of 1e-4."""
    if resources is None:
        return
    if not isinstance(resources, dict):
        raise TypeError(f"{what} must be a dict such as {{'CPU': 1, 'GPU': 1}}, got {resources!r}")
    for key, value in resources.items():
        if not isinstance(key, str):
            raise TypeError(f"{what}: resource names must be strings, got {key!r}")
        if not _is_number(value) or not 0 <= value < math.inf:
            raise ValueError(f"{what}[{key!r}] must be a number >= 0, got {value!r}")
        scaled = value / RESOURCE_GRID
        if not math.isclose(scaled, round(scaled), rel_tol=1e-12, abs_tol=1e-9):
            raise ValueError(f"{what}[{key!r}]={value!r} is finer than raylite's resource precision of 0.0001: "
                             f"round it to 4 decimals (e.g. {math.floor(scaled) * RESOURCE_GRID:.4f})")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def _is_search_space(value) -> bool:
    """A raylite.tune search space (recognized without importing raylite.tune, which needs Optuna)."""
    return (isinstance(value, dict) and list(value) == ["grid_search"]) or \
        type(value).__module__ == "raylite.tune.search_space"


@dataclass
class CheckpointConfig:
    """Which persisted checkpoints to keep. The latest checkpoint is always kept, for resuming.

    Args:
        num_to_keep: how many to keep (None: all); the most recent ones, or the best by the score.
        checkpoint_score_attribute: a reported metric ranking checkpoints (``"a/b"`` reaches a nested one).
        checkpoint_score_order: ``"max"`` or ``"min"``: which end of the score is best.
        checkpoint_frequency: Ray's class-trainable option: an error here, as in Ray for function
            trainables and TorchTrainer (checkpoint in the loop).
        checkpoint_at_end: the same.
    """

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: str = "max"
    checkpoint_frequency: int = 0
    checkpoint_at_end: bool | None = None

    def check_function_trainable(self, what: str) -> None:
        """The error Ray gives when class-trainable options reach a function's checkpoints."""
        for name, value in (("checkpoint_frequency", self.checkpoint_frequency),
                            ("checkpoint_at_end", self.checkpoint_at_end)):
            if value:
                raise ValueError(f"CheckpointConfig({name}={value!r}) cannot be used with {what}: save a checkpoint "
                                 f"with report(..., checkpoint=...) in the loop instead (e.g. every N iterations)")

    def __post_init__(self):
        if self.num_to_keep is not None and (not isinstance(self.num_to_keep, int) or isinstance(self.num_to_keep, bool)
                                             or self.num_to_keep < 1):
            raise ValueError(f"num_to_keep must be None or an integer >= 1, got {self.num_to_keep!r}")
        if self.checkpoint_score_attribute is not None and not isinstance(self.checkpoint_score_attribute, str):
            raise TypeError(f"checkpoint_score_attribute must be a metric name (str) or None, "
                            f"got {self.checkpoint_score_attribute!r}")
        if self.checkpoint_score_order not in ("max", "min"):
            raise ValueError(f"checkpoint_score_order must be 'max' or 'min', got {self.checkpoint_score_order!r}")
        if not isinstance(self.checkpoint_frequency, int) or isinstance(self.checkpoint_frequency, bool) \
                or self.checkpoint_frequency < 0:
            raise ValueError(f"checkpoint_frequency must be an integer >= 0, got {self.checkpoint_frequency!r}")
        if self.checkpoint_at_end not in (None, True, False):
            raise ValueError(f"checkpoint_at_end must be True, False or None, got {self.checkpoint_at_end!r}")


CheckpointStrategy = CheckpointConfig   # Ray Train 1.x name


@dataclass
class FailureConfig:
    """What to do when a run fails.

    Args:
        max_failures: how many times a failed run (a worker's death, or an error in the training
            function) is restarted from its latest checkpoint (-1: without limit).
        fail_fast: (Tune only) True stops the experiment at the first trial error; ``"raise"`` also
            raises that error from ``Tuner.fit``. Needs ``max_failures=0``, as in Ray.
    """

    max_failures: int = 0
    fail_fast: bool | str = False

    def __post_init__(self):
        check_max_failures(self.max_failures, "FailureConfig.max_failures")
        check_fail_fast(self.fail_fast, self.max_failures)


def check_max_failures(max_failures, what: str) -> None:
    """Restarts after a failure: an integer (not a bool) >= -1, -1 meaning no limit (Train and Tune alike)."""
    if not isinstance(max_failures, int) or isinstance(max_failures, bool) or max_failures < -1:
        raise ValueError(f"{what} must be an integer >= -1 (-1: no limit), got {max_failures!r}")


def check_fail_fast(fail_fast: bool | str, max_failures: int) -> None:
    """Ray's rules: fail_fast is a bool or "raise", and only goes with max_failures=0."""
    if not isinstance(fail_fast, bool) and not (isinstance(fail_fast, str) and fail_fast.upper() == "RAISE"):
        raise ValueError(f"fail_fast must be True, False or 'raise', got {fail_fast!r}")
    if fail_fast and max_failures != 0:
        raise ValueError(f"max_failures must be 0 if fail_fast={fail_fast!r}, got max_failures={max_failures!r}")


@dataclass
class RunConfig:
    """Where results go: ``storage_path/name/`` (metrics history, checkpoints), and the run's hooks.

    Args:
        name: the run's directory under ``storage_path``; a rerun with the same name resumes it.
        storage_path: a local directory or ``file://`` URI (default ``$RAYLITE_RESULTS_DIR`` or
            ``~/raylite_results``).
        checkpoint_config: which checkpoints to keep (a ``CheckpointConfig``).
        failure_config: restarts after failures (a ``FailureConfig``).
        callbacks: objects with ``handle_result(results: list[dict])`` (Ray Train 1.x's
            TrainingCallback) and/or ``after_report(run_context, metrics: list[dict], checkpoint)``
            (2.x's UserCallback; run_context is None), called in the driver with every worker's
            metrics for each round of ``report``; ``after_exception(run_context, worker_exceptions)``
            when workers fail.
        verbose: how much progress to print (Tune's levels 0-3).
        stop: (Tune only) stop criteria, as ``tune.run``'s ``stop``.
    """

    name: str | None = None
    storage_path: str | None = None
    checkpoint_config: CheckpointConfig | None = None
    failure_config: FailureConfig | None = None
    callbacks: list | None = None
    verbose: int = 1
    stop: Any = None

    def __post_init__(self):
        check_name(self.name)
        if self.storage_path is not None:
            if not isinstance(self.storage_path, (str, os.PathLike)):
                raise TypeError(f"RunConfig.storage_path must be a directory path (str), got {self.storage_path!r}")
            self.storage_path = local_storage_path(self.storage_path)
        for field, cls in (("checkpoint_config", CheckpointConfig), ("failure_config", FailureConfig)):
            value = getattr(self, field)
            if value is not None and not isinstance(value, cls):
                raise TypeError(f"RunConfig.{field} must be a tune.{cls.__name__} (the same as train.{cls.__name__}), "
                                f"got {type(value).__name__} {value!r}")
        if self.callbacks is not None and not isinstance(self.callbacks, (list, tuple)):
            raise TypeError(f"RunConfig.callbacks must be a list of callbacks, got {self.callbacks!r}")
        if not isinstance(self.verbose, int) or self.verbose not in (0, 1, 2, 3):
            raise ValueError(f"RunConfig.verbose must be 0, 1, 2 or 3, got {self.verbose!r}")


@dataclass
class DataConfig:
    """Ray's `train.DataConfig`, accepted as a trainer's `dataset_config`. Every field is about
    Ray Data datasets (`datasets=`), which raylite does not have: they are checked and have no
    effect; data reaches workers through `train_loop_config` or is loaded in the loop.

    Args:
        datasets_to_split: "all" or a list of dataset names to shard across workers.
        execution_options: Ray Data's execution options (not used).
        enable_shard_locality: Ray Data's locality hint (not used).
    """

    datasets_to_split: str | list = "all"
    execution_options: object = None
    enable_shard_locality: bool = True

    def __post_init__(self):
        ok = self.datasets_to_split == "all" or (isinstance(self.datasets_to_split, (list, tuple))
                                                 and all(isinstance(n, str) for n in self.datasets_to_split))
        if not ok:
            raise TypeError(f"DataConfig(datasets_to_split={self.datasets_to_split!r}) must be 'all' or a list of "
                            f"dataset names")
        if not isinstance(self.enable_shard_locality, bool):
            raise TypeError(f"DataConfig(enable_shard_locality={self.enable_shard_locality!r}) must be a bool")


def check_dataset_config(value) -> None:
    """A trainer's `dataset_config`: a DataConfig (Ray 2), a dict of per-dataset configs (Ray 1.x), or None."""
    if value is not None and not isinstance(value, (DataConfig, dict)):
        raise TypeError(f"dataset_config must be a train.DataConfig, got {type(value).__name__}")


@dataclass
class BackendConfig:
    """Ray's framework-agnostic backend: the workers start with no process group (a
    ``DataParallelTrainer``'s default; ``TorchConfig`` adds torch.distributed)."""


@dataclass
class TorchConfig(BackendConfig):
    """The torch.distributed process group of the workers.

    Args:
        backend: ``"nccl"`` or ``"gloo"``; None picks NCCL on GPU workers and gloo on CPU ones.
        init_method: only ``"env"`` (Ray's default): ranks meet at ``MASTER_ADDR``/``MASTER_PORT``; on one
            machine, in a private file store.
        timeout_s: bound on every collective, in seconds (torch's default 30 minutes, as in Ray).
    """

    backend: str | None = None
    init_method: str = "env"
    timeout_s: float = 1800

    def __post_init__(self):
        if self.backend not in (None, "gloo", "nccl"):
            raise ValueError(f"TorchConfig.backend must be None, 'gloo' or 'nccl', got {self.backend!r}")
        if self.init_method != "env":
            raise ValueError("TorchConfig.init_method: only 'env' (MASTER_ADDR/MASTER_PORT) is supported")
        if not _is_number(self.timeout_s) or not 0 < self.timeout_s < math.inf:
            raise ValueError(f"TorchConfig.timeout_s must be a positive number of seconds, got {self.timeout_s!r}")


def backend_config_from(backend) -> BackendConfig:
    """Trainer's ``backend`` argument as a config: a TorchConfig unless a plain BackendConfig was given."""
    if backend in ("torch", None):
        return TorchConfig()
    if isinstance(backend, BackendConfig):
        return backend
    if backend in ("gloo", "nccl"):
        return TorchConfig(backend=backend)
    raise ValueError(f"backend={backend!r}: raylite.train supports backend='torch' (or a TorchConfig, or a "
                     f"BackendConfig for workers without a process group)")
