"""``ray.util.scheduling_strategies``'s names (the implementation is raylite.core.placement_groups
and raylite.core.labels)."""
from raylite.core.labels import DoesNotExist, Exists, In, NodeLabelSchedulingStrategy, NotIn
from raylite.core.placement_groups import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

__all__ = ["NodeAffinitySchedulingStrategy", "PlacementGroupSchedulingStrategy", "NodeLabelSchedulingStrategy",
           "In", "NotIn", "Exists", "DoesNotExist"]
