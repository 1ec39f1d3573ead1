"""The runtime as seen from the driver's user threads: thin calls into the node manager.

It has the same methods as the worker-side client (raylite.core.worker.loop.WorkerClient), so the
public API is written once for both.
"""
from __future__ import annotations

from raylite import exceptions
from raylite.core.node.manager import Node
from raylite.core.node.records import Waiter
from raylite.core.wire.resources import NodeResources


class DriverClient:
    def __init__(self, node: Node):
        self.node = node
        self.shm_prefix = node.shm_prefix
        self.sent_functions: set[str] = set()

    @property
    def resources_model(self) -> NodeResources:
        return self.node.res

    def submit(self, spec, fn_bytes: bytes | None) -> None:
        self.node.call(self.node.submit, spec, self._first_time(spec, fn_bytes))

    def create_named(self, spec, fn_bytes: bytes | None, get_if_exists: bool):
        return self.node.call_sync(self.node.create_named, spec, self._first_time(spec, fn_bytes), get_if_exists)

    def _first_time(self, spec, fn_bytes: bytes | None) -> bytes | None:
        """The function's bytes the first time it is sent, None after (the node keeps them)."""
        if spec.fn_id in self.sent_functions:
            return None
        if fn_bytes is not None:
            self.sent_functions.add(spec.fn_id)
        return fn_bytes

    def put(self, object_id: int, ser) -> None:
        self.node.call(self.node.table.put, object_id, ser)

    def _block(self, ids, timeout, want=None) -> Waiter:
        waiter = None

        def send(gate):
            nonlocal waiter
            waiter = Waiter(lambda timed_out, _waiter: gate.open(timed_out), want, fail_fast=want is None)
            self.node.wait_reading(waiter, ids, timeout)

        if self.node.failure.ask(send) and want is None:
            raise exceptions.GetTimeoutError(f"get timed out after {timeout} s")
        return waiter

    def get(self, ids: list[int], timeout: float | None) -> list:
        """The values of ids, or a list of the first error among them as soon as one holds an
        error (Ray's get fails fast: it does not wait for the others)."""
        objects = self.node.table.objects
        values = []
        for i in ids:   # fast path: everything is ready
            entry = objects.get(i)
            if entry is None or entry.value is None:
                break
            values.append(entry.value)
        else:
            return values
        for i in ids:
            entry = objects.get(i)
            if entry is not None and entry.infeasible:
                raise exceptions.InfeasibleTaskError(entry.infeasible)
        waiter = self._block(ids, timeout)
        if waiter.infeasible_reason:
            raise exceptions.InfeasibleTaskError(waiter.infeasible_reason)
        if waiter.lost_id is not None:
            raise exceptions.ObjectLostError(f"object {waiter.lost_id:028x} was freed")
        return self.node.table.values(ids, waiter)

    def wait(self, ids: list[int], num_returns: int, timeout: float | None) -> set[int]:
        ready = self.node.table.ready_ids(ids)
        if len(ready) < num_returns and timeout != 0:
            self._block(ids, timeout, num_returns)
            ready = self.node.table.ready_ids(ids)
        elif len(ready) < num_returns and self.node.shared.unwatched:
            # a worker may have been left unwatched until the next section (ProducerReading.
            # may_hold), which a loop of wait(timeout=0) would never make: read it now
            self.node.call(self.node.catch_up)
            ready = self.node.table.ready_ids(ids)
        return ready

    def stream_next(self, completion_id: int, index: int) -> tuple:
        return self.node.failure.ask(lambda gate: self.node.call(self.node.stream_next, completion_id, index, gate.open))

    def pin(self, object_id: int) -> None:
        if self.node.failure.cause is None:   # a broken node keeps no counts (its refs die quietly)
            self.node.call(self.node.table.pin, object_id)

    def release(self, object_id: int) -> None:
        node = self.node
        if node.failure.cause is not None:   # a broken node keeps no counts (its refs die quietly)
            return
        # held back only behind no queued command: one of this thread's (an addref) must not be overtaken
        if node.shared.commands or not node.table.drop_later(object_id):
            node.call(node.table.release, object_id)

    def addref(self, object_id: int) -> None:
        if self.node.failure.cause is None:   # a broken node keeps no counts (its refs die quietly)
            self.node.call(self.node.table.addref, object_id)

    def kill(self, actor_id: int, no_restart: bool) -> None:
        self.node.call(self.node.kill, actor_id, no_restart)

    def cancel(self, object_id: int, force: bool, recursive: bool) -> None:
        self.node.call(self.node.cancel, object_id, force, recursive)

    def get_actor(self, name: str, namespace: str | None):
        return self.node.call_sync(self.node.get_actor, name, namespace)

    def named_actors(self) -> list[tuple[str, str]]:
        return self.node.call_sync(self.node.named_actors)

    def resources(self) -> tuple[dict, dict]:
        return self.node.call_sync(self.node.resource_view)

    def state(self, what: str, detail: bool) -> tuple[list, int]:
        return self.node.call_sync(self.node.state, what, detail)

    def group(self, op: str, *args):
        """Placement groups: "create", "remove" or "info" on the node (ValueError raises here)."""
        return self.node.call_sync(self.node.group, op, *args)
