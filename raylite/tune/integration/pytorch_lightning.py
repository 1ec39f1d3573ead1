"""Ray 2.x's `ray.tune.integration.pytorch_lightning` path for the Lightning callbacks of raylite.plugins.

    from raylite.tune.integration.pytorch_lightning import TuneReportCheckpointCallback

    trainer = pl.Trainer(callbacks=[TuneReportCheckpointCallback({"loss": "val_loss"}, on="validation_end")])

Loaded on first use, so importing this module does not import Lightning.
"""
from __future__ import annotations

__all__ = ["TuneReportCallback", "TuneReportCheckpointCallback"]  # noqa: F822 (served by __getattr__)


def __getattr__(name: str):
    if name in __all__:
        from raylite.plugins import callbacks
        return getattr(callbacks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
