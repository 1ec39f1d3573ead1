"""What tasks did, for the state API (raylite.util.state) and ``timeline()``: one small record per
task, actor creation and actor call, kept by the node manager (touched only under its lock).

The node calls a hook when a task is submitted, sent to a worker, and done (finished, failed,
never schedulable), and when an actor is dead. A hook is a dict operation, a clock read and a few
attribute stores: about a microsecond per task on the tiny-task path. Where an unfinished task
stands (waiting for arguments, for resources, running) is read off the node's own tables when
someone asks, and Ray's ids, names, units and error types are made then too
(raylite.core.node.snapshot).

Records of unfinished tasks, and the creation record of every actor not yet dead, are always
kept. Finished ones go into a ring of the last ``limit`` (Ray's setting
``RAY_task_events_max_num_task_in_gcs``, default 10,000 here); the oldest falls out first and is
counted in ``dropped``, which the state API reports as Ray reports
``num_status_task_events_dropped``. A finished record is one flat tuple of plain values (no dict,
no object), which Python's garbage collector stops tracking once it has seen it: the ring held
as objects made every collection during a batch of tiny tasks walk 10,000 of them again. It takes
about 0.3 KB (plus at most 1 KB of error text for a failed task), so 10,000 finished tasks hold
3-4 MB, 14 MB at most if all of them failed; ``records()`` makes TaskEvents of them again.
"""
from __future__ import annotations

import itertools
import os
import time
from collections import deque, namedtuple
from operator import attrgetter

from raylite import exceptions
from raylite.core.node.records import NextSection
from raylite.core.wire import serialization

LIMIT_ENV = "RAY_task_events_max_num_task_in_gcs"
DEFAULT_LIMIT = 10_000
ERROR_TEXT_MAX = 1000   # characters of an error's text kept (its end: the exception line)
_now = time.time

# Ray's TaskStatus names
PENDING_ARGS_AVAIL = "PENDING_ARGS_AVAIL"
PENDING_NODE_ASSIGNMENT = "PENDING_NODE_ASSIGNMENT"
SUBMITTED_TO_WORKER = "SUBMITTED_TO_WORKER"   # an actor call not started yet, or a task in a worker's line
RUNNING = "RUNNING"
FINISHED = "FINISHED"
FAILED = "FAILED"

# Ray's ErrorType for raylite's exceptions (the nearest class in the error's MRO)
_ERROR_TYPES = {"TaskCancelledError": "TASK_CANCELLED", "WorkerCrashedError": "WORKER_DIED",
                "ActorDiedError": "ACTOR_DIED", "ObjectLostError": "DEPENDENCY_RESOLUTION_FAILED",
                "InfeasibleTaskError": "TASK_UNSCHEDULABLE_ERROR", "OutOfMemoryError": "OUT_OF_MEMORY",
                "RayTaskError": "TASK_EXECUTION_EXCEPTION"}


# What a finished task's record keeps of its spec (not its arguments, which may be large)
Facts = namedtuple("Facts", "kind task_id name actor_id actor_name return_ids request placement")
_facts = attrgetter(*Facts._fields)
_created = attrgetter("created")


# TaskEvent.parent of a task submitted where the node cannot tell by which task: a thread of a
# worker between tasks, or an actor running several calls at once
UNKNOWN_PARENT = -1


class TaskEvent:
    """One task. `spec` is its TaskSpec until it is done, then its Facts; `proc` is the
    worker it was sent to (its pid arrives with the worker's hello), then that worker's (index,
    pid); `state` is None until it is done (meanwhile it is read off the node's own tables);
    `parent` is the id of the task that submitted it, None for the driver; `log`, with output going
    to log files, is where the latest attempt's lines are there once it has run (Ray's task_log_info)."""

    __slots__ = ("spec", "created", "started", "ended", "proc", "attempt", "state", "error_type", "error",
                 "death", "parent", "log")

    def __init__(self, spec, now: float):
        self.spec, self.created = spec, now
        self.started = self.ended = self.proc = self.state = self.error_type = self.error = self.death = None
        self.parent = self.log = None
        self.attempt = 0

    def facts(self):
        """The spec's fields the readers use: the TaskSpec itself, or its Facts once done."""
        return self.spec

    def worker_pid(self) -> tuple[int | None, int | None]:
        """(worker index, pid) of the worker it ran on, if any."""
        proc = self.proc
        if proc is None:
            return None, None
        return proc if type(proc) is tuple else (proc.index, proc.pid)


