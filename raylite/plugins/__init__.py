"""raylite.plugins: PyTorch Lightning 2.x on raylite.

* ``RayStrategy(num_workers=1, num_cpus_per_worker=1, use_gpu=False, resources_per_worker=None,
  init_hook=None, **ddp_kwargs)``: ``pl.Trainer(strategy=RayStrategy(num_workers=4))`` trains with
  DDP in raylite worker actors and hands the results back to the driver's trainer and module.
* ``RayShardedStrategy(...)``: the same with torch FSDP.
* ``RayEnvironment()``: ``pl.Trainer(strategy="ddp", plugins=[RayEnvironment()])`` inside a
  ``raylite.train.Trainer`` worker: joins the workers raylite started instead of spawning.
* ``TuneReportCallback`` / ``TuneReportCheckpointCallback``: Lightning metrics to ``tune.report``;
  ``raylite.plugins.tune`` (ray_lightning.tune) has them too, with ``get_tune_resources``.
* ``RayPlugin`` / ``RayShardedPlugin``: ray_lightning's names for the two strategies. Lightning 2.x
  takes strategies only as ``strategy=``: ``plugins=[RayPlugin(...)]`` becomes ``strategy=RayPlugin(...)``.
* ``release_workers()``: stop the worker groups kept warm between fits.
* ``init_with_preload(**init_kwargs)``: ``ray.init`` whose worker processes start with torch and
  Lightning already imported (raylite's ``RAYLITE_PRELOAD``; after the driver's own imports its
  zygote is the driver's fork); RayStrategy uses it when it has to start the runtime itself.

Horovod's ``HorovodRayPlugin`` is not provided: Lightning 2.0 removed Horovod support.

Importing this package is cheap; Lightning (``pytorch_lightning``, else ``lightning.pytorch``) is
imported when one of the names above is first used.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "RayStrategy": "strategy", "RayPlugin": "strategy",
    "RayShardedStrategy": "strategy", "RayShardedPlugin": "strategy",
    "RayEnvironment": "environment",
    "TuneReportCallback": "callbacks", "TuneReportCheckpointCallback": "callbacks",
    "RayLauncher": "launcher", "release_workers": "launcher", "init_with_preload": "_preload",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'raylite.plugins' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"raylite.plugins.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
