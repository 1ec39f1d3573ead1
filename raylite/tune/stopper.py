"""Stoppers with Ray Tune's names (`ray.tune.stopper`), for `tune.run(stop=...)` and `RunConfig(stop=...)`.

The runner calls a stopper in the driver with every result, `stopper(trial_id, result)` (True ends
that trial at this result), and asks `stopper.stop_all()` after each result and on each step of its
loop (True ends the experiment: running trials stop, no new ones start). Stoppers keep their state
in the driver, so one that looks across trials (ExperimentPlateauStopper) sees every trial's results.
"""
from __future__ import annotations

import datetime
import math
import statistics
import time
from collections import defaultdict, deque
from typing import Callable

from raylite.tune._validate import check_mode
from raylite.tune.metrics import is_number

__all__ = ["CombinedStopper", "ExperimentPlateauStopper", "FunctionStopper", "MaximumIterationStopper",
           "NoopStopper", "Stopper", "TimeoutStopper", "TrialPlateauStopper"]


class Stopper:
    """Base class: override `__call__(trial_id, result) -> bool` and `stop_all() -> bool`."""

    def __call__(self, trial_id: str, result: dict) -> bool:
        raise NotImplementedError

    def stop_all(self) -> bool:
        raise NotImplementedError


class NoopStopper(Stopper):
    """Stops nothing."""

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        return False


class FunctionStopper(Stopper):
    """A plain `(trial_id, result) -> bool` function as a Stopper."""

    def __init__(self, function: Callable[[str, dict], bool]):
        if not callable(function):
            raise TypeError(f"FunctionStopper(function=...) must be callable, got {type(function).__name__}")
        self._fn = function

    def __call__(self, trial_id: str, result: dict) -> bool:
        return bool(self._fn(trial_id, result))

    def stop_all(self) -> bool:
        return False


class CombinedStopper(Stopper):
    """Stops what any of `stoppers` stops. Every stopper sees every result (none is skipped once
    another said stop), so stateful ones stay consistent."""

    def __init__(self, *stoppers: Stopper):
        for s in stoppers:
            if not callable(s) or not callable(getattr(s, "stop_all", None)):
                raise TypeError(f"CombinedStopper takes Stopper objects, got {type(s).__name__}")
        self._stoppers = stoppers

    def __call__(self, trial_id: str, result: dict) -> bool:
        return any([s(trial_id, result) for s in self._stoppers])

    def stop_all(self) -> bool:
        return any([s.stop_all() for s in self._stoppers])


class MaximumIterationStopper(Stopper):
    """Stops each trial at its `max_iter`-th result."""

    def __init__(self, max_iter: int):
        if not isinstance(max_iter, int) or max_iter < 1:
            raise ValueError(f"MaximumIterationStopper(max_iter=...) must be an integer >= 1, got {max_iter!r}")
        self._max_iter = max_iter
        self._iter: dict[str, int] = defaultdict(int)

    def __call__(self, trial_id: str, result: dict) -> bool:
        self._iter[trial_id] += 1
        return self._iter[trial_id] >= self._max_iter

    def stop_all(self) -> bool:
        return False


class TrialPlateauStopper(Stopper):
    """Stops a trial once the (population) standard deviation of its last `num_results` values of
    `metric` is below `std`, after at least `grace_period` results; with `metric_threshold`, only
    once the latest value is past it (below for mode "min", above for "max")."""

    def __init__(self, metric: str, std: float = 0.01, num_results: int = 4, grace_period: int = 4,
                 metric_threshold: float | None = None, mode: str | None = None):
        if metric_threshold is not None:   # only a threshold needs a mode (Ray's rule)
            check_mode(mode, "TrialPlateauStopper", required=True, when=f" with metric_threshold={metric_threshold!r}")
        if not isinstance(num_results, int) or num_results < 1:
            raise ValueError(f"TrialPlateauStopper(num_results=...) must be an integer >= 1, got {num_results!r}")
        self._metric, self._mode, self._std = metric, mode, std
        self._num_results, self._grace_period, self._threshold = num_results, grace_period, metric_threshold
        self._iter: dict[str, int] = defaultdict(int)
        self._values: dict[str, deque] = defaultdict(lambda: deque(maxlen=self._num_results))

    def __call__(self, trial_id: str, result: dict) -> bool:
        value = result.get(self._metric)
        self._values[trial_id].append(value)
        self._iter[trial_id] += 1
        if self._iter[trial_id] < self._grace_period or len(self._values[trial_id]) < self._num_results:
            return False
        if self._threshold is not None and is_number(value):
            if (self._mode == "min" and value > self._threshold) or (self._mode == "max" and value < self._threshold):
                return False
        try:
            spread = statistics.pstdev(float(v) for v in self._values[trial_id])
        except (TypeError, ValueError):   # a missing or non-numeric value: no plateau
            spread = math.inf
        return spread < self._std

    def stop_all(self) -> bool:
        return False


class ExperimentPlateauStopper(Stopper):
    """Stops the experiment once the `top` best values of `metric` over all results have a standard
    deviation of at most `std`, for more than `patience` consecutive results."""

    def __init__(self, metric: str, std: float = 0.001, top: int = 10, mode: str = "min", patience: int = 0):
        check_mode(mode, "ExperimentPlateauStopper", required=True)
        if not isinstance(top, int) or top <= 1:
            raise ValueError(f"ExperimentPlateauStopper(top=...) must be an integer > 1, got {top!r}")
        if not isinstance(patience, int) or patience < 0:
            raise ValueError(f"ExperimentPlateauStopper(patience=...) must be an integer >= 0, got {patience!r}")
        if not isinstance(std, float) or std <= 0:
            raise ValueError(f"ExperimentPlateauStopper(std=...) must be a positive float, got {std!r}")
        self._metric, self._std, self._top, self._mode, self._patience = metric, std, top, mode, patience
        self._top_values: list[float] = []
        self._plateau_results = 0

    def __call__(self, trial_id: str, result: dict) -> bool:
        self._top_values = sorted(self._top_values + [result[self._metric]], reverse=self._mode == "max")[:self._top]
        self._plateau_results = self._plateau_results + 1 if self._has_plateaued() else 0
        return self.stop_all()

    def _has_plateaued(self) -> bool:
        return len(self._top_values) == self._top and statistics.pstdev(self._top_values) <= self._std

    def stop_all(self) -> bool:
        return self._has_plateaued() and self._plateau_results >= self._patience


class TimeoutStopper(Stopper):
    """Stops the experiment once `timeout` (seconds or a timedelta) has passed since its first
    `stop_all()` check, i.e. about since the experiment started."""

    def __init__(self, timeout: float | datetime.timedelta):
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool):
            raise ValueError(f"TimeoutStopper(timeout=...) must be a number of seconds or a timedelta, "
                             f"got {type(timeout).__name__}")
        self._timeout_s = float(timeout)
        self._started: float | None = None

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        now = time.monotonic()
        if self._started is None:
            self._started = now
        return now - self._started >= self._timeout_s

    def __getstate__(self):   # a restored experiment starts its own clock
        return {**self.__dict__, "_started": None}
