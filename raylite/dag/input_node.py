"""``ray.dag.input_node``'s names, for code that imports them from there (raylite.dag.nodes defines them)."""
from raylite.dag.nodes import InputNode, InputAttributeNode, DAGInputData

__all__ = ["InputNode", "InputAttributeNode", "DAGInputData"]
