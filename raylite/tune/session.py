"""The trial side: `report`, `get_checkpoint`, `Checkpoint`, and the task that runs a function trainable.

A trial is one raylite task with the trial's resources (so it gets its device variables). Each
`report` goes to the experiment's hub actor, which the driver drains; the reply carries the
driver's stop decision, and a stopped trial ends at its next `report` (a `StopTrial` raised there).
Reports block for the reply at most every `BLOCK_EVERY_S`, so a slow trial learns of a stop at its
next report and a fast one costs a message, not a round trip; when nothing in the driver can stop
the trial (no pruning scheduler, stopper function or time budget) reports never block.
Thresholds known in advance (a `stop={"metric": bound}` dict, the scheduler's `max_t`) are also
checked in the trial, which then stops at exactly the result that crossed them.
"""
from __future__ import annotations

import contextlib
import inspect
import json
import os
import pickle
import shutil
import socket
import tempfile
import time
import warnings

import raylite as ray
from raylite.tune.metrics import is_number, json_default, lookup
from raylite.tune.trainable import run_class
from raylite.tune.trial_env import trial_process

BLOCK_EVERY_S = 0.05
CHECKPOINT_META = ".tune_checkpoint.json"
CHECKPOINT_DATA = "checkpoint.pkl"


class StopTrial(BaseException):
    """Raised inside `report` when the driver stopped the trial (a BaseException, so user code's
    `except Exception` does not swallow it)."""


class Checkpoint:
    """A directory (Ray 2's `Checkpoint.from_directory`) or a dict (`from_dict`, Ray 1.x style)."""

    def __init__(self, path: str | os.PathLike | None = None, data: dict | None = None):
        self.path = os.fspath(path) if path is not None else None
        self._data = data

    @classmethod
    def from_directory(cls, path) -> Checkpoint:
        if not os.path.isdir(path):
            raise FileNotFoundError(f"checkpoint directory {path} does not exist")
        return cls(path=path)

    @classmethod
    def from_dict(cls, data: dict) -> Checkpoint:
        return cls(data=dict(data))

    def to_dict(self) -> dict:
        if self._data is not None:
            return dict(self._data)
        file = os.path.join(self.path, CHECKPOINT_DATA)
        if not os.path.exists(file):
            raise ValueError(f"checkpoint {self.path} was not made from a dict (no {CHECKPOINT_DATA})")
        with open(file, "rb") as f:
            return pickle.load(f)

    @contextlib.contextmanager
    def as_directory(self):
        if self.path is not None:
            yield self.path
            return
        with tempfile.TemporaryDirectory(prefix="raylite-ckpt-") as tmp:
            self._write_into(tmp)
            yield tmp

    def to_directory(self, path=None) -> str:
        path = os.fspath(path) if path is not None else tempfile.mkdtemp(prefix="raylite-ckpt-")
        os.makedirs(path, exist_ok=True)
        if self.path is not None:
            shutil.copytree(self.path, path, dirs_exist_ok=True)
        else:
            self._write_into(path)
        return path

    def _write_into(self, path: str) -> None:
        import cloudpickle
        with open(os.path.join(path, CHECKPOINT_DATA), "wb") as f:
            cloudpickle.dump(self._data, f)

    @property
    def metadata(self) -> dict:
        try:
            with open(os.path.join(self.path, CHECKPOINT_META)) as f:
                return json.load(f)
        except (OSError, TypeError, ValueError):
            return {}

    def __repr__(self) -> str:
        return f"Checkpoint({self.path!r})" if self.path else "Checkpoint(<dict>)"

    def __fspath__(self) -> str:
        return self.path


def _as_checkpoint(value) -> Checkpoint:
    if isinstance(value, Checkpoint):
        return value
    if isinstance(value, dict):
        return Checkpoint.from_dict(value)
    if isinstance(value, (str, os.PathLike)):
        return Checkpoint.from_directory(value)
    from raylite.train.checkpoint import Checkpoint as TrainCheckpoint
    if isinstance(value, TrainCheckpoint):   # Ray's train.Checkpoint and tune.Checkpoint are one class
        return Checkpoint.from_directory(value.path)
    raise TypeError(f"checkpoint must be a tune.Checkpoint, a train.Checkpoint, a dict or a directory, "
                    f"got {type(value).__name__}")


