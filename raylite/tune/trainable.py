"""Ray Tune's class API, `tune.Trainable`, and the loop that runs one inside a trial's task.

    class MyTrainable(tune.Trainable):
        def setup(self, config):              # once per trial (and per new config without reset_config)
            self.lr, self.w = config["lr"], 0.0
        def step(self):                       # one iteration: returns its result
            self.w += self.lr
            return {"loss": (1 - self.w) ** 2}
        def save_checkpoint(self, checkpoint_dir):
            return {"w": self.w}              # or write files into checkpoint_dir and return None
        def load_checkpoint(self, checkpoint):
            self.w = checkpoint["w"]          # the dict save_checkpoint returned, else the directory

A trial is still one raylite task (runner.py): the task builds the object and calls `step()` until
something stops the trial, reporting each result through `tune.report`, so stopping, pruning,
`max_failures` and resume work exactly as for function trainables. Checkpoints are taken where Ray
takes them: every `checkpoint_frequency` iterations, at the end (`checkpoint_at_end`, at a stop the
trial itself can see: `done`, a `stop=` bound or `max_t`), when a result says `should_checkpoint`,
and at each of PBT's perturbation points.

`reuse_actors=True`: Ray reuses a trial's actor for the next config when `reset_config` returns
True. raylite's trials run on reused worker processes, so the object itself is kept in the worker
when its trial ends and the next trial of the same class there calls `reset_config(new_config)`
on it instead of building a new one (`setup` is skipped); a False answer builds a new one.
"""
from __future__ import annotations

import atexit
import copy
import os
import pickle
import shutil
import tempfile
import time

from raylite.tune.metrics import is_number, lookup

_STATE_FILE = ".trainable_state.pkl"   # what save_checkpoint returned, when it was a dict


class Trainable:
    """Subclass it and override `setup`, `step`, and for checkpoints `save_checkpoint` and
    `load_checkpoint`; `reset_config` (return True) lets PBT and `reuse_actors` change the config
    in place; `cleanup` runs when the object is dropped. It also runs on its own:
    `t = MyTrainable({"lr": 0.1}); t.train(); path = t.save(); t.restore(path)`."""

    def __init__(self, config: dict | None = None, logger_creator=None, storage=None, **setup_kwargs):
        self.config = dict(config or {})
        self._iteration, self._time_total = 0, 0.0
        self._info: dict = {}
        self.setup(copy.deepcopy(self.config), **setup_kwargs)

    # ------------------------------------------------------------------ what a subclass overrides
    def setup(self, config: dict) -> None:
        """Build the model and state for `config` (once, before the first `step`)."""

    def step(self) -> dict:
        """One iteration; returns its metrics (`{"done": True}` ends the trial)."""
        raise NotImplementedError(f"{type(self).__name__} must implement step() returning a dict of metrics")

    def save_checkpoint(self, checkpoint_dir: str) -> dict | None:
        """Write the state into `checkpoint_dir` (return None), or return it as a dict."""
        raise NotImplementedError(f"{type(self).__name__} was asked for a checkpoint (checkpoint_frequency, "
                                  f"checkpoint_at_end or PBT) but does not implement save_checkpoint(checkpoint_dir)")

    def load_checkpoint(self, checkpoint: dict | str) -> None:
        """Restore the state: the dict `save_checkpoint` returned, else its directory."""
        raise NotImplementedError(f"{type(self).__name__} must implement load_checkpoint(checkpoint) to restart "
                                  f"from a checkpoint")

    def reset_config(self, new_config: dict) -> bool:
        """Take `new_config` in place (PBT's explore, `reuse_actors`); True if it did."""
        return False

    def cleanup(self) -> None:
        """Release what `setup` took; called once when the object is dropped."""

    @classmethod
    def default_resource_request(cls, config: dict):
        """The resources a trial of this class holds for `config` (a dict or PlacementGroupFactory),
        or None for tune.run's `resources_per_trial`."""
        return None

    # ------------------------------------------------------------------ Ray's public surface
    @property
    def iteration(self) -> int:
        return self._iteration

    training_iteration = iteration

    @property
    def trial_id(self) -> str:
        return self._info.get("trial_id", "default")

    @property
    def trial_name(self) -> str:
        return self._info.get("trial_name", "default")

    @property
    def logdir(self) -> str:
        return self._info.get("trial_dir") or os.getcwd()

    @property
    def trial_resources(self) -> dict:
        return dict(self._info.get("resources", {}))

    def train(self) -> dict:
        """One `step()`, with Ray's counters added (what a trial reports)."""
        start = time.time()
        result = self.step()
        if not isinstance(result, dict):
            raise TypeError(f"{type(self).__name__}.step() must return a dict of metrics, got {type(result).__name__}")
        self._iteration += 1
        self._time_total += time.time() - start
        return {**result, "training_iteration": self._iteration}

    def save(self, checkpoint_dir: str | None = None) -> str:
        """A checkpoint directory of the current state (a new temporary one unless given)."""
        path = checkpoint_dir or tempfile.mkdtemp(prefix="raylite-trainable-")
        os.makedirs(path, exist_ok=True)
        state = self.save_checkpoint(path)
        if state is not None:
            if not isinstance(state, dict):
                raise TypeError(f"{type(self).__name__}.save_checkpoint() must return a dict or None, "
                                f"got {type(state).__name__}")
            import cloudpickle
            with open(os.path.join(path, _STATE_FILE), "wb") as f:
                cloudpickle.dump(state, f)
        return path

    def restore(self, checkpoint_dir) -> None:
        """Load a checkpoint `save` made (or a tune.Checkpoint / its path)."""
        path = os.fspath(getattr(checkpoint_dir, "path", None) or checkpoint_dir)
        state_file = os.path.join(path, _STATE_FILE)
        if os.path.exists(state_file):
            with open(state_file, "rb") as f:
                self.load_checkpoint(pickle.load(f))
        else:
            self.load_checkpoint(path)

    def stop(self) -> None:
        """Ray's end of an actor's life: `cleanup()`."""
        self.cleanup()


