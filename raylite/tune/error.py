"""Ray's import path for Tune's error: `from ray.tune.error import TuneError`."""
from raylite.tune.api import TuneError

__all__ = ["TuneError"]
