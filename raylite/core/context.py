"""`get_runtime_context()`: who is running (task, actor, job) and with which resources."""
from __future__ import annotations

import os

from raylite.core import ray_backend
from raylite.core.objects import process
from raylite.core.resources import ACCELERATOR_RESOURCES


class _Current:
    job_id = "01000000"
    node_id = ""
    worker_id = 0
    task_id: int | None = None
    actor_id: int | None = None
    name = ""
    assigned: dict = {}
    accelerator_ids: dict = {}
    placement: tuple | None = None


_current = _Current()


def set_process(job_id: str, node_id: str, worker_id: int) -> None:
    _current.job_id, _current.node_id, _current.worker_id = job_id, node_id, worker_id


def set_current(*, task_id, actor_id, name, assigned, accelerator_ids, placement=None) -> None:
    _current.task_id, _current.actor_id, _current.name = task_id, actor_id, name
    _current.assigned, _current.accelerator_ids = assigned, accelerator_ids
    _current.placement = placement


def current_placement() -> tuple | None:
    """(group id, bundle index, capture children) of the running task or actor, if placed."""
    return _current.placement


class RuntimeContext:
    """Ray's RuntimeContext accessors for the calling process."""

    def get_job_id(self) -> str:
        return _current.job_id

    def get_node_id(self) -> str:
        return _current.node_id

    def get_worker_id(self) -> str:
        return f"{_current.worker_id:016x}"

    def get_task_id(self) -> str | None:
        return None if _current.task_id is None else f"{_current.task_id:028x}"

    def get_actor_id(self) -> str | None:
        return None if _current.actor_id is None else f"{_current.actor_id:028x}"

    def get_task_name(self) -> str | None:
        return _current.name or None

    def get_assigned_resources(self) -> dict[str, float]:
        return dict(_current.assigned)

    def get_accelerator_ids(self) -> dict[str, list[str]]:
        ids = _current.accelerator_ids   # only the resources this task holds travel with it
        return {r: list(ids.get(r, ())) for r in ACCELERATOR_RESOURCES}

    def get_pid(self) -> int:
        return os.getpid()

    @property
    def was_current_actor_reconstructed(self) -> bool:
        return False


def get_runtime_context() -> RuntimeContext:
    """raylite's context, or Ray's (same accessors) while the Ray backend runs."""
    if process.client is None and (process.ray is not None or ray_backend.attach()):
        return process.ray.get_runtime_context()
    return RuntimeContext()
