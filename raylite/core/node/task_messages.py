"""The task lifecycle's own messages from a worker (hello, done, submit; the handler
table and the other messages are raylite.core.node.worker_messages), and a blocked task's CPU
lent back while it waits."""
from __future__ import annotations

import time
from typing import Protocol

from raylite.core.node.records import Actor, WorkerProc
from raylite.core.node.state import NodeState
from raylite.core.node.worker_lifecycle import send_signal
from raylite.core.wire import protocol as P, serialization
from raylite.core.wire.protocol import TaskSpec


class EmitsOutput(Protocol):
    def emit_early_output(self, w: WorkerProc) -> None: ...


class Dispatches(Protocol):
    def run_on(self, w: WorkerProc, spec: TaskSpec) -> None: ...
    def finish(self, spec: TaskSpec, results) -> None: ...
    def enqueue(self, spec: TaskSpec) -> None: ...
    def to_idle(self, w: WorkerProc) -> None: ...


class PumpsActors(Protocol):
    def pump_actor(self, actor: Actor) -> None: ...
    def actor_blocked(self, w: WorkerProc) -> None: ...


class Submits(Protocol):
    def submit(self, spec: TaskSpec, fn_bytes: bytes | None) -> None: ...
    def take_unsent(self, w: WorkerProc) -> bool: ...


class Recalls(Protocol):
    def recall(self, w: WorkerProc, only: TaskSpec | None = None) -> None: ...


class Unblocks(Protocol):
    def unblock(self, w: WorkerProc) -> None: ...


class TaskMessages:
    def __init__(self, state: NodeState, output: EmitsOutput, dispatch: Dispatches, actor_ops: PumpsActors,
                 scheduler: Submits, lines: Recalls, procs: Unblocks):
        self.s, self.output, self.dispatch, self.actor_ops = state, output, dispatch, actor_ops
        self.scheduler, self.lines, self.procs = scheduler, lines, procs

    def msg_hello(self, w: WorkerProc, pid: int) -> None:
        s = self.s
        w.pid = pid
        s.starting.discard(w.index)
        if w.early_output:
            self.output.emit_early_output(w)
        if w.signal_on_hello:
            send_signal(w, w.signal_on_hello)
        if s.unsent.pop(w.index, None) is not None:   # nobody took its task meanwhile
            w.started = time.monotonic()
            self.dispatch.run_on(w, w.task)

    def msg_done(self, w: WorkerProc, task_id: int, results: list, retry: bool = False,
                  log_span: tuple | None = None, ran: float | None = None) -> None:
        """`ran`: how long the task's function took in the worker (a successful task's), which
        tells tiny tasks (see TaskLines.prefetch) however long their round trips take on a busy machine."""
        s = self.s
        results = serialization.results_from_wire(results)
        if w.actor is not None:
            actor = w.actor
            spec = actor.inflight.pop(task_id, None)
            if spec is None:   # the constructor
                s.task_events.finished(actor.spec, results)
                s.children.pop(actor.spec.task_id, None)
                if results[0].is_error:
                    actor.error = f"its constructor raised: {serialization.loads(results[0])}"
                    actor.restarts_left = 0
                    actor.exit_when_idle = True
                    self.actor_ops.pump_actor(actor)
                return
            if retry and spec.max_retries != 0 and spec.task_id not in s.cancelled:
                spec.max_retries -= 1   # retry_exceptions, within max_task_retries: ahead of later calls
                actor.queue.appendleft(spec)
                return self.actor_ops.pump_actor(actor)
            self.dispatch.finish(spec, results)
            if actor.exit_when_idle and not actor.inflight:   # its last call: now it may exit
                self.actor_ops.pump_actor(actor)
            return
        spec, w.task = w.task, None
        if log_span is not None:
            s.task_events.logged(spec, w.pid, log_span)
        now = time.monotonic()
        took = now - w.started if ran is None else ran
        s.fn_time[spec.fn_id] = 0.8 * s.fn_time.get(spec.fn_id, took) + 0.2 * took
        w.calls += 1
        self.procs.unblock(w)
        if w.ahead:   # the next task sent ahead is already running on the same resources
            w.task, w.started = w.ahead.popleft(), now
            s.task_events.sent(w.task, w)
        else:
            w.alloc.pool.release(w.alloc)
            w.alloc = None
            if not (s.unsent and self.scheduler.take_unsent(w)):
                self.dispatch.to_idle(w)
        if retry and spec.max_retries != 0 and spec.task_id not in s.cancelled:
            spec.max_retries -= 1   # retry_exceptions: the same budget as a crashed worker's retries
            return self.dispatch.enqueue(spec)
        self.dispatch.finish(spec, results)

    def msg_dones(self, w: WorkerProc, dones: list) -> None:
        """Several DONEs in one message (results a worker held back while its line ran), in order."""
        done = self.s.handlers[P.DONE]
        for items in dones:
            done(w, *items)

    def msg_submit(self, w: WorkerProc, spec: TaskSpec, fn_bytes, parent: int | None = None) -> None:
        """`parent`: the task or actor call (of several an actor may run at once) that submits it;
        not one that has finished (a thread it started submits), whose children nobody would drop."""
        s = self.s
        s.task_events.settle()   # (a parent that has finished is no parent)
        if parent is not None and parent not in s.task_events.live:
            parent = None
        if parent is None and w.task is not None:
            parent = w.task.task_id
        if parent is not None and spec.kind == "task":   # (for cancel's recursive=True)
            s.children.setdefault(parent, []).append(spec)
        s.task_events.submitted_by(spec, w, parent)   # its parent task, for the state API
        self.scheduler.submit(spec, fn_bytes)
        self.owned_by(spec, w)

    def owned_by(self, spec: TaskSpec, w: WorkerProc) -> None:
        s = self.s
        if spec.kind == "actor_create" and spec.actor_id in s.actors:
            s.actors[spec.actor_id].owner = w.index

    def lend_cpu(self, w: WorkerProc) -> None:
        """A task blocked in get, wait or next gives its CPU back, so nested work cannot deadlock.
        An actor keeps what it holds, as in Ray (which releases CPUs for blocked tasks only)."""
        if w.actor is not None:
            return self.actor_ops.actor_blocked(w)
        if w.ahead:   # it may wait on the tasks queued behind it
            self.lines.recall(w)
        if w.alloc is not None and not w.blocked:
            cpu = w.alloc.resources.get("CPU", 0)
            if cpu:
                w.alloc.pool.adjust("CPU", cpu)
                w.blocked = cpu
