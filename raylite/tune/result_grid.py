"""Ray's import path for `Tuner.fit()`'s return type: `from ray.tune.result_grid import ResultGrid`."""
from raylite.tune.tuner import ResultGrid

__all__ = ["ResultGrid"]
