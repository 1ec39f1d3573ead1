"""``ray.dag.dag_node``'s names, for code that imports them from there (raylite.dag.nodes defines them)."""
from raylite.dag.nodes import DAGNode

__all__ = ["DAGNode"]
