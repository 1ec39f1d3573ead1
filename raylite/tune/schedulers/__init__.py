"""Trial schedulers: Ray Tune's names on Optuna's pruners, fed every reported result.

Each result's metric goes to the trial's Optuna trial with `trial.report(value, step)` (step =
`result[time_attr]`), and `trial.should_prune()` decides. A pruned trial is stopped for real (it
ends at its next `tune.report`, or is cancelled if it does not report soon) and ends TERMINATED
with `early_stopped=True`, not ERROR.

- `FIFOScheduler`: never stops a trial early.
- `ASHAScheduler(time_attr, max_t, grace_period, reduction_factor)`: Optuna's
  SuccessiveHalvingPruner (asynchronous successive halving, rungs at grace_period * rf^k); a trial
  reaching `max_t` stops (completed).
- `MedianStoppingRule(time_attr, grace_period, min_samples_required)`: Ray's rule (best so far
  against the median of the other trials' running means), on its own records.
- `OptunaPruner(pruner, time_attr)`, or an Optuna pruner passed as `scheduler=`: any other pruner.
- `PopulationBasedTraining`, `PopulationBasedTrainingReplay` (pbt.py) and `HyperBandScheduler`
  (hyperband.py, synchronous brackets) stop trials to start them again from a checkpoint
  (EXPLOIT, PAUSE: restarts.py runs that).
"""
from __future__ import annotations

import bisect
import math
import statistics
import warnings

from optuna import pruners

from raylite.tune._validate import check_mode
from raylite.tune.metrics import is_finite as _finite

CONTINUE, STOP, PRUNE = "CONTINUE", "STOP", "PRUNE"
EXPLOIT = "EXPLOIT"   # stop the trial and start it again from `trial.restart` = (config, checkpoint path)
PAUSE = "PAUSE"       # stop the trial and hold it until `release` lets it go on (synchronous schedules)


class TrialScheduler:
    """What the runner asks of a scheduler: a decision per result (`on_result`), plus hooks for
    the ones that change trials (PBT) or hold them back (synchronous HyperBand, synch PBT)."""

    metric: str | None = None
    mode: str | None = None
    time_attr = "training_iteration"
    needs_metric = False
    mutates_config = False   # True: each result records the trial's config of the moment

    def make_pruner(self) -> pruners.BasePruner:
        return pruners.NopPruner()

    def on_trial_add(self, trial) -> None:
        """A new trial, before its first launch (it may still change `trial.config`)."""

    def on_result(self, trial, result: dict) -> str:
        return CONTINUE

    def on_trial_complete(self, trial) -> None:
        """The trial ended for good (finished, stopped or errored)."""

    def release(self, paused: list, trials: list, more_coming: bool) -> tuple[list, list]:
        """(those of the PAUSEd trials to start again now, each from `trial.restart` if set, else
        from its latest checkpoint; those to end, stopped early); `more_coming`: trials are still
        to be created."""
        return [], []

    def setup_experiment(self, path: str) -> None:
        """The experiment directory, before the first trial (for files the scheduler writes)."""

    def describe(self) -> str:
        return type(self).__name__


class FIFOScheduler(TrialScheduler):
    """Runs every trial to its end (or its `stop=` criterion)."""


class OptunaPruner(TrialScheduler):
    """Any Optuna pruner, fed `result[metric]` at step `result[time_attr]` on every report."""

    needs_metric = True

    def __init__(self, pruner: pruners.BasePruner, time_attr: str = "training_iteration",
                 metric: str | None = None, mode: str | None = None, max_t: float | None = None):
        if not isinstance(pruner, pruners.BasePruner):
            raise TypeError(f"expected an Optuna pruner, got {type(pruner).__name__}")
        check_mode(mode, type(self).__name__)
        self.pruner, self.time_attr, self.metric, self.mode, self.max_t = pruner, time_attr, metric, mode, max_t
        self.num_pruned = 0

    def make_pruner(self):
        return self.pruner

    def on_result(self, trial, result: dict) -> str:
        step, value = result.get(self.time_attr), result.get(self.metric)
        ot = trial.optuna_trial
        if ot is not None and _finite(step) and _finite(value):
            s = int(step)
            last = trial.optuna.setdefault("last_step", -1)
            if s > last and self.decides_at(trial, s):   # Optuna keeps the first value of a step
                trial.optuna["last_step"] = s
                with warnings.catch_warnings():   # a Repeater's repeats share one Optuna trial: the
                    warnings.filterwarnings("ignore", message=".*is already reported")   # first's value stands
                    ot.report(float(value), s)
                trial.optuna.setdefault("intermediate", {})[str(s)] = float(value)
                if ot.should_prune():
                    self.num_pruned += 1
                    return PRUNE
        if self.max_t is not None and _finite(step) and step >= self.max_t:
            return STOP
        return CONTINUE

    def decides_at(self, trial, step: int) -> bool:
        """Whether the pruner may decide at this step (it then gets the report); every step here."""
        return True

    def describe(self) -> str:
        return f"{type(self).__name__} ({type(self.pruner).__name__}): {self.num_pruned} stopped early"


