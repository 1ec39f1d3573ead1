"""Node mixin: the task lifecycle's own messages from a worker (hello, done, submit; the handler
table and the other messages are raylite.core.node.worker_messages), and a blocked task's CPU
lent back while it waits."""
from __future__ import annotations

import time

from raylite.core.node.records import WorkerProc
from raylite.core.wire import serialization
from raylite.core.wire.protocol import TaskSpec
from raylite.core.wire.serialization import Serialized


class TaskMessages:
    """Needs: starting, unsent, actors, children, cancelled, fn_time, task_events, emit_early_output,
    _signal, _run_on, _pump_actor, _finish, _unblock, _take_unsent, _to_idle, _enqueue, submit,
    _actor_blocked, _recall."""

    def _msg_hello(self, w: WorkerProc, pid: int) -> None:
        w.pid = pid
        self.starting.discard(w.index)
        if w.early_output:
            self.emit_early_output(w)
        if w.signal_on_hello:
            self._signal(w, w.signal_on_hello)
        if self.unsent.pop(w.index, None) is not None:   # nobody took its task meanwhile
            w.started = time.monotonic()
            self._run_on(w, w.task)

    def _msg_done(self, w: WorkerProc, task_id: int, results: list, retry: bool = False,
                  log_span: tuple | None = None, ran: float | None = None) -> None:
        """`ran`: how long the task's function took in the worker (a successful task's), which
        tells tiny tasks (see _prefetch) however long their round trips take on a busy machine."""
        results = [Serialized(*r) for r in results]   # sent as plain data (see worker finish)
        if w.actor is not None:
            actor = w.actor
            spec = actor.inflight.pop(task_id, None)
            if spec is None:   # the constructor
                self.task_events.finished(actor.spec, results)
                self.children.pop(actor.spec.task_id, None)
                if results[0].is_error:
                    actor.error = f"its constructor raised: {serialization.loads(results[0])}"
                    actor.restarts_left = 0
                    actor.exit_when_idle = True
                    self._pump_actor(actor)
                return
            if retry and spec.max_retries != 0 and spec.task_id not in self.cancelled:
                spec.max_retries -= 1   # retry_exceptions, within max_task_retries: ahead of later calls
                actor.queue.appendleft(spec)
                return self._pump_actor(actor)
            self._finish(spec, results)
            if actor.exit_when_idle and not actor.inflight:   # its last call: now it may exit
                self._pump_actor(actor)
            return
        spec, w.task = w.task, None
        if log_span is not None:
            self.task_events.logged(spec, w.pid, log_span)
        now = time.monotonic()
        took = now - w.started if ran is None else ran
        self.fn_time[spec.fn_id] = 0.8 * self.fn_time.get(spec.fn_id, took) + 0.2 * took
        w.calls += 1
        self._unblock(w)
        if w.ahead:   # the next task sent ahead is already running on the same resources
            w.task, w.started = w.ahead.popleft(), now
            self.task_events.sent(w.task, w)
        else:
            w.alloc.pool.release(w.alloc)
            w.alloc = None
            if not (self.unsent and self._take_unsent(w)):
                self._to_idle(w)
        if retry and spec.max_retries != 0 and spec.task_id not in self.cancelled:
            spec.max_retries -= 1   # retry_exceptions: the same budget as a crashed worker's retries
            return self._enqueue(spec)
        self._finish(spec, results)

    def _msg_submit(self, w: WorkerProc, spec: TaskSpec, fn_bytes, parent: int | None = None) -> None:
        """`parent`: the task or actor call (of several an actor may run at once) that submits it;
        not one that has finished (a thread it started submits), whose children nobody would drop."""
        if parent is not None and parent not in self.task_events.live:
            parent = None
        if parent is None and w.task is not None:
            parent = w.task.task_id
        if parent is not None and spec.kind == "task":   # (for cancel's recursive=True)
            self.children.setdefault(parent, []).append(spec)
        self.task_events.submitted_by(spec, w, parent)   # its parent task, for the state API
        self.submit(spec, fn_bytes)
        self._owned_by(spec, w)

    def _owned_by(self, spec: TaskSpec, w: WorkerProc) -> None:
        if spec.kind == "actor_create" and spec.actor_id in self.actors:
            self.actors[spec.actor_id].owner = w.index

    def _lend_cpu(self, w: WorkerProc) -> None:
        """A task blocked in get, wait or next gives its CPU back, so nested work cannot deadlock.
        An actor keeps what it holds, as in Ray (which releases CPUs for blocked tasks only)."""
        if w.actor is not None:
            return self._actor_blocked(w)
        if w.ahead:   # it may wait on the tasks queued behind it
            self._recall(w)
        if w.alloc is not None and not w.blocked:
            cpu = w.alloc.resources.get("CPU", 0)
            if cpu:
                w.alloc.pool.adjust("CPU", cpu)
                w.blocked = cpu
