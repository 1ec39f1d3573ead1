"""``ray.dag.class_node``'s names, for code that imports them from there (raylite.dag.nodes defines them)."""
from raylite.dag.nodes import ClassNode, ClassMethodNode

__all__ = ["ClassNode", "ClassMethodNode"]
