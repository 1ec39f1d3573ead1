"""``ray.util.scheduling_strategies``'s names (the implementation is raylite.core.placement_groups)."""
from raylite.core.placement_groups import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

__all__ = ["NodeAffinitySchedulingStrategy", "PlacementGroupSchedulingStrategy"]
