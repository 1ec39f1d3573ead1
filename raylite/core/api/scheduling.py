"""Where a task or actor's options say it runs: the scheduling strategies (Ray's
``ray.util.scheduling_strategies``) and the placement a submission asks for (``placement_of``).
Below both what submits (raylite.core.api.submission) and the placement-group API."""
from __future__ import annotations

from raylite.core.client import context
from raylite.core.client.placement_group import PlacementGroup
from raylite.core.wire.resources import from_fixed, to_fixed


class PlacementGroupSchedulingStrategy:
    """``scheduling_strategy=`` for a task or actor: run in bundle ``placement_group_bundle_index``
    of the group (-1: any bundle with room); with ``placement_group_capture_child_tasks``, the
    tasks it submits run in the group too."""

    def __init__(self, placement_group, placement_group_bundle_index: int = -1,
                 placement_group_capture_child_tasks: bool | None = None):
        self.placement_group = placement_group
        self.placement_group_bundle_index = placement_group_bundle_index
        self.placement_group_capture_child_tasks = placement_group_capture_child_tasks


class NodeAffinitySchedulingStrategy:
    """Accepted for Ray code; on the local runtime every task runs on this one node."""

    def __init__(self, node_id: str, soft: bool, _spill_on_unavailable: bool = False,
                 _fail_on_unavailable: bool = False):
        self.node_id, self.soft = node_id, soft


def placement_of(options: dict, request: dict[str, int], name: str) -> tuple | None:
    """(group id, bundle index, capture children) for a task's or actor's options, or None.
    A ValueError, as in Ray, when `request` (in units) fits in no bundle it may use."""
    strategy = options.get("scheduling_strategy")
    if isinstance(strategy, PlacementGroupSchedulingStrategy):
        group = strategy.placement_group
        index = strategy.placement_group_bundle_index
        capture = strategy.placement_group_capture_child_tasks
    else:
        group = options.get("placement_group", "default")
        index = options.get("placement_group_bundle_index", -1)
        capture = options.get("placement_group_capture_child_tasks")
    if group == "default" or group is None:
        current = context.current_placement()
        if strategy is None and current is not None and current[2]:
            return (current[0], -1, True)   # the parent captures its children
        return None
    _check_group(group, "scheduling_strategy")
    if isinstance(index, bool) or not isinstance(index, int) or not -1 <= index < group.bundle_count:
        raise ValueError(f"placement_group_bundle_index must be -1 or in [0, {group.bundle_count}), "
                         f"got {index!r}")
    _check_fits(group, index, request, name)
    return (group._pg_id, index, bool(capture))


def _check_fits(group: PlacementGroup, index: int, request: dict[str, int], name: str) -> None:
    """Ray refuses at `.remote()` what no bundle of its group can hold (it would pend forever);
    here also what the one bundle it names cannot hold."""
    bundles = group.bundle_specs if index < 0 else [group.bundle_specs[index]]
    for bundle in bundles:
        if all(to_fixed(bundle.get(k, 0), k) >= v for k, v in request.items()):
            return
    asked = {k: from_fixed(v) for k, v in request.items() if v}
    where = f"any bundle of the placement group, {group.bundle_specs}" if index < 0 else \
        f"bundle {index} of the placement group, {bundles[0]}"
    raise ValueError(f"Cannot schedule {name} with the placement group because the resource request {asked} "
                     f"cannot fit into {where}")


def _check_group(group, what: str) -> None:
    if not isinstance(group, PlacementGroup):
        raise TypeError(f"{what} expects a placement group made by raylite's placement_group(), "
                        f"got {type(group).__name__}")
