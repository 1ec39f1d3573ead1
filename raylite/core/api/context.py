"""`get_runtime_context()`: who is running (task, actor, job) and with which resources.

As in Ray, ``get_runtime_context()`` in a driver that has not called ``init()`` starts the
runtime first, so its ids are real ones; a context kept past ``shutdown()`` raises for what
only a running runtime knows (Ray's RuntimeError or RaySystemError), never stale or made-up ids.
The state it reads is raylite.core.client.context's, which the worker sets per call.
"""
from __future__ import annotations

import os
import warnings

from raylite.core.api import runtime
from raylite.core.client import context, link
from raylite.core.client.context import now, state
from raylite.core.client.link import process
from raylite.core.client.objects import BackendType
from raylite.core.wire.ids import PlacementGroupID
from raylite.core.wire.resources import ACCELERATOR_RESOURCES

TYPE_CHECKING = False   # typing's flag (type checkers read it as True) without importing typing here
if TYPE_CHECKING:
    from typing import NoReturn

    from raylite.runtime_env import RuntimeEnv


class _ID(str):
    """An id from Ray's deprecated id properties: the hex string raylite's getters return, also
    answering ``.hex()`` as Ray's ID objects do, so code written either way works."""

    def hex(self) -> str:
        return str(self)


def _deprecated(use: str) -> None:
    warnings.warn(f"Use {use} instead", DeprecationWarning, stacklevel=3)


class RuntimeContext(metaclass=BackendType):
    """Ray's RuntimeContext accessors for the calling process."""

    def get_job_id(self) -> str:
        context.require("Job ID")
        return state.job_id

    def get_node_id(self) -> str:
        context.require("Node ID")
        return state.node_id

    def get_worker_id(self) -> str:
        context.require("Worker ID")
        return f"{state.worker_id:016x}"

    def get_task_id(self) -> str | None:
        task_id = now().task_id
        return None if task_id is None else f"{task_id:028x}"

    def get_actor_id(self) -> str | None:
        actor_id = now().actor_id
        return None if actor_id is None else f"{actor_id:028x}"

    def get_task_name(self) -> str | None:
        return now().name or None

    def get_task_function_name(self) -> str | None:
        """``module.f`` or ``module.Class.method`` of the running call, as Ray gives it; None in
        the driver."""
        return context.task_function_name()

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
        context.require("Session name")
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
        context.check_connected()
        return dict(context.node_labels())

    def get_assigned_resources(self) -> dict[str, float]:
        """What the running task or actor holds ({} in the driver, which holds nothing)."""
        context.check_connected()
        return dict(now().assigned)

    def get_accelerator_ids(self) -> dict[str, list[str]]:
        context.check_connected()
        ids = now().accelerator_ids   # only the resources this task holds travel with it
        return {r: list(ids.get(r, ())) for r in ACCELERATOR_RESOURCES}

    def get_resource_ids(self) -> dict[str, list[str]]:
        _deprecated("get_accelerator_ids()")
        return self.get_accelerator_ids()

    def get_placement_group_id(self) -> str | None:
        """The hex id of the placement group the running task or actor is in, else None."""
        placement = context.current_placement()
        return None if placement is None else f"{placement[0]:028x}"

    @property
    def current_placement_group_id(self) -> PlacementGroupID | None:
        """The running task's PlacementGroupID, or None outside a group (Ray: a nil id)."""
        _deprecated("get_placement_group_id()")
        placement = context.current_placement()
        if placement is None:
            return None
        return PlacementGroupID(placement[0])

    @property
    def should_capture_child_tasks_in_placement_group(self) -> bool:
        """Whether tasks and actors submitted from here default to the current placement group."""
        placement = context.current_placement()
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
        if state.worker_id == 0:
            raise RuntimeError("is_canceled() is only available inside a task or actor call")
        return now().task_id in context.cancelled

    def get_actor_name(self) -> str | None:
        """The running actor's name ("" if it has none); None outside an actor."""
        return None if now().actor_id is None else state.actor_name

    @property
    def namespace(self) -> str:
        context.require("Namespace")
        return state.namespace

    def get_dashboard_url(self) -> str:
        """As Ray's, the address without its scheme (``127.0.0.1:8265/?token=...``, the token
        included) in the driver that started one; "" otherwise, as Ray gives with its dashboard off."""
        context.check_connected()
        url = runtime.dashboard_url()
        return url[len("http://"):] if url else ""

    @property
    def current_actor(self):
        """A handle to the actor this code runs in (to pass itself to other tasks)."""
        context.check_connected()
        actor_id = now().actor_id
        if actor_id is None or state.actor_meta is None:
            raise RuntimeError("current_actor is only available inside an actor")
        from raylite.core.api.actor_class import ActorHandle
        return ActorHandle(actor_id, state.actor_meta)

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
        return state.restarted


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
    if link.local_or_start() is None:   # (the local runtime, or a Ray cluster when RAY_ADDRESS names one)
        return process.ray.get_runtime_context()
    return RuntimeContext()