class TaskEvents:
    def __init__(self, limit: int | None = None):
        self.limit = limit if limit is not None else configured_limit()
        self.live: dict[int, TaskEvent] = {}
        self.done: deque[tuple] = deque(maxlen=self.limit)   # finished records, flat (see _retire)
        self.dropped = 0
        self.free_at: dict[int, float] = {}   # one-call-at-a-time actors: when their last call ended
        self.started_at = time.time()
        self.submitter: tuple[int, int] | None = None   # (task id, its parent) from submitted_by
        self.ending = NextSection()   # (spec, results, when) of tasks finished, not recorded yet: see age
        self._last_request: dict | None = None   # _retire's last spec request, and its _flat form
        self._last_flat: tuple = ()

    # -- hooks (node thread) --
    def submitted_by(self, spec, w, parent: int | None = None) -> None:
        """spec, about to be submitted, comes from worker w: its parent is the call that submits
        it, as the worker says, while that call runs; else the task w runs now. Keyed by spec's
        id, so a submission that does not happen (a named actor's name taken) leaves nothing for
        the next one."""
        self.settle()
        self.submitter = (spec.task_id, parent if parent in self.live else self._running_on(w))

    def _running_on(self, w) -> int:
        actor = w.actor
        if actor is None:
            return w.task.task_id if w.task is not None else UNKNOWN_PARENT
        creation = self.live.get(actor.spec.task_id)
        if creation is not None and creation.state is None:   # its constructor runs
            return actor.spec.task_id
        calls = actor.inflight   # sent to the actor, in order: a one-at-a-time actor runs the first
        if len(calls) == 1 or (calls and actor.spec.actor_id in self.free_at):
            return next(iter(calls))
        return UNKNOWN_PARENT

    def submitted(self, spec) -> None:
        rec = self.live[spec.task_id] = TaskEvent(spec, _now())
        submitter = self.submitter
        if submitter is not None and submitter[0] == spec.task_id:
            rec.parent = submitter[1]
        if spec.kind == "actor_create" and spec.max_concurrency <= 1 and not spec.concurrency_groups:
            self.free_at[spec.actor_id] = 0.0

    def logged(self, spec, pid: int, span: tuple) -> None:
        """Where the attempt that just ran wrote its output in worker-<pid>.out and .err: (stdout's
        start and end offsets, stderr's), as Ray's task_log_info has them."""
        rec = self.live.get(spec.task_id)
        if rec is not None:
            rec.log = {"stdout_file": f"worker-{pid}.out", "stderr_file": f"worker-{pid}.err",
                       **dict(zip(("stdout_start", "stdout_end", "stderr_start", "stderr_end"), span))}

    def sent(self, spec, w) -> None:
        """spec went to worker w. It runs now unless it waits behind w's running task (a tiny task
        sent ahead: it starts, and `sent` is called again, when that one is done); an actor call
        runs when the actor gets to it."""
        if w.ahead and w.ahead[-1] is spec:
            return
        rec = self.live.get(spec.task_id)
        if rec is None:
            return
        if rec.started is not None:   # it ran before: a retry, or an actor's restart
            rec.attempt += 1
            rec.state = rec.error_type = rec.error = rec.log = None
        rec.started, rec.ended, rec.proc = _now(), None, w

    def finished(self, spec, results) -> None:
        """The task's result (a list, or one value for all returns) is stored. Recorded at the end
        of the next locked section (see age), or before anything reads the records (settle)."""
        self.ending.add((spec, results, _now()))

    def age(self) -> None:
        """At the end of each locked section: record what finished before it (NextSection). A
        result's get so returns without waiting for its record."""
        for item in self.ending.age():
            self._finished(*item)

    def settle(self) -> None:
        """Record every task finished so far: before any reading or other hook that may concern them."""
        for item in self.ending.take_all():
            self._finished(*item)

    def _finished(self, spec, results, now: float) -> None:
        rec = self.live.pop(spec.task_id, None)
        if rec is None:
            return
        value = results if type(results) is not list else results[0] if results else None
        if value is not None and value.is_error:
            rec.state = FAILED
            rec.error_type, rec.error = error_of(value)
        else:
            rec.state = FINISHED
        if spec.actor_id and rec.started is not None:
            free = self.free_at.get(spec.actor_id)
            if free is not None:   # a call waits in the actor's process for the constructor and calls before it
                rec.started = max(rec.started, free)
                self.free_at[spec.actor_id] = now
        rec.ended = now
        if spec.kind == "actor_create":   # kept with the actor until it is dead
            self.live[spec.task_id] = rec
        else:
            self._retire(rec)

    def unschedulable(self, spec, message: str) -> None:
        """The node can never run it (infeasible, or its placement group cannot hold it)."""
        self.settle()
        rec = self.live.pop(spec.task_id, None)
        if rec is None:
            return
        creation = spec.kind == "actor_create"
        rec.state, rec.ended, rec.error = FAILED, _now(), _clip(message)
        rec.error_type = "ACTOR_UNSCHEDULABLE_ERROR" if creation else "TASK_UNSCHEDULABLE_ERROR"
        if creation:
            rec.death = ("UNSCHEDULABLE", rec.error)
            self.free_at.pop(spec.actor_id, None)
        self._retire(rec)

    def actor_dead(self, actor) -> None:
        """The actor is dead for good: its creation record joins the finished ones."""
        self.settle()
        self.free_at.pop(actor.spec.actor_id, None)
        rec = self.live.pop(actor.spec.task_id, None)
        if rec is None:
            return
        if rec.state is None:   # it never finished constructing
            rec.state, rec.ended, rec.error_type = FAILED, _now(), "ACTOR_DIED"
            rec.error = _clip(actor.error or "the actor died before its constructor finished")
        rec.death = death_of(actor, rec)
        self._retire(rec)

    def _retire(self, rec: TaskEvent) -> None:
        """Into the ring as a flat tuple of plain values (see the module's doc; `_revive` reads it):
        a dict, or a tuple made after its own items, in it would keep the collector tracking it."""
        kind, task_id, name, actor_id, actor_name, return_ids, request, placement = _facts(rec.spec)
        if request is not self._last_request:   # most records share their function's request
            self._last_request, self._last_flat = request, _flat(request)
        proc, log = rec.proc, rec.log
        if len(self.done) == self.limit:
            self.dropped += 1
        self.done.append((kind, task_id, name, actor_id, actor_name, return_ids, self._last_flat, placement,
                          rec.created, rec.started, rec.ended, None if proc is None else proc.index,
                          None if proc is None else proc.pid, rec.attempt, rec.state, rec.error_type, rec.error,
                          rec.death, rec.parent, None if log is None else _flat(log)))

    # -- reading (node thread) --
    def records(self) -> list[TaskEvent]:
        """Every record kept, oldest submission first."""
        self.settle()
        return sorted([*map(_revive, self.done), *self.live.values()], key=_created)


