"""A running experiment as the `raylite` CLI and the dashboard show it (published with
raylite.control.register_panel): trials with their status and metric, counts by status, and the
best value of the metric so far over time, sampled every SAMPLE_S by a daemon thread (a
comparison per trial), whenever someone looks, and once at the end.

The view is built in the control endpoint's thread from the runner's own objects, reading only:
it copies the list of trials and each trial's latest result, which the runner replaces whole.
"""
from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator

from raylite import control
from raylite.tune.metrics import lookup

TRIALS_SHOWN = 200
HISTORY_POINTS = 500
SAMPLE_S = 1.0


class ExperimentPanel:
    def __init__(self, runner):
        self.runner = runner
        self.history: list[list[float]] = []   # [elapsed s, best so far]
        self.started = time.monotonic()
        self._lock = threading.Lock()   # the sampler's thread and the endpoint's

    def _best(self, trials: list) -> tuple[float, str] | None:
        metric, mode = self.runner.metric, self.runner.mode
        if not metric or mode not in ("min", "max"):
            return None
        found = None
        for t in trials:
            summary = t.metric_summary(metric)   # (max, min, last, ...) of every result it reported
            if summary is None:
                continue
            value = summary[0] if mode == "max" else summary[1]
            if math.isfinite(value) and (found is None or (value > found[0] if mode == "max" else value < found[0])):
                found = (value, t.trial_id)
        return found

    def sample(self, trials: list) -> tuple[float, str] | None:
        """The best so far, added to the history when it changed."""
        best = self._best(trials)
        with self._lock:
            if best is not None and (not self.history or self.history[-1][1] != best[0]):
                self.history.append([time.monotonic() - self.started, best[0]])
                del self.history[:-HISTORY_POINTS]
        return best

    def __call__(self) -> dict:
        runner = self.runner
        trials = list(runner.trials)
        elapsed = time.monotonic() - self.started
        best = self.sample(trials)
        states: dict[str, int] = {}
        for t in trials:
            states[t.status] = states.get(t.status, 0) + 1
        shown = sorted(trials, key=lambda t: t.status != "RUNNING")[:TRIALS_SHOWN]
        return {"name": runner.name, "metric": runner.metric, "mode": runner.mode, "elapsed_s": elapsed,
                "trial_states": states, "total_trials": runner.total_trials,
                "best": None if best is None else {"value": best[0], "trial_id": best[1]},
                "best_history": self._history(),
                "trials": [_trial_row(t, runner.metric) for t in shown]}


    def _history(self) -> list:
        with self._lock:
            return list(self.history)


def _trial_row(t, metric: str | None) -> dict:
    last = t.last_result or {}
    value = lookup(last, metric) if metric else None
    return {"trial_id": t.trial_id, "status": t.status, "config": _plain(t.config),
            "metric": value if isinstance(value, (int, float)) else None,
            "iteration": last.get("training_iteration"), "error": (t.error_msg or "")[:200] or None}


def _plain(config: dict) -> dict:
    """The config with values JSON can show (a search-space object or a function: its repr)."""
    return {str(k): (_plain(v) if isinstance(v, dict) else
                     v if isinstance(v, (int, float, str, bool, type(None))) else repr(v))
            for k, v in (config or {}).items()}


@contextlib.contextmanager
def published(runner) -> Iterator[None]:
    """Show ``runner``'s experiment while it runs (and its last view after)."""
    panel = ExperimentPanel(runner)
    handle = control.register_panel("tune", panel)
    done = threading.Event()

    def sample_every():
        while not done.wait(SAMPLE_S):
            try:
                panel.sample(list(runner.trials))
            except Exception:   # noqa: BLE001 - a trial changing under it: the next sample will do
                pass
    sampler = threading.Thread(target=sample_every, name="raylite-tune-panel", daemon=True)
    sampler.start()
    try:
        yield
    finally:
        done.set()
        sampler.join(5)
        control.unregister_panel(handle)
