"""`get_runtime_context()`: who is running (task, actor, job) and with which resources."""
from __future__ import annotations

import os
from contextvars import ContextVar

from raylite.core import ray_backend
from raylite.core.objects import process
from raylite.core.resources import ACCELERATOR_RESOURCES


class _Process:
    job_id = "01000000"
    node_id = ""
    worker_id = 0
    namespace = ""
    restarted = False   # an actor's process started again after its previous one died
    actor_meta = None   # in an actor's process: its handle's (class name, methods, max_pending_calls)
    actor_name = ""


class _Call:
    """What runs now: set per call, in a context variable, so each of an actor's concurrent calls
    (threads or asyncio tasks) sees its own."""

    __slots__ = ("task_id", "actor_id", "name", "assigned", "accelerator_ids", "placement")

    def __init__(self, task_id=None, actor_id=None, name="", assigned=None, accelerator_ids=None,
                 placement=None):
        self.task_id, self.actor_id, self.name = task_id, actor_id, name
        self.assigned, self.accelerator_ids = assigned or {}, accelerator_ids or {}
        self.placement = placement


_process = _Process()
_call: ContextVar[_Call] = ContextVar("raylite_call")
_last = _Call()   # for threads the user starts inside a task, which begin with an empty context


def set_process(job_id: str, node_id: str, worker_id: int, restarted: bool = False, namespace: str = "") -> None:
    _process.job_id, _process.node_id, _process.worker_id = job_id, node_id, worker_id
    _process.restarted, _process.namespace = restarted, namespace


def set_actor(meta: tuple, name: str | None) -> None:
    """This process became an actor: what current_actor and get_actor_name() report."""
    _process.actor_meta, _process.actor_name = meta, name or ""


def set_current(*, task_id, actor_id, name, assigned, accelerator_ids, placement=None) -> None:
    global _last
    _last = _Call(task_id, actor_id, name, assigned, accelerator_ids, placement)
    _call.set(_last)


def _now() -> _Call:
    return _call.get(_last)


def current_placement() -> tuple | None:
    """(group id, bundle index, capture children) of the running task or actor, if placed."""
    return _now().placement


class RuntimeContext:
    """Ray's RuntimeContext accessors for the calling process."""

    def get_job_id(self) -> str:
        return _process.job_id

    def get_node_id(self) -> str:
        return _process.node_id

    def get_worker_id(self) -> str:
        return f"{_process.worker_id:016x}"

    def get_task_id(self) -> str | None:
        task_id = _now().task_id
        return None if task_id is None else f"{task_id:028x}"

    def get_actor_id(self) -> str | None:
        actor_id = _now().actor_id
        return None if actor_id is None else f"{actor_id:028x}"

    def get_task_name(self) -> str | None:
        return _now().name or None

    def get_assigned_resources(self) -> dict[str, float]:
        return dict(_now().assigned)

    def get_accelerator_ids(self) -> dict[str, list[str]]:
        ids = _now().accelerator_ids   # only the resources this task holds travel with it
        return {r: list(ids.get(r, ())) for r in ACCELERATOR_RESOURCES}

    def get_actor_name(self) -> str | None:
        """The running actor's name ("" if it has none); None outside an actor."""
        return None if _now().actor_id is None else _process.actor_name

    @property
    def namespace(self) -> str:
        return _process.namespace

    @property
    def current_actor(self):
        """A handle to the actor this code runs in (to pass itself to other tasks)."""
        actor_id = _now().actor_id
        if actor_id is None or _process.actor_meta is None:
            raise RuntimeError("current_actor is only available inside an actor")
        from raylite.core.remote import ActorHandle
        return ActorHandle(actor_id, _process.actor_meta)

    def get(self) -> dict[str, str]:
        """Ray's summary dict: job, node and namespace, plus the task and actor ids when set."""
        out = {"job_id": self.get_job_id(), "node_id": self.get_node_id(), "namespace": self.namespace}
        for key, value in (("task_id", self.get_task_id()), ("actor_id", self.get_actor_id())):
            if value is not None:
                out[key] = value
        return out

    def get_pid(self) -> int:
        return os.getpid()

    @property
    def was_current_actor_reconstructed(self) -> bool:
        return _process.restarted


def get_runtime_context() -> RuntimeContext:
    """raylite's context, or Ray's (same accessors) while the Ray backend runs."""
    if process.client is None and (process.ray is not None or ray_backend.attach()):
        return process.ray.get_runtime_context()
    return RuntimeContext()