def checkpoint_dir_name(index: int) -> str:
    """Ray's name for a trial's index-th checkpoint: 0-based, counted per trial (not the iteration)."""
    return f"checkpoint_{index:06d}"


def persist_checkpoint(ckpt: Checkpoint, trial_dir: str, name: str, meta: dict) -> Checkpoint:
    """Copy into trial_dir/name; a checkpoint exists once its rename is done."""
    dest = os.path.join(trial_dir, name)
    tmp = dest + f".tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    if ckpt.path is not None:
        shutil.copytree(ckpt.path, tmp)
    else:
        os.makedirs(tmp)
        ckpt._write_into(tmp)
    with open(os.path.join(tmp, CHECKPOINT_META), "w") as f:
        json.dump(meta, f, default=json_default)
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(tmp, dest)
    return Checkpoint(dest)


def trial_checkpoints(trial_dir: str) -> list[tuple[int, Checkpoint]]:
    """The complete checkpoint_* directories of a trial, oldest first, with their numbers (the
    checkpoint's index; the iteration in experiments written before raylite numbered them as Ray:
    both grow with the iteration, so either sorts them)."""
    try:
        names = [n for n in os.listdir(trial_dir) if n.startswith("checkpoint_") and n[11:].isdigit()
                 and os.path.exists(os.path.join(trial_dir, n, CHECKPOINT_META))]
    except OSError:
        return []
    return sorted((int(n[11:]), Checkpoint(os.path.join(trial_dir, n))) for n in names)


def restart_point(trial_dir: str, recorded: int) -> tuple[int, Checkpoint | None, list[str]]:
    """(its iteration, the checkpoint, the paths of newer ones) for a trial restarting with
    `recorded` results on disk: the newest checkpoint at most one iteration past them (its result
    may not have reached the driver); the newer ones belong to results it redoes."""
    stale = []
    for _, ckpt in reversed(trial_checkpoints(trial_dir)):   # read by iteration, whatever the names
        iteration = int(ckpt.metadata.get("training_iteration", 0))
        if iteration <= recorded + 1:
            return iteration, ckpt, stale
        stale.append(ckpt.path)
    return 0, None, stale

# ---------------------------------------------------------------------------- the session
class _Session:
    def __init__(self, info: dict):
        self.trial_id = info["trial_id"]
        self.trial_name = info.get("trial_name", self.trial_id)
        self.trial_dir = info["trial_dir"]
        self.hub = info["hub"]
        self.attempt = info["attempt"]
        self.resources = info.get("resources", {})
        self.checkpoint = Checkpoint(info["checkpoint"]) if info.get("checkpoint") else None
        meta = self.checkpoint.metadata if self.checkpoint else {}
        self.iteration = self.start_iteration = int(meta.get("training_iteration", 0))
        self.time_offset = float(meta.get("time_total_s", 0.0))
        found = trial_checkpoints(self.trial_dir)   # a restarted trial numbers on after its last checkpoint
        self.checkpoint_index = found[-1][0] + 1 if found else 0
        self.start = self.last = time.time()
        self.last_block = 0.0
        self.pid = os.getpid()
        self.experiment_name = os.path.basename(os.path.dirname(self.trial_dir))
        self.auto = {"experiment_tag": info.get("experiment_tag", ""), "hostname": socket.gethostname(),
                     "node_ip": _node_ip()}   # Ray's per-trial auto-filled metrics
        self._date = (0, "")
        self.may_stop = info.get("may_stop", True)   # False: nothing in the driver can stop this trial
        self.stop_at = info.get("stop_at") or {}   # {metric: bound}: `stop=` dict and the scheduler's max_t
        # Reports that do not wait for the stop decision return no ref: one message, nothing to free.
        self.post = self.hub.report.options(num_returns=0)


    def date(self, second: int) -> str:
        """Ray's `date` metric, formatted once per second (reports may come thousands a second)."""
        if self._date[0] != second:
            self._date = (second, time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(second)))
        return self._date[1]


_session: _Session | None = None
_warned: set[str] = set()


def _outside(name: str, default=None):
    """What a session function returns outside a trial: as Ray's `_warn_session_misuse`, a warning
    (once per function) and `default`, so code written for a trial also runs on its own."""
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"`{name}` is meant to only be called inside a function that is executed by a Tuner "
                      f"or Trainer. Returning `{default}`.", stacklevel=3)
    return default


