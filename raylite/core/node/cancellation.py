"""ray.cancel on the node: a queued task ends at once, a running one is interrupted (SIGINT,
again if the signal came too early) or killed (force=True), its children with it (recursive)."""
from __future__ import annotations

import signal
from typing import Protocol

from raylite import exceptions
from raylite.core.node.records import WorkerProc
from raylite.core.node.state import NodeState
from raylite.core.node.worker_lifecycle import send_signal
from raylite.core.wire import protocol as P
from raylite.core.wire.protocol import TaskSpec
from raylite.core.wire.serialization import error_value

# A cancel's SIGINT can be lost: one that lands just before the task blocks in a system call (a
# sleep, a read) only marks Python's flag, which it checks once that call returns. So while the task
# runs on, the node sends it again after these delays; the worker raises KeyboardInterrupt once
# per task whatever it gets (a task that catches it to clean up is not interrupted again).
RESIGNAL_S = (0.05, 0.2, 1.0)


class _Resignal:
    """A timer (see ObjectTable.add_timer) that interrupts a cancelled task again."""

    __slots__ = ("cancels", "worker", "spec", "tries", "done")

    def __init__(self, cancels: Cancellation, worker: WorkerProc, spec: TaskSpec):
        self.cancels, self.worker, self.spec, self.tries, self.done = cancels, worker, spec, 0, False

    def expire(self) -> None:
        self.cancels.resignal(self)


class Finishes(Protocol):
    def finish(self, spec: TaskSpec, results) -> None: ...


class Sends(Protocol):
    def send(self, w: WorkerProc, msg) -> None: ...


class Reclaims(Protocol):
    def reclaim_unsent(self, w: WorkerProc) -> tuple: ...


class Recalls(Protocol):
    def recall(self, w: WorkerProc, only: TaskSpec | None = None) -> None: ...


class Cancellation:
    def __init__(self, state: NodeState, dispatch: Finishes, loop: Sends, scheduler: Reclaims, lines: Recalls):
        self.s, self.dispatch, self.loop, self.scheduler, self.lines = state, dispatch, loop, scheduler, lines

    def cancel(self, oid: int, force: bool, recursive: bool = True) -> None:
        s = self.s
        spec = s.producers.get(oid)
        if spec is None:
            return
        s.cancelled.add(spec.task_id)
        if recursive:   # tasks it submitted would otherwise run on, holding their resources
            for child in s.children.pop(spec.task_id, ()):
                if child.return_ids:
                    self.cancel(child.return_ids[0], force, True)
        error = error_value(exceptions.TaskCancelledError(f"task {spec.name} was cancelled"))
        for queue in s.queues.values():
            if spec in queue:
                queue.remove(spec)
                return self.dispatch.finish(spec, error)
        if spec.kind == "actor_call":
            actor = s.actors.get(spec.actor_id)
            if actor is not None and spec in actor.queue:
                actor.queue.remove(spec)
                self.dispatch.finish(spec, error)
            elif actor is not None and actor.worker is not None and spec.task_id in actor.inflight:
                self.loop.send(actor.worker, (P.CANCEL_CALL, spec.task_id))   # async actors stop it
                if next(iter(actor.inflight)) == spec.task_id:   # a one-at-a-time actor runs it now:
                    send_signal(actor.worker, signal.SIGUSR1)   # its is_canceled() turns true
            return
        w = next((w for w in s.workers.values() if w.task is spec or spec in w.ahead), None)
        if w is None:   # still waiting for its arguments
            return self.dispatch.finish(spec, error)
        if w.index in s.unsent:   # not sent to its starting worker yet
            _, alloc = self.scheduler.reclaim_unsent(w)
            alloc.pool.release(alloc)
            return self.dispatch.finish(spec, error)
        if w.task is not spec:   # sent ahead: asked back (if it has started, it ends cancelled)
            return self.lines.recall(w, spec)
        if force:
            w.exit_cause = ("INTENDED_USER_EXIT", f"ray.cancel(force=True) of {spec.name} killed it")
        send_signal(w, signal.SIGKILL if force else signal.SIGINT)
        if not force:
            s.table.add_timer(RESIGNAL_S[0], _Resignal(self, w, spec))

    def resignal(self, timer: _Resignal) -> None:
        s = self.s
        w, spec = timer.worker, timer.spec
        if w.task is spec and spec.task_id in s.cancelled and w.index in s.workers:
            send_signal(w, signal.SIGINT)
            timer.tries += 1
            if timer.tries < len(RESIGNAL_S):
                s.table.add_timer(RESIGNAL_S[timer.tries], timer)

    def msg_interrupt_missed(self, w: WorkerProc, task_id: int) -> None:
        """The worker got a cancel's SIGINT before it started this task: if that was for it, again."""
        s = self.s
        if w.task is not None and w.task.task_id == task_id and task_id in s.cancelled:
            send_signal(w, signal.SIGINT)
