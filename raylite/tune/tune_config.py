"""Ray's import path for the Tuner's search settings: `from ray.tune.tune_config import TuneConfig`."""
from raylite.tune.tuner import TuneConfig

__all__ = ["TuneConfig"]
