"""What ``train_func`` sees inside a worker: report, get_context, get_checkpoint, and the 1.x
functions world_rank / local_rank / world_size / save_checkpoint / load_checkpoint.

Outside a run (in the driver, or a plain task) the context is rank 0 of 1, ``get_checkpoint()`` is
None and ``report`` warns and does nothing. Inside a raylite.tune trial (Ray 2.x's Tune examples call
``train.report`` from a function trainable), ``report``, ``get_checkpoint`` and the context's trial
getters are the trial's: ``tune.report`` and ``tune.get_checkpoint``, as in Ray.
"""
from __future__ import annotations

import numbers
import os
import shutil
import sys
import time
import warnings
from dataclasses import dataclass, field

from raylite.train.checkpoint import Checkpoint, persist


@dataclass
class SessionInfo:
    """Sent by the driver with each run: who this worker is and where results go."""

    world_rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    run_dir: str | None = None
    experiment_name: str | None = None
    trial_name: str | None = None
    checkpoint: Checkpoint | None = None      # to resume from
    attempt: int = 0
    use_gpu: bool = False
    reporter: object = None                    # the driver's _Reporter actor (reports, collectives)
    metadata: dict = field(default_factory=dict)


class _Session:
    def __init__(self, info: SessionInfo):
        self.info = info
        self.seq = 0          # report rounds
        self.collective = 0   # collectives (report rounds included): every rank counts the same

    def gather(self, value, name_if_any: bool = False) -> tuple[list, str | None]:
        """Wait until every rank has made this collective call; every rank's value, and the
        round's checkpoint name (see _Reporter.gather)."""
        import raylite as ray
        info = self.info
        seq, self.collective = self.collective, self.collective + 1
        return ray.get(info.reporter.gather.remote(info.attempt, info.world_rank, seq, value, name_if_any))

    def report(self, metrics: dict | None, checkpoint: Checkpoint | None) -> None:
        """Ray V2's report: a barrier across ranks that agrees on the round's checkpoint directory;
        each rank with a checkpoint copies its files there, then the driver gets the report (it
        commits the round, and its checkpoint, once every rank's report is in)."""
        info = self.info
        has = checkpoint is not None and info.run_dir is not None
        if metrics is None:   # Ray 1.x save_checkpoint: rank 0's own checkpoint, no round
            name = self._allocate() if has else None
        else:
            _, name = self.gather(has, name_if_any=True)
        if name is not None and has:
            persist(checkpoint, info.run_dir, name, owner=info.world_rank == 0)
        seq = -1 if metrics is None else self.seq
        # fire and forget: calls from one caller run in order
        info.reporter.report.remote(info.attempt, info.world_rank, seq, metrics, name if has else None, time.time())
        if metrics is not None:
            self.seq += 1

    def _allocate(self) -> str:
        import raylite as ray
        return ray.get(self.info.reporter.allocate.remote(self.info.attempt))


class _LocalSession(_Session):
    """Ray V2's local mode (``ScalingConfig(num_workers=0)``): the training function runs in the
    driver as rank 0 of 1. As in Ray, a report only keeps its metrics and checkpoint (not copied,
    nothing written); ``get_checkpoint()`` returns the last reported one; collectives return at once."""

    def __init__(self, info: SessionInfo, callbacks: list | None = None):
        super().__init__(info)
        self.last_metrics: dict | None = None
        # raylite.tune's hook (a trainer run in a trial), which reports each round on to Tune
        self.forward = [cb for cb in callbacks or () if hasattr(cb, "on_rank0_report")]

    def gather(self, value, name_if_any: bool = False) -> tuple[list, str | None]:
        return [value], None

    def report(self, metrics: dict | None, checkpoint: Checkpoint | None) -> None:
        self.last_metrics, self.info.checkpoint = metrics, checkpoint
        for cb in self.forward:
            cb.on_rank0_report(dict(metrics or {}), checkpoint)


_session: _Session | None = None
_default_info = SessionInfo()


def _start(info: SessionInfo, local: bool = False, callbacks: list | None = None) -> _Session:
    global _session
    _session = _LocalSession(info, callbacks) if local else _Session(info)
    return _session


def _end() -> None:
    global _session
    _session = None


def _info() -> SessionInfo:
    return _session.info if _session is not None else _default_info


def _tune_session():
    """raylite.tune's session module when this process runs a Tune trial (and is no train worker),
    else None. Looked up, not imported: a trial's process has imported it already."""
    if _session is not None:
        return None
    tune_session = sys.modules.get("raylite.tune.session")
    return tune_session if tune_session is not None and tune_session.in_session() else None


