"""Placement groups, as ``ray.util.placement_group`` (the strategies that schedule into one, and
what a submission's options ask for: raylite.core.api.scheduling; the handle: raylite.core.client.placement_group).

``placement_group(bundles)`` reserves every bundle's resources at once (when they fit) and tasks
or actors scheduled into the group (``PlacementGroupSchedulingStrategy``, or the older
``placement_group=`` option) draw from a bundle instead of the node's free resources, so a gang of
workers either all fit or wait together. On one node every strategy packs; ``STRICT_SPREAD`` with
more than one bundle cannot be placed and is an error. On the Ray backend these calls are Ray's.
"""
from __future__ import annotations

from raylite.core.api.scheduling import _check_group
from raylite.core.client import context, link
from raylite.core.client.link import next_id, process
from raylite.core.client.placement_group import PlacementGroup
from raylite.core.wire import serialization
from raylite.core.wire.resources import from_fixed, to_fixed

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def placement_group(bundles: list[dict], strategy: str = "PACK", name: str = "", lifetime: str | None = None,
                    _max_cpu_fraction_per_node: float | None = None, bundle_label_selector: list | None = None,
                    **ray_only) -> PlacementGroup:
    """Reserve ``bundles`` (dicts of resource name to amount) together, placed asynchronously:
    ``ray.get(pg.ready())`` waits for them.

    Args:
        bundles: the resources of each bundle, ``[{"CPU": 1, "GPU": 1}, ...]``.
        strategy: ``"PACK"``, ``"SPREAD"``, ``"STRICT_PACK"`` or ``"STRICT_SPREAD"`` (all pack on one node).
        name: a name for ``get_placement_group``.
        lifetime: ``"detached"``: outlives its creator (here, until ``shutdown``).
        bundle_label_selector: per bundle, node labels it needs (``[{"zone": "eu-1"}, ...]``).
    """
    # checked on either backend: Ray's takes a bundle such as {'CPU': '1'}, and its raylet crashed on it
    if strategy not in STRATEGIES:
        raise ValueError(f"placement_group: strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if lifetime not in (None, "detached"):
        raise ValueError(f"placement_group: lifetime must be None or 'detached', got lifetime={lifetime!r}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"placement_group: name must be a string, got name={name!r} ({type(name).__name__})")
    if not isinstance(bundles, (list, tuple)) or not bundles:
        raise ValueError(f"placement_group: bundles must be a non-empty list of dicts, got {bundles!r}")
    units = [_bundle_units(i, b) for i, b in enumerate(bundles)]
    if (ray_util := _ray_util()) is not None:
        if bundle_label_selector is not None:
            ray_only["bundle_label_selector"] = bundle_label_selector
        return ray_util.placement_group(bundles, strategy=strategy, name=name, lifetime=lifetime, **ray_only)
    client = _client()   # (started first: the label check needs the node's labels)
    if bundle_label_selector:
        _check_label_selectors(bundle_label_selector, len(bundles))
    pg_id, ready_id = next_id(), next_id()
    ready = PlacementGroup(pg_id, [{k: from_fixed(v) for k, v in b.items()} for b in units], ready_id)
    client.group("create", pg_id, units, strategy, name or "", ready_id, serialization.dumps(ready, None))
    return PlacementGroup(pg_id, [dict(b) for b in bundles], ready_id)


def _check_label_selectors(selectors, n_bundles: int) -> None:
    """Each bundle's label selector must match this node, the only one (else, like a bundle
    larger than the node, the group could never be placed: an error, not a group pending forever)."""
    from raylite.core.wire import labels
    if not isinstance(selectors, (list, tuple)) or len(selectors) != n_bundles:
        raise ValueError(f"placement_group: bundle_label_selector must be a list of {n_bundles} dicts, one per "
                         f"bundle, got {selectors!r}")
    node = context.node_labels()
    for i, selector in enumerate(selectors):
        why = labels.unmet(labels.selector(selector, f"bundle_label_selector[{i}]"), node)
        if why is not None:
            raise ValueError(f"placement_group: bundle {i} can never be placed: its bundle_label_selector "
                             f"{selector!r} does not match this node: {why}")


def remove_placement_group(placement_group: PlacementGroup) -> None:
    """Release the group's resources; tasks and actors running in it are killed, as in Ray."""
    if (ray_util := _ray_util()) is not None:
        return ray_util.remove_placement_group(placement_group)
    _check_group(placement_group, "remove_placement_group")
    _client().group("remove", placement_group._pg_id)


def get_placement_group(placement_group_name: str) -> PlacementGroup:
    if (ray_util := _ray_util()) is not None:
        return ray_util.get_placement_group(placement_group_name)
    pg_id, bundles, ready_id = _client().group("info", None, placement_group_name, True)
    return PlacementGroup(pg_id, [{k: from_fixed(v) for k, v in b.items()} for b in bundles], ready_id)


def placement_group_table(placement_group: PlacementGroup | None = None) -> dict:
    """State, strategy and bundles of one group, or of all of them by id."""
    if (ray_util := _ray_util()) is not None:
        return ray_util.placement_group_table(placement_group)
    return _client().group("info", None if placement_group is None else placement_group._pg_id)


def get_current_placement_group() -> PlacementGroup | None:
    """The group the calling task or actor runs in (None in the driver or outside a group)."""
    if (ray_util := _ray_util()) is not None:
        return ray_util.get_current_placement_group()
    current = context.current_placement()
    if current is None:
        return None
    pg_id, bundles, ready_id = _client().group("info", current[0], None, True)
    return PlacementGroup(pg_id, [{k: from_fixed(v) for k, v in b.items()} for b in bundles], ready_id)


def _bundle_units(i: int, bundle) -> dict[str, int]:
    if not isinstance(bundle, dict) or not bundle:
        raise ValueError(f"placement_group: bundles[{i}] must be a non-empty dict of resource amounts, "
                         f"got {bundle!r}")
    units = {}
    for name, amount in bundle.items():
        if not isinstance(name, str):
            raise ValueError(f"placement_group: bundles[{i}] has a non-string resource name {name!r}")
        units[name] = to_fixed(amount, f"bundles[{i}][{name!r}]")
    if not any(units.values()):
        raise ValueError(f"placement_group: bundles[{i}] asks for nothing ({bundle!r})")
    return {k: v for k, v in units.items() if v}


def _ray_util():
    """``ray.util`` while raylite runs on Ray (also inside Ray's own workers), else None."""
    if link.on_ray():
        return process.ray.util()
    return None


def _client():
    from raylite.core.api.submission import client
    return client()
