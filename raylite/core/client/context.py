"""Who is running in this process (task, actor, job) and with which resources: the state that
the worker sets per call and the RuntimeContext front end (raylite.core.api.context) reads. A
process that no runtime runs has none: asking raises Ray's RuntimeError or RaySystemError."""
from __future__ import annotations

from contextvars import ContextVar

from raylite import exceptions
from raylite.core.client.link import process


class _State:
    job_id = "01000000"
    node_id = ""
    worker_id = 0
    namespace = ""
    labels: dict = {}
    restarted = False   # an actor's process started again after its previous one died
    actor_meta = None   # in an actor's process: its handle's (class name, methods, max_pending_calls)
    actor_name = ""


class _Call:
    """What runs now: set per call, in a context variable, so each of an actor's concurrent calls
    (threads or asyncio tasks) sees its own."""

    __slots__ = ("task_id", "actor_id", "name", "assigned", "accelerator_ids", "placement", "function")

    def __init__(self, task_id=None, actor_id=None, name="", assigned=None, accelerator_ids=None,
                 placement=None, function=None):
        self.task_id, self.actor_id, self.name = task_id, actor_id, name
        self.assigned, self.accelerator_ids = assigned or {}, accelerator_ids or {}
        self.placement = placement
        self.function = function   # the task's function, or (actor class, method name)


state = _State()
cancelled: set[int] = set()   # calls ray.cancel() reached while they run here (is_canceled())
_call: ContextVar[_Call] = ContextVar("raylite_call")
_last = _Call()   # for threads the user starts inside a task, which begin with an empty context


def set_process(job_id: str, node_id: str, worker_id: int, restarted: bool = False, namespace: str = "",
                labels: dict | None = None) -> None:
    state.job_id, state.node_id, state.worker_id = job_id, node_id, worker_id
    state.restarted, state.namespace = restarted, namespace
    state.labels = labels or {"ray.io/node-id": node_id}


def node_labels() -> dict[str, str]:
    """This node's labels (raylite.core.wire.labels): Ray's own and init(labels=...)'s."""
    return state.labels or {"ray.io/node-id": state.node_id}


def set_actor(meta: tuple, name: str | None) -> None:
    """This process became an actor: what current_actor and get_actor_name() report."""
    state.actor_meta, state.actor_name = meta, name or ""


def set_current(*, task_id, actor_id, name, assigned, accelerator_ids, placement=None, function=None) -> None:
    global _last
    _last = _Call(task_id, actor_id, name, assigned, accelerator_ids, placement, function)
    _call.set(_last)


def now() -> _Call:
    return _call.get(_last)


def mark_cancelled(task_id: int | None) -> None:
    if task_id is not None:
        cancelled.add(task_id)


def forget_cancelled(task_id: int) -> None:
    cancelled.discard(task_id)


def running_task_id() -> int | None:
    return now().task_id


def current_placement() -> tuple | None:
    """(group id, bundle index, capture children) of the running task or actor, if placed."""
    return now().placement


def task_function_name() -> str | None:
    """``module.f`` or ``module.Class.method`` of the running call, as Ray gives it; None in the driver."""
    function = now().function
    if isinstance(function, tuple):
        cls, method = function
        return f"{cls.__module__}.{cls.__name__}.{method}"
    return None if function is None else f"{function.__module__}.{getattr(function, '__name__', 'task')}"


def connected() -> bool:
    """Whether this process belongs to a running local runtime (a driver after init(), or a worker)."""
    return process.client is not None


def require(what: str) -> None:
    """Ray's RuntimeError for an id asked of a process that no runtime runs."""
    if not connected():
        raise RuntimeError(f"{what} is not available because raylite has not been initialized: "
                           "call ray.init() first")


def check_connected() -> None:
    """Ray's check_connected(): a RaySystemError outside a running runtime."""
    if not connected():
        raise exceptions.RaySystemError("raylite has not been started yet. You can start it with 'ray.init()'.")
