"""``ray.dag.output_node``'s names, for code that imports them from there (raylite.dag defines them)."""
from raylite.dag import MultiOutputNode

__all__ = ["MultiOutputNode"]
