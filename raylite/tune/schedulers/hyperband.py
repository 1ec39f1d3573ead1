"""Ray's synchronous `HyperBandScheduler`.

Trials fill brackets in turn, s = s_max .. 0 (s_max + 1 = round(log(max_t) / log(eta)) + 1): bracket
s takes n = ceil((s_max + 1) / (s + 1) * eta**s) trials and first runs each to r = max_t / eta**s of
`time_attr`. Each trial stops (PAUSE) at the bracket's rung; once every trial of a full bracket (or
of the last one, when no more trials come) is there, the best 1/eta of them go on to a rung eta
times higher (up to `max_t`), the others end, stopped early. Pausing restarts a trial from its
latest checkpoint, so a function trainable must report one at each rung (a class trainable saves
them by itself); this is Ray's requirement too.

The asynchronous form is `ASHAScheduler` / `AsyncHyperBandScheduler` (Optuna's pruners): this one
is its own bookkeeping, as Optuna has no synchronous bracket schedule to build on.
"""
from __future__ import annotations

import math

from raylite.tune._validate import check_mode
from raylite.tune.metrics import is_finite
from raylite.tune.schedulers import CONTINUE, PAUSE, STOP, TrialScheduler


class _Bracket:
    __slots__ = ("size", "rung", "max_t", "eta", "live", "scores")

    def __init__(self, size: int, rung: float, max_t: float, eta: float):
        self.size, self.rung, self.max_t, self.eta = size, rung, max_t, eta
        self.live: list[str] = []          # trial ids still in the bracket
        self.scores: dict[str, float] = {}  # trial id -> its score at the current rung

    @property
    def full(self) -> bool:
        return len(self.live) >= self.size


class HyperBandScheduler(TrialScheduler):
    """Ray's HyperBand: `max_t` the most `time_attr` a trial gets, `reduction_factor` (eta) the
    fraction kept at each rung; `stop_last_trials=False` lets the last rung's trials run on."""

    needs_metric = True

    def __init__(self, time_attr: str = "training_iteration", metric: str | None = None, mode: str | None = None,
                 max_t: int = 81, reduction_factor: float = 3, stop_last_trials: bool = True):
        if not is_finite(max_t) or max_t < 1:
            raise ValueError(f"HyperBandScheduler(max_t={max_t!r}) must be >= 1")
        if not is_finite(reduction_factor) or reduction_factor <= 1:
            raise ValueError(f"HyperBandScheduler(reduction_factor={reduction_factor!r}) must be > 1")
        check_mode(mode, type(self).__name__)
        self.time_attr, self.metric, self.mode = time_attr, metric, mode
        self.max_t, self.eta, self.stop_last_trials = max_t, reduction_factor, stop_last_trials
        self.s_max_1 = int(round(math.log(max_t) / math.log(reduction_factor))) + 1
        self.brackets: list[_Bracket] = []
        self.of: dict[str, _Bracket] = {}
        self.stopped_early: set[str] = set()

    def _new_bracket(self) -> _Bracket:
        s = self.s_max_1 - 1 - len(self.brackets) % self.s_max_1
        size = int(math.ceil(self.s_max_1 / (s + 1) * self.eta ** s))
        rung = max(1, int(self.max_t * self.eta ** -s))
        return _Bracket(size, rung, self.max_t, self.eta)

    def rungs(self) -> list[float]:
        """Every rung any bracket can stop a trial at (where a class trainable checkpoints)."""
        levels = set()
        for s in range(self.s_max_1):
            r = max(1, int(self.max_t * self.eta ** -s))
            while r < self.max_t:
                levels.add(r)
                r = min(self.max_t, int(math.ceil(r * self.eta)))
        return sorted(levels)

    def checkpoint_points(self) -> dict:
        return {"time_attr": self.time_attr, "at": self.rungs()}

    def on_trial_add(self, trial) -> None:
        if not self.brackets or self.brackets[-1].full:
            self.brackets.append(self._new_bracket())
        bracket = self.brackets[-1]
        bracket.live.append(trial.trial_id)
        self.of[trial.trial_id] = bracket

    def on_result(self, trial, result: dict) -> str:
        bracket = self.of.get(trial.trial_id)
        t, value = result.get(self.time_attr), result.get(self.metric)
        if bracket is None or not is_finite(t):
            return CONTINUE
        if t >= self.max_t and self.stop_last_trials:
            return STOP
        if t < bracket.rung or bracket.rung >= self.max_t:
            return CONTINUE
        if not is_finite(value):
            bracket.scores[trial.trial_id] = -math.inf
        else:
            bracket.scores[trial.trial_id] = value if self.mode == "max" else -value
        return PAUSE

    def on_trial_complete(self, trial) -> None:
        bracket = self.of.get(trial.trial_id)
        if bracket is not None and trial.trial_id in bracket.live:
            bracket.live.remove(trial.trial_id)
            bracket.scores.pop(trial.trial_id, None)

    def release(self, paused: list, trials: list, more_coming: bool) -> tuple[list, list]:
        """Successive halving in every bracket whose trials are all at its rung: the top 1/eta go on."""
        go, end = [], []
        by_id = {t.trial_id: t for t in paused}
        for bracket in self.brackets:
            waiting = [tid for tid in bracket.live if tid in by_id]
            if not waiting or len(waiting) < len(bracket.live) or (not bracket.full and more_coming):
                continue
            ranked = sorted(waiting, key=lambda tid: bracket.scores.get(tid, -math.inf), reverse=True)
            keep = max(1, int(len(ranked) / self.eta))
            for tid in ranked[keep:]:
                bracket.live.remove(tid)
                self.stopped_early.add(tid)
                end.append(by_id[tid])
            go += [by_id[tid] for tid in ranked[:keep]]
            bracket.rung = min(self.max_t, int(math.ceil(bracket.rung * self.eta)))
            bracket.scores.clear()
        return go, end

    def describe(self) -> str:
        return f"HyperBandScheduler ({len(self.brackets)} brackets): {len(self.stopped_early)} stopped early"
