"""``ray.dag.dag_node``'s names, for code that imports them from there (raylite.dag defines them)."""
from raylite.dag import DAGNode

__all__ = ["DAGNode"]
