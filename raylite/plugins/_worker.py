"""The worker side of RayStrategy: what runs inside each raylite actor.

Kept free of Lightning and torch at import time: unpickling the actor class imports this module,
and an actor must answer ``ready`` as soon as it is placed (that is how the launcher tells "waiting
for resources" from "starting"). torch and Lightning are imported by ``warm``.
"""
from __future__ import annotations

import os
import random
import sys

import raylite as ray
from raylite.plugins._phases import Phases
from raylite.util.placement import node_address

FORWARDED_ENV_PREFIXES = ("PL_", "TORCH_", "NCCL_", "GLOO_", "CUBLAS_", "CUDA_LAUNCH_BLOCKING")


class _WorkerSession:
    """What code running in a RayStrategy worker can ask: its rank and where reports go."""

    def __init__(self, rank: int, world_size: int, mailbox):
        self.rank, self.world_size, self.mailbox = rank, world_size, mailbox

    def send(self, item) -> bool:
        """Deliver ``item`` to the launching process (rank 0 only); False if nobody listens."""
        if self.mailbox is None:
            return False
        if self.rank == 0:
            ray.get(self.mailbox.put.remote(item))   # synchronous, like tune.report itself
        return True


_session: _WorkerSession | None = None


def worker_session() -> _WorkerSession | None:
    """The session of the RayStrategy call running in this process, else None."""
    return _session


class _Worker:
    """One rank. ``warm`` (torch, Lightning, the init hook) is queued right after the actor is
    created, so every rank imports in parallel while the driver pickles the trainer; ``ready``
    answers as soon as the actor is placed, which tells waiting-for-resources from starting."""

    def __init__(self, init_hook=None):
        self.init_hook = init_hook
        self.started = Phases()   # this process's start, reported with its first call
        self.started.mark("worker_up")

    def ready(self, rendezvous_dir: str) -> tuple[str, str, int, bool]:
        """Node id, IP and a free port there (the TCP rendezvous, if this actor becomes rank 0 on a
        cluster), and whether it sees the driver's rendezvous directory (same machine)."""
        return (*node_address(), os.path.isdir(rendezvous_dir))

    def warm(self) -> int:
        self.started.mark("import_start")
        from raylite.plugins import _compat  # noqa: F401 - torch + Lightning
        self.started.mark("imported")
        hook, self.init_hook = self.init_hook, None
        if hook is not None:
            hook()
        return os.getpid()

    def run(self, payload, spec: dict):
        global _session
        phases, self.started = self.started, Phases()
        phases.mark("run")
        _apply_spec(spec)
        strategy, trainer, function, args, kwargs = payload
        strategy._raylite_phases = phases
        rank = spec["rank"]
        strategy._raylite_assign(rank=rank, world_size=spec["world_size"], layout=spec["layout"],
                                 address=spec["address"], port=spec["port"], init_method=spec["init_method"],
                                 trainer=trainer)
        _session = _WorkerSession(rank, spec["world_size"], spec["mailbox"])
        try:
            results = function(*args, **kwargs)
            out = _collect(strategy, trainer, results, rank)
            if rank == 0:
                phases.mark("collected")
                out["phases"] = phases.marks
            return out
        finally:
            _session = None
            strategy._raylite_phases = None


def _apply_spec(spec: dict) -> None:
    for key in [k for k in os.environ if k.startswith(FORWARDED_ENV_PREFIXES) and k not in spec["env"]]:
        if key.startswith("PL_"):   # e.g. PL_GLOBAL_SEED from a previous seed_everything
            del os.environ[key]
    os.environ.update(spec["env"])
    os.environ.update({"RANK": str(spec["rank"]), "WORLD_SIZE": str(spec["world_size"]),
                       "MASTER_ADDR": spec["address"], "MASTER_PORT": str(spec["port"]), **spec["layout"].env()})
    try:
        os.chdir(spec["cwd"])
    except OSError:
        pass
    sys.path[:] = spec["sys_path"]
    import torch
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(spec["threads"])
    _restore_global_state(spec["global_state"])


