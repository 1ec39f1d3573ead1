"""``ray.util.placement_group``'s names (the implementation is raylite.core.api.placement_groups)."""
from raylite.core.api.placement_groups import (PlacementGroup, get_current_placement_group, get_placement_group,
                                               placement_group, placement_group_table, remove_placement_group)

__all__ = ["PlacementGroup", "get_current_placement_group", "get_placement_group", "placement_group",
           "placement_group_table", "remove_placement_group"]
