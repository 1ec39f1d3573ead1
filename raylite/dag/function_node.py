"""``ray.dag.function_node``'s names, for code that imports them from there (raylite.dag defines them)."""
from raylite.dag import FunctionNode

__all__ = ["FunctionNode"]
