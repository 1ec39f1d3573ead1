"""Dispatch: how a task moves between its queue, a worker and its result. Queueing it (its queue is
its request and placement), sending it to a worker, storing what it returned, dropping what its
arguments held, and a worker put back with the idle ones or told to exit."""
from __future__ import annotations

from collections import deque
from typing import Protocol

from raylite import exceptions
from raylite.core.node.records import Waiter, WorkerProc
from raylite.core.node.state import SETTLED, NodeState
from raylite.core.wire import protocol as P
from raylite.core.wire.protocol import TaskSpec, line_entry, line_key, spec_to_wire
from raylite.core.wire.serialization import error_value


class Sends(Protocol):
    def send(self, w: WorkerProc, msg) -> None: ...


class Answers(Protocol):
    def answer(self, completion_id: int, due: list) -> None: ...


def _queue_key(spec: TaskSpec, _known: dict = {}) -> tuple:   # noqa: B006 - the cache, by request dict
    """The queue a spec waits in: its request and placement. The calls of one remote function
    share their request dict, so its sorted items are kept per dict (while it lives)."""
    request = spec.schedule_request or spec.request
    known = _known.get(id(request))
    if known is None or known[0] is not request:
        if len(_known) > 1024:
            _known.clear()
        known = _known[id(request)] = (request, tuple(sorted(request.items())))
    return known[1], spec.placement


