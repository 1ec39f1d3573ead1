"""Lines of tiny tasks sent ahead to a busy worker, several per write, which it runs
in turn on the resources of the task it runs (they pass on unchanged), and asking them back."""
from __future__ import annotations

from collections import deque
from typing import Protocol

from raylite.core.node.records import WorkerProc
from raylite.core.node.state import NodeState
from raylite.core.wire import protocol as P
from raylite.core.wire.protocol import TaskSpec

PREFETCH_BELOW_S = 0.002   # tasks whose function runs faster than this are pipelined to busy workers,
PREFETCH_MAX = 64          # this many at most ahead of each (and no more than this long of work)


def _runs_like(spec: TaskSpec, running: TaskSpec) -> bool:
    """Whether spec may run on the worker and resources of `running`: one queue holds calls of
    several functions and runtime_envs (it is keyed by request and placement only)."""
    return (spec.fn_id == running.fn_id and spec.request == running.request
            and spec.runtime_env == running.runtime_env and spec.placement == running.placement)


class Dispatches(Protocol):
    def send_ahead(self, w: WorkerProc, specs: list[TaskSpec]) -> None: ...
    def finish(self, spec: TaskSpec, results) -> None: ...
    def requeue(self, spec: TaskSpec) -> None: ...


class Sends(Protocol):
    def send(self, w: WorkerProc, msg) -> None: ...


class TaskLines:
    def __init__(self, state: NodeState, dispatch: Dispatches, loop: Sends):
        self.s, self.dispatch, self.loop = state, dispatch, loop

    def prefetch(self, queue: deque) -> None:
        """Send queued tiny tasks ahead to workers busy with the same function, so each starts
        without a round trip through this thread, and several go in one write. A worker holds up
        to PREFETCH_MAX of them, and no more than PREFETCH_BELOW_S of their usual run time (so an
        idle worker is never left with nothing while another has a long line); they run one at a time on the resources of the
        task before, which pass on unchanged: no task ahead holds resources of its own. A line is
        topped up once it is half gone, so each write carries several."""
        s = self.s
        fn_id = queue[0].fn_id
        typical = s.fn_time.get(fn_id, 1.0)
        if typical > PREFETCH_BELOW_S:
            return
        window = min(PREFETCH_MAX, max(1, int(PREFETCH_BELOW_S / max(typical, 1e-6))))
        for w in s.workers.values():
            if not queue or queue[0].fn_id != fn_id:
                return
            t = w.task
            if (t is None or len(w.ahead) > window // 2 or w.blocked or w.recalling or w.index in s.unsent
                    or not _runs_like(queue[0], t)):
                continue
            room = window - len(w.ahead)
            if w.max_calls:   # its last call must be one it was sent
                room = min(room, w.max_calls - w.calls - 1 - len(w.ahead))
            line = []
            while room > 0 and queue and _runs_like(queue[0], t):
                line.append(queue.popleft())
                room -= 1
            self.dispatch.send_ahead(w, line)

    def recall(self, w: WorkerProc, only: TaskSpec | None = None) -> None:
        """Ask for the tasks sent ahead to w back (or just `only`), last first: each given back
        goes to the front of its queue, so they keep their order."""
        for spec in reversed(w.ahead) if only is None else (only,):
            if spec.task_id not in w.recalling:
                w.recalling.add(spec.task_id)
                self.loop.send(w, (P.UNPREFETCH, spec.task_id))

    def msg_unprefetched(self, w: WorkerProc, task_id: int, found: bool) -> None:
        s = self.s
        w.recalling.discard(task_id)
        spec = next((s for s in w.ahead if s.task_id == task_id), None) if found else None
        if spec is not None:
            w.ahead.remove(spec)
            if spec.task_id in s.cancelled:
                self.dispatch.finish(spec, [])
            else:
                self.dispatch.requeue(spec)
