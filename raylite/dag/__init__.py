"""Ray's lazy DAG API (``ray.dag``): ``.bind()`` builds a graph of nodes (raylite.dag.nodes says how
they run), ``execute()`` runs it, ``experimental_compile()`` makes a compiled graph of actor calls
(raylite.dag.compiled_dag_node). This package wires the two: the nodes sit below the compiler."""
from raylite.dag.compiled_dag_node import CompiledDAG
from raylite.dag.nodes import (ClassMethodNode, ClassNode, DAGInputData, DAGNode, FunctionNode, InputAttributeNode,
                               InputNode, MultiOutputNode, set_compiler)

set_compiler(CompiledDAG)

__all__ = ["ClassMethodNode", "ClassNode", "DAGInputData", "DAGNode", "FunctionNode", "InputAttributeNode",
           "InputNode", "MultiOutputNode"]
