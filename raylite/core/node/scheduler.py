"""Scheduling: a submitted task or actor checked (can it ever run here?), held until its
runtime_env and arguments are ready, queued, then given resources (the node's, or its placement
group's) and a worker: an idle one with the same devices, threads and runtime_env, or a new one."""
from __future__ import annotations

import time
from typing import Protocol

from raylite import exceptions
from raylite.core.client import streams
from raylite.core.client.link import minted_by
from raylite.core.envs import runtime_env
from raylite.core.node.records import Actor, WorkerProc
from raylite.core.node.state import NodeState
from raylite.core.node.worker_lifecycle import cannot_start
from raylite.core.wire.protocol import TaskSpec
from raylite.core.wire.resources import SCALE
from raylite.core.wire.serialization import error_value

_GROUP_GONE = object()   # acquire: the spec's placement group was removed


class Dispatches(Protocol):
    def enqueue(self, spec: TaskSpec) -> None: ...
    def run_on(self, w: WorkerProc, spec: TaskSpec) -> None: ...
    def finish(self, spec: TaskSpec, results) -> None: ...
    def drop_args(self, spec: TaskSpec) -> None: ...
    def to_idle(self, w: WorkerProc) -> None: ...
    def when_deps_ready(self, spec: TaskSpec, then, lost=None) -> None: ...


class Spawns(Protocol):
    def spawn(self, device_ids: dict, key: tuple, env: tuple | None, restarted: bool = False) -> WorkerProc: ...


class RunsActors(Protocol):
    def pump_actor(self, actor: Actor) -> None: ...
    def actor_died(self, actor: Actor | None, spec: TaskSpec) -> exceptions.ActorDiedError: ...
    def actor_gone(self, actor: Actor) -> None: ...


class SetsUpEnvs(Protocol):
    def when_env_ready(self, spec: TaskSpec, then) -> None: ...


class EndsGroupWork(Protocol):
    def group_gone(self, spec: TaskSpec) -> None: ...


class Prefetches(Protocol):
    def prefetch(self, queue) -> None: ...


