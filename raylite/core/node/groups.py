"""Placement groups on the node manager: bundles of resources reserved together, which tasks and
actors then draw from instead of the node's free pool (Ray's placement groups, on one node).

A group is placed all at once or not at all, in creation order, before queued tasks are
scheduled. Each placed bundle becomes a small pool of its own (`NodeResources.bundle`), holding
the devices the node gave it, so a task in a bundle sees exactly those devices. Removing a group
kills the tasks and actors in it (as Ray does) and gives its resources back to the node. Like
`Node`, this is touched only by the node thread.
"""
from __future__ import annotations

import time
from collections import deque

from raylite.core.wire.resources import NodeResources, from_fixed


class Group:
    __slots__ = ("pg_id", "bundles", "strategy", "name", "state", "pools", "allocs", "ready_id", "created",
                 "placed_after", "attempts", "ready_value")

    def __init__(self, pg_id: int, bundles: list[dict[str, int]], strategy: str, name: str, ready_id: int):
        self.pg_id, self.bundles, self.strategy, self.name = pg_id, bundles, strategy, name
        self.state = "PENDING"   # -> CREATED -> REMOVED, or PENDING -> REMOVED
        self.pools: list[NodeResources] = []
        self.allocs: list = []
        self.ready_id = ready_id
        self.created = time.monotonic()
        self.placed_after: float | None = None   # seconds from creation to placement
        self.attempts = 0                        # times placement was tried (Ray's scheduling_attempt)
        self.ready_value = None   # what its ready ref resolves to once placed: the API's handle, serialized


class Groups:
    def __init__(self, res: NodeResources, node_id: str):
        self.res, self.node_id = res, node_id
        self.by_id: dict[int, Group] = {}
        self.by_name: dict[str, int] = {}
        self.pending: deque[Group] = deque()

    def create(self, pg_id: int, bundles: list[dict[str, int]], strategy: str, name: str,
               ready_id: int) -> Group:
        """Register a group (placed later by `place`); ValueError if it could never be placed."""
        if strategy == "STRICT_SPREAD" and len(bundles) > 1:
            raise ValueError(f"placement group {name or pg_id}: STRICT_SPREAD puts each of its "
                             f"{len(bundles)} bundles on a different node, and this runtime has one")
        for i, bundle in enumerate(bundles):
            if not self.res.feasible(bundle):
                raise ValueError(f"placement group {name or pg_id}: bundle {i} "
                                 f"{self.res.describe(bundle)} does not fit on this node "
                                 f"({self.res.describe(self.res.total)})")
        idle = NodeResources(self.res.total, self.res.device_ids)   # would they fit together?
        if any(idle.try_acquire(bundle) is None for bundle in bundles):
            together: dict[str, int] = {}
            for bundle in bundles:
                for k, v in bundle.items():
                    together[k] = together.get(k, 0) + v
            raise ValueError(f"placement group {name or pg_id}: its bundles together need "
                             f"{self.res.describe(together)}, more than this node has "
                             f"({self.res.describe(self.res.total)})")
        if name and name in self.by_name:
            raise ValueError(f"a placement group named {name!r} already exists")
        group = Group(pg_id, bundles, strategy, name, ready_id)
        self.by_id[pg_id] = group
        if name:
            self.by_name[name] = pg_id
        self.pending.append(group)
        return group

    def place(self) -> list[Group]:
        """Reserve what pending groups need, oldest first; the groups placed now."""
        placed = []
        while self.pending:
            group = self.pending[0]
            group.attempts += 1
            allocs = []
            for bundle in group.bundles:
                alloc = self.res.try_acquire(bundle)
                if alloc is None:
                    break
                allocs.append(alloc)
            if len(allocs) < len(group.bundles):
                for alloc in allocs:
                    self.res.release(alloc)
                break
            self.pending.popleft()
            group.allocs = allocs
            group.pools = [NodeResources.bundle(alloc) for alloc in allocs]
            group.state, group.placed_after = "CREATED", time.monotonic() - group.created
            placed.append(group)
        return placed

    def remove(self, pg_id: int) -> Group | None:
        group = self.by_id.get(pg_id)
        if group is None or group.state == "REMOVED":
            return None
        if group in self.pending:
            self.pending.remove(group)
        for alloc in group.allocs:
            self.res.release(alloc)
        group.allocs, group.state = [], "REMOVED"
        if group.name and self.by_name.get(group.name) == pg_id:
            del self.by_name[group.name]
        return group

    def pools_for(self, placement: tuple) -> list[NodeResources] | None:
        """The bundle pools a placed task may draw from; None while its group is pending, [] once
        the group is gone."""
        group = self.by_id.get(placement[0])
        if group is None or group.state == "REMOVED":
            return []
        if group.state == "PENDING":
            return None
        return group.pools if placement[1] < 0 else [group.pools[placement[1]]]

    def fits(self, placement: tuple, request: dict[str, int]) -> str | None:
        """Why the request can never run in its bundle(s), or None if it can."""
        group = self.by_id.get(placement[0])
        if group is None or group.state == "REMOVED":
            return f"its placement group {placement[0]:028x} was removed"
        index = placement[1]
        candidates = group.bundles if index < 0 else [group.bundles[index]]
        if any(all(bundle.get(k, 0) >= v for k, v in request.items()) for bundle in candidates):
            return None
        where = "any bundle" if index < 0 else f"bundle {index} {self.res.describe(group.bundles[index])}"
        return f"{self.res.describe(request)} does not fit in {where} of placement group {group.name or placement[0]}"

    def table(self, pg_id: int) -> dict:
        """The group as Ray's placement_group_table() gives it (its latencies in ms)."""
        group = self.by_id[pg_id]
        placed = group.placed_after is not None
        latency_ms = group.placed_after * 1e3 if placed else 0.0
        return {"placement_group_id": f"{pg_id:028x}", "name": group.name, "strategy": group.strategy,
                "state": group.state,
                "bundles": {i: {k: from_fixed(v) for k, v in b.items()} for i, b in enumerate(group.bundles)},
                "bundles_to_node_id": {i: self.node_id if group.state == "CREATED" else ""
                                       for i in range(len(group.bundles))},
                "stats": {"end_to_end_creation_latency_ms": latency_ms, "scheduling_latency_ms": latency_ms,
                          "scheduling_attempt": group.attempts, "highest_retry_delay_ms": 0.0,
                          "scheduling_state": ("REMOVED" if group.state == "REMOVED" else
                                               "FINISHED" if placed else "NO_RESOURCES" if group.attempts else
                                               "QUEUED")}}