def _capture_global_state() -> dict:
    import torch
    state = {"random": random.getstate(), "torch": torch.get_rng_state(),
             "deterministic": torch.are_deterministic_algorithms_enabled(),
             "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
             "cudnn_benchmark": torch.backends.cudnn.benchmark}
    np = sys.modules.get("numpy")
    if np is not None:
        state["numpy"] = np.random.get_state()
    return state


def _restore_global_state(state: dict) -> None:
    import torch
    random.setstate(state["random"])
    torch.set_rng_state(state["torch"])
    torch.use_deterministic_algorithms(state["deterministic"], warn_only=state["warn_only"])
    torch.backends.cudnn.benchmark = state["cudnn_benchmark"]
    if "numpy" in state:
        import numpy as np
        np.random.set_state(state["numpy"])


def _to_cpu(value):
    import torch
    from lightning_utilities.core.apply_func import apply_to_collection
    return apply_to_collection(value, torch.Tensor, lambda t: t.detach().cpu())


def _collect(strategy, trainer, results, rank: int):
    """Every rank: what the driver needs back (rank 0 the lot, others only their predictions)."""
    from raylite.plugins._compat import TrainerFn
    if trainer is None:
        return {"results": _to_cpu(results)} if rank == 0 else None
    fn = trainer.state.fn
    weights = None
    if fn == TrainerFn.FITTING:
        # All ranks: with a sharded model this is a collective that gathers the full weights.
        weights = strategy.lightning_module_state_dict()
    out: dict = {}
    if fn == TrainerFn.PREDICTING:
        out["predictions"] = _to_cpu(results)
        out["layout"] = _predict_layout(trainer)
    if rank != 0:
        return out or None
    callbacks = {}
    for cb in trainer.callbacks:
        try:
            callbacks[callback_key(cb)] = cb.state_dict()
        except Exception:  # noqa: BLE001 - a callback that cannot describe itself stays behind
            pass
    out.update(
        results=None if fn == TrainerFn.PREDICTING else _to_cpu(results),
        weights=_to_cpu(weights),
        state=trainer.state,
        callback_metrics=_to_cpu(dict(trainer.callback_metrics)),
        logged_metrics=_to_cpu(dict(trainer.logged_metrics)),
        progress_bar_metrics=_to_cpu(dict(trainer.progress_bar_metrics)),
        callbacks=callbacks,
        global_step=trainer.global_step,
        current_epoch=trainer.current_epoch,
    )
    return out


def _predict_layout(trainer) -> list:
    """Per predict loader: (num_replicas, rank, batch_size) if a distributed sampler split it."""
    from torch.utils.data import DistributedSampler
    loaders = trainer.predict_dataloaders
    if loaders is None:
        return []
    if not isinstance(loaders, (list, tuple)):
        loaders = [loaders]
    layout = []
    for dl in loaders:
        # Lightning rebuilds the loader with batch_sampler=BatchSampler(distributed sampler),
        # wrapped to record indices; the wrapper keeps the BatchSampler's attributes.
        batches = getattr(dl, "batch_sampler", None)
        sampler = getattr(dl, "sampler", None)
        if not isinstance(sampler, DistributedSampler):
            sampler = getattr(batches, "sampler", None)
        batch_size = getattr(dl, "batch_size", None) or getattr(batches, "batch_size", None)
        if isinstance(sampler, DistributedSampler) and not getattr(batches, "drop_last", False):
            layout.append((sampler.num_replicas, sampler.rank, batch_size))
        else:
            layout.append(None)
    return layout


def callback_key(cb) -> str:
    """``cb.state_key`` with the class's qualified name cut to its name: a class shipped by value
    (defined in a function or a notebook) arrives with a different ``__qualname__``."""
    key, cls = cb.state_key, type(cb)
    if key.startswith(cls.__qualname__):
        key = cls.__name__ + key[len(cls.__qualname__):]
    return f"{cls.__module__}:{key}"


class _Mailbox:
    """Reports (tune/train) from rank 0, collected by the launching process while it waits."""

    def __init__(self):
        self.items: list = []

    def put(self, item) -> None:
        self.items.append(item)

    def drain(self) -> list:
        items, self.items = self.items, []
        return items
