"""raylite's public API on its Ray backend, as a module ``bench/core.py`` can drive: ``init``
starts a local Ray instance (or joins ``RAY_ADDRESS``) instead of raylite's local runtime."""
import raylite
from raylite import *  # noqa: F401,F403 - the same names as raylite


def init(*args, **kwargs):
    return raylite.init(*args, backend="ray", **kwargs)
