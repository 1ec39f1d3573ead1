"""``ray.dag.function_node``'s names, for code that imports them from there (raylite.dag.nodes defines them)."""
from raylite.dag.nodes import FunctionNode

__all__ = ["FunctionNode"]