class TrainContext:
    """``train.get_context()``: ranks and sizes of the calling worker (Ray Train 2.x)."""

    def get_world_rank(self) -> int:
        return _info().world_rank

    def get_local_rank(self) -> int:
        return _info().local_rank

    def get_world_size(self) -> int:
        return _info().world_size

    def get_local_world_size(self) -> int:
        return _info().local_world_size

    def get_node_rank(self) -> int:
        return _info().node_rank

    def get_experiment_name(self) -> str | None:
        tune = _tune_session()
        return tune.get_context().get_experiment_name() if tune else _info().experiment_name

    def get_trial_name(self) -> str | None:
        tune = _tune_session()
        return tune.get_context().get_trial_name() if tune else _info().trial_name

    def get_trial_id(self) -> str | None:
        tune = _tune_session()
        return tune.get_trial_id() if tune else _info().trial_name

    def get_trial_dir(self) -> str | None:
        tune = _tune_session()
        return tune.get_trial_dir() if tune else _info().run_dir

    def get_trial_resources(self) -> dict:
        tune = _tune_session()
        return tune.get_trial_resources() if tune else {}

    def get_storage(self) -> str | None:
        return _info().run_dir

    def get_metadata(self) -> dict:
        return dict(_info().metadata)

    def uses_gpu(self) -> bool:
        return _info().use_gpu

    def in_session(self) -> bool:
        return _session is not None

    def __repr__(self) -> str:
        i = _info()
        return f"TrainContext(world_rank={i.world_rank}, world_size={i.world_size}, local_rank={i.local_rank})"


def get_context() -> TrainContext:
    """This worker's place in the run: ``get_world_rank()``, ``get_local_rank()``, ``get_world_size()``, ..."""
    return TrainContext()


def world_rank() -> int:
    return _info().world_rank


def local_rank() -> int:
    return _info().local_rank


def world_size() -> int:
    return _info().world_size


def get_checkpoint() -> Checkpoint | None:
    """The checkpoint to resume from: the latest one persisted by this run (after a restart) or the
    one the run was started with; None when there is none or outside a run. In a Tune trial: the
    trial's (``tune.get_checkpoint()``)."""
    tune = _tune_session()
    return tune.get_checkpoint() if tune else _info().checkpoint


def _plain(value):
    """Metrics as plain Python values: numpy and torch scalars (and one-element tensors) become
    numbers, so the history can be written as JSON and CSV."""
    if isinstance(value, (bool, str, type(None))):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (ValueError, RuntimeError, TypeError):   # more than one element
            return value
    return value


def report(metrics: dict | None = None, checkpoint: Checkpoint | None = None, **kwargs) -> None:
    """Record one round of metrics (and optionally a checkpoint) from this worker: a barrier, as in
    Ray, that every rank must call.

    ``report({"loss": l}, checkpoint=Checkpoint.from_directory(d))`` (2.x) or ``report(loss=l)`` (1.x).
    The driver keeps rank 0's metrics as the run's history; the files of every rank's checkpoint
    are copied into the round's one checkpoint directory before this returns, so ``d`` may be
    deleted afterwards.

    Args:
        metrics: a dict of JSON-able values (numbers, strings, nested dicts).
        checkpoint: this rank's files for the round's checkpoint (a ``Checkpoint``), or None.
        **kwargs: 1.x's ``report(loss=l)``: the metrics as keywords.
    """
    if metrics is None:
        metrics = kwargs
    elif kwargs:
        metrics = {**metrics, **kwargs}
    if not isinstance(metrics, dict):
        raise TypeError(f"report() expects a dict of metrics, got {type(metrics).__name__}")
    tune = _tune_session()
    if tune is not None:
        return tune.report({str(k): _plain(v) for k, v in metrics.items()}, checkpoint=checkpoint)
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        path = getattr(checkpoint, "path", None)   # a tune.Checkpoint of a directory: Ray's two are one class
        if not isinstance(path, str) or not os.path.isdir(path):
            raise TypeError(f"checkpoint must be a raylite.train.Checkpoint (or a directory tune.Checkpoint), "
                            f"got {checkpoint!r}")
        checkpoint = Checkpoint(path)
    if _session is None:
        warnings.warn("raylite.train.report() called outside a training run; ignored", stacklevel=2)
        return
    _session.report({str(k): _plain(v) for k, v in metrics.items()}, checkpoint)


def get_dataset_shard(dataset_name: str | None = None):
    """Ray Data's per-worker shard: not available, as raylite has no Ray Data (a trainer's
    ``datasets=`` is refused too). Raises NotImplementedError saying how to feed data instead."""
    raise NotImplementedError(
        f"train.get_dataset_shard({dataset_name!r}): Ray Data is not supported by raylite.train. Load the data "
        f"in the training function (e.g. a torch DataLoader wrapped with train.torch.prepare_data_loader, "
        f"which shards it across workers) or pass it (or its path) in train_loop_config.")


def save_checkpoint(**state) -> None:
    """Ray Train 1.x: persist ``state`` (a dict) as a checkpoint without reporting metrics."""
    if _session is None:
        warnings.warn("raylite.train.save_checkpoint() called outside a training run; ignored", stacklevel=2)
        return
    if _session.info.world_rank != 0:
        return
    ckpt = Checkpoint.from_dict(state)
    try:
        _session.report(None, ckpt)
    finally:
        shutil.rmtree(ckpt.path, ignore_errors=True)


def load_checkpoint() -> dict | None:
    """Ray Train 1.x: the dict given to ``save_checkpoint`` by the run being resumed, or None."""
    ckpt = get_checkpoint()
    return None if ckpt is None else ckpt.to_dict()