class Dispatch:
    def __init__(self, state: NodeState, loop: Sends, streams: Answers):
        self.s, self.loop, self.streams = state, loop, streams

    def enqueue(self, spec: TaskSpec):
        """Queue spec; SETTLED when its queue had others already (see Scheduler.submit)."""
        s = self.s
        if spec.task_id in s.cancelled or (spec.return_ids and s.producers.get(spec.return_ids[0]) is not spec):
            return None   # cancelled, or already finished while it waited (cancelled waiting for its arguments)
        queue = self._queue_of(spec)
        queue.append(spec)
        return SETTLED if len(queue) > 1 else None

    def requeue(self, spec: TaskSpec) -> None:
        self._queue_of(spec).appendleft(spec)

    def _queue_of(self, spec: TaskSpec) -> deque:
        """Its queue, made when it is the first (setdefault would build a deque on every submit)."""
        queues, key = self.s.queues, _queue_key(spec)
        queue = queues.get(key)
        if queue is None:
            queue = queues[key] = deque()
        return queue

    def when_deps_ready(self, spec: TaskSpec, then, lost=None) -> None:
        """`then()` once every argument of spec is ready; if one can never be, spec fails, then
        `lost()` runs (an actor's next calls go on)."""
        table = self.s.table
        missing = table.missing(spec.deps)
        if not missing:
            return then()

        def resolved(_timed_out, waiter):
            if waiter.infeasible_reason or waiter.lost_id is not None:
                why = waiter.infeasible_reason or f"object {waiter.lost_id:028x} was freed"
                self.finish(spec, error_value(exceptions.RayTaskError(
                    spec.name, f"an argument of {spec.name} can never be computed: {why}")))
                if lost is not None:
                    lost()
                return
            then()
        table.add_waiter(Waiter(resolved), missing, None)

    def _function_for(self, w: WorkerProc, spec: TaskSpec) -> bytes | None:
        """The bytes of spec's function the first time w is sent it, None after (w keeps it)."""
        if spec.fn_id and spec.fn_id not in w.functions:
            w.functions.add(spec.fn_id)
            return self.s.functions[spec.fn_id]
        return None

    def run_on(self, w: WorkerProc, spec: TaskSpec) -> None:
        s = self.s
        fn_bytes = self._function_for(w, spec)
        table = s.table
        deps = {d: table.objects[d].value for d in spec.deps}
        if deps or spec.args.buffers:   # the worker maps their segments: it must let go before reuse
            table.sent(w.index, (spec.args, *deps.values()))
        assigned, accel = w.alloc_on_wire()
        self.loop.send(w, (P.RUN, spec_to_wire(spec), fn_bytes, {d: v.wire() for d, v in deps.items()} if deps else deps,
                           assigned, accel))
        s.task_events.sent(spec, w)

    def send_ahead(self, w: WorkerProc, specs: list[TaskSpec]) -> None:
        """Send a line of tiny tasks to w, to run after its task (they join w.ahead): calls that
        differ only in their ids and plain arguments go in one RUN_LINE, which the worker unpacks
        into its RUNs (one pickle of the shared fields, not one per call); the rest one RUN each."""
        group: list[TaskSpec] = []
        key = None
        for spec in specs:
            # one with a ref argument or a large buffer goes alone: run_on records what the worker maps
            spec_key = None if spec.deps or spec.args.buffers else line_key(spec)
            if spec_key is None or spec_key != key:
                self._send_line(w, group, key)
                group, key = [], spec_key
            group.append(spec)
        self._send_line(w, group, key)

    def _send_line(self, w: WorkerProc, specs: list[TaskSpec], key: tuple | None) -> None:
        """specs, which share `key` (their line_key) when there are several."""
        if not specs:
            return
        w.ahead.extend(specs)   # (their start is recorded when each begins: TaskEvents.sent)
        if len(specs) == 1:
            return self.run_on(w, specs[0])
        assigned, accel = w.alloc_on_wire()
        self.loop.send(w, (P.RUN_LINE, key, self._function_for(w, specs[0]), assigned, accel,
                           [line_entry(s) for s in specs]))

    def finish(self, spec: TaskSpec, results) -> None:
        """Store a task's results (one value or a list) and drop its argument pins."""
        s = self.s
        if spec.task_id in s.cancelled:   # cancel() came first: the caller gets the cancellation
            s.cancelled.discard(spec.task_id)
            if not (isinstance(results, list) and results and results[0].is_error):
                err = exceptions.TaskCancelledError(f"task {spec.name} was cancelled")
                if spec.kind == "actor_call":   # it ran in user code: a RayTaskError as well, as in Ray
                    err = exceptions.RayTaskError(spec.name, f"TaskCancelledError: {err}", err)
                results = error_value(err)
        s.task_events.finished(spec, results)
        if not isinstance(results, list):
            results = [results] * len(spec.return_ids)
        if spec.return_ids:
            s.producers.pop(spec.return_ids[0], None)
        if s.children:
            s.children.pop(spec.task_id, None)
        table = s.table
        for oid, value in zip(spec.return_ids, results):
            table.set_value(oid, value)
        stream = table.streams.get(spec.return_ids[0]) if spec.stream else None
        if stream is not None:
            stream.done, stream.failed = True, results[0].is_error
            self.streams.answer(spec.return_ids[0], stream.wake())
        self.drop_args(spec)

    def drop_args(self, spec: TaskSpec) -> None:
        """Release what a task's arguments held (once): its ref arguments and nested refs, and the
        segments of large arguments passed by value (which stayed in /dev/shm until shutdown)."""
        s = self.s
        if spec.task_id in s.arg_holders:
            s.arg_holders.discard(spec.task_id)
            table = s.table
            for oid in spec.deps + spec.args.refs:
                table.release(oid)
            if spec.args.buffers:
                table.retire_segments(spec.args)

    def to_idle(self, w: WorkerProc) -> None:
        s = self.s
        pool = s.idle.setdefault(w.key, [])
        if s.stopping or (w.max_calls and w.calls >= w.max_calls) or len(pool) >= s.max_idle:
            self.retire(w)
        else:
            pool.append(w)

    def retire(self, w: WorkerProc) -> None:
        w.retiring = True
        w.exit_cause = ("INTENDED_SYSTEM_EXIT", "its actor ended: no handle left, or it was asked to end"
                        if w.actor is not None else "raylite ended it: idle, or its max_calls reached")
        self.loop.send(w, (P.EXIT,))
