"""Compiled graphs' names where raylite first kept them (raylite.dag.compiled_dag_node defines them,
at Ray's path ``ray.dag.compiled_dag_node``)."""
from raylite.dag.compiled_dag_node import CompiledDAG, CompiledDAGFuture, CompiledDAGRef

__all__ = ["CompiledDAG", "CompiledDAGFuture", "CompiledDAGRef"]
