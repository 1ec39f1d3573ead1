"""Ray's lazy DAG API (``ray.dag``): ``.bind()`` builds a graph of nodes, ``execute()`` runs it.

``f.bind(...)``, ``ActorClass.bind(...)``, ``class_node.method.bind(...)`` and
``handle.method.bind(...)`` (and the same after ``.options(...)``) return nodes instead of
submitting. A node's arguments may hold other nodes, at the top level or inside lists, tuples and
dicts. ``node.execute(*args, **kwargs)`` submits each node the graph needs once, dependencies
first, through the ordinary ``.remote()`` (so it runs on either backend), and returns what that
gave for the root: an ObjectRef, an ActorHandle for a ClassNode, a list for a MultiOutputNode.
As in Ray:

* a node's result reaches a task as ``.remote()`` passes an ObjectRef: resolved at the top level
  of the arguments, still a ref inside a list or dict;
* every ``execute()`` creates its ClassNodes' actors anew, and a ClassNode's method calls run in
  the order they were bound: executing ``a.get.bind()`` first submits an ``a.inc.bind()`` bound
  before it;
* ``InputNode`` stands for ``execute()``'s arguments: a single positional argument is the input
  itself (``inp[0]`` indexes into it); otherwise ``inp[i]`` is the i-th and ``inp.key`` (or
  ``inp["key"]``) the keyword ``key``.

On the Ray backend, actor handles are Ray's own, so ``handle.method.bind(...)`` gives a node of
``ray.dag``, which raylite's nodes refuse as an argument (a TypeError says so); graphs of functions
and ClassNodes run there as here.
"""
from __future__ import annotations

import warnings
from typing import Any

from raylite.core.api.options import METHOD_OPTIONS, check
from raylite.core.api.remote import ActorClass, ActorMethod, RemoteFunction
from raylite.core.api.submission import Options

__all__ = ["ClassMethodNode", "ClassNode", "DAGInputData", "DAGNode", "FunctionNode", "InputAttributeNode",
           "InputNode", "MultiOutputNode"]

_LOOKUP_ERRORS = (IndexError, KeyError, TypeError, AttributeError)


def _no_compiler(root: DAGNode, **options):
    raise RuntimeError("raylite.dag.nodes was imported without raylite.dag, which wires experimental_compile()")


_compiler = _no_compiler   # builds a compiled graph; compiled_dag_node sits above these nodes, so raylite.dag sets it


def set_compiler(compiler) -> None:
    """Give ``experimental_compile()`` the class that compiles a graph (raylite.dag, above both, calls it)."""
    global _compiler
    _compiler = compiler


def bind(target, args: tuple, kwargs: dict) -> DAGNode | tuple[DAGNode, ...]:
    """``.bind(*args, **kwargs)`` of a remote function, actor class or actor method, or of their
    ``.options(...)`` (then ``target`` wraps the original as ``_target``)."""
    original = target._target if isinstance(target, Options) else target
    if isinstance(original, RemoteFunction):
        return FunctionNode(target, original._name, args, kwargs)
    if isinstance(original, ActorClass):
        return ClassNode(target, original._name, original._meta[1], args, kwargs)
    if isinstance(original, ActorMethod):
        options = getattr(target, "_options", {})
        call = ClassMethodNode(original._handle, f"{original._handle._class_name}.{original._name}",
                               original._name, args, kwargs, options)
        returns = options.get("num_returns", original._num_returns)
        if isinstance(returns, int) and returns > 1:   # one node per return value, as Ray gives
            return tuple(_ReturnNode(call, i) for i in range(returns))
        return call
    raise TypeError(f"bind() needs a remote function, actor class or actor method, got {target!r}")


def _find(value, found: list) -> list:
    """The nodes in an argument: itself, or inside lists, tuples and dict values."""
    if isinstance(value, DAGNode):
        found.append(value)
    elif type(value) in (list, tuple):
        for item in value:
            _find(item, found)
    elif type(value) is dict:
        for item in value.values():
            _find(item, found)
    elif type(value).__module__.startswith("ray.dag."):
        raise TypeError(f"{type(value).__name__} is a node of Ray's own DAG API (ray.dag), which raylite's DAG "
                        f"nodes cannot take as an argument. On the Ray backend actor handles are Ray's, so their "
                        f"method.bind() gives Ray's nodes: bind on ActorClass.bind() (a ClassNode) instead, which "
                        f"runs on both backends, or build the whole graph with ray.dag.")
    return found


