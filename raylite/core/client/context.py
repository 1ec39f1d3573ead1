"""`get_runtime_context()`: who is running (task, actor, job) and with which resources.

As in Ray, ``get_runtime_context()`` in a driver that has not called ``init()`` starts the
runtime first, so its ids are real ones; a context kept past ``shutdown()`` raises for what
only a running runtime knows (Ray's RuntimeError or RaySystemError), never stale or made-up ids.
"""
from __future__ import annotations

import os
import warnings
from contextvars import ContextVar

from raylite import exceptions
from raylite.core.client import ray_backend
from raylite.core.client.objects import BackendType, process
from raylite.core.wire.ids import PlacementGroupID
from raylite.core.wire.resources import ACCELERATOR_RESOURCES

TYPE_CHECKING = False   # typing's flag (type checkers read it as True) without importing typing here
if TYPE_CHECKING:
    from typing import NoReturn

    from raylite.runtime_env import RuntimeEnv


class _Process:
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


_process = _Process()
_cancelled: set[int] = set()   # calls ray.cancel() reached while they run here (is_canceled())
_call: ContextVar[_Call] = ContextVar("raylite_call")
_last = _Call()   # for threads the user starts inside a task, which begin with an empty context


def set_process(job_id: str, node_id: str, worker_id: int, restarted: bool = False, namespace: str = "",
                labels: dict | None = None) -> None:
    _process.job_id, _process.node_id, _process.worker_id = job_id, node_id, worker_id
    _process.restarted, _process.namespace = restarted, namespace
    _process.labels = labels or {"ray.io/node-id": node_id}


def node_labels() -> dict[str, str]:
    """This node's labels (raylite.core.wire.labels): Ray's own and init(labels=...)'s."""
    return _process.labels or {"ray.io/node-id": _process.node_id}


def set_actor(meta: tuple, name: str | None) -> None:
    """This process became an actor: what current_actor and get_actor_name() report."""
    _process.actor_meta, _process.actor_name = meta, name or ""


def set_current(*, task_id, actor_id, name, assigned, accelerator_ids, placement=None, function=None) -> None:
    global _last
    _last = _Call(task_id, actor_id, name, assigned, accelerator_ids, placement, function)
    _call.set(_last)


def _now() -> _Call:
    return _call.get(_last)


def mark_cancelled(task_id: int | None) -> None:
    if task_id is not None:
        _cancelled.add(task_id)


def forget_cancelled(task_id: int) -> None:
    _cancelled.discard(task_id)


def running_task_id() -> int | None:
    return _now().task_id


def current_placement() -> tuple | None:
    """(group id, bundle index, capture children) of the running task or actor, if placed."""
    return _now().placement


class _ID(str):
    """An id from Ray's deprecated id properties: the hex string raylite's getters return, also
    answering ``.hex()`` as Ray's ID objects do, so code written either way works."""

    def hex(self) -> str:
        return str(self)


def _deprecated(use: str) -> None:
    warnings.warn(f"Use {use} instead", DeprecationWarning, stacklevel=3)


def connected() -> bool:
    """Whether this process belongs to a running local runtime (a driver after init(), or a worker)."""
    return process.client is not None


def _require(what: str) -> None:
    """Ray's RuntimeError for an id asked of a process that no runtime runs."""
    if not connected():
        raise RuntimeError(f"{what} is not available because raylite has not been initialized: "
                           "call ray.init() first")


def _check_connected() -> None:
    """Ray's check_connected(): a RaySystemError outside a running runtime."""
    if not connected():
        raise exceptions.RaySystemError("raylite has not been started yet. You can start it with 'ray.init()'.")


