"""``ray_lightning.tune``: the resources of a Tune trial that fits with ``RayStrategy`` inside, and
the Tune callbacks (``TuneReportCallback``, ``TuneReportCheckpointCallback``; Lightning is imported
when one of them is first used).

    analysis = tune.run(train_fn, resources_per_trial=get_tune_resources(num_workers=2), ...)
"""
from __future__ import annotations

import importlib
import warnings

__all__ = ["TuneReportCallback", "TuneReportCheckpointCallback", "get_tune_resources"]  # noqa: F822 (__getattr__ serves the callbacks)


def get_tune_resources(num_workers: int = 1, num_cpus_per_worker: float = 1, use_gpu: bool = False,
                       cpus_per_worker: float | None = None):
    """ray_lightning's trial resources: a ``PlacementGroupFactory`` of one ``{"CPU": 1}`` bundle for
    the trial's own process and one per RayStrategy worker (``cpus_per_worker``: the old name).

    raylite.tune holds the sum of the bundles in the trial's task and lends its CPUs to the
    workers while the trial waits for them, so trials run at once only as far as all their workers
    fit (RayStrategy's workers are not reserved together: two trials half-placed would wait on each
    other forever). GPUs are not lent that way, so ``use_gpu=True`` is refused rather than left to
    hang: ask for the CPUs here and bound the trials by GPUs with ``max_concurrent_trials``."""
    if cpus_per_worker is not None:
        warnings.warn("`cpus_per_worker` will be deprecated in the future. Use `num_cpus_per_worker` instead.",
                      PendingDeprecationWarning, stacklevel=2)
        num_cpus_per_worker = cpus_per_worker
    from raylite.train.config import check_num_workers
    check_num_workers(num_workers, "get_tune_resources")
    if use_gpu:
        raise ValueError(
            "get_tune_resources(use_gpu=True): a raylite.tune trial keeps the GPUs it holds, so RayStrategy's GPU "
            "workers inside it could never get them. Use get_tune_resources(num_workers, num_cpus_per_worker) "
            "(CPUs only) with tune.run(..., max_concurrent_trials=<GPUs // num_workers>)")
    from raylite.tune import PlacementGroupFactory
    return PlacementGroupFactory([{"CPU": 1}] + [{"CPU": num_cpus_per_worker}] * num_workers, strategy="PACK")


def __getattr__(name: str):
    if name in ("TuneReportCallback", "TuneReportCheckpointCallback"):
        return getattr(importlib.import_module("raylite.plugins.callbacks"), name)
    raise AttributeError(f"module 'raylite.plugins.tune' has no attribute {name!r}")
