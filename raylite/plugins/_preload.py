"""Which Lightning flavour, and starting raylite with it preloaded. Imports no Lightning itself, so
``init_with_preload`` can run before the driver imports torch or Lightning (then the zygote imports
them while the driver does) as well as after (then the zygote is the driver's fork)."""
from __future__ import annotations

import importlib.util
import os
import sys

FLAVOURS = ("pytorch_lightning", "lightning.pytorch")
ENV = "RAYLITE_LIGHTNING"
PRELOAD_ENV = "RAYLITE_PRELOAD"


def candidates() -> list[str]:
    """Lightning flavours to try, in order (see raylite.plugins._compat)."""
    chosen = os.environ.get(ENV)
    if chosen:
        if chosen not in FLAVOURS:
            raise ImportError(f"{ENV}={chosen!r}: expected one of {', '.join(FLAVOURS)}")
        return [chosen]
    if "lightning.pytorch" in sys.modules and "pytorch_lightning" not in sys.modules:
        return ["lightning.pytorch", "pytorch_lightning"]
    return list(FLAVOURS)


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):   # a missing parent package
        return False


def preload_modules() -> list[str]:
    """What RayStrategy's workers import: torch and the Lightning flavour that will be used."""
    flavour = next((n for n in candidates() if _installed(n)), None)
    return ["torch"] + ([flavour] if flavour else [])


def init_with_preload(**init_kwargs):
    """``ray.init(**init_kwargs)`` whose zygote has torch and Lightning loaded (``RAYLITE_PRELOAD``),
    so worker actors start with them instead of each importing them for seconds.

    Called after the driver imported them (the usual order), the zygote is the driver's fork and
    has them at once (``RAYLITE_ZYGOTE_FORK=0``, or a driver that is unsafe to fork, e.g. one
    running threads or with CUDA initialised: it imports them itself, in the background). Called
    before, the zygote's import overlaps the driver's. The variable is set only for this ``init``.
    """
    import raylite as ray
    prev = os.environ.get(PRELOAD_ENV)
    names = [n.strip() for n in (prev or "").split(",") if n.strip()]
    names += [m for m in preload_modules() if m not in names]
    os.environ[PRELOAD_ENV] = ",".join(names)
    try:
        return ray.init(**init_kwargs)
    finally:
        if prev is None:
            os.environ.pop(PRELOAD_ENV, None)
        else:
            os.environ[PRELOAD_ENV] = prev
