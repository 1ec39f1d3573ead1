"""The node's side of the worker -> node protocol (raylite.core.wire.protocol): one table of handlers
keyed by message kind, and the handlers of the requests a worker's client makes (get, wait, the
actor and state look-ups, each answered by one REPLY) and of its fire-and-forget notices.

The task lifecycle's own messages live beside what they change: hello, done and submit in
raylite.core.node.task_messages, item in stream_serving, unprefetched in lines, interrupt_missed
in cancellation.
"""
from __future__ import annotations

from typing import Protocol

from raylite import exceptions
from raylite.core.client import metrics
from raylite.core.node.records import Waiter, WorkerProc
from raylite.core.node.state import NodeState
from raylite.core.wire import protocol as P
from raylite.core.wire.protocol import TaskSpec


def handler_table(worker_msgs: WorkerMessages, task_msgs, streams, lines, cancels) -> dict:
    """The worker -> node message kinds (raylite.core.wire.protocol) and their handlers; the rest
    of a message is the handler's arguments after the worker."""
    handlers = {
        P.HELLO: task_msgs.msg_hello, P.DONE: task_msgs.msg_done, P.DONES: task_msgs.msg_dones, P.ITEM: streams.msg_item,
        P.SUBMIT: task_msgs.msg_submit, P.PUT: worker_msgs.msg_put, P.REFS: worker_msgs.msg_refs,
        P.KILL: worker_msgs.msg_kill, P.CANCEL: worker_msgs.msg_cancel, P.ACTOR_REPR: worker_msgs.msg_actor_repr,
        P.EXIT_ACTOR: worker_msgs.msg_exit_actor, P.INTERRUPT_MISSED: cancels.msg_interrupt_missed,
        P.UNPREFETCHED: lines.msg_unprefetched, P.RELEASED: worker_msgs.msg_released,
        P.METRICS: worker_msgs.msg_metrics,
        # requests: (kind, request id, *args), each answered by one REPLY
        P.GET: worker_msgs.msg_get, P.WAIT: worker_msgs.msg_wait, P.STREAM_NEXT: worker_msgs.msg_stream_next,
        P.CREATE_NAMED: worker_msgs.msg_create_named, P.GET_ACTOR: worker_msgs.msg_get_actor,
        P.NAMED_ACTORS: worker_msgs.msg_named_actors, P.RESOURCES: worker_msgs.msg_resources,
        P.STATE: worker_msgs.msg_state, P.GROUP: worker_msgs.msg_group,
    }
    assert handlers.keys() == P.TO_NODE, "a worker -> node message kind without its handler"
    return handlers


class NodeApi(Protocol):
    """What a worker's client asks of the node: the Node facade's own methods."""

    def group(self, op: str, *args): ...
    def kill(self, actor_id: int, no_restart: bool = True) -> None: ...
    def cancel(self, oid: int, force: bool, recursive: bool = True) -> None: ...
    def get_actor(self, name: str, namespace: str | None = None): ...
    def create_named(self, spec: TaskSpec, fn_bytes: bytes | None, get_if_exists: bool): ...
    def named_actors(self) -> list: ...
    def state(self, what: str, detail: bool) -> tuple[list, int]: ...
    def resource_view(self) -> tuple[dict, dict]: ...
    def stream_next(self, completion_id: int, index: int, reply) -> bool: ...


class Sends(Protocol):
    def send(self, w: WorkerProc, msg) -> None: ...


class LendsCpu(Protocol):
    def lend_cpu(self, w: WorkerProc) -> None: ...
    def owned_by(self, spec: TaskSpec, w: WorkerProc) -> None: ...


class Unblocks(Protocol):
    def unblock(self, w: WorkerProc) -> None: ...


