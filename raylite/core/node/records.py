"""Records the node manager keeps: worker processes, actors, object entries and waiters."""
from __future__ import annotations

import time
from collections import deque

from raylite.core.wire.protocol import Channel, Progress, TaskSpec
from raylite.core.wire.resources import from_fixed


class WorkerProc:
    """A worker process as the driver sees it."""

    __slots__ = ("index", "chan", "key", "out_fd", "err_fd", "pid", "task", "alloc", "actor", "name",
                 "calls", "max_calls", "blocked", "functions", "signal_on_hello", "partial", "ahead", "started",
                 "recalling", "retiring", "early_output", "exit_cause", "launched", "progress", "alloc_wire")

    def __init__(self, index: int, chan: Channel, key: tuple, out_fd: int, err_fd: int):
        self.index, self.chan, self.key = index, chan, key
        self.out_fd, self.err_fd = out_fd, err_fd
        self.pid: int | None = None
        self.task: TaskSpec | None = None     # the task it runs (task workers)
        self.alloc = None                     # resources it holds
        self.actor: Actor | None = None       # the actor it hosts (actor workers)
        self.name = "worker"                  # prefix for its output lines
        self.calls = 0
        self.max_calls = 0
        self.blocked = 0                      # CPU units lent back while it waits in get/wait
        self.functions: set[str] = set()      # function ids already sent to it
        self.signal_on_hello = 0   # a signal asked for before the worker's pid was known
        self.partial: dict[int, bytes] = {}   # unfinished output line per pipe
        self.ahead: deque[TaskSpec] = deque()   # tiny tasks sent ahead, run in turn once `task` is done
        self.started = 0.0                    # when `task` was sent
        self.recalling: set[int] = set()      # ids of those asked back (it blocked in get), not answered yet
        self.retiring = False                 # told to exit: its end is no crash
        self.early_output: list = []          # (stream, lines) it wrote before its pid was known
        self.exit_cause: tuple | None = None  # (Ray's exit type, detail) once its end was asked for
        self.launched = time.time()
        self.progress: Progress | None = None   # how many tasks it has begun, shared with it
        self.alloc_wire: tuple | None = None    # (alloc, its resources and device ids as RUN sends them)

    def alloc_on_wire(self) -> tuple[dict, dict]:
        """Its resources and device ids as RUN sends them, kept while its alloc is the same (the
        tasks of a line share them) or an equal one (a worker's tasks one after another: each has
        its own alloc)."""
        alloc, held = self.alloc, self.alloc_wire
        if held is None or held[0] is not alloc:
            last = held[0] if held is not None else None
            if (alloc is not None and last is not None and alloc.resources == last.resources
                    and alloc.device_ids == last.device_ids):
                held = self.alloc_wire = (alloc, held[1], held[2])
            else:
                held = self.alloc_wire = (alloc, {k: from_fixed(v) for k, v in alloc.resources.items()} if alloc else {},
                                          {r: list(ids) for r, ids in alloc.device_ids.items() if ids} if alloc else {})
        return held[1], held[2]


class NextSection:
    """Items held until the end of the locked section after the one that added them (Loop.step
    ages them after its flush): node work that need not come between a result and its get's
    return, done once the next section's messages went out, most often while the next task runs."""

    __slots__ = ("due", "fresh")

    def __init__(self):
        self.due: list = []     # added before the section now running: due at its end
        self.fresh: list = []   # added in it: due at the end of the next

    def add(self, item) -> None:
        self.fresh.append(item)

    def age(self) -> list:
        """At the end of a section: what is due now; what this section added becomes due next."""
        due, self.due, self.fresh = self.due, self.fresh, []
        return due

    def discard(self, w) -> None:
        """Drop the items of worker w (items whose first field is it)."""
        if self.due:
            self.due = [item for item in self.due if item[0] is not w]
        if self.fresh:
            self.fresh = [item for item in self.fresh if item[0] is not w]

    def take_all(self) -> list:
        """Everything held, oldest first, now (before anything that must see it done)."""
        items, self.due, self.fresh = self.due + self.fresh, [], []
        return items