class ASHAScheduler(OptunaPruner):
    """Asynchronous successive halving on Optuna's SuccessiveHalvingPruner.

    Rungs sit at `grace_period * reduction_factor**k` of `time_attr`; at each rung a trial goes on
    only if it is in the top 1/reduction_factor of the trials that reached it. `max_t` ends a trial.

    Args:
        time_attr: the result field that measures progress (`"training_iteration"`).
        metric: the metric judged (default: the experiment's).
        mode: `"min"` or `"max"` (default: the experiment's).
        max_t: the most `time_attr` a trial runs for.
        grace_period: the first rung: no trial stops before it.
        reduction_factor: the fraction (1/rf) of trials that go on at each rung.
        brackets: 1: Optuna's SuccessiveHalvingPruner; more: asynchronous HyperBand on Optuna's
            HyperbandPruner, which sets the number of brackets itself (from max_t, grace_period and
            reduction_factor).
        stop_last_trials: whether `max_t` ends trials (False: they run on).
    """

    def __init__(self, time_attr: str = "training_iteration", metric: str | None = None,
                 mode: str | None = None, max_t: int = 100, grace_period: int = 1, reduction_factor: int = 4,
                 brackets: int = 1, stop_last_trials: bool = True):
        if grace_period < 1 or max_t < grace_period:
            raise ValueError(f"need 1 <= grace_period <= max_t, got grace_period={grace_period}, max_t={max_t}")
        if reduction_factor < 2:
            raise ValueError(f"reduction_factor must be >= 2, got {reduction_factor}")
        if not isinstance(brackets, int) or brackets < 1:
            raise ValueError(f"ASHAScheduler(brackets={brackets!r}) must be an integer >= 1")
        if brackets == 1:
            pruner = pruners.SuccessiveHalvingPruner(min_resource=int(grace_period),
                                                     reduction_factor=int(reduction_factor), min_early_stopping_rate=0)
        else:   # asynchronous HyperBand: Optuna's HyperbandPruner runs the brackets (its own count of them)
            pruner = pruners.HyperbandPruner(min_resource=int(grace_period), max_resource=int(max_t),
                                             reduction_factor=int(reduction_factor))
        super().__init__(pruner, time_attr, metric, mode, max_t if stop_last_trials else None)
        self.grace_period, self.reduction_factor, self.brackets = grace_period, reduction_factor, brackets

    def decides_at(self, trial, step: int) -> bool:
        """Successive halving judges a trial only at the first report at or past each rung
        (grace_period * reduction_factor**k); the steps between never change its decision. So only
        those go to Optuna, whose per-report cost grows with the values it holds: a trial reporting
        every step for days costs the driver the same per report as in its first minute. (Several
        brackets have rungs of their own: every step goes to Optuna then.)"""
        if self.brackets != 1:
            return True
        rung = trial.optuna.get("next_rung", self.grace_period)
        if step < rung:
            return False
        while rung <= step:
            rung *= self.reduction_factor
        trial.optuna["next_rung"] = rung
        return True

    def describe(self) -> str:
        kind = "SuccessiveHalvingPruner" if self.brackets == 1 else "HyperbandPruner"
        return f"ASHA (Optuna {kind}, max_t={self.max_t}): {self.num_pruned} stopped early"


AsyncHyperBandScheduler = ASHAScheduler


