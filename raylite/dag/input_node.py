"""``ray.dag.input_node``'s names, for code that imports them from there (raylite.dag defines them)."""
from raylite.dag import InputNode, InputAttributeNode, DAGInputData

__all__ = ["InputNode", "InputAttributeNode", "DAGInputData"]
