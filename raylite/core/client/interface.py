"""The client interfaces. ``Client``: what the local runtime's API code asks of this process's
runtime, by ids; the driver's client (raylite.core.node.driver.DriverClient, calls into the node
manager) and a worker's (raylite.core.worker.client.WorkerClient, requests over its socket)
implement it, so that code is written once for both (link.process.client holds this process's).
``Backend``: the API's whole calls, on refs, handles and values; the Ray adapter
(raylite.core.client.ray_backend) and the local runtime's front end over its Client
(raylite.core.api.local.LocalBackend) implement it, and ``link.backend()`` gives the one that runs.
Ray has no ids to offer, hence two interfaces rather than one."""
from __future__ import annotations

from typing import Protocol


class Client(Protocol):
    """Ids are the ints ``process.next_id()`` mints; values travel as ``Serialized``."""

    shm_prefix: str   # names this session's shared-memory segments
    resources_model: object   # the node's NodeResources totals (feasibility warnings)

    def submit(self, spec, fn_bytes: bytes | None) -> None:
        """Queue a task, an actor's creation or a call (``fn_bytes``: the definition, first time only)."""

    def create_named(self, spec, fn_bytes: bytes | None, get_if_exists: bool):
        """Create a named actor, or (``get_if_exists``) find the one of that name."""

    def put(self, object_id: int, ser) -> None: ...

    def get(self, ids: list[int], timeout: float | None) -> list:
        """The values of ``ids``, or a list of the first error as soon as one is an error."""

    def wait(self, ids: list[int], num_returns: int, timeout: float | None) -> set[int]:
        """The ids among ``ids`` that are ready (at least ``num_returns``, unless timed out)."""

    def stream_next(self, completion_id: int, index: int) -> tuple:
        """A streaming generator's item ``index``, once yielded (or its end)."""

    def addref(self, object_id: int) -> None: ...

    def release(self, object_id: int) -> None: ...

    def pin(self, object_id: int) -> None:
        """Keep the object until shutdown (a copy of its ref that nobody can follow exists)."""

    def kill(self, actor_id: int, no_restart: bool) -> None: ...

    def cancel(self, object_id: int, force: bool, recursive: bool) -> None: ...

    def get_actor(self, name: str, namespace: str | None): ...

    def named_actors(self) -> list[tuple[str, str]]: ...

    def resources(self) -> tuple[dict, dict]:
        """(total, available) resources of the node."""

    def state(self, what: str, detail: bool) -> tuple[list, int]:
        """The state API's rows of one table, and how many were dropped."""

    def group(self, op: str, *args):
        """A placement-group request: create, remove, info, ..."""


class Backend(Protocol):
    """The API calls both backends carry out whole, once the API has checked their arguments."""

    def get(self, object_refs, timeout: float | None): ...

    def wait(self, object_refs: list, num_returns: int, timeout: float | None, fetch_local: bool) -> tuple[list, list]:
        """(ready, not_ready), each in the order given, at most ``num_returns`` ready."""

    def put(self, value, owner): ...

    def kill(self, actor, no_restart: bool) -> None: ...

    def cancel(self, object_ref, force: bool, recursive: bool) -> None: ...

    def get_actor(self, name: str, namespace: str | None): ...

    def list_named_actors(self, all_namespaces: bool) -> list: ...

    def cluster_resources(self) -> dict: ...

    def available_resources(self) -> dict: ...

    def nodes(self) -> list[dict]: ...

    def get_gpu_ids(self) -> list: ...

    def timeline(self, filename: str | None) -> list[dict] | None:
        """The finished tasks as Chrome trace events, or (given ``filename``) written there as JSON."""
