"""``ray.util.scheduling_strategies``'s names (the implementation is raylite.core.api.placement_groups
and raylite.core.wire.labels)."""
from raylite.core.api.scheduling import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy
from raylite.core.wire.labels import DoesNotExist, Exists, In, NodeLabelSchedulingStrategy, NotIn

__all__ = ["NodeAffinitySchedulingStrategy", "PlacementGroupSchedulingStrategy", "NodeLabelSchedulingStrategy",
           "In", "NotIn", "Exists", "DoesNotExist"]
