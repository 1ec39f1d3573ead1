"""Trial schedulers: Ray Tune's names on Optuna's pruners, fed every reported result.

Each result's metric goes to the trial's Optuna trial with `trial.report(value, step)` (step =
`result[time_attr]`), and `trial.should_prune()` decides. A pruned trial is stopped for real (it
ends at its next `tune.report`, or is cancelled if it does not report soon) and ends TERMINATED
with `early_stopped=True`, not ERROR.

- `FIFOScheduler`: never stops a trial early.
- `ASHAScheduler(time_attr, max_t, grace_period, reduction_factor)`: Optuna's
  SuccessiveHalvingPruner (asynchronous successive halving, rungs at grace_period * rf^k); a trial
  reaching `max_t` stops (completed).
- `MedianStoppingRule(time_attr, grace_period, min_samples_required)`: Optuna's MedianPruner.
- `OptunaPruner(pruner, time_attr)`, or an Optuna pruner passed as `scheduler=`: any other pruner.
"""
from __future__ import annotations

import math
import warnings

from optuna import pruners

CONTINUE, STOP, PRUNE = "CONTINUE", "STOP", "PRUNE"


class TrialScheduler:
    metric: str | None = None
    mode: str | None = None
    time_attr = "training_iteration"
    needs_metric = False

    def make_pruner(self) -> pruners.BasePruner:
        return pruners.NopPruner()

    def on_result(self, trial, result: dict) -> str:
        return CONTINUE

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
        if mode not in (None, "min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
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
    """

    def __init__(self, time_attr: str = "training_iteration", metric: str | None = None,
                 mode: str | None = None, max_t: int = 100, grace_period: int = 1, reduction_factor: int = 4,
                 brackets: int = 1, stop_last_trials: bool = True):
        if grace_period < 1 or max_t < grace_period:
            raise ValueError(f"need 1 <= grace_period <= max_t, got grace_period={grace_period}, max_t={max_t}")
        if reduction_factor < 2:
            raise ValueError(f"reduction_factor must be >= 2, got {reduction_factor}")
        if brackets != 1:
            warnings.warn("ASHAScheduler: only brackets=1 is supported (Optuna's SuccessiveHalvingPruner); "
                          "for several brackets pass scheduler=optuna.pruners.HyperbandPruner(...)", stacklevel=2)
        super().__init__(pruners.SuccessiveHalvingPruner(min_resource=int(grace_period),
                                                         reduction_factor=int(reduction_factor),
                                                         min_early_stopping_rate=0),
                         time_attr, metric, mode, max_t if stop_last_trials else None)
        self.grace_period, self.reduction_factor = grace_period, reduction_factor

    def decides_at(self, trial, step: int) -> bool:
        """Successive halving judges a trial only at the first report at or past each rung
        (grace_period * reduction_factor**k); the steps between never change its decision. So only
        those go to Optuna, whose per-report cost grows with the values it holds: a trial reporting
        every step for days costs the driver the same per report as in its first minute."""
        rung = trial.optuna.get("next_rung", self.grace_period)
        if step < rung:
            return False
        while rung <= step:
            rung *= self.reduction_factor
        trial.optuna["next_rung"] = rung
        return True

    def describe(self) -> str:
        return f"ASHA (Optuna SuccessiveHalvingPruner, max_t={self.max_t}): {self.num_pruned} stopped early"


AsyncHyperBandScheduler = ASHAScheduler


class MedianStoppingRule(OptunaPruner):
    """Stops a trial whose best result so far is worse than the median of the completed trials'
    results at the same step (Optuna's MedianPruner), after `grace_period` steps of `time_attr`
    and once `min_samples_required` trials completed.

    Unlike Ray, `time_attr` defaults to `training_iteration`: Optuna compares trials at equal steps,
    which wall-clock seconds rarely are.
    """

    def __init__(self, time_attr: str = "training_iteration", metric: str | None = None,
                 mode: str | None = None, grace_period: float = 1, min_samples_required: int = 3,
                 min_time_slice: float = 0, hard_stop: bool = True):
        super().__init__(pruners.MedianPruner(n_startup_trials=int(min_samples_required),
                                              n_warmup_steps=int(grace_period), interval_steps=1),
                         time_attr, metric, mode)

    def describe(self) -> str:
        return f"MedianStoppingRule (Optuna MedianPruner): {self.num_pruned} stopped early"


def as_scheduler(scheduler) -> TrialScheduler:
    if scheduler is None:
        return FIFOScheduler()
    if isinstance(scheduler, TrialScheduler):
        return scheduler
    if isinstance(scheduler, pruners.BasePruner):
        return OptunaPruner(scheduler)
    raise TypeError(f"scheduler must be a tune scheduler or an Optuna pruner, got {type(scheduler).__name__}")


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
