"""The node manager's actor lifecycle: placing calls in order, restarts, kills, and forgetting
dead actors. Part of Node (raylite.core.node.manager), kept in a module of its own: it uses the node's
state under the node's lock like every other node method."""
from __future__ import annotations

import signal
import sys

from raylite import exceptions
from raylite.core.client.link import minted_by
from raylite.core.node.records import Actor
from raylite.core.wire.protocol import TaskSpec
from raylite.core.wire.serialization import error_value

STARVED_WARN_S = 10.0   # a task waiting this long for CPUs that actors blocked in get hold: say so (once)


class _StarvedCheck:
    """A timer (see ObjectTable.add_timer): is a task waiting for CPUs that blocked actors hold?"""

    __slots__ = ("node", "done")

    def __init__(self, node):
        self.node, self.done = node, False

    def expire(self) -> None:
        self.done = True
        self.node.starved_check = None
        self.node._check_starved()


class ActorLifecycle:
    """Node methods for actors (see raylite.core.node.manager.Node for the state they use)."""

    def _actor_blocked(self, w) -> None:
        """An actor waiting in get, wait or next keeps the CPUs it holds, as in Ray. Should a task
        then wait for CPUs, that is likely why: after STARVED_WARN_S it is said once (Ray warns too)."""
        if w.alloc is None or not w.alloc.resources.get("CPU", 0):
            return
        self.blocked_actors.add(w.index)
        if not self.starved_warned and self.starved_check is None:
            self.starved_check = _StarvedCheck(self)
            self.table.add_timer(STARVED_WARN_S, self.starved_check)

    def _check_starved(self) -> None:
        holders = [w for i in self.blocked_actors if (w := self.workers.get(i)) is not None and w.alloc is not None]
        waiting = next((q[0] for q in self.queues.values() if q and q[0].kind == "task" and q[0].placement is None
                        and q[0].request.get("CPU", 0)), None)
        if self.starved_warned or not holders or waiting is None:
            return
        self.starved_warned = True
        held = sum(w.alloc.resources.get("CPU", 0) for w in holders)
        message = (f"{waiting.name} is waiting for {self.res.describe(waiting.request)} while {len(holders)} "
                   f"actor(s) blocked in get hold {self.res.describe({'CPU': held})}: as in Ray, an actor keeps its "
                   f"CPUs while it waits, so what it waits for may never start. Create such actors with fewer "
                   f"num_cpus (num_cpus=0 holds none), or give the node more CPUs")
        sys.stderr.write(f"raylite: {message}\n")
        self.cluster_events.add("WARNING", "AUTOSCALER", message, name=waiting.name)

    def _pump_actor(self, actor: Actor) -> None:
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
            if caller in waiting or self.table.missing(spec.deps):
                if caller not in waiting and spec.task_id not in actor.waiting_deps:
                    actor.waiting_deps.add(spec.task_id)
                    self._when_deps_ready(spec, lambda actor=actor, t=spec.task_id: self._resume_actor(actor, t))
                if not overtake:
                    if len(actor.callers) == 1:   # the common case: nothing else may go ahead
                        break
                    waiting.add(caller)
                held.append(actor.queue.popleft())
                continue
            actor.queue.popleft()
            if spec.task_id in self.cancelled:
                continue
            actor.inflight[spec.task_id] = spec
            self._run_on(w, spec)
        actor.queue.extendleft(reversed(held))
        if actor.exit_when_idle and not actor.queue and not actor.inflight and w is not None and not w.retiring:
            self._retire(w)   # only once its calls are done: a concurrent actor's may wait on replies

    def _resume_actor(self, actor: Actor, task_id: int) -> None:
        actor.waiting_deps.discard(task_id)
        self._pump_actor(actor)

    def _actor_died(self, actor: Actor | None, spec: TaskSpec) -> exceptions.ActorDiedError:
        why = actor.error if actor is not None and actor.error else "it was killed or its process died"
        return exceptions.ActorDiedError(f"cannot run {spec.name}: the actor is dead ({why})",
                                         actor_id=f"{spec.actor_id:028x}")

    def _release_actor(self, actor: Actor) -> None:
        actor.refs -= 1
        if actor.state == "DEAD":
            return self._forget_actor(actor)
        if actor.refs <= 0 and not actor.pinned:   # named or not, as Ray (unless detached)
            actor.exit_when_idle = True   # calls already submitted still run, then it exits
            if actor.state == "ALIVE":
                self._pump_actor(actor)
            elif not actor.queue:
                self._kill_actor(actor.spec.actor_id, True)

    def kill(self, actor_id: int, no_restart: bool = True) -> None:
        self._kill_actor(actor_id, no_restart)

    def _kill_actor(self, actor_id: int, no_restart: bool) -> None:
        actor = self.actors.get(actor_id)
        if actor is None or actor.state == "DEAD":
            return
        if no_restart:
            actor.restarts_left = 0
            name = actor.spec.actor_name
            if name and self.named.get(name) == actor_id:   # free at once, as Ray's kill: a new actor
                del self.named[name]                        # may take the name before this one is gone
        actor.error = actor.error or "killed by kill()"
        w = actor.worker
        if w is None:   # not placed yet
            for queue in self.queues.values():
                if actor.spec in queue:
                    queue.remove(actor.spec)
            self._actor_gone(actor)
        else:
            w.exit_cause = ("INTENDED_USER_EXIT", "killed by ray.kill()")
            self._signal(w, signal.SIGKILL)

    def _actor_gone(self, actor: Actor) -> None:
        """The actor's process ended: fail its calls, then restart it or mark it dead."""
        w, actor.worker = actor.worker, None
        if w is not None and w.alloc is not None:
            w.alloc.pool.release(w.alloc)
            w.alloc = None
        pending = list(actor.inflight.values())
        actor.inflight.clear()
        restarting = actor.restarts_left != 0 and not actor.exit_when_idle
        retried = []
        for spec in pending:
            if restarting and spec.max_retries != 0 and spec.task_id not in self.cancelled:
                spec.max_retries -= 1   # max_task_retries: runs again on the restarted actor
                retried.append(spec)
            else:
                self._finish(spec, error_value(self._actor_died(actor, spec)))
        actor.queue.extendleft(reversed(retried))
        if restarting:
            actor.restarts_left -= 1
            actor.state, actor.error = "RESTARTING", None
            self._enqueue(actor.spec)
            return
        actor.state = "DEAD"
        self.task_events.actor_dead(actor)
        self._drop_args(actor.spec)   # no restart will need the constructor's arguments again
        while actor.queue:
            spec = actor.queue.popleft()
            self._finish(spec, error_value(self._actor_died(actor, spec)))
        if actor.spec.actor_name and self.named.get(actor.spec.actor_name) == actor.spec.actor_id:
            del self.named[actor.spec.actor_name]
        self._forget_actor(actor)

    def _owner_died(self, w) -> None:
        """As in Ray, actors die with the process that created them when it crashes or is killed
        (not when it is told to exit): only a detached actor outlives its owner."""
        for actor in list(self.actors.values()):
            if actor.owner == w.index and not actor.spec.detached and actor.state != "DEAD":
                actor.error = f"its owner (pid {w.pid}, which created it) died"
                self._kill_actor(actor.spec.actor_id, True)

    def _forget_actor(self, actor: Actor) -> None:
        """Drop a dead actor's record once no handle can call it (a sweep may create thousands)."""
        if actor.state == "DEAD" and actor.refs <= 0 and not actor.pinned:
            self.actors.pop(actor.spec.actor_id, None)

    def get_actor(self, name: str, namespace: str | None = None):
        key = (namespace or self.namespace, name)
        actor = self.actors.get(self.named.get(key, 0))
        if actor is None:
            raise ValueError(f"Failed to look up actor with name {name!r} in namespace {key[0]!r}: no actor "
                             "has that name there (it was never created, it died, or it lives in another "
                             "namespace; pass namespace=... to look elsewhere)")
        actor.pinned = True   # a looked-up handle is not counted: the actor lives until killed
        return actor.spec.actor_id, actor.class_meta

    def named_actors(self) -> list[tuple[str, str]]:
        """(namespace, name) of every named actor not known dead."""
        return [key for key, actor_id in self.named.items()
                if actor_id in self.actors and self.actors[actor_id].state != "DEAD"]

    def create_named(self, spec: TaskSpec, fn_bytes: bytes | None, get_if_exists: bool):
        """Create a named actor in its namespace (the job's unless given) and return None, or,
        when the name is taken by a live actor, return that one (get_if_exists) or raise."""
        if fn_bytes is not None:   # kept even if no actor is created: the caller counts them as sent
            self.functions.setdefault(spec.fn_id, fn_bytes)
        namespace, name = spec.actor_name
        key = spec.actor_name = (namespace or self.namespace, name)
        holder = self.actors.get(self.named.get(key, 0))
        if holder is not None and holder.state != "DEAD":
            if get_if_exists:
                return self.get_actor(name, key[0])
            raise exceptions.ActorAlreadyExistsError(
                f"The actor name {name!r} is already taken in namespace {key[0]!r}: pick another "
                f"name, or get the existing actor with ray.get_actor({name!r}, namespace={key[0]!r})")
        self.named[key] = spec.actor_id
        self.submit(spec, fn_bytes)
        return None