class _Execution:
    """One ``execute()``: the graph's input, and what each node gave so far (by identity)."""

    def __init__(self, args: tuple, kwargs: dict):
        self.args, self.kwargs = args, kwargs
        self.done: dict[int, Any] = {}

    def resolve(self, value):
        """An argument with its nodes replaced by their results."""
        if isinstance(value, DAGNode):
            return self.done[id(value)]
        if type(value) in (list, tuple):
            return type(value)(self.resolve(item) for item in value)
        if type(value) is dict:
            return {key: self.resolve(item) for key, item in value.items()}
        return value

    def arguments(self, node: DAGNode) -> tuple[tuple, dict]:
        if not node._upstream:
            return node._bound_args, node._bound_kwargs
        return (tuple(self.resolve(a) for a in node._bound_args),
                {k: self.resolve(v) for k, v in node._bound_kwargs.items()})


def _order(root: DAGNode) -> list[DAGNode]:
    """Every node ``root`` needs, each once, dependencies first (iterative: long chains are fine)."""
    order, seen, stack = [], set(), [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
        elif id(node) not in seen:
            seen.add(id(node))
            stack.append((node, True))
            stack.extend((up, False) for up in reversed(node._upstream))
    return order


class DAGNode:
    """A node of a lazy graph. Subclasses list the nodes they wait for (``_upstream``) and say
    what they give once those are done (``_run``)."""

    def __init__(self, args: tuple = (), kwargs: dict | None = None, upstream: tuple = ()):
        self._bound_args, self._bound_kwargs = tuple(args), dict(kwargs or {})
        self._upstream: list[DAGNode] = _find([self._bound_args, list(self._bound_kwargs.values())], [])
        self._upstream.extend(upstream)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        """Submit the graph this node ends, with ``args`` and ``kwargs`` as its InputNode; returns
        this node's result (an ObjectRef, an ActorHandle, or a list for a MultiOutputNode)."""
        warnings.warn("DAGNode.execute() is deprecated and will be removed in a future release.",
                      DeprecationWarning, stacklevel=2)   # Ray 2.60 says so too
        order = _order(self)
        inputs = [node for node in order if isinstance(node, InputNode)]
        if len(inputs) > 1:   # the error type Ray raises
            raise AssertionError(f"Each DAG should only have one unique InputNode; {self!r} reads "
                                 f"{len(inputs)}. Bind every input to the one `with InputNode() as inp:`.")
        run = _Execution(args, kwargs)
        for node in order:
            run.done[id(node)] = node._run(run)
        return run.done[id(self)]

    def _run(self, run: _Execution) -> Any:
        raise NotImplementedError

    def experimental_compile(self, _submit_timeout: float | None = None, _buffer_size_bytes: int | None = None,
                             enable_asyncio: bool = False, _max_inflight_executions: int | None = None,
                             _max_buffered_results: int | None = None, _overlap_gpu_communication: bool | None = None,
                             _default_communicator="create"):
        """Ray's compiled graph of this node's actor calls (raylite.dag.compiled_dag_node)."""
        return _compiler(self, enable_asyncio=enable_asyncio, _max_inflight_executions=_max_inflight_executions)

    def with_tensor_transport(self, transport: str = "auto", device: str = "default", _static_shape: bool = False,
                              _direct_return: bool = False) -> DAGNode:
        """How a compiled graph moves this node's tensors; on one node they go through shared memory."""
        return self

    def with_type_hint(self, typ) -> DAGNode:
        """A compiled graph's hint for this node's output (raylite.experimental.channel): changes nothing
        on one node, where tensors go through shared memory."""
        return self

    def __getattr__(self, name: str):
        if name == "bind":
            raise AttributeError(f".bind() cannot be used again on {self!r}")
        if name == "remote":
            raise AttributeError(f".remote() cannot be used on {self!r}. To execute the task graph for this "
                                 f"node, use .execute().")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class FunctionNode(DAGNode):
    """A task: ``f.bind(...)``."""

    def __init__(self, target, name: str, args: tuple, kwargs: dict):
        self._target, self._name = target, name
        super().__init__(args, kwargs)

    def _run(self, run: _Execution):
        args, kwargs = run.arguments(self)
        return self._target.remote(*args, **kwargs)

    def __repr__(self) -> str:
        return f"FunctionNode({self._name})"


class ClassNode(DAGNode):
    """An actor, created anew by each ``execute()``: ``ActorClass.bind(...)``. Its methods bind
    calls on it: ``node.method.bind(...)``."""

    def __init__(self, target, name: str, methods: dict, args: tuple, kwargs: dict):
        self._target, self._name, self._methods = target, name, methods
        self._last_call: ClassMethodNode | None = None   # calls run in the order they were bound
        super().__init__(args, kwargs)
        if any(isinstance(node, InputNode) for node in self._upstream):
            raise ValueError(f"InputNode cannot be an argument of {name}.bind(): the actor's constructor "
                             f"arguments are fixed when the graph is built. Pass the input to a method "
                             f"call instead (node.method.bind(inp)).")

    def _run(self, run: _Execution):
        args, kwargs = run.arguments(self)
        return self._target.remote(*args, **kwargs)

    def __getattr__(self, name: str):
        if name in self.__dict__.get("_methods", ()):
            return _UnboundMethod(self, name, {})
        if name in ("bind", "remote") or name.startswith("__"):
            return super().__getattr__(name)
        raise AttributeError(f"actor class {self.__dict__.get('_name')} has no method {name!r}")

    def __repr__(self) -> str:
        return f"ClassNode({self._name})"


class _UnboundMethod:
    """``class_node.method``: what ``.bind(...)`` (or ``.options(...).bind(...)``) makes a call of."""

    def __init__(self, actor: ClassNode, method: str, options: dict):
        self._actor, self._method, self._options = actor, method, options

    def options(self, **options) -> _UnboundMethod:
        return _UnboundMethod(self._actor, self._method, check(options, METHOD_OPTIONS, "actor methods"))

    def bind(self, *args, **kwargs) -> ClassMethodNode:
        actor = self._actor
        call = ClassMethodNode(actor, f"{actor._name}.{self._method}", self._method, args, kwargs,
                               self._options, after=actor._last_call)
        actor._last_call = call
        return call

    def __getattr__(self, name: str):
        if name == "remote":
            raise AttributeError(".remote() cannot be used on ClassMethodNodes. Use .bind() instead to express "
                                 "a symbolic actor call.")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class ClassMethodNode(DAGNode):
    """An actor call: on a ClassNode's actor, or on an existing handle (``handle.method.bind``)."""

    def __init__(self, actor, name: str, method: str, args: tuple, kwargs: dict, options: dict,
                 after: ClassMethodNode | None = None):
        self._actor, self._name, self._method, self._options = actor, name, method, options
        super().__init__(args, kwargs, tuple(n for n in (actor, after) if isinstance(n, DAGNode)))

    def _run(self, run: _Execution):
        handle = run.done[id(self._actor)] if isinstance(self._actor, ClassNode) else self._actor
        method = getattr(handle, self._method)
        if self._options:
            method = method.options(**self._options)
        args, kwargs = run.arguments(self)
        return method.remote(*args, **kwargs)

    def __repr__(self) -> str:
        return f"ClassMethodNode({self._name})"


class _ReturnNode(DAGNode):
    """One of the refs of an actor call with num_returns > 1."""

    def __init__(self, call: ClassMethodNode, index: int):
        self._call, self._index = call, index
        super().__init__(upstream=(call,))

    def _run(self, run: _Execution):
        return run.done[id(self._call)][self._index]

    def __repr__(self) -> str:
        return f"ClassMethodNode({self._call._name})[{self._index}]"


class MultiOutputNode(DAGNode):
    """Several results from one ``execute()``: it returns their list."""

    def __init__(self, args: list | tuple):
        if not isinstance(args, (list, tuple)):
            raise ValueError(f"MultiOutputNode takes a list or tuple of nodes, got args={args!r} "
                             f"({type(args).__name__})")
        super().__init__(args)

    def _run(self, run: _Execution) -> list:
        return list(run.arguments(self)[0])

    def __repr__(self) -> str:
        return f"MultiOutputNode({len(self._bound_args)} outputs)"


class DAGInputData:
    """The input of an ``execute()`` given several arguments, or keywords: ``[i]`` reads the
    i-th positional argument, ``["key"]`` the keyword ``key``."""

    def __init__(self, *args, **kwargs):
        self._args, self._kwargs = list(args), kwargs

    def __getitem__(self, key: int | str):
        if isinstance(key, int):
            return self._args[key]
        if isinstance(key, str):
            return self._kwargs[key]
        raise ValueError(f"DAG input is read with an int index or a str key, got {key!r}")

    def __repr__(self) -> str:
        return f"DAGInputData(args={self._args!r}, kwargs={self._kwargs!r})"


class InputNode(DAGNode):
    """``execute()``'s arguments inside the graph: ``with InputNode() as inp:``, then ``inp``,
    ``inp[0]`` or ``inp.key`` as arguments of ``.bind(...)``."""

    def __init__(self, *args, **kwargs):
        if args or kwargs:
            raise ValueError(f"InputNode should not take any args or kwargs (the input comes from "
                             f"execute()), got args={args!r}, kwargs={kwargs!r}")
        self._entered = False
        super().__init__()

    def __enter__(self) -> InputNode:
        self._entered = True
        return self

    def __exit__(self, *exc_info) -> None:
        pass

    def __getitem__(self, key: int | str) -> InputAttributeNode:
        if not isinstance(key, (int, str)):   # the error type Ray raises
            raise AssertionError(f"DAG input is read with an int index or a str key, got inp[{key!r}]")
        return InputAttributeNode(self, key, by_attribute=False)

    def __getattr__(self, name: str) -> InputAttributeNode:
        if name.startswith("__"):
            raise AttributeError(name)
        return InputAttributeNode(self, name, by_attribute=True)

    def _run(self, run: _Execution):
        if not self._entered:   # the error type Ray raises
            raise AssertionError("InputNode must be created as `with InputNode() as inp:` and the graph bound "
                                 "inside that block before execute() can pass it the input.")
        if len(run.args) == 1 and not run.kwargs:
            return run.args[0]
        return DAGInputData(*run.args, **run.kwargs)

    def __repr__(self) -> str:
        return "InputNode()"


class InputAttributeNode(DAGNode):
    """Part of the input: ``inp[0]``, ``inp["key"]`` or ``inp.key``."""

    def __init__(self, input_node: InputNode, key: int | str, by_attribute: bool):
        self._input, self._key, self._by_attribute = input_node, key, by_attribute
        super().__init__(upstream=(input_node,))

    def _run(self, run: _Execution):
        value = run.done[id(self._input)]
        try:
            if isinstance(value, DAGInputData):
                return value[self._key]
            return getattr(value, self._key) if self._by_attribute else value[self._key]
        except _LOOKUP_ERRORS as e:
            if type(e) not in _LOOKUP_ERRORS:   # a user type's own error: as it is
                raise
            if len(run.args) == 1 and not run.kwargs:
                given = (f" from execute()'s only argument, {run.args[0]!r:.60} ({type(run.args[0]).__name__}), "
                         f"which is the whole input: {e} (for several inputs, call execute(a, b, key=...))")
            else:
                given = (f", but execute() got {len(run.args)} positional argument(s) and keyword(s) "
                         f"{sorted(run.kwargs)}")
            raise type(e)(f"the DAG reads {self._label()}{given}") from None

    def _label(self) -> str:
        return f"inp.{self._key}" if self._by_attribute else f"inp[{self._key!r}]"

    def __repr__(self) -> str:
        return f"InputAttributeNode({self._label()})"