def is_trainable_class(obj) -> bool:
    return isinstance(obj, type) and issubclass(obj, Trainable)


# ---------------------------------------------------------------------------- the trial side
_kept: dict = {}   # reuse_actors: {"key": (class name, experiment dir), "obj": the Trainable}


def _drop_kept() -> None:
    obj = _kept.pop("obj", None)
    _kept.clear()
    if obj is not None:
        obj.cleanup()


atexit.register(_drop_kept)


def _build(cls, config: dict, info: dict, setup_kwargs: dict) -> Trainable:
    key = (f"{cls.__module__}.{cls.__qualname__}", os.path.dirname(info["trial_dir"]))
    if _kept:
        obj, same = _kept["obj"], _kept["key"] == key
        _kept.clear()
        if same and info.get("reuse_actors") and obj.reset_config(copy.deepcopy(config)):
            obj.config, obj._iteration, obj._time_total = dict(config), 0, 0.0
            return obj
        obj.cleanup()
    return cls(config, **setup_kwargs)


def run_class(cls, config: dict, info: dict, *, checkpoint, report, stop_error, setup_kwargs: dict) -> None:
    """The task body for a class trainable: build (or reuse) the object, restore ``checkpoint`` (the
    trial's, or None), then `step()` and `report` until the trial is stopped. The session that calls
    it owns the rest: ``report(result, checkpoint=directory)`` keeps the directory's copy before it
    returns, and raises ``stop_error`` once the trial is to stop."""
    obj = _build(cls, config, info, setup_kwargs)
    obj._info = info
    keep = False
    try:
        ckpt, meta = checkpoint, {}
        if ckpt is not None:
            obj.restore(ckpt.path)
            meta = ckpt.metadata
            obj._iteration, obj._time_total = int(meta.get("training_iteration", 0)), float(meta.get("time_total_s", 0))
        every = int(info.get("checkpoint_frequency") or 0)
        at_end = bool(info.get("checkpoint_at_end"))
        stop_at = info.get("stop_at") or {}
        points = info.get("pbt")   # PBT's perturbation points (or a replay's steps): checkpoint there
        key = points and points["time_attr"]
        last_point = float(meta.get("result", {}).get(key, 0)) if points and ckpt is not None else 0.0
        while True:
            result = obj.train()
            ending = bool(result.get("done")) or any(is_number(v := lookup(result, k)) and v >= b
                                                     for k, b in stop_at.items())
            want = bool(result.pop("should_checkpoint", False)) or (every and obj._iteration % every == 0) \
                or (at_end and ending)
            t = result.get(key, obj._time_total if key == "time_total_s" else None) if points else None
            if is_number(t) and ("at" in points and t in points["at"] or "interval" in points
                                 and t >= points["burn_in"] and t - last_point >= points["interval"]):
                want, last_point = True, t
            result.pop("training_iteration")   # the session counts it (it may resume from a checkpoint)
            if not want:
                report(result)
                continue
            tmp = tempfile.mkdtemp(prefix=".ckpt-", dir=info["trial_dir"])
            try:
                obj.save(tmp)
                report(result, checkpoint=tmp)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except stop_error:
        keep = bool(info.get("reuse_actors"))
        raise
    finally:
        if keep:
            _kept.update(key=(f"{cls.__module__}.{cls.__qualname__}", os.path.dirname(info["trial_dir"])), obj=obj)
        else:
            obj.cleanup()
