"""The node's side of the worker -> node protocol (raylite.core.wire.protocol): one table of handlers
keyed by message kind, and the handlers of the requests a worker's client makes (get, wait, the
actor and state look-ups, each answered by one REPLY) and of its fire-and-forget notices.

The task lifecycle's own messages live beside what they change: hello, done and submit in
raylite.core.node.task_messages, item in stream_serving, unprefetched in lines, interrupt_missed
in cancellation.
"""
from __future__ import annotations

from raylite import exceptions
from raylite.core.client import metrics
from raylite.core.node.records import Waiter, WorkerProc
from raylite.core.wire import protocol as P
from raylite.core.wire.protocol import TaskSpec


class WorkerMessages:
    """Node mixin. Needs: table, workers, task_events, _send, _unblock, _lend_cpu, stream_next,
    group, kill, cancel, get_actor, create_named, _owned_by, named_actors, state, resource_view,
    and the lifecycle handlers _msg_hello, _msg_done, _msg_submit, _msg_item, _msg_unprefetched,
    _msg_interrupt_missed."""

    def _message_handlers(self) -> dict:
        """The worker -> node message kinds (raylite.core.wire.protocol) and their handlers; the rest
        of a message is the handler's arguments after the worker."""
        handlers = {
            P.HELLO: self._msg_hello, P.DONE: self._msg_done, P.ITEM: self._msg_item,
            P.SUBMIT: self._msg_submit, P.PUT: self._msg_put, P.REFS: self._msg_refs,
            P.KILL: self._msg_kill, P.CANCEL: self._msg_cancel, P.ACTOR_REPR: self._msg_actor_repr,
            P.EXIT_ACTOR: self._msg_exit_actor, P.INTERRUPT_MISSED: self._msg_interrupt_missed,
            P.UNPREFETCHED: self._msg_unprefetched, P.RELEASED: self._msg_released, P.METRICS: self._msg_metrics,
            # requests: (kind, request id, *args), each answered by one REPLY
            P.GET: self._msg_get, P.WAIT: self._msg_wait, P.STREAM_NEXT: self._msg_stream_next,
            P.CREATE_NAMED: self._msg_create_named, P.GET_ACTOR: self._msg_get_actor,
            P.NAMED_ACTORS: self._msg_named_actors, P.RESOURCES: self._msg_resources, P.STATE: self._msg_state,
            P.GROUP: self._msg_group,
        }
        assert handlers.keys() == P.TO_NODE, "a worker -> node message kind without its handler"
        return handlers

    def _msg_group(self, w: WorkerProc, req: int, op: str, args: tuple) -> None:
        try:
            payload = self.group(op, *args)
        except ValueError as e:
            payload = e
        self._send(w, (P.REPLY, req, payload))

    def _msg_metrics(self, w: WorkerProc, updates: list) -> None:
        metrics.store.merge(updates)

    def _msg_stream_next(self, w: WorkerProc, req: int, completion_id: int, index: int) -> None:
        def reply(found):
            self._unblock(w)
            if w.index in self.workers:
                self._send(w, (P.REPLY, req, found))
        if not self.stream_next(completion_id, index, reply):
            self._lend_cpu(w)

    def _msg_exit_actor(self, w: WorkerProc, why: str) -> None:
        """The actor called ray.actor.exit_actor() (or was sent __ray_terminate__): its process
        ends now, for good."""
        if w.actor is not None:
            w.actor.restarts_left = 0
            w.actor.error = why
            w.exit_cause = ("INTENDED_USER_EXIT", why)

    def _msg_released(self, w: WorkerProc, names: list) -> None:
        for name in names:
            self.table.reader_done(name, w.index)

    def _msg_put(self, w: WorkerProc, oid: int, value) -> None:
        self.table.put(oid, value)

    def _msg_refs(self, w: WorkerProc, ops: list) -> None:
        handlers = {P.PIN: self.table.pin, P.RELEASE: self.table.release, P.ADDREF: self.table.addref}
        for op, oid in ops:
            handlers[op](oid)

    def _msg_get(self, w: WorkerProc, req: int, ids: list, timeout) -> None:
        def reply(timed_out: bool, waiter=None):
            self._unblock(w)
            if timed_out:
                payload = (False, exceptions.GetTimeoutError(f"get timed out after {timeout} s"))
            elif waiter.infeasible_reason:
                payload = (False, exceptions.InfeasibleTaskError(waiter.infeasible_reason))
            elif waiter.lost_id is not None:
                payload = (False, exceptions.ObjectLostError(f"object {waiter.lost_id:028x} was freed"))
            else:
                payload = (True, self.table.values(ids, waiter))
                self.table.sent(w.index, payload[1])
            if w.index in self.workers:
                self._send(w, (P.REPLY, req, payload))
        self._block_until(w, Waiter(reply, fail_fast=True), ids, timeout)

    def _msg_wait(self, w: WorkerProc, req: int, ids: list, num_returns: int, timeout) -> None:
        def reply(timed_out: bool, waiter=None):
            self._unblock(w)
            if w.index in self.workers:
                self._send(w, (P.REPLY, req, self.table.ready_ids(ids)))
        self._block_until(w, Waiter(reply, num_returns), ids, timeout)

    def _block_until(self, w: WorkerProc, waiter: Waiter, ids, timeout) -> None:
        self.table.add_waiter(waiter, ids, timeout)
        if not waiter.done:
            self._lend_cpu(w)

    def _msg_kill(self, w: WorkerProc, actor_id: int, no_restart: bool) -> None:
        self.kill(actor_id, no_restart)

    def _msg_cancel(self, w: WorkerProc, oid: int, force: bool, recursive: bool) -> None:
        self.cancel(oid, force, recursive)

    def _msg_get_actor(self, w: WorkerProc, req: int, name: str, namespace: str | None) -> None:
        try:
            payload = self.get_actor(name, namespace)
        except ValueError as e:
            payload = e
        self._send(w, (P.REPLY, req, payload))

    def _msg_create_named(self, w: WorkerProc, req: int, spec: TaskSpec, fn_bytes, get_if_exists: bool) -> None:
        self.task_events.submitted_by(spec, w)
        try:
            payload = self.create_named(spec, fn_bytes, get_if_exists)
            self._owned_by(spec, w)
        except ValueError as e:
            payload = e
        self._send(w, (P.REPLY, req, payload))

    def _msg_actor_repr(self, w: WorkerProc, text: str) -> None:
        w.name = text   # the actor's __repr__ prefixes its output, as in Ray

    def _msg_named_actors(self, w: WorkerProc, req: int) -> None:
        self._send(w, (P.REPLY, req, self.named_actors()))

    def _msg_state(self, w: WorkerProc, req: int, what: str, detail: bool) -> None:
        self._send(w, (P.REPLY, req, self.state(what, detail)))

    def _msg_resources(self, w: WorkerProc, req: int) -> None:
        self._send(w, (P.REPLY, req, self.resource_view()))
