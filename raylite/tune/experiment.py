"""Ray's import path for the trial record that callbacks receive: `from ray.tune.experiment import Trial`."""
from raylite.tune.trial import Trial

__all__ = ["Trial"]
