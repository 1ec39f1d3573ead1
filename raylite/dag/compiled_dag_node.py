"""Ray's compiled graphs (``dag.experimental_compile()``), with Ray's API and rules, run as ordinary
actor calls.

Ray compiles a graph of actor method calls into channels between the actors, for low overhead per
execution. On one node raylite runs each ``execute()`` as the calls ``.remote()`` makes (about 0.2
ms each here), so code written for compiled graphs runs unchanged, with Ray's checks: only method
calls on actors that already exist, exactly one InputNode, no graph node as a keyword argument,
``execute()`` with the arguments the graph reads; each CompiledDAGRef can be got once, at most
``_max_inflight_executions`` (``RAY_CGRAPH_max_inflight_executions``, 10) executions may wait to be
got, a get waits ``RAY_CGRAPH_get_timeout`` (10 s) unless given a timeout, and ``teardown()`` ends
the graph. Tensor transports (``with_tensor_transport``) change nothing here: values travel
through shared memory either way.
"""
from __future__ import annotations

import asyncio
import os
from typing import Any

from raylite import exceptions
from raylite.dag.nodes import (ClassMethodNode, ClassNode, DAGNode, FunctionNode, InputAttributeNode, InputNode,
                               MultiOutputNode, _Execution, _order, _ReturnNode)

MAX_INFLIGHT = int(os.environ.get("RAY_CGRAPH_max_inflight_executions", 10))
GET_TIMEOUT_S = float(os.environ.get("RAY_CGRAPH_get_timeout", 10))


class CompiledDAG:
    def __init__(self, root: DAGNode, enable_asyncio: bool = False, _max_inflight_executions: int | None = None,
                 **_ignored):
        self._order = _order(root)
        self._root = root
        self._check()
        self._wait_for_actors()
        self._enable_asyncio = enable_asyncio
        self._max_inflight = MAX_INFLIGHT if _max_inflight_executions is None else _max_inflight_executions
        self._submitted = 0      # executions so far
        self._fetched = 0        # the highest execution got (those before it count as read, as in Ray)
        self.is_teardown = False

    def _check(self) -> None:
        inputs = [n for n in self._order if isinstance(n, InputNode)]
        if len(inputs) != 1:
            raise NotImplementedError("Compiled DAGs currently require exactly one InputNode")
        direct, positional, keywords = False, set(), set()
        for node in self._order:
            if isinstance(node, FunctionNode):
                raise NotImplementedError("Compiled DAGs currently only support actor method nodes")
            if isinstance(node, ClassNode):   # (a method bound on one has it upstream, so in the order)
                raise ValueError("Compiled DAGs can only bind methods to an actor that is already created with "
                                 "Actor.remote()")
            if isinstance(node, MultiOutputNode) and node is not self._root:
                raise ValueError("a MultiOutputNode can only be the graph's output (the node compiled)")
            if any(isinstance(v, DAGNode) for v in node._bound_kwargs.values()):
                raise ValueError("Compiled DAG currently does not support binding to other DAG nodes as kwargs")
            if isinstance(node, InputAttributeNode):
                (positional if isinstance(node._key, int) else keywords).add(node._key)
            elif not isinstance(node, (InputNode, _ReturnNode)) and any(isinstance(a, InputNode) for a in node._upstream):
                direct = True
        if direct and (positional or keywords):
            raise ValueError("All tasks must either use InputNode() directly, or they must index to specific args "
                             "or kwargs.")
        self._positional = 1 if direct else (max(positional) + 1 if positional else 0)
        self._keywords = tuple(sorted(keywords))

    def _wait_for_actors(self) -> None:
        """As Ray's compile (which sets up its channels on every actor), return once each actor's
        constructor has run, so executions are not timed by a slow one; a failed one raises here."""
        from raylite.core.api import runtime as api
        api.get([handle.__ray_ready__.remote() for handle in self._actors()])

    def _actors(self) -> list:
        return list({id(n._actor): n._actor for n in self._order if isinstance(n, ClassMethodNode)}.values())

    def _check_inputs(self, args: tuple, kwargs: dict) -> None:
        if len(args) != self._positional:
            raise ValueError(f"dag.execute() or dag.execute_async() must be called with {self._positional} "
                             f"positional args, got {len(args)}")
        for key in self._keywords:
            if key not in kwargs:
                raise ValueError(f"dag.execute() or dag.execute_async() must be called with kwarg `{key}`")

    def _submit(self, args: tuple, kwargs: dict):
        if self.is_teardown:
            raise exceptions.RayChannelError("the compiled graph was torn down (teardown()): its channels are closed")
        self._check_inputs(args, kwargs)
        waiting = self._submitted - self._fetched
        if waiting >= self._max_inflight:
            raise exceptions.RayCgraphCapacityExceeded(
                f"The compiled graph can't have more than {self._max_inflight} in-flight executions, and you "
                f"currently have {waiting} in-flight executions. Retrieve an output using ray.get before "
                f"submitting more requests or increase `_max_inflight_executions`. "
                f"`dag.experimental_compile(_max_inflight_executions=...)`")
        run = _Execution(args, kwargs)
        for node in self._order:
            run.done[id(node)] = node._run(run)
        self._submitted += 1
        return self._submitted, run.done[id(self._root)]

    def execute(self, *args: Any, **kwargs: Any):
        """One execution: a CompiledDAGRef (a list of them for a MultiOutputNode)."""
        if self._enable_asyncio:
            raise ValueError("Use execute_async if enable_asyncio=True")
        index, out = self._submit(args, kwargs)
        if isinstance(out, list):
            return [CompiledDAGRef(self, index, ref) for ref in out]
        return CompiledDAGRef(self, index, out)

    async def execute_async(self, *args: Any, **kwargs: Any):
        """One execution: a CompiledDAGFuture to await (a list of them for a MultiOutputNode)."""
        if not self._enable_asyncio:
            raise ValueError("Use execute if enable_asyncio=False")
        index, out = self._submit(args, kwargs)
        if isinstance(out, list):
            return [CompiledDAGFuture(self, index, ref) for ref in out]
        return CompiledDAGFuture(self, index, out)

    def _got(self, index: int) -> None:
        """An execution's result was got, or its ref dropped: it and those before it are no longer
        in flight (Ray reads the results in order, buffering those not got yet)."""
        self._fetched = max(self._fetched, index)

    def teardown(self, kill_actors: bool = False) -> None:
        """End the graph (later executes raise RayChannelError); with kill_actors, kill its actors."""
        if self.is_teardown:
            return
        self.is_teardown = True
        if kill_actors:
            import raylite
            for handle in self._actors():
                raylite.kill(handle)

    def get_id(self) -> str:
        return f"{id(self):x}"

    def visualize(self, filename: str = "compiled_graph", format: str = "png", view: bool = False,
                  channel_details: bool = False) -> str:
        """Ray's drawing of the graph: ``format="ascii"`` returns a text listing (and prints it with
        ``view``); other formats need the graphviz package, as in Ray, write ``filename.format``
        and return the DOT source."""
        index = {id(node): i for i, node in enumerate(self._order)}
        edges = [(index[id(up)], i) for i, node in enumerate(self._order) for up in node._upstream if id(up) in index]
        if format == "ascii":
            if channel_details:
                raise ValueError("Parameters 'channel_details' are not compatible with 'ascii' format.")
            text = "\n".join(f"{i}: {node!r}" + "".join(f" <- {a}" for a, b in edges if b == i)
                             for i, node in enumerate(self._order))
            if view:
                print(text)
            return text
        try:
            import graphviz
        except ImportError:
            raise ImportError("Please install graphviz to visualize the compiled graph. You can install it by "
                              "running `pip install graphviz`.") from None
        dot = graphviz.Digraph(name="compiled_graph", format=format)
        for i, node in enumerate(self._order):
            dot.node(str(i), f"Task {i}\n{node!r}")
        for a, b in edges:
            dot.edge(str(a), str(b))
        dot.render(filename, view=view)
        return dot.source


