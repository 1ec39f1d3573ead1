"""The handle of a placement group, like ObjectRef a value any process may hold: the API returns
one (raylite.core.api.placement_groups), and serializes one as the value of the group's ready ref
(the node keeps the group as plain data: id, bundles, strategy, name, state),
and tasks pickle it to schedule into the group too."""
from __future__ import annotations

from raylite.core.client import link
from raylite.core.client.objects import ObjectRef, check_timeout
from raylite.core.wire.ids import PlacementGroupID


class PlacementGroup:
    """A handle to a placement group; picklable, so tasks can schedule into it too."""

    def __init__(self, pg_id: int, bundle_specs: list[dict], ready_id: int):
        self._pg_id, self.bundle_specs, self._ready_id = pg_id, bundle_specs, ready_id
        self.id = PlacementGroupID(pg_id)

    @property
    def bundle_count(self) -> int:
        return len(self.bundle_specs)

    def ready(self) -> ObjectRef:
        """A ref that resolves (to this group, as in Ray) once every bundle is reserved."""
        link.local_or_start().addref(self._ready_id)
        return ObjectRef(self._ready_id, True)

    def wait(self, timeout_seconds: float = 30) -> bool:
        """Whether the group is placed within ``timeout_seconds``."""
        ref = self.ready()
        return ref.id in link.local_or_start().wait([ref.id], 1, check_timeout(timeout_seconds))

    def __reduce__(self):
        return (PlacementGroup, (self._pg_id, self.bundle_specs, self._ready_id))

    def __eq__(self, other) -> bool:
        return isinstance(other, PlacementGroup) and other._pg_id == self._pg_id

    def __hash__(self) -> int:
        return hash(self._pg_id)

    def __repr__(self) -> str:
        return f"PlacementGroup({self.id.hex()}, bundles={self.bundle_specs})"