class Scheduler:
    def __init__(self, state: NodeState, dispatch: Dispatches, procs: Spawns, actor_ops: RunsActors,
                 envs: SetsUpEnvs, placement: EndsGroupWork, lines: Prefetches):
        self.s, self.dispatch, self.procs, self.actor_ops = state, dispatch, procs, actor_ops
        self.envs, self.placement, self.lines = envs, placement, lines

    def submit(self, spec: TaskSpec, fn_bytes: bytes | None):
        """Take a task, an actor's creation or an actor call. SETTLED (raylite.core.node.state) when
        it only joined a queue behind tasks that could not start: no resources, workers or lines
        changed, so the scheduling pass that follows a command would find nothing to do; a burst of
        submits then costs no pass each."""
        s = self.s
        if fn_bytes is not None:
            s.functions.setdefault(spec.fn_id, fn_bytes)
        s.task_events.submitted(spec)
        s.table.new_entries(spec.return_ids)
        if spec.return_ids:
            s.producers[spec.return_ids[0]] = spec
        if spec.stream:
            s.table.streams[spec.return_ids[0]] = streams.Stream()
        if spec.deps:
            lost = next((dep for dep in spec.deps if dep not in s.table.objects), None)
            if lost is not None:   # (it holds nothing yet but its arguments' segments)
                s.table.retire_segments(spec.args)
                return self.dispatch.finish(spec, error_value(exceptions.ObjectLostError(
                    f"argument {lost:028x} of {spec.name} was freed before the task ran")))
            s.table.hold(spec.deps)
        if spec.args.refs:
            s.table.hold(spec.args.refs)
        s.arg_holders.add(spec.task_id)
        if spec.kind == "actor_call":
            actor = s.actors.get(spec.actor_id)
            if actor is None or actor.state == "DEAD":
                return self.dispatch.finish(spec, error_value(self.actor_ops.actor_died(actor, spec)))
            if spec.max_retries is None:
                spec.max_retries = actor.spec.max_retries   # the actor's max_task_retries
            actor.callers.add(minted_by(spec.task_id))
            actor.queue.append(spec)
            return self.actor_ops.pump_actor(actor)
        if spec.kind == "actor_create":
            actor = Actor(spec, spec.class_meta)
            actor.pinned = spec.detached   # lives on without handles (until killed or the driver ends)
            s.actors[spec.actor_id] = actor
        request = spec.schedule_request or spec.request
        message = spec.unschedulable   # (from its label selector, decided where it was submitted)
        if message is None and spec.placement is not None:
            why = s.groups.fits(spec.placement, spec.request)
            message = f"{spec.name} can never be scheduled: {why}" if why else None
        elif message is None and not self.feasible(request):
            message = (f"{spec.name} asks for {s.res.describe(request)} but this node has "
                       f"{s.res.describe(s.res.total)}; it can never be scheduled")
        if message:
            s.task_events.unschedulable(spec, message)
            s.cluster_events.add("WARNING", "AUTOSCALER", message, name=spec.name)
            s.table.mark_infeasible(spec.return_ids, message)
            if spec.kind == "actor_create":
                s.actors[spec.actor_id].state, s.actors[spec.actor_id].error = "DEAD", message
            return self.dispatch.drop_args(spec)   # it never runs
        if spec.deps:
            self.envs.when_env_ready(spec, lambda: self.dispatch.when_deps_ready(spec, lambda: self.dispatch.enqueue(spec)))
        elif spec.runtime_env is None and s.job_env is None:   # nothing to set up: the common task
            return self.dispatch.enqueue(spec)
        else:
            self.envs.when_env_ready(spec, lambda: self.dispatch.enqueue(spec))

    def feasible(self, request: dict) -> bool:
        """res.feasible, remembered per request dict: the calls of one remote function share its
        dict, and what this node has never changes while it runs."""
        s = self.s
        known = s.feasible_seen.get(id(request))
        if known is not None and known[0] is request:
            return known[1]
        ok = s.res.feasible(request)
        if len(s.feasible_seen) > 1024:
            s.feasible_seen.clear()
        s.feasible_seen[id(request)] = (request, ok)
        return ok

    def schedule(self) -> None:
        s = self.s
        if s.stopping:   # shutdown(): a task retried after its worker was killed starts nowhere
            return
        if s.groups.pending:
            for group in s.groups.place():   # ready() gives the group's handle, as in Ray
                s.table.set_value(group.ready_id, group.ready_value)
                group.ready_value = None
        for key in list(s.queues):
            queue = s.queues[key]
            while queue:
                spec = queue[0]
                alloc = self._acquire(spec)
                if alloc is None:
                    break
                queue.popleft()
                if alloc is _GROUP_GONE:
                    self.placement.group_gone(spec)
                    continue
                self._start(spec, alloc)
            if queue and queue[0].kind == "task":
                self.lines.prefetch(queue)
            if not queue:
                del s.queues[key]

    def _acquire(self, spec: TaskSpec):
        """Resources for a queued spec from the node, or from its placement group's bundles."""
        s = self.s
        if spec.placement is None:
            alloc = s.res.try_acquire(spec.schedule_request or spec.request)
            if alloc is not None and spec.schedule_request is not None:   # actors: placed with more
                s.res.release(alloc)                                   # than they hold
                alloc = s.res.try_acquire(spec.request)
            return alloc
        pools = s.groups.pools_for(spec.placement)
        if pools == []:
            return _GROUP_GONE
        for pool in pools or ():
            alloc = pool.try_acquire(spec.request)
            if alloc is not None:
                return alloc
        return None

    def _start(self, spec: TaskSpec, alloc) -> None:
        # a worker's environment is fixed at fork: reuse only one with the same devices and threads
        s = self.s
        threads = max(1, alloc.resources.get("CPU", 0) // SCALE)
        env = runtime_env.merge(s.job_env, spec.runtime_env)
        devices = alloc.device_ids
        key = (tuple(sorted((k, tuple(v)) for k, v in devices.items())) if devices else (), threads, env)
        if spec.kind == "actor_create":
            actor = s.actors[spec.actor_id]
            try:
                w = self.procs.spawn(alloc.device_ids, key, env, restarted=actor.state == "RESTARTING")
            except OSError as e:
                alloc.pool.release(alloc)
                actor.restarts_left, actor.error = 0, cannot_start(e)
                return self.actor_ops.actor_gone(actor)
            w.actor, w.alloc, w.name = actor, alloc, spec.name
            actor.worker, actor.state = w, "ALIVE"
            self.dispatch.run_on(w, spec)
            return self.actor_ops.pump_actor(actor)
        pool = s.idle.get(key, [])
        # reuse only a worker with calls to spare, so max_calls=1 always means a fresh process
        w = next((w for w in reversed(pool) if not spec.max_calls or w.calls < spec.max_calls), None)
        hold = False
        if w is not None:
            pool.remove(w)
        else:
            hold = bool(s.starting)   # see take_unsent
            try:
                w = self.procs.spawn(alloc.device_ids, key, env)
            except OSError as e:
                alloc.pool.release(alloc)
                return self.dispatch.finish(spec, error_value(exceptions.RaySystemError(
                    f"{spec.name} could not run: a worker process could not start ({cannot_start(e)})")))
            s.starting.add(w.index)
        w.task, w.alloc, w.name, w.max_calls = spec, alloc, spec.name, spec.max_calls
        w.started = time.monotonic()
        if hold:
            s.unsent[w.index] = w
        else:
            self.dispatch.run_on(w, spec)

    def take_unsent(self, w: WorkerProc) -> bool:
        """Run on w, a worker just free, the task not sent yet to the worker that will start last.

        A burst of tasks forks a worker for each, and on a busy machine the last ones start tens of
        milliseconds after the first (8 on 2 CPUs: 25 ms). So while other workers are starting, a
        new one's task waits for its hello instead of being sent at once, and a reusable worker that
        is free first runs it: of 8 tasks sleeping 0-0.7 s, the 0.7 s one starts in the process that
        ran the 0 s one. The worker left without its task joins the idle ones."""
        s = self.s
        if s.stopping or (w.max_calls and w.calls >= w.max_calls):
            return False
        victim = None
        for v in s.unsent.values():
            spec = v.task
            if (v.key == w.key and (not spec.max_calls or w.calls < spec.max_calls)
                    and (victim is None or v.index > victim.index)):
                victim = v
        if victim is None:
            return False
        spec, alloc = self.reclaim_unsent(victim)
        reader = s.readers.get(victim.index)
        if reader is not None:   # a thread waits reading the victim: it moves to w (raylite.core.node.reader)
            reader.moved = True
        w.task, w.alloc, w.name, w.max_calls = spec, alloc, spec.name, spec.max_calls
        w.started = time.monotonic()
        self.dispatch.run_on(w, spec)
        return True

    def reclaim_unsent(self, w: WorkerProc) -> tuple:
        """Take its unsent task (and the resources it holds) from a starting worker, which then
        joins the idle ones."""
        s = self.s
        spec, alloc = w.task, w.alloc
        del s.unsent[w.index]
        w.task = w.alloc = None
        w.max_calls, w.name = 0, "worker"
        self.dispatch.to_idle(w)
        return spec, alloc
