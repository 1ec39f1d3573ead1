"""Ray's import path for the Optuna searcher: `from ray.tune.search.optuna import OptunaSearch`."""
from raylite.tune.search import OptunaSearch

__all__ = ["OptunaSearch"]