def report(metrics: dict | None = None, *, checkpoint=None, **kwargs) -> None:
    """Report one iteration's metrics (`report({"loss": l})`, or the 1.x form `report(loss=l)`),
    optionally with a checkpoint. Adds `training_iteration`, `time_this_iter_s`, `time_total_s`.
    Raises `StopTrial` (ending the trainable) when the driver stopped this trial; outside a trial
    it warns and does nothing."""
    s = _session
    if s is None:
        return _outside("report")
    if metrics is None:
        metrics = kwargs
    elif kwargs:
        metrics = {**metrics, **kwargs}
    elif not isinstance(metrics, dict):
        raise TypeError(f"report() expects a dict of metrics, got {type(metrics).__name__}")
    now = time.time()
    s.iteration += 1
    result = dict(metrics)
    result.update(training_iteration=s.iteration, time_this_iter_s=now - s.last,
                  time_total_s=s.time_offset + now - s.start, timestamp=int(now), trial_id=s.trial_id,
                  pid=s.pid, iterations_since_restore=s.iteration - s.start_iteration,
                  time_since_restore=now - s.start, date=s.date(int(now)), **s.auto)
    s.last = now
    block = s.may_stop and time.monotonic() - s.last_block >= BLOCK_EVERY_S
    if checkpoint is not None:
        result["checkpoint_dir_name"] = name = checkpoint_dir_name(s.checkpoint_index)
        s.checkpoint_index += 1
        meta = {"training_iteration": s.iteration, "time_total_s": result["time_total_s"], "result": result}
        s.checkpoint = persist_checkpoint(_as_checkpoint(checkpoint), s.trial_dir, name, meta)
    if block:
        ref = s.hub.report.remote(s.trial_id, s.attempt, result)
    else:
        s.post.remote(s.trial_id, s.attempt, result)
    if result.get("done"):   # Ray's Trial.should_stop: a result saying done ends the trial
        raise StopTrial(s.trial_id)
    for key, bound in s.stop_at.items():   # checked here too, so the trial stops at exactly this result
        v = lookup(result, key)
        if is_number(v) and v >= bound:
            raise StopTrial(s.trial_id)
    if block:
        stop = ray.get(ref)
        s.last_block = time.monotonic()
        if stop:
            raise StopTrial(s.trial_id)


def get_checkpoint() -> Checkpoint | None:
    """The checkpoint to resume from: the latest this trial reported, or the one it restarted from."""
    return _session.checkpoint if _session is not None else _outside("get_checkpoint")


def get_trial_id() -> str | None:
    return _session.trial_id if _session is not None else _outside("get_trial_id")


def get_trial_name() -> str | None:
    return _session.trial_name if _session is not None else _outside("get_trial_name")


def get_trial_dir() -> str | None:
    return _session.trial_dir if _session is not None else _outside("get_trial_dir")


def get_experiment_name() -> str | None:
    return _session.experiment_name if _session is not None else _outside("get_experiment_name")


def get_trial_resources() -> dict | None:
    return dict(_session.resources) if _session is not None else _outside("get_trial_resources")


def in_session() -> bool:
    """Whether this process is running a trial now (raylite.train's functions defer to it then)."""
    return _session is not None


class TuneContext:
    """`tune.get_context()` (Ray 2.x): who the running trial is and where its files go. Outside a
    trial its getters warn and return None (the ranks and sizes: 0 and 1), as in Ray."""

    get_trial_id = staticmethod(get_trial_id)
    get_trial_name = staticmethod(get_trial_name)
    get_trial_dir = staticmethod(get_trial_dir)
    get_experiment_name = staticmethod(get_experiment_name)
    get_trial_resources = staticmethod(get_trial_resources)

    def get_world_rank(self) -> int:
        return 0

    def get_local_rank(self) -> int:
        return 0

    def get_world_size(self) -> int:
        return 1

    def get_local_world_size(self) -> int:
        return 1

    def get_node_rank(self) -> int:
        return 0


def get_context() -> TuneContext:
    """The running trial's context."""
    return TuneContext()


def _node_ip() -> str:
    try:
        from raylite.util import get_node_ip_address
        return get_node_ip_address()
    except Exception:  # noqa: BLE001 - a label only
        return "127.0.0.1"


