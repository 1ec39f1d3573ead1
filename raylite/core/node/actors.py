"""The node manager's actor lifecycle: placing calls in order, restarts, kills, and forgetting
dead actors. A part of the node (raylite.core.node.manager wires it), under the node's lock."""
from __future__ import annotations

import signal
import sys
from typing import Protocol

from raylite import exceptions
from raylite.core.client.link import minted_by
from raylite.core.node.records import Actor, WorkerProc
from raylite.core.node.state import NodeState
from raylite.core.node.worker_lifecycle import send_signal
from raylite.core.wire.protocol import TaskSpec
from raylite.core.wire.serialization import error_value

STARVED_WARN_S = 10.0   # a task waiting this long for CPUs that actors blocked in get hold: say so (once)


class _StarvedCheck:
    """A timer (see ObjectTable.add_timer): is a task waiting for CPUs that blocked actors hold?"""

    __slots__ = ("actor_ops", "done")

    def __init__(self, actor_ops: ActorLifecycle):
        self.actor_ops, self.done = actor_ops, False

    def expire(self) -> None:
        self.done = True
        self.actor_ops.s.starved_check = None
        self.actor_ops.check_starved()


class Dispatches(Protocol):
    def run_on(self, w: WorkerProc, spec: TaskSpec) -> None: ...
    def finish(self, spec: TaskSpec, results) -> None: ...
    def drop_args(self, spec: TaskSpec) -> None: ...
    def enqueue(self, spec: TaskSpec) -> None: ...
    def retire(self, w: WorkerProc) -> None: ...
    def when_deps_ready(self, spec: TaskSpec, then, lost=None) -> None: ...


