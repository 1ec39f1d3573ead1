"""Placement groups on the node (raylite.core.api.placement_groups is the API, raylite.core.node.groups
the bundles' bookkeeping): creating, looking up and removing one, and what removal ends: its
actors, its running tasks, the tasks still waiting for it."""
from __future__ import annotations

import signal
from typing import Protocol

from raylite import exceptions
from raylite.core.node.records import Actor
from raylite.core.node.state import NodeState
from raylite.core.node.worker_lifecycle import send_signal
from raylite.core.wire.protocol import TaskSpec
from raylite.core.wire.serialization import Serialized, error_value


class EndsActors(Protocol):
    def actor_gone(self, actor: Actor) -> None: ...
    def kill_actor(self, actor_id: int, no_restart: bool) -> None: ...


class Finishes(Protocol):
    def finish(self, spec: TaskSpec, results) -> None: ...


class GroupLifecycle:
    def __init__(self, state: NodeState, actor_ops: EndsActors, dispatch: Finishes):
        self.s, self.actor_ops, self.dispatch = state, actor_ops, dispatch

    def group_gone(self, spec: TaskSpec) -> None:
        s = self.s
        error = error_value(exceptions.TaskPlacementGroupRemoved(
            f"cannot run {spec.name}: its placement group was removed"))
        if spec.kind == "actor_create":
            actor = s.actors[spec.actor_id]
            actor.restarts_left, actor.error = 0, "its placement group was removed"
            return self.actor_ops.actor_gone(actor)
        self.dispatch.finish(spec, error)

    def create_group(self, pg_id: int, bundles: list, strategy: str, name: str, ready_id: int,
                     ready_value: Serialized) -> None:
        """A group is plain data here; `ready_value` is what ready() resolves to once it is placed,
        serialized by the API (the handle, as in Ray), so the node never builds a handle itself."""
        s = self.s
        s.groups.create(pg_id, bundles, strategy, name, ready_id).ready_value = ready_value
        s.table.new_entries([ready_id])   # its one ref: the group's own, dropped at removal

    def remove_group(self, pg_id: int) -> None:
        s = self.s
        group = s.groups.remove(pg_id)
        if group is None:
            return
        for actor in list(s.actors.values()):
            if actor.spec.placement is not None and actor.spec.placement[0] == pg_id:
                actor.restarts_left, actor.error = 0, "its placement group was removed"
                self.actor_ops.kill_actor(actor.spec.actor_id, True)
        for w in s.workers.values():
            if w.task is not None and w.task.placement is not None and w.task.placement[0] == pg_id:
                send_signal(w, signal.SIGKILL)   # its death is then final (see WorkerLifecycle._worker_gone)
        entry = s.table.objects.get(group.ready_id)
        if entry is not None and entry.value is None:
            s.table.set_value(group.ready_id, error_value(exceptions.RayError(
                f"placement group {group.name or pg_id} was removed before it was placed")))
        s.table.release(group.ready_id)

    def group_info(self, pg_id: int | None = None, name: str | None = None, handle: bool = False):
        """A live group's (id, bundles in units, ready id) by id or name with ``handle``; else the
        table entry of one group, or of all by id."""
        s = self.s
        if name is not None:
            pg_id = s.groups.by_name.get(name)
            if pg_id is None:
                raise ValueError(f"Failed to look up placement group with name: {name}")
        if handle:
            group = s.groups.by_id[pg_id]
            return pg_id, group.bundles, group.ready_id
        if pg_id is None:
            return {f"{i:028x}": s.groups.table(i) for i in s.groups.by_id}
        return s.groups.table(pg_id)

    def group(self, op: str, *args):
        """One entry for the clients: "create", "remove" or "info"."""
        return {"create": self.create_group, "remove": self.remove_group, "info": self.group_info}[op](*args)
