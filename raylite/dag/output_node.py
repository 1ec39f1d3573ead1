"""``ray.dag.output_node``'s names, for code that imports them from there (raylite.dag.nodes defines them)."""
from raylite.dag.nodes import MultiOutputNode

__all__ = ["MultiOutputNode"]