class MedianStoppingRule(TrialScheduler):
    """Ray's median stopping rule: at time t (`result[time_attr]`, past `grace_period`), a trial
    stops when its best result so far is worse than the median of the other trials' running means
    (their results between `grace_period` and t), over the trials that reached t, once there are
    `min_samples_required` of them. Its own bookkeeping, not an Optuna pruner: Optuna's
    MedianPruner compares values at one step, Ray's rule best-so-far with running means.

    With `hard_stop=False` Ray pauses the trial and lets it finish later; raylite cannot pause a
    running task, so the trial is marked (`stopped_trials`) and runs on to its end, as it would
    in Ray once resumed. `min_time_slice` only matters with pausing (never here). Its records are
    the driver's: a resumed experiment starts them over.

    Args:
        time_attr: the result field that measures time (`"time_total_s"`).
        metric: the metric judged (default: the experiment's).
        mode: `"min"` or `"max"` (default: the experiment's).
        grace_period: no trial stops before this much `time_attr`.
        min_samples_required: the other trials needed at a time before one is stopped.
        min_time_slice: only matters with pausing (never here).
        hard_stop: True stops the trial; False marks it and lets it run on.
    """

    needs_metric = True

    def __init__(self, time_attr: str = "time_total_s", metric: str | None = None,
                 mode: str | None = None, grace_period: float = 60.0, min_samples_required: int = 3,
                 min_time_slice: float = 0, hard_stop: bool = True):
        check_mode(mode, type(self).__name__)
        self.time_attr, self.metric, self.mode = time_attr, metric, mode
        self.grace_period, self.min_samples_required = grace_period, min_samples_required
        self.min_time_slice, self.hard_stop = min_time_slice, hard_stop
        self.records: dict[str, _Record] = {}
        self.stopped_trials: set[str] = set()

    def on_result(self, trial, result: dict) -> str:
        t, value = result.get(self.time_attr), result.get(self.metric)
        if not _finite(t) or not _finite(value) or trial.trial_id in self.stopped_trials:
            return CONTINUE
        sign = 1.0 if self.mode == "max" else -1.0   # compared as "higher is better"
        mine = self.records.setdefault(trial.trial_id, _Record(self.grace_period))
        mine.add(t, sign * value)
        if t < self.grace_period:
            return CONTINUE
        means = [m for tid, r in self.records.items() if tid != trial.trial_id and r.last >= t
                 and (m := r.mean_until(t)) is not None]
        if len(means) < self.min_samples_required:
            return CONTINUE
        if mine.best < statistics.median(means):
            self.stopped_trials.add(trial.trial_id)
            return PRUNE if self.hard_stop else CONTINUE
        return CONTINUE

    def describe(self) -> str:
        return f"MedianStoppingRule: {len(self.stopped_trials)} stopped early"


class _Record:
    """One trial's results for the median rule: times, and prefix sums of the values reported at or
    past the grace period, so a running mean up to t is a bisect (each result costs O(trials log n))."""

    __slots__ = ("grace", "times", "sums", "best", "last")

    def __init__(self, grace: float):
        self.grace, self.times, self.sums, self.best, self.last = grace, [], [0.0], -math.inf, -math.inf

    def add(self, t: float, value: float) -> None:
        self.best, self.last = max(self.best, value), t
        if t >= self.grace:
            self.times.append(t)
            self.sums.append(self.sums[-1] + value)

    def mean_until(self, t: float) -> float | None:
        n = bisect.bisect_right(self.times, t)
        return self.sums[n] / n if n else None


def as_scheduler(scheduler) -> TrialScheduler:
    if scheduler is None:
        return FIFOScheduler()
    if isinstance(scheduler, TrialScheduler):
        return scheduler
    if isinstance(scheduler, pruners.BasePruner):
        return OptunaPruner(scheduler)
    raise TypeError(f"scheduler must be a tune scheduler or an Optuna pruner, got {type(scheduler).__name__}")



_LAZY = {"PopulationBasedTraining": "pbt", "PopulationBasedTrainingReplay": "pbt",
         "HyperBandScheduler": "hyperband"}


def __getattr__(name: str):
    """PBT and HyperBand load on first use; Ray's schedulers raylite lacks (PB2, BOHB) fail with a
    hint, under `from ... import` too."""
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f"raylite.tune.schedulers.{_LAZY[name]}"), name)
    from raylite.tune._missing import missing
    raise missing(__name__, name)
