"""``ray.dag.class_node``'s names, for code that imports them from there (raylite.dag defines them)."""
from raylite.dag import ClassNode, ClassMethodNode

__all__ = ["ClassNode", "ClassMethodNode"]
