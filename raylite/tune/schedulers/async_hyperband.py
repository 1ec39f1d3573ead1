"""Ray's module path for ASHA: `ray.tune.schedulers.async_hyperband.ASHAScheduler`."""
from raylite.tune.schedulers import ASHAScheduler, AsyncHyperBandScheduler

__all__ = ["ASHAScheduler", "AsyncHyperBandScheduler"]
