"""The error for a Ray Tune name raylite.tune lacks, with a hint of what to use instead.

Under `from m import X`, Python replaces an AttributeError from the module's `__getattr__` with a
bare "cannot import name", losing the hint; there this gives an ImportError (which Python lets
through), elsewhere an AttributeError, so `hasattr(tune, "Trainable")` still answers False."""
from __future__ import annotations

import dis
import sys

_IMPORT_FROM = dis.opmap["IMPORT_FROM"]

HINTS = {   # Ray names a user meets in its docs, and what to do instead
    "PB2": "PB2 (PBT with a Gaussian-process bandit) is not supported; use "
           "tune.schedulers.PopulationBasedTraining",
    "HyperBandForBOHB": "BOHB needs its TuneBOHB searcher, which raylite lacks; use "
                        "tune.schedulers.HyperBandScheduler, or OptunaSearch with "
                        "scheduler=optuna.pruners.HyperbandPruner(...)",
    "ResourceChangingScheduler": "a trial's resources are fixed for the whole experiment",
    "SyncConfig": "results are on the local filesystem; nothing to sync",
}


def missing(module: str, name: str) -> Exception:
    """The exception a module's `__getattr__(name)` raises for a name it lacks (call it from there)."""
    why = HINTS.get(name)
    message = f"module {module!r} has no attribute {name!r}" + (f": {why}" if why else "")
    caller = sys._getframe(2)   # the code that asked: missing <- __getattr__ <- caller
    if why and caller.f_code.co_code[caller.f_lasti] == _IMPORT_FROM:
        return ImportError(f"cannot import name {name!r} from {module!r}: raylite.tune does not support it: {why}",
                           name=module)
    return AttributeError(message)