class ActorLifecycle:
    def __init__(self, state: NodeState, dispatch: Dispatches):
        self.s, self.dispatch = state, dispatch

    def actor_blocked(self, w) -> None:
        """An actor waiting in get, wait or next keeps the CPUs it holds, as in Ray. Should a task
        then wait for CPUs, that is likely why: after STARVED_WARN_S it is said once (Ray warns too)."""
        s = self.s
        if w.alloc is None or not w.alloc.resources.get("CPU", 0):
            return
        s.blocked_actors.add(w.index)
        if not s.starved_warned and s.starved_check is None:
            s.starved_check = _StarvedCheck(self)
            s.table.add_timer(STARVED_WARN_S, s.starved_check)

    def check_starved(self) -> None:
        s = self.s
        holders = [w for i in s.blocked_actors if (w := s.workers.get(i)) is not None and w.alloc is not None]
        waiting = next((q[0] for q in s.queues.values() if q and q[0].kind == "task" and q[0].placement is None
                        and q[0].request.get("CPU", 0)), None)
        if s.starved_warned or not holders or waiting is None:
            return
        s.starved_warned = True
        held = sum(w.alloc.resources.get("CPU", 0) for w in holders)
        message = (f"{waiting.name} is waiting for {s.res.describe(waiting.request)} while {len(holders)} "
                   f"actor(s) blocked in get hold {s.res.describe({'CPU': held})}: as in Ray, an actor keeps its "
                   f"CPUs while it waits, so what it waits for may never start. Create such actors with fewer "
                   f"num_cpus (num_cpus=0 holds none), or give the node more CPUs")
        sys.stderr.write(f"raylite: {message}\n")
        s.cluster_events.add("WARNING", "AUTOSCALER", message, name=waiting.name)

    def pump_actor(self, actor: Actor) -> None:
        s = self.s
        w = actor.worker
        # threaded and async actors promise no order (as in Ray), nor one created with
        # allow_out_of_order_execution=True: a call still waiting for its arguments lets later
        # calls go ahead. A one-at-a-time actor keeps each caller's submission order, as Ray
        # orders calls per submitter: a waiting call holds back only its own caller's later calls
        overtake = actor.spec.out_of_order
        held, waiting = [], set()   # (callers with a call waiting, for a one-at-a-time actor)
        # nothing more goes to a process that is ending (killed, or told to exit): as in Ray, a
        # call made after kill() fails, or runs on the restarted actor
        while actor.queue and w is not None and actor.state == "ALIVE" and w.exit_cause is None:
            spec = actor.queue[0]
            caller = minted_by(spec.task_id)
            if caller in waiting or s.table.missing(spec.deps):
                if caller not in waiting and spec.task_id not in actor.waiting_deps:
                    actor.waiting_deps.add(spec.task_id)
                    self.dispatch.when_deps_ready(spec, lambda actor=actor, t=spec.task_id: self.resume_actor(actor, t),
                                                  lambda actor=actor, spec=spec: self._lost_call(actor, spec))
                if not overtake:
                    if len(actor.callers) == 1:   # the common case: nothing else may go ahead
                        break
                    waiting.add(caller)
                held.append(actor.queue.popleft())
                continue
            actor.queue.popleft()
            if spec.task_id in s.cancelled:
                continue
            actor.inflight[spec.task_id] = spec
            self.dispatch.run_on(w, spec)
        actor.queue.extendleft(reversed(held))
        if actor.exit_when_idle and not actor.queue and not actor.inflight and w is not None and not w.retiring:
            self.dispatch.retire(w)   # only once its calls are done: a concurrent actor's may wait on replies

    def resume_actor(self, actor: Actor, task_id: int) -> None:
        actor.waiting_deps.discard(task_id)
        self.pump_actor(actor)

    def _lost_call(self, actor: Actor, spec: TaskSpec) -> None:
        """A call's argument can never be computed (it failed already): the calls behind it go on."""
        if spec in actor.queue:
            actor.queue.remove(spec)
            self.resume_actor(actor, spec.task_id)

    def actor_died(self, actor: Actor | None, spec: TaskSpec) -> exceptions.ActorDiedError:
        why = actor.error if actor is not None and actor.error else "it was killed or its process died"
        return exceptions.ActorDiedError(f"cannot run {spec.name}: the actor is dead ({why})",
                                         actor_id=f"{spec.actor_id:028x}")

    def release_actor(self, actor: Actor) -> None:
        actor.refs -= 1
        if actor.state == "DEAD":
            return self._forget_actor(actor)
        if actor.refs <= 0 and not actor.pinned:   # named or not, as Ray (unless detached)
            actor.exit_when_idle = True   # calls already submitted still run, then it exits
            if actor.state == "ALIVE":
                self.pump_actor(actor)
            elif not actor.queue:
                self.kill_actor(actor.spec.actor_id, True)

    def kill(self, actor_id: int, no_restart: bool = True) -> None:
        self.kill_actor(actor_id, no_restart)

    def kill_actor(self, actor_id: int, no_restart: bool) -> None:
        s = self.s
        actor = s.actors.get(actor_id)
        if actor is None or actor.state == "DEAD":
            return
        if no_restart:
            actor.restarts_left = 0
            name = actor.spec.actor_name
            if name and s.named.get(name) == actor_id:   # free at once, as Ray's kill: a new actor
                del s.named[name]                        # may take the name before this one is gone
        actor.error = actor.error or "killed by kill()"
        w = actor.worker
        if w is None:   # not placed yet
            for queue in s.queues.values():
                if actor.spec in queue:
                    queue.remove(actor.spec)
            self.actor_gone(actor)
        else:
            w.exit_cause = ("INTENDED_USER_EXIT", "killed by ray.kill()")
            send_signal(w, signal.SIGKILL)

    def actor_gone(self, actor: Actor) -> None:
        """The actor's process ended: fail its calls, then restart it or mark it dead."""
        s = self.s
        w, actor.worker = actor.worker, None
        if w is not None and w.alloc is not None:
            w.alloc.pool.release(w.alloc)
            w.alloc = None
        pending = list(actor.inflight.values())
        actor.inflight.clear()
        restarting = actor.restarts_left != 0 and not actor.exit_when_idle
        retried = []
        for spec in pending:
            if restarting and spec.max_retries != 0 and spec.task_id not in s.cancelled:
                spec.max_retries -= 1   # max_task_retries: runs again on the restarted actor
                retried.append(spec)
            else:
                self.dispatch.finish(spec, error_value(self.actor_died(actor, spec)))
        actor.queue.extendleft(reversed(retried))
        if restarting:
            actor.restarts_left -= 1
            actor.state, actor.error = "RESTARTING", None
            self.dispatch.enqueue(actor.spec)
            return
        actor.state = "DEAD"
        s.task_events.actor_dead(actor)
        self.dispatch.drop_args(actor.spec)   # no restart will need the constructor's arguments again
        while actor.queue:
            spec = actor.queue.popleft()
            self.dispatch.finish(spec, error_value(self.actor_died(actor, spec)))
        if actor.spec.actor_name and s.named.get(actor.spec.actor_name) == actor.spec.actor_id:
            del s.named[actor.spec.actor_name]
        self._forget_actor(actor)

    def owner_died(self, w) -> None:
        """As in Ray, actors die with the process that created them when it crashes or is killed
        (not when it is told to exit): only a detached actor outlives its owner."""
        s = self.s
        for actor in list(s.actors.values()):
            if actor.owner == w.index and not actor.spec.detached and actor.state != "DEAD":
                actor.error = f"its owner (pid {w.pid}, which created it) died"
                self.kill_actor(actor.spec.actor_id, True)

    def _forget_actor(self, actor: Actor) -> None:
        """Drop a dead actor's record once no handle can call it (a sweep may create thousands)."""
        s = self.s
        if actor.state == "DEAD" and actor.refs <= 0 and not actor.pinned:
            s.actors.pop(actor.spec.actor_id, None)

    def get_actor(self, name: str, namespace: str | None = None):
        s = self.s
        key = (namespace or s.namespace, name)
        actor = s.actors.get(s.named.get(key, 0))
        if actor is None:
            raise ValueError(f"Failed to look up actor with name {name!r} in namespace {key[0]!r}: no actor "
                             "has that name there (it was never created, it died, or it lives in another "
                             "namespace; pass namespace=... to look elsewhere)")
        actor.pinned = True   # a looked-up handle is not counted: the actor lives until killed
        return actor.spec.actor_id, actor.class_meta

    def named_actors(self) -> list[tuple[str, str]]:
        """(namespace, name) of every named actor not known dead."""
        s = self.s
        return [key for key, actor_id in s.named.items()
                if actor_id in s.actors and s.actors[actor_id].state != "DEAD"]

    def claim_name(self, spec: TaskSpec, fn_bytes: bytes | None, get_if_exists: bool):
        """Give a named actor its name in its namespace (the job's unless given) and return None
        (the caller then submits it), or, when the name is taken by a live actor, return that one
        (get_if_exists) or raise."""
        s = self.s
        if fn_bytes is not None:   # kept even if no actor is created: the caller counts them as sent
            s.functions.setdefault(spec.fn_id, fn_bytes)
        namespace, name = spec.actor_name
        key = spec.actor_name = (namespace or s.namespace, name)
        holder = s.actors.get(s.named.get(key, 0))
        if holder is not None and holder.state != "DEAD":
            if get_if_exists:
                return self.get_actor(name, key[0])
            raise exceptions.ActorAlreadyExistsError(
                f"The actor name {name!r} is already taken in namespace {key[0]!r}: pick another "
                f"name, or get the existing actor with ray.get_actor({name!r}, namespace={key[0]!r})")
        s.named[key] = spec.actor_id
        return None
