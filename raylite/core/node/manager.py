"""The node manager, in the driver: the scheduler and the worker table here; beside it, in this package,
the loop and its commands (loop), how it fails (failures), the object table (object_table), the actors'
lifecycle (actors), the workers' output (output), its messages (worker_messages, task_messages), its workers' lifecycle
(worker_lifecycle), the tiny tasks sent ahead to busy workers (lines), cancel (cancellation), placement
groups (group_lifecycle) and streams (stream_serving). One lock guards all of it."""
from __future__ import annotations

import itertools
import selectors
import socket
import threading
import time
from collections import deque

from raylite import exceptions
from raylite.core.client import streams
from raylite.core.client.link import minted_by
from raylite.core.client.placement_group import PlacementGroup
from raylite.core.envs import runtime_env
from raylite.core.node.actors import ActorLifecycle
from raylite.core.node.cancellation import Cancellation
from raylite.core.node.env_setup import EnvSetup
from raylite.core.node.events import ClusterEvents, TaskEvents
from raylite.core.node.failures import NodeFailure
from raylite.core.node.group_lifecycle import GroupLifecycle
from raylite.core.node.lines import TaskLines
from raylite.core.node.groups import Groups
from raylite.core.node.loop import NodeLoop
from raylite.core.node.object_table import ObjectTable
from raylite.core.node.output import WorkerOutput
from raylite.core.node.reader import ProducerReading
from raylite.core.node.records import Actor, Waiter, WorkerProc
from raylite.core.node.segment_pool import SegmentPool
from raylite.core.node.stream_serving import StreamServing
from raylite.core.node.task_messages import TaskMessages
from raylite.core.node.worker_lifecycle import WorkerLifecycle, cannot_start, oom_kills
from raylite.core.node.worker_messages import WorkerMessages
from raylite.core.wire import protocol as P
from raylite.core.wire import segments, serialization
from raylite.core.wire.protocol import Channel, TaskSpec, spec_to_wire
from raylite.core.wire.resources import SCALE, NodeResources, from_fixed
from raylite.core.wire.serialization import error_value
from raylite.core.worker.zygote import Zygote

_GROUP_GONE = object()   # _acquire: the spec's placement group was removed


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


DEAD_WORKERS_KEPT = 1000   # list_workers shows the last ones that ended, as Ray keeps dead workers