def _flat(mapping: dict) -> tuple:
    """(key, value, key, value, ...): a dict as one tuple of plain values."""
    return tuple(itertools.chain.from_iterable(mapping.items()))


def _revive(kept: tuple) -> TaskEvent:
    """A finished record's TaskEvent again, from its tuple in the ring (TaskEvents._retire)."""
    rec = TaskEvent.__new__(TaskEvent)
    (kind, task_id, name, actor_id, actor_name, return_ids, request, placement, rec.created, rec.started,
     rec.ended, index, pid, rec.attempt, rec.state, rec.error_type, rec.error, rec.death, rec.parent, log) = kept
    rec.spec = Facts(kind, task_id, name, actor_id, actor_name, return_ids,
                     dict(zip(request[::2], request[1::2])), placement)
    rec.proc = None if index is None else (index, pid)
    rec.log = None if log is None else dict(zip(log[::2], log[1::2]))
    return rec


def configured_limit() -> int:
    value = os.environ.get(LIMIT_ENV, "")
    try:
        limit = int(value) if value else DEFAULT_LIMIT
    except ValueError:
        raise ValueError(f"{LIMIT_ENV} must be a whole number of tasks, got {value!r}") from None
    if limit < 0:
        raise ValueError(f"{LIMIT_ENV} must be >= 0, got {limit}")
    return limit


def error_of(value) -> tuple[str, str]:
    """(Ray's ErrorType, the error's text) of a failed task's stored error."""
    try:
        err = serialization.loads(value)
    except Exception as e:  # noqa: BLE001 - say so in the record instead
        return "TASK_EXECUTION_EXCEPTION", f"(its error could not be read in the driver: {e!r})"
    text = _clip(str(err))
    for cls in type(err).__mro__:
        if cls.__name__ in _ERROR_TYPES:
            return _ERROR_TYPES[cls.__name__], text
    if isinstance(err, exceptions.RayError) and "placement group" in text:
        return "TASK_PLACEMENT_GROUP_REMOVED", text
    return "TASK_EXECUTION_EXCEPTION", text


def death_of(actor, rec: TaskEvent | None) -> tuple[str, str]:
    """(reason, message) of an actor's death: Ray's ActorDiedErrorContext reason, or
    CREATION_FAILED (its constructor raised) / UNSCHEDULABLE."""
    if rec is not None and rec.error_type == "TASK_EXECUTION_EXCEPTION":
        return "CREATION_FAILED", rec.error
    if rec is not None and rec.death is not None:
        return rec.death
    why = actor.error
    if why is None:
        if actor.exit_when_idle:
            return "OUT_OF_SCOPE", "all references to the actor were removed"
        return "WORKER_DIED", "the actor's worker process died unexpectedly"
    return ("RAY_KILL" if "kill()" in why else "UNSPECIFIED"), _clip(why)


def _clip(text: str) -> str:
    return text if len(text) <= ERROR_TEXT_MAX else "..." + text[-ERROR_TEXT_MAX:]


class ClusterEvents:
    """What happened to the node that a user should hear of (Ray's ``list_cluster_events``): a
    worker that died unexpectedly (ERROR when the kernel's out-of-memory killer ended it), work
    that can never be scheduled, a runtime_env that could not be set up. The last ``limit`` are
    kept."""

    def __init__(self, limit: int = 1000):
        self.kept: deque = deque(maxlen=limit)
        self._ids = itertools.count(1)

    def add(self, severity: str, source: str, message: str, **custom) -> None:
        self.kept.append((next(self._ids), _now(), severity, source, message, custom))

    def rows(self, detail: bool) -> list[dict]:
        import datetime
        rows = []
        for event_id, when, severity, source, message, custom in self.kept:
            row = {"severity": severity, "time": str(datetime.datetime.fromtimestamp(int(when))),
                   "source_type": source, "message": message, "event_id": f"{event_id:036x}"}
            if detail:
                row["custom_fields"] = custom
            rows.append(row)
        return rows
