"""Stopping trials and the experiment, for the runner (runner.py): `stop=` criteria and stoppers,
requests posted to the trials through the hub, the time budget, cancelling a trial that does not
stop at its next report within STOP_GRACE_S (SIGINT, then SIGKILL), and the experiment's end
(every task cancelled, every record written, its state saved)."""
from __future__ import annotations

import os
import time
import warnings

import raylite as ray
from raylite.tune.trial import Trial

STOP_GRACE_S = float(os.environ.get("RAYLITE_TUNE_STOP_GRACE_S", "2.0"))


def stop_criteria(r, trial: Trial, result: dict, flat: dict) -> bool:
    """A `stop=` dict reads the flattened result ("a/b" keys); a stopper the result as reported."""
    stop = r.stop
    if stop is None:
        return False
    if isinstance(stop, dict):
        for key, bound in stop.items():
            v = flat.get(key)
            if v is None and key not in r.warned_stop_keys:
                r.warned_stop_keys.add(key)   # as Ray: a warning, once; the trial runs to its end
                warnings.warn(f"stop criterion {key!r} is not in trial {trial.trial_id}'s result (keys: "
                              f"{sorted(flat)}); if it is never reported, trials run until they end",
                              stacklevel=2)
            if v is not None and v >= bound:
                return True
        return False
    if bool(stop(trial.trial_id, result)):
        return True
    stop_all = getattr(stop, "stop_all", None)
    if stop_all is not None and stop_all():
        stop_experiment(r, "the stopper's stop_all()")
    return False


def request_stop(r, trial: Trial, reason: str) -> None:
    if trial.stop_reason is None:
        trial.stop_reason = reason
        trial.stop_requested_at = time.monotonic()
        r.new_stops.append((trial.trial_id, trial.attempt))


def stop_experiment(r, why: str) -> None:
    if r.stopping:
        return
    r.stopping = why
    for trial in r.running.values():
        request_stop(r, trial, why)
    if r.queued is not None:   # withdrawn: cancelled while it waits, discarded if it never began
        trial, r.queued = r.queued, None
        ray.cancel(trial.ref)
        trial.withdrawn = True
        r._started(trial, callbacks=False)
        request_stop(r, trial, why)
    for trial in [t for t in r.pending if t.attempt == 0 and not t.restored and not t.num_failures]:
        r._discard(trial)   # asked for but never started: not a trial of this experiment after all
    if r.new_stops:
        r.hub.stop.remote(r.new_stops)
        r.new_stops = []


def enforce(r, now: float) -> None:
    if r.time_budget_s is not None and not r.stopping and now - r.started_at >= r.time_budget_s:
        stop_experiment(r, f"time_budget_s={r.time_budget_s:g}")
    stop_all = getattr(r.stop, "stop_all", None)   # also between results, as Ray checks it (TimeoutStopper)
    if stop_all is not None and not r.stopping and stop_all():
        stop_experiment(r, "the stopper's stop_all()")
    for ref, trial in r.running.items():
        if trial.stop_requested_at is None:
            continue
        waited = now - trial.stop_requested_at
        if trial.cancel_stage == 0 and waited >= STOP_GRACE_S:
            trial.cancel_stage = 1
            ray.cancel(ref)                # the trial did not report: interrupt it
        elif trial.cancel_stage == 1 and waited >= 3 * STOP_GRACE_S:
            trial.cancel_stage = 2
            ray.cancel(ref, force=True)    # nor did it stop: end its process


def cleanup(r, outcome: str) -> None:
    if r.queued is not None:
        try:
            ray.cancel(r.queued.ref, force=True)
        except Exception:  # noqa: BLE001
            pass
    for ref in list(r.running):
        try:
            ray.cancel(ref, force=True)
        except Exception:  # noqa: BLE001
            pass
    for trial in r.running.values():
        r.storage.save_trial(trial)
    r._write_results()
    r.storage.close()
    if r.hub is not None:
        try:
            ray.kill(r.hub)
        except Exception:  # noqa: BLE001
            pass
    mirror = getattr(r, "mirror", None)
    if mirror is not None:
        mirror.close(timeout=120.0 if outcome == "finished" else 10.0)
    if hasattr(r, "meta"):
        r.meta["status"] = outcome if outcome != "finished" or not r.stopping else \
            f"stopped: {r.stopping}"
        r.meta["end"] = time.time()
        r.storage.save_meta(r.meta)
    if outcome == "interrupted" and r.reporter.verbose and hasattr(r, "meta"):
        r.reporter._print(f"Experiment {r.name} interrupted; continue it with "
                             f"tune.run(..., name={r.name!r}, storage_path={r.storage.root!r}, resume=True)")
