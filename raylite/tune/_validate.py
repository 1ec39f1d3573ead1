"""Checks of `tune.run`'s arguments that the experiment loop would otherwise trip over only once
trials run (a `stop=` bound compared with a result, `verbose` with a level, a resource share the
scheduler counts in units of 1e-4): each is an error naming the field and its value, raised before
any trial starts. Shared with the Tuner's configs, each rule written once: `check_mode` is the one
"min or max" rule of every scheduler, searcher, stopper and result view."""
from __future__ import annotations

import datetime
import math
import numbers

from raylite.tune.metrics import is_number
from raylite.tune.progress import UNITS

VERBOSITY = (0, 1, 2, 3)
MODES = ("min", "max")


def _not_nan(value) -> bool:
    """A metric-like number (metrics.is_number) that is not NaN."""
    return is_number(value) and not math.isnan(value)


def check_mode(mode, where: str, field: str = "mode", *, required: bool = False, when: str = "") -> None:
    """Tune's one rule for a "min or max" argument, in one message shape naming the caller, the
    field and its value: ``HyperBandScheduler(mode='mn'): mode must be 'min' or 'max'``. None
    passes unless ``required`` (the experiment's mode applies then); ``when`` says what requires it."""
    if mode is None and not required:
        return
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"{where}({field}={mode!r}): {field} must be 'min' or 'max'{when}")


def check_num_samples(num_samples, what: str = "num_samples") -> None:
    if not isinstance(num_samples, int) or isinstance(num_samples, bool) or (num_samples < 1 and num_samples != -1):
        raise ValueError(f"{what} must be a positive integer (or -1: until stopped), got {num_samples!r}")


def check_trial_namers(prefix: str = "", **namers) -> None:
    """``trial_name_creator`` / ``trial_dirname_creator``: None or a function trial -> str."""
    for name, fn in namers.items():
        if fn is not None and not callable(fn):
            raise TypeError(f"{prefix}{name} must be a function trial -> str, got {type(fn).__name__}")


def check_stop(stop) -> None:
    """A `stop=` dict maps result keys to numeric bounds (a trial stops once `result[key] >= bound`)."""
    if not isinstance(stop, dict):
        return
    for key, bound in stop.items():
        if not isinstance(key, str):
            raise TypeError(f"stop: its keys are result names (str), got {key!r}")
        if not isinstance(bound, numbers.Real):
            raise TypeError(f"stop[{key!r}] must be a number (a trial stops once its result reaches it), "
                            f"got {bound!r}")
        if math.isnan(bound):
            raise ValueError(f"stop[{key!r}] is NaN, which no result ever reaches")


def check_verbose(verbose) -> None:
    if not isinstance(verbose, int) or verbose not in VERBOSITY:   # a bool counts, as in Ray (True: 1)
        raise ValueError(f"verbose must be 0 (silent), 1 (status table), 2 (also each finished trial) or "
                         f"3 (also each result), got {verbose!r}")


def time_budget(time_budget_s, what: str = "time_budget_s") -> float | None:
    """The budget in seconds: a positive number or a `datetime.timedelta` (None: no budget)."""
    if time_budget_s is None:
        return None
    if isinstance(time_budget_s, datetime.timedelta):
        seconds = time_budget_s.total_seconds()
    elif _not_nan(time_budget_s):
        seconds = float(time_budget_s)
    else:
        raise TypeError(f"{what} must be a number of seconds or a datetime.timedelta, got {time_budget_s!r}")
    if not seconds > 0:
        raise ValueError(f"{what} must be positive (None: no budget), got {time_budget_s!r}")
    return seconds


def check_resource_grid(resources, what: str = "resources_per_trial") -> None:
    """Every share on raylite's grid of 1e-4: a finer one would count as nothing (or a remainder).
    A PlacementGroupFactory counts as the sum of its bundles."""
    if hasattr(resources, "required_resources"):
        resources, what = dict(resources.required_resources), f"{what} (the PlacementGroupFactory's bundles)"
    if not isinstance(resources, dict):
        return
    items = [(k, v) for k, v in resources.items() if k != "custom_resources"]
    if isinstance(resources.get("custom_resources"), dict):
        items += list(resources["custom_resources"].items())
    for key, value in items:
        if not _not_nan(value) or value <= 0 or math.isinf(value):
            continue
        scaled = value * UNITS
        if math.isclose(scaled, round(scaled), rel_tol=1e-12, abs_tol=1e-9):
            continue
        hint = (f"ask for 0 or at least {1 / UNITS:g}" if scaled < 1
                else f"round it to 4 decimals, e.g. {math.floor(scaled) / UNITS:g}")
        raise ValueError(f"{what}[{key!r}]={value!r} is finer than raylite's resource precision of "
                         f"{1 / UNITS:g}: {hint}")