class RuntimeContext(metaclass=BackendType):
    """Ray's RuntimeContext accessors for the calling process."""

    def get_job_id(self) -> str:
        _require("Job ID")
        return _process.job_id

    def get_node_id(self) -> str:
        _require("Node ID")
        return _process.node_id

    def get_worker_id(self) -> str:
        _require("Worker ID")
        return f"{_process.worker_id:016x}"

    def get_task_id(self) -> str | None:
        task_id = _now().task_id
        return None if task_id is None else f"{task_id:028x}"

    def get_actor_id(self) -> str | None:
        actor_id = _now().actor_id
        return None if actor_id is None else f"{actor_id:028x}"

    def get_task_name(self) -> str | None:
        return _now().name or None

    def get_task_function_name(self) -> str | None:
        """``module.f`` or ``module.Class.method`` of the running call, as Ray gives it; None in
        the driver."""
        function = _now().function
        if isinstance(function, tuple):
            cls, method = function
            return f"{cls.__module__}.{cls.__name__}.{method}"
        return None if function is None else f"{function.__module__}.{getattr(function, '__name__', 'task')}"

    @property
    def job_id(self) -> _ID:
        _deprecated("get_job_id()")
        return _ID(self.get_job_id())

    @property
    def node_id(self) -> _ID:
        _deprecated("get_node_id()")
        return _ID(self.get_node_id())

    @property
    def task_id(self) -> _ID | None:
        """None outside a task (Ray asserts there)."""
        _deprecated("get_task_id()")
        task_id = self.get_task_id()
        return None if task_id is None else _ID(task_id)

    @property
    def actor_id(self) -> _ID | None:
        """None outside an actor (Ray asserts in the driver)."""
        _deprecated("get_actor_id()")
        actor_id = self.get_actor_id()
        return None if actor_id is None else _ID(actor_id)

    def get_session_name(self) -> str:
        """``session_<id>``, the name of the running session's log directory under get_temp_dir()."""
        _require("Session name")
        from raylite.core.wire.segments import session_of
        return f"session_{session_of(process.client.shm_prefix)}"

    def get_temp_dir(self) -> str:
        """raylite's directory under the system temp directory (created if missing, so callers can
        write there as under Ray's /tmp/ray); ``init(_temp_dir=...)`` is not reflected here."""
        import tempfile
        path = os.path.join(tempfile.gettempdir(), "raylite")
        os.makedirs(path, exist_ok=True)
        return path

    def get_node_labels(self) -> dict[str, str]:
        """The node's labels, as the state API's ``list_nodes`` reports them."""
        _check_connected()
        return dict(node_labels())

    def get_assigned_resources(self) -> dict[str, float]:
        """What the running task or actor holds ({} in the driver, which holds nothing)."""
        _check_connected()
        return dict(_now().assigned)

    def get_accelerator_ids(self) -> dict[str, list[str]]:
        _check_connected()
        ids = _now().accelerator_ids   # only the resources this task holds travel with it
        return {r: list(ids.get(r, ())) for r in ACCELERATOR_RESOURCES}

    def get_resource_ids(self) -> dict[str, list[str]]:
        _deprecated("get_accelerator_ids()")
        return self.get_accelerator_ids()

    def get_placement_group_id(self) -> str | None:
        """The hex id of the placement group the running task or actor is in, else None."""
        placement = current_placement()
        return None if placement is None else f"{placement[0]:028x}"

    @property
    def current_placement_group_id(self) -> PlacementGroupID | None:
        """The running task's PlacementGroupID, or None outside a group (Ray: a nil id)."""
        _deprecated("get_placement_group_id()")
        placement = current_placement()
        if placement is None:
            return None
        return PlacementGroupID(placement[0])

    @property
    def should_capture_child_tasks_in_placement_group(self) -> bool:
        """Whether tasks and actors submitted from here default to the current placement group."""
        placement = current_placement()
        return placement is not None and bool(placement[2])

    @property
    def runtime_env(self) -> RuntimeEnv:
        """The runtime_env this process runs with, as a RuntimeEnv: the fields raylite applies
        (env_vars, working_dir, py_modules), after inheritance from the job's."""
        from raylite.runtime_env import RuntimeEnv
        return RuntimeEnv(**_runtime_env_fields())

    def get_runtime_env_string(self) -> str:
        """``runtime_env`` as JSON, as Ray gives it."""
        return self.runtime_env.serialize()

    @property
    def gcs_address(self) -> NoReturn:
        """raylite's local runtime has no GCS for other processes to connect to, so this raises
        AttributeError: ``getattr(ctx, "gcs_address", None)`` gives None, and direct use says why."""
        raise AttributeError("gcs_address: raylite's local runtime has no GCS (Ray's cluster metadata "
                             "service); connect to a Ray cluster (init(address=...)) to use one")

    def is_canceled(self) -> bool:
        """Whether ray.cancel() was called on the running actor call (for a graceful stop: a call
        on a plain or threaded actor is not interrupted). An async call gets CancelledError instead."""
        if _process.worker_id == 0:
            raise RuntimeError("is_canceled() is only available inside a task or actor call")
        return _now().task_id in _cancelled

    def get_actor_name(self) -> str | None:
        """The running actor's name ("" if it has none); None outside an actor."""
        return None if _now().actor_id is None else _process.actor_name

    @property
    def namespace(self) -> str:
        _require("Namespace")
        return _process.namespace

    def get_dashboard_url(self) -> str:
        """As Ray's, the address without its scheme (``127.0.0.1:8265/?token=...``, the token
        included) in the driver that started one; "" otherwise, as Ray gives with its dashboard off."""
        _check_connected()
        from raylite.core.api import runtime as api
        url = api.dashboard_url()
        return url[len("http://"):] if url else ""

    @property
    def current_actor(self):
        """A handle to the actor this code runs in (to pass itself to other tasks)."""
        _check_connected()
        actor_id = _now().actor_id
        if actor_id is None or _process.actor_meta is None:
            raise RuntimeError("current_actor is only available inside an actor")
        from raylite.core.api.actor_class import ActorHandle
        return ActorHandle(actor_id, _process.actor_meta)

    def get(self) -> dict[str, str]:
        """Ray's deprecated summary dict: job, node and namespace, plus the task and actor ids
        when set; the ids answer ``.hex()`` as Ray's ID objects do."""
        warnings.warn("Use get_xxx_id() methods to get relevant ids instead", DeprecationWarning, stacklevel=2)
        out = {"job_id": _ID(self.get_job_id()), "node_id": _ID(self.get_node_id()), "namespace": self.namespace}
        for key, value in (("task_id", self.get_task_id()), ("actor_id", self.get_actor_id())):
            if value is not None:
                out[key] = _ID(value)
        return out

    def get_pid(self) -> int:
        return os.getpid()

    @property
    def was_current_actor_reconstructed(self) -> bool:
        return _process.restarted


def _runtime_env_fields() -> dict:
    """This process's normalized runtime_env (raylite.core.envs.runtime_env) as Ray's dict shape."""
    if process.index == 0 and process.client is not None:
        env = process.client.node.job_env   # the driver: what init(runtime_env=...) set
    else:
        env = process.runtime_env
    fields = dict(env or ())
    if "env_vars" in fields:
        fields["env_vars"] = dict(fields["env_vars"])
    if "py_modules" in fields:
        fields["py_modules"] = list(fields["py_modules"])
    return fields


def get_runtime_context() -> RuntimeContext:
    """raylite's context, or Ray's (same accessors) while the Ray backend runs. In a driver
    without a runtime it starts one with the defaults first, as Ray's does."""
    if process.client is None:
        if process.ray is None and not ray_backend.attach():
            from raylite.core.api import runtime as api
            api.init()   # the local runtime, or a Ray cluster when RAY_ADDRESS names one
        if process.ray is not None:
            return process.ray.get_runtime_context()
    return RuntimeContext()