class Actor:
    __slots__ = ("spec", "worker", "state", "queue", "inflight", "restarts_left", "error", "refs",
                 "pinned", "exit_when_idle", "waiting_deps", "class_meta", "owner", "callers")

    def __init__(self, spec: TaskSpec, class_meta=None):
        self.spec = spec
        self.worker = None
        self.state = "PENDING"          # PENDING -> ALIVE -> (RESTARTING -> ALIVE)* -> DEAD
        self.queue: deque[TaskSpec] = deque()   # calls not yet sent, in submission order
        self.inflight: dict[int, TaskSpec] = {}
        self.restarts_left = spec.max_restarts
        self.error: str | None = None
        self.refs = 1
        self.pinned = False
        self.exit_when_idle = False
        self.waiting_deps: set[int] = set()   # calls whose arguments a waiter is registered for
        self.class_meta = class_meta
        self.owner = 0   # index of the worker whose code created it (0: the driver)
        self.callers: set[int] = set()   # indexes of the processes that called it (see ActorLifecycle.pump_actor)


class ObjectEntry:
    __slots__ = ("value", "refs", "pinned", "waiters", "infeasible")

    def __init__(self, value=None):
        self.value = value             # Serialized once ready
        self.refs = 1                  # live ObjectRefs plus tasks using it as an argument
        self.pinned = False            # a ref escaped by pickling: keep until shutdown
        self.waiters: list[Waiter] | tuple = ()   # a list once one waits: most objects never get a waiter
        self.infeasible: str | None = None


class Waiter:
    """Fires its callback once enough of its objects are ready, or on timeout, loss or infeasibility.

    Only the node thread touches a waiter; `arm` counts what was ready when it was registered.
    """

    __slots__ = ("want", "needed", "callback", "done", "armed", "is_get", "infeasible_reason", "lost_id",
                 "entries", "fail_fast", "failed")

    def __init__(self, callback, want: int | None = None, fail_fast: bool = False):
        self.want = want                 # None: all of them (get); else num_returns (wait)
        self.is_get = want is None       # for get, an infeasible or lost object ends the wait
        self.fail_fast = fail_fast       # a get(): an object holding an error ends the wait, as in Ray
        self.failed = False              # (it did)
        self.needed = 0
        self.callback = callback
        self.done = False
        self.armed = False
        self.infeasible_reason: str | None = None
        self.lost_id: int | None = None
        self.entries: list[ObjectEntry] = []   # whose `waiters` it is in

    def arm(self, ready: int, total: int) -> None:
        self.needed = (total if self.want is None else min(self.want, total)) - ready
        self.armed = True
        self._check()

    def hit(self) -> None:
        if self.armed:
            self.needed -= 1
            self._check()

    def _check(self) -> None:
        if not self.done and (self.needed <= 0 or self.infeasible_reason or self.lost_id is not None or self.failed):
            self._fire(False)

    def infeasible(self, reason: str) -> None:
        if self.is_get:
            self.infeasible_reason = reason
            if self.armed:
                self._check()

    def error(self) -> None:
        """An object it waits for holds an error (a task's exception, a dead actor or worker)."""
        if self.fail_fast:
            self.failed = True

    def lost(self, oid: int) -> None:
        if self.is_get:
            self.lost_id = oid

    def expire(self) -> None:
        if not self.done:
            self._fire(True)

    def _fire(self, timed_out: bool) -> None:
        self.done = True
        for entry in self.entries:   # a wait() that times out, or needs only some, must not stay
            if self in entry.waiters:   # on the others (a trainer polls its workers' refs for days)
                entry.waiters.remove(self)
        self.entries = []
        self.callback(timed_out, self)