class WorkerMessages:
    """The handlers of a worker's requests and notices (the task lifecycle's are TaskMessages')."""

    def __init__(self, state: NodeState, loop: Sends, api: NodeApi, task_msgs: LendsCpu, procs: Unblocks):
        self.s, self.loop, self.api, self.task_msgs, self.procs = state, loop, api, task_msgs, procs

    def msg_group(self, w: WorkerProc, req: int, op: str, args: tuple) -> None:
        try:
            payload = self.api.group(op, *args)
        except ValueError as e:
            payload = e
        self.loop.send(w, (P.REPLY, req, payload))

    def msg_metrics(self, w: WorkerProc, updates: list) -> None:
        metrics.store.merge(updates)

    def msg_stream_next(self, w: WorkerProc, req: int, completion_id: int, index: int) -> None:
        s = self.s
        def reply(found):
            self.procs.unblock(w)
            if w.index in s.workers:
                self.loop.send(w, (P.REPLY, req, found))
        if not self.api.stream_next(completion_id, index, reply):
            self.task_msgs.lend_cpu(w)

    def msg_exit_actor(self, w: WorkerProc, why: str) -> None:
        """The actor called ray.actor.exit_actor() (or was sent __ray_terminate__): its process
        ends now, for good."""
        if w.actor is not None:
            w.actor.restarts_left = 0
            w.actor.error = why
            w.exit_cause = ("INTENDED_USER_EXIT", why)

    def msg_released(self, w: WorkerProc, names: list) -> None:
        s = self.s
        for name in names:
            s.table.reader_done(name, w.index)

    def msg_put(self, w: WorkerProc, oid: int, value) -> None:
        s = self.s
        s.table.put(oid, value)

    def msg_refs(self, w: WorkerProc, ops: list) -> None:
        s = self.s
        handlers = {P.PIN: s.table.pin, P.RELEASE: s.table.release, P.ADDREF: s.table.addref}
        for op, oid in ops:
            handlers[op](oid)

    def msg_get(self, w: WorkerProc, req: int, ids: list, timeout) -> None:
        s = self.s
        def reply(timed_out: bool, waiter=None):
            self.procs.unblock(w)
            if timed_out:
                payload = (False, exceptions.GetTimeoutError(f"get timed out after {timeout} s"))
            elif waiter.infeasible_reason:
                payload = (False, exceptions.InfeasibleTaskError(waiter.infeasible_reason))
            elif waiter.lost_id is not None:
                payload = (False, exceptions.ObjectLostError(f"object {waiter.lost_id:028x} was freed"))
            else:
                payload = (True, s.table.values(ids, waiter))
                s.table.sent(w.index, payload[1])
            if w.index in s.workers:
                self.loop.send(w, (P.REPLY, req, payload))
        self._block_until(w, Waiter(reply, fail_fast=True), ids, timeout)

    def msg_wait(self, w: WorkerProc, req: int, ids: list, num_returns: int, timeout) -> None:
        s = self.s
        def reply(timed_out: bool, waiter=None):
            self.procs.unblock(w)
            if w.index in s.workers:
                self.loop.send(w, (P.REPLY, req, s.table.ready_ids(ids)))
        self._block_until(w, Waiter(reply, num_returns), ids, timeout)

    def _block_until(self, w: WorkerProc, waiter: Waiter, ids, timeout) -> None:
        s = self.s
        s.table.add_waiter(waiter, ids, timeout)
        if not waiter.done:
            self.task_msgs.lend_cpu(w)

    def msg_kill(self, w: WorkerProc, actor_id: int, no_restart: bool) -> None:
        self.api.kill(actor_id, no_restart)

    def msg_cancel(self, w: WorkerProc, oid: int, force: bool, recursive: bool) -> None:
        self.api.cancel(oid, force, recursive)

    def msg_get_actor(self, w: WorkerProc, req: int, name: str, namespace: str | None) -> None:
        try:
            payload = self.api.get_actor(name, namespace)
        except ValueError as e:
            payload = e
        self.loop.send(w, (P.REPLY, req, payload))

    def msg_create_named(self, w: WorkerProc, req: int, spec: TaskSpec, fn_bytes, get_if_exists: bool) -> None:
        s = self.s
        s.task_events.submitted_by(spec, w)
        try:
            payload = self.api.create_named(spec, fn_bytes, get_if_exists)
            self.task_msgs.owned_by(spec, w)
        except ValueError as e:
            payload = e
        self.loop.send(w, (P.REPLY, req, payload))

    def msg_actor_repr(self, w: WorkerProc, text: str) -> None:
        w.name = text   # the actor's __repr__ prefixes its output, as in Ray

    def msg_named_actors(self, w: WorkerProc, req: int) -> None:
        self.loop.send(w, (P.REPLY, req, self.api.named_actors()))

    def msg_state(self, w: WorkerProc, req: int, what: str, detail: bool) -> None:
        self.loop.send(w, (P.REPLY, req, self.api.state(what, detail)))

    def msg_resources(self, w: WorkerProc, req: int) -> None:
        self.loop.send(w, (P.REPLY, req, self.api.resource_view()))
