"""Ray's import path for the default searcher: `from ray.tune.search.basic_variant import BasicVariantGenerator`."""
from raylite.tune.search import BasicVariantGenerator

__all__ = ["BasicVariantGenerator"]