class Node(NodeLoop, TaskLines, WorkerLifecycle, Cancellation, GroupLifecycle, StreamServing, ActorLifecycle, WorkerOutput,
           ProducerReading, EnvSetup, WorkerMessages, TaskMessages):
    def __init__(self, totals: dict[str, int], device_ids: dict[str, list[str]], session: str,
                 node_id: str, job_id: str, zygote: Zygote, job_env: tuple | None = None, namespace: str = "",
                 log_dir: str | None = None, logging: dict | None = None, labels: dict | None = None):
        self.res = NodeResources(totals, device_ids)
        self.groups = Groups(self.res, node_id)
        self.accel_resources = [r for r in device_ids if totals.get(r, 0) > 0]
        self.max_idle = max(1, -(-totals.get("CPU", 0) // SCALE))   # idle workers kept per device set
        self.session, self.node_id, self.job_id = session, node_id, job_id
        self.job_env = job_env   # init(runtime_env=...), under every task's and actor's own
        self.namespace = namespace   # the job's: named actors without one of their own live here
        self.log_dir = log_dir       # init(log_to_driver=False): worker output goes to files here
        self.logging = logging       # init(logging_config=...), as a dict each worker applies at start
        self.labels = labels or {"ray.io/node-id": node_id}   # (raylite.core.wire.labels)
        self.shm_prefix = segments.session_prefix(session)
        store = totals.get("object_store_memory", 0) // SCALE
        self.pool = segments.pool = SegmentPool(min(store // 4, 4 << 30))
        self.sel = selectors.DefaultSelector()
        self.commands: deque = deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._woken = False
        self.failure = NodeFailure(self._broken)
        self.sel.register(self._wake_r, selectors.EVENT_READ, self._on_wake)
        self.handlers = self._message_handlers()   # worker -> node messages, by kind
        self.functions: dict[str, bytes] = {}
        self.workers: dict[int, WorkerProc] = {}
        self.idle: dict[tuple, list[WorkerProc]] = {}
        self.queues: dict[tuple, deque[TaskSpec]] = {}
        self._feasible_seen: dict[int, tuple[dict, bool]] = {}   # see _feasible
        self.starting: set[int] = set()             # task workers forked, their hello not read yet
        self.unsent: dict[int, WorkerProc] = {}     # of those, whose task is not sent yet (see _take_unsent)
        self.producers: dict[int, TaskSpec] = {}   # first return id -> pending or running task
        self.arg_holders: set[int] = set()         # tasks whose arguments still hold their refs
        self.cancelled: set[int] = set()
        self.fn_time: dict[str, float] = {}        # function id -> typical run time (s)
        self.children: dict[int, list[TaskSpec]] = {}   # task id -> tasks it submitted (for cancel)
        self.actors: dict[int, Actor] = {}
        self.table = ObjectTable(self.actors, self._release_actor, self.workers,
                                 lambda index, names: self._send(self.workers[index], (P.FORGET, names)))
        self.named: dict[tuple[str, str], int] = {}   # (namespace, name) -> actor id
        self.task_events = TaskEvents()   # what tasks did, for the state API and timeline()
        self.cluster_events = ClusterEvents()   # what a user should hear of (list_cluster_events)
        self.runtime_envs: dict[tuple, list] = {}   # env -> [first used, setup error] (list_runtime_envs)
        self.dirty_channels: set[Channel] = set()
        self.dead_workers: deque = deque(maxlen=DEAD_WORKERS_KEPT)   # (index, pid, exit type, detail,
                                                                      #  launched, ended)
        self.oom_kills = oom_kills()   # the kernel's count, to tell an out-of-memory kill (_worker_gone)
        self.blocked_actors: set[int] = set()   # actor workers waiting in get with CPUs held (_actor_blocked)
        self.starved_check = None               # its pending timer, if any
        self.starved_warned = False
        self._init_readers()
        self._init_env_setup()
        self._init_output()
        self._worker_index = itertools.count(1)
        self.stopping = False
        self.lock = threading.Lock()      # held by whoever runs node code: the node thread or a caller
        self._node_busy = False           # the node thread holds the lock (and checks `commands` after)
        self.inline_thread: int | None = None   # the caller running node code now, if any
        self.held_interrupt = None              # Ctrl-C's handler, to run once that caller is done
        self._sigint = None
        self._hold_interrupts()
        self.zygote = zygote
        self.zygote_restarted = False   # see _fork
        self.zygote_since = 0.0
        self.thread = threading.Thread(target=self._loop, name="raylite-node", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------ submission
    def submit(self, spec: TaskSpec, fn_bytes: bytes | None) -> None:
        if fn_bytes is not None:
            self.functions.setdefault(spec.fn_id, fn_bytes)
        self.task_events.submitted(spec)
        self.table.new_entries(spec.return_ids)
        if spec.return_ids:
            self.producers[spec.return_ids[0]] = spec
        if spec.stream:
            self.table.streams[spec.return_ids[0]] = streams.Stream()
        if spec.deps:
            lost = next((dep for dep in spec.deps if dep not in self.table.objects), None)
            if lost is not None:   # (it holds nothing yet but its arguments' segments)
                self.table.retire_segments(spec.args)
                return self._finish(spec, error_value(exceptions.ObjectLostError(
                    f"argument {lost:028x} of {spec.name} was freed before the task ran")))
            self.table.hold(spec.deps)
        if spec.args.refs:
            self.table.hold(spec.args.refs)
        self.arg_holders.add(spec.task_id)
        if spec.kind == "actor_call":
            actor = self.actors.get(spec.actor_id)
            if actor is None or actor.state == "DEAD":
                return self._finish(spec, error_value(self._actor_died(actor, spec)))
            if spec.max_retries is None:
                spec.max_retries = actor.spec.max_retries   # the actor's max_task_retries
            actor.callers.add(minted_by(spec.task_id))
            actor.queue.append(spec)
            return self._pump_actor(actor)
        if spec.kind == "actor_create":
            actor = Actor(spec, spec.class_meta)
            actor.pinned = spec.detached   # lives on without handles (until killed or the driver ends)
            self.actors[spec.actor_id] = actor
        request = spec.schedule_request or spec.request
        message = spec.unschedulable   # (from its label selector, decided where it was submitted)
        if message is None and spec.placement is not None:
            why = self.groups.fits(spec.placement, spec.request)
            message = f"{spec.name} can never be scheduled: {why}" if why else None
        elif message is None and not self._feasible(request):
            message = (f"{spec.name} asks for {self.res.describe(request)} but this node has "
                       f"{self.res.describe(self.res.total)}; it can never be scheduled")
        if message:
            self.task_events.unschedulable(spec, message)
            self.cluster_events.add("WARNING", "AUTOSCALER", message, name=spec.name)
            self.table.mark_infeasible(spec.return_ids, message)
            if spec.kind == "actor_create":
                self.actors[spec.actor_id].state, self.actors[spec.actor_id].error = "DEAD", message
            return self._drop_args(spec)   # it never runs
        if spec.deps:
            self._when_env_ready(spec, lambda: self._when_deps_ready(spec, lambda: self._enqueue(spec)))
        elif spec.runtime_env is None and self.job_env is None:   # nothing to set up: the common task
            self._enqueue(spec)
        else:
            self._when_env_ready(spec, lambda: self._enqueue(spec))

    def _when_deps_ready(self, spec: TaskSpec, then) -> None:
        missing = self.table.missing(spec.deps)
        if not missing:
            return then()
        def resolved(_timed_out, waiter):
            if waiter.infeasible_reason or waiter.lost_id is not None:
                why = waiter.infeasible_reason or f"object {waiter.lost_id:028x} was freed"
                self._finish(spec, error_value(exceptions.RayTaskError(
                    spec.name, f"an argument of {spec.name} can never be computed: {why}")))
                actor = self.actors.get(spec.actor_id) if spec.kind == "actor_call" else None
                if actor is not None and spec in actor.queue:
                    actor.queue.remove(spec)
                    self._resume_actor(actor, spec.task_id)
                return
            then()
        self.table.add_waiter(Waiter(resolved), missing, None)

    def _feasible(self, request: dict) -> bool:
        """res.feasible, remembered per request dict: the calls of one remote function share its
        dict, and what this node has never changes while it runs."""
        known = self._feasible_seen.get(id(request))
        if known is not None and known[0] is request:
            return known[1]
        ok = self.res.feasible(request)
        if len(self._feasible_seen) > 1024:
            self._feasible_seen.clear()
        self._feasible_seen[id(request)] = (request, ok)
        return ok

    def _enqueue(self, spec: TaskSpec) -> None:
        if spec.task_id in self.cancelled or (spec.return_ids and self.producers.get(spec.return_ids[0]) is not spec):
            return   # cancelled, or already finished while it waited (cancelled waiting for its arguments)
        self.queues.setdefault(_queue_key(spec), deque()).append(spec)

    def _requeue(self, spec: TaskSpec) -> None:
        self.queues.setdefault(_queue_key(spec), deque()).appendleft(spec)

    def _schedule(self) -> None:
        if self.stopping:   # shutdown(): a task retried after its worker was killed starts nowhere
            return
        if self.groups.pending:
            for group in self.groups.place():   # ready() gives the group, as in Ray
                handle = PlacementGroup(group.pg_id, [{k: from_fixed(v) for k, v in b.items()} for b in group.bundles],
                                        group.ready_id)
                self.table.set_value(group.ready_id, serialization.dumps(handle, None))
        for key in list(self.queues):
            queue = self.queues[key]
            while queue:
                spec = queue[0]
                alloc = self._acquire(spec)
                if alloc is None:
                    break
                queue.popleft()
                if alloc is _GROUP_GONE:
                    self._group_gone(spec)
                    continue
                self._start(spec, alloc)
            if queue and queue[0].kind == "task":
                self._prefetch(queue)
            if not queue:
                del self.queues[key]

    def _acquire(self, spec: TaskSpec):
        """Resources for a queued spec from the node, or from its placement group's bundles."""
        if spec.placement is None:
            alloc = self.res.try_acquire(spec.schedule_request or spec.request)
            if alloc is not None and spec.schedule_request is not None:   # actors: placed with more
                self.res.release(alloc)                                   # than they hold
                alloc = self.res.try_acquire(spec.request)
            return alloc
        pools = self.groups.pools_for(spec.placement)
        if pools == []:
            return _GROUP_GONE
        for pool in pools or ():
            alloc = pool.try_acquire(spec.request)
            if alloc is not None:
                return alloc
        return None

    def _start(self, spec: TaskSpec, alloc) -> None:
        # a worker's environment is fixed at fork: reuse only one with the same devices and threads
        threads = max(1, alloc.resources.get("CPU", 0) // SCALE)
        env = runtime_env.merge(self.job_env, spec.runtime_env)
        key = (tuple(sorted((k, tuple(v)) for k, v in alloc.device_ids.items())), threads, env)
        if spec.kind == "actor_create":
            actor = self.actors[spec.actor_id]
            try:
                w = self._spawn(alloc.device_ids, key, env, restarted=actor.state == "RESTARTING")
            except OSError as e:
                alloc.pool.release(alloc)
                actor.restarts_left, actor.error = 0, cannot_start(e)
                return self._actor_gone(actor)
            w.actor, w.alloc, w.name = actor, alloc, spec.name
            actor.worker, actor.state = w, "ALIVE"
            self._run_on(w, spec)
            return self._pump_actor(actor)
        pool = self.idle.get(key, [])
        # reuse only a worker with calls to spare, so max_calls=1 always means a fresh process
        w = next((w for w in reversed(pool) if not spec.max_calls or w.calls < spec.max_calls), None)
        hold = False
        if w is not None:
            pool.remove(w)
        else:
            hold = bool(self.starting)   # see _take_unsent
            try:
                w = self._spawn(alloc.device_ids, key, env)
            except OSError as e:
                alloc.pool.release(alloc)
                return self._finish(spec, error_value(exceptions.RaySystemError(
                    f"{spec.name} could not run: a worker process could not start ({cannot_start(e)})")))
            self.starting.add(w.index)
        w.task, w.alloc, w.name, w.max_calls = spec, alloc, spec.name, spec.max_calls
        w.started = time.monotonic()
        if hold:
            self.unsent[w.index] = w
        else:
            self._run_on(w, spec)

    def _take_unsent(self, w: WorkerProc) -> bool:
        """Run on w, a worker just free, the task not sent yet to the worker that will start last.

        A burst of tasks forks a worker for each, and on a busy machine the last ones start tens of
        milliseconds after the first (8 on 2 CPUs: 25 ms). So while other workers are starting, a
        new one's task waits for its hello instead of being sent at once, and a reusable worker that
        is free first runs it: of 8 tasks sleeping 0-0.7 s, the 0.7 s one starts in the process that
        ran the 0 s one. The worker left without its task joins the idle ones."""
        if self.stopping or (w.max_calls and w.calls >= w.max_calls):
            return False
        victim = None
        for v in self.unsent.values():
            spec = v.task
            if (v.key == w.key and (not spec.max_calls or w.calls < spec.max_calls)
                    and (victim is None or v.index > victim.index)):
                victim = v
        if victim is None:
            return False
        spec, alloc = self._reclaim_unsent(victim)
        reader = self.readers.get(victim.index)
        if reader is not None:   # a thread waits reading the victim: it moves to w (raylite.core.node.reader)
            reader.moved = True
        w.task, w.alloc, w.name, w.max_calls = spec, alloc, spec.name, spec.max_calls
        w.started = time.monotonic()
        self._run_on(w, spec)
        return True

    def _reclaim_unsent(self, w: WorkerProc) -> tuple:
        """Take its unsent task (and the resources it holds) from a starting worker, which then
        joins the idle ones."""
        spec, alloc = w.task, w.alloc
        del self.unsent[w.index]
        w.task = w.alloc = None
        w.max_calls, w.name = 0, "worker"
        self._to_idle(w)
        return spec, alloc

    def _to_idle(self, w: WorkerProc) -> None:
        pool = self.idle.setdefault(w.key, [])
        if self.stopping or (w.max_calls and w.calls >= w.max_calls) or len(pool) >= self.max_idle:
            self._retire(w)
        else:
            pool.append(w)

    def _run_on(self, w: WorkerProc, spec: TaskSpec) -> None:
        fn_bytes = None
        if spec.fn_id and spec.fn_id not in w.functions:
            fn_bytes = self.functions[spec.fn_id]
            w.functions.add(spec.fn_id)
        deps = {d: self.table.objects[d].value for d in spec.deps}
        if deps or spec.args.buffers:   # the worker maps their segments: it must let go before reuse
            self.table.sent(w.index, (spec.args, *deps.values()))
        assigned, accel = w.alloc_on_wire()
        self._send(w, (P.RUN, spec_to_wire(spec), fn_bytes, {d: v.wire() for d, v in deps.items()} if deps else deps,
                       assigned, accel))
        self.task_events.sent(spec, w)

    def _finish(self, spec: TaskSpec, results) -> None:
        """Store a task's results (one value or a list) and drop its argument pins."""
        if spec.task_id in self.cancelled:   # cancel() came first: the caller gets the cancellation
            self.cancelled.discard(spec.task_id)
            if not (isinstance(results, list) and results and results[0].is_error):
                err = exceptions.TaskCancelledError(f"task {spec.name} was cancelled")
                if spec.kind == "actor_call":   # it ran in user code: a RayTaskError as well, as in Ray
                    err = exceptions.RayTaskError(spec.name, f"TaskCancelledError: {err}", err)
                results = error_value(err)
        self.task_events.finished(spec, results)
        if not isinstance(results, list):
            results = [results] * len(spec.return_ids)
        if spec.return_ids:
            self.producers.pop(spec.return_ids[0], None)
        self.children.pop(spec.task_id, None)
        for oid, value in zip(spec.return_ids, results):
            self.table.set_value(oid, value)
        stream = self.table.streams.get(spec.return_ids[0]) if spec.stream else None
        if stream is not None:
            stream.done, stream.failed = True, results[0].is_error
            self._answer(spec.return_ids[0], stream.wake())
        self._drop_args(spec)

    def _drop_args(self, spec: TaskSpec) -> None:
        """Release what a task's arguments held (once): its ref arguments and nested refs, and the
        segments of large arguments passed by value (which stayed in /dev/shm until shutdown)."""
        if spec.task_id in self.arg_holders:
            self.arg_holders.discard(spec.task_id)
            for oid in spec.deps + spec.args.refs:
                self.table.release(oid)
            self.table.retire_segments(spec.args)

    def state(self, what: str, detail: bool) -> tuple[list, int]:
        """Rows of the state API (raylite.core.node.snapshot), and how many task records were dropped."""
        from raylite.core.node import snapshot  # only when someone asks
        return snapshot.view(self, what, detail)

    def resource_view(self) -> tuple[dict, dict]:
        avail = self.res.available()
        return ({k: from_fixed(v) for k, v in self.res.total.items()},
                {k: from_fixed(v) for k, v in avail.items() if v > 0 or k not in ("CPU",) and v > 0})

    # ------------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        def begin():
            self.stopping = True
            for w in list(self.workers.values()):
                if w.task is None and w.actor is None:
                    self._retire(w)
        broken = self.failure.cause is not None   # then the node thread has ended: nothing to ask it
        if not broken:
            try:
                self.call_sync(begin)
            except Exception:  # noqa: BLE001 - shutting down regardless
                pass
        self._cancel_installs()
        self.zygote.close()            # kills every worker still running, removes segments
        if not broken and self.failure.cause is None:
            self.call(lambda: None)
        self.thread.join(5)
        self._release_interrupts()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and self._drain_output():
            pass
        if self.dedup is not None:   # the repeats still held, counted
            self._release_held(time.monotonic(), everything=True)
        segments.remove_session_segments(self.session)
        segments.pool = None
        for w in list(self.workers.values()):
            w.chan.close()
        self.sel.close()
        self._close_readers()
        self._wake_r.close()
        self._wake_w.close()


__all__ = ["Node", "SCALE"]