class _OneExecution:
    """What an execution gives back: bound to its graph's bookkeeping, so never copied or pickled."""

    def __str__(self) -> str:
        return f"{type(self).__name__}({self._dag.get_id()}, execution_index={self._execution_index})"

    __repr__ = __str__

    def __copy__(self):
        raise ValueError(f"{type(self).__name__} cannot be copied.")

    def __deepcopy__(self, memo):
        raise ValueError(f"{type(self).__name__} cannot be deep copied.")

    def __reduce__(self):
        raise ValueError(f"{type(self).__name__} cannot be pickled.")


class CompiledDAGRef(_OneExecution):
    """A compiled graph execution's result: ``ray.get`` it once. It cannot be copied, pickled,
    passed to a task or waited on."""

    _raylite_compiled = True

    def __init__(self, dag: CompiledDAG, execution_index: int, ref):
        self._dag, self._execution_index, self._ref = dag, execution_index, ref
        self._ray_get_called = False

    def get(self, timeout: float | None = None):
        import raylite
        if self._ray_get_called:
            raise ValueError("ray.get() can only be called once on a CompiledDAGRef, and it was already called.")
        self._ray_get_called = True
        try:
            return raylite.get(self._ref, timeout=GET_TIMEOUT_S if timeout is None else timeout)
        except exceptions.GetTimeoutError:
            raise exceptions.RayChannelTimeoutError(
                f"the compiled graph's result was not ready within {GET_TIMEOUT_S if timeout is None else timeout} "
                f"s (RAY_CGRAPH_get_timeout, or get's timeout)") from None
        finally:
            self._dag._got(self._execution_index)

    def __del__(self):
        if not self._ray_get_called:
            self._dag._got(self._execution_index)


class CompiledDAGFuture(_OneExecution):
    """An ``execute_async()`` result: await it once."""

    def __init__(self, dag: CompiledDAG, execution_index: int, ref):
        self._dag, self._execution_index, self._ref = dag, execution_index, ref

    def __await__(self):
        if self._ref is None:
            raise ValueError("CompiledDAGFuture can only be awaited upon once, and it has already been awaited upon.")
        ref, self._ref = self._ref, None
        try:
            return (yield from asyncio.ensure_future(_await(ref)).__await__())
        finally:
            self._dag._got(self._execution_index)

    def __del__(self):
        if self._ref is not None:
            self._dag._got(self._execution_index)


async def _await(ref):
    return await ref