def run_trial(trainable, config: dict, info: dict, shared: dict | None = None) -> dict:
    """The task body: run the function trainable with a session installed, in its trial directory
    (trial_env.py). `info` is the trial's own (id, name, directory, attempt, checkpoint; a gate if
    it was submitted ahead), `shared` what every trial of the experiment gets alike (hub,
    resources, stop thresholds, whether to change directory, log files)."""
    global _session
    if shared:
        info = {**shared, **info}
    if info.get("gate"):   # submitted ahead: begin once one of the trials it replaces has ended
        ray.wait(info["gate"], num_returns=1)
    _session = s = _Session(info)
    s.hub.started.options(num_returns=0).remote(s.trial_id, s.attempt, os.getpid(),
                                                ray.get_runtime_context().get_accelerator_ids())
    wants_dir = info["checkpoint_dir_arg"] if "checkpoint_dir_arg" in info else wants_checkpoint_dir(trainable)
    stopped = False
    try:
        with trial_process(s.trial_dir, info.get("chdir", True), info.get("log_files")):
            inner = inner_trainable(trainable)
            if isinstance(inner, type):   # a tune.Trainable subclass (trainable.py)
                values = trainable.values() if inner is not trainable else {}
                out = run_class(inner, config, info, checkpoint=s.checkpoint, report=report, stop_error=StopTrial,
                                setup_kwargs=values)
            elif wants_dir:
                out = trainable(config, checkpoint_dir=s.checkpoint.path if s.checkpoint else None)
            else:
                out = trainable(config)
            if isinstance(out, dict) and out:
                report(out)   # a returned dict is the last result, as in Ray
    except StopTrial:
        stopped = True
    finally:
        _session = None
        # On a Ray cluster, calls to the hub are ordered per caller, not across callers: the driver's
        # drain after this task ends could overtake the reports still on their way. One call that
        # waits for the hub to have taken them (~0.3 ms here) makes the driver's next drain see them.
        try:
            ray.get(s.hub.taken.remote())
        except Exception:  # noqa: BLE001 - a dead hub: the driver reports that itself
            pass
    return {"iterations": s.iteration, "stopped": stopped}


def wants_checkpoint_dir(fn) -> bool:
    try:
        return "checkpoint_dir" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class Hub:
    """The experiment's mailbox actor: trials post results, the driver drains them and posts stops."""

    def __init__(self):
        self.events: list = []
        self.stops: set = set()

    def started(self, trial_id, attempt, pid, accelerator_ids) -> None:
        self.events.append(("start", trial_id, attempt, {"pid": pid, "accelerator_ids": accelerator_ids}))

    def report(self, trial_id, attempt, result) -> bool:
        self.events.append(("result", trial_id, attempt, result))
        return (trial_id, attempt) in self.stops

    def drain(self) -> list:
        events, self.events = self.events, []
        return events

    def taken(self) -> None:
        """Returns once the calling trial's earlier posts are in `events` (calls run in order)."""

    def stop(self, attempts) -> None:
        """Stop these (trial id, attempt)s: a trial a scheduler starts again (PBT) is a new attempt."""
        self.stops.update(tuple(a) for a in attempts)


class with_parameters:   # noqa: N801 - Ray's name
    """`tune.with_parameters(trainable, data=big)`: large objects go to the object store once
    (at `tune.run`), not into every trial's arguments."""

    def __init__(self, trainable, **kwargs):
        self.trainable, self.kwargs, self.__name__ = trainable, kwargs, getattr(trainable, "__name__", "trainable")

    def _put(self) -> with_parameters:
        return with_parameters(self.trainable, **{k: v if isinstance(v, ray.ObjectRef) else ray.put(v)
                                                  for k, v in self.kwargs.items()})

    def values(self) -> dict:
        """The objects, fetched (once per trial: a worker maps a large one from shared memory)."""
        return {k: ray.get(v) if isinstance(v, ray.ObjectRef) else v for k, v in self.kwargs.items()}

    def __call__(self, config, **extra):
        return self.trainable(config, **self.values(), **extra)

    @property
    def __signature__(self):
        return inspect.signature(self.trainable)


def inner_trainable(trainable):
    """The trainable under a `with_parameters` wrapper (itself when there is none)."""
    return trainable.trainable if isinstance(trainable, with_parameters) else trainable
