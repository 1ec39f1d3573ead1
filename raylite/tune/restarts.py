"""Trials a scheduler stops and starts again (PBT's exploit, synchronous pauses), for the runner
(runner.py): a paused trial keeps its record open and goes on from a checkpoint, its own or one
copied from the trial it clones, with the config the scheduler gave it."""
from __future__ import annotations

import os
import time

from optuna.trial import TrialState

from raylite.tune import records, session
from raylite.tune.schedulers import EXPLOIT
from raylite.tune.trial import PAUSED, PENDING, TERMINATED, Trial


def restart_later(r, trial: Trial) -> None:
    """A trial the scheduler stopped to change (EXPLOIT: at once) or to hold (PAUSE: until it
    releases the paused ones together). Its record stays open: it goes on from a checkpoint."""
    trial.status = PAUSED
    if trial.stop_reason == EXPLOIT:
        requeue(r, trial)
    else:
        r.paused.append(trial)
        r.storage.save_trial(trial)
    release_paused(r)


def release_paused(r) -> None:
    if not r.paused:
        return
    go, end = r.scheduler.release(list(r.paused), r.trials, r._can_create())
    for trial in go:
        r.paused.remove(trial)
        requeue(r, trial)
    for trial in end:
        end_paused(r, trial, pruned=True)


def requeue(r, trial: Trial) -> None:
    """Queue the trial to start again first: from `trial.restart`'s checkpoint (copied into its
    directory, as its next one) with that config, else from its own latest checkpoint."""
    restart, trial.restart = trial.restart, None
    source = restart[1] if restart else trial.checkpoint_path
    if source and os.path.isdir(source) and os.path.dirname(source) != trial.path:
        found = session.trial_checkpoints(trial.path)
        name = session.checkpoint_dir_name(found[-1][0] + 1 if found else 0)
        meta = session.Checkpoint(source).metadata
        source = session.persist_checkpoint(session.Checkpoint(source), trial.path, name, meta).path
        trial.checkpoint_path = source
        trial.checkpoints.append((source, meta.get("result") or {}))
    if restart:
        trial.config = restart[0]
        r.storage.save_config(trial)
    trial.resume_from = source if source and os.path.isdir(source) else None
    trial.status = PENDING
    r.pending.appendleft(trial)
    r.storage.save_trial(trial)
    if trial.resume_from:
        r._fire("on_trial_restore", iteration=r.iteration, trials=r.trials, trial=trial)


def end_held(r) -> None:
    """The experiment stopped (time budget, a stopper) with trials a scheduler held or queued to
    start again: they end as they stood, TERMINATED."""
    for trial in [t for t in r.pending if t.resume_from is not None]:
        r.pending.remove(trial)
        r.paused.append(trial)
    for trial in list(r.paused):
        end_paused(r, trial)


def end_paused(r, trial: Trial, pruned: bool = False) -> None:
    """A paused trial that will not run again ends TERMINATED, as it stood (`pruned`: the
    scheduler stopped it early, as HyperBand does with a rung's losers)."""
    r.paused.remove(trial)
    trial.status, trial.end_time, trial.early_stopped = TERMINATED, time.time(), pruned
    records.tell(r, trial, TrialState.PRUNED if pruned else TrialState.COMPLETE)
    trial.compact()
    r.storage.save_trial(trial)
    r._fire("on_trial_complete", iteration=r.iteration, trials=r.trials, trial=trial)
    r.scheduler.on_trial_complete(trial)
