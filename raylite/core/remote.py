"""`@remote` functions and actor classes, `.options(...)`, and actor handles."""
from __future__ import annotations

import os
import warnings

from raylite import exceptions
from raylite.core import context, objects, ray_backend, runtime_env, serialization, signatures, streams
from raylite.core.objects import BackendType, ObjectRef, next_id, process
from raylite.core.protocol import TaskSpec
from raylite.core.options import ACTOR_OPTIONS, METHOD_OPTIONS, TASK_OPTIONS, check
from raylite.core.options import retry_on as _retry_on
from raylite.core.resources import ACCELERATOR_RESOURCES, SCALE, normalize_request

_RESOURCE_KEYS = {"num_cpus", "num_gpus", "resources", "memory", "accelerator_type"}
_PLACEMENT_KEYS = {"scheduling_strategy", "placement_group", "placement_group_bundle_index",
                   "placement_group_capture_child_tasks"}   # see _placement and _unschedulable


def _placement(options: dict, request: dict, name: str):
    if _PLACEMENT_KEYS.isdisjoint(options) and context.current_placement() is None:
        return None   # the common case, without importing placement groups
    from raylite.core.placement_groups import placement_of
    return placement_of(options, request, name)


def _env(options: dict, name: str, holder) -> tuple | None:
    """The runtime_env a submission runs in on the local runtime: its own over the submitter's
    (inherited). Checked at the first local submission, not at decoration (a Ray cluster accepts
    more: URIs, containers), and kept on `holder`, whose options never change."""
    own = holder.__dict__.get("_own_env", _UNCHECKED)
    if own is _UNCHECKED:
        raw = options.get("runtime_env")
        own = holder._own_env = runtime_env.normalize(raw, name) if raw is not None else None
    return runtime_env.merge(process.runtime_env, own)


_UNCHECKED = object()


def _request(options: dict, default_cpus: float) -> dict:
    return normalize_request(num_cpus=options.get("num_cpus"), num_gpus=options.get("num_gpus"),
                             resources=options.get("resources"), memory=options.get("memory"),
                             accelerator_type=options.get("accelerator_type"), default_cpus=default_cpus)


def _unschedulable(options: dict, name: str) -> str | None:
    """Why this node can never run a task or actor with these options (its label selector, a
    NodeLabelSchedulingStrategy, or a hard NodeAffinitySchedulingStrategy naming another node);
    warned at submission, as for a request larger than the node."""
    selector, strategy = options.get("label_selector"), options.get("scheduling_strategy")
    if not selector and strategy is None:
        return None
    from raylite.core import labels
    node = context.node_labels()
    why = labels.unmet(labels.selector(selector), node) if selector else None
    if why is None and isinstance(strategy, labels.NodeLabelSchedulingStrategy):
        why = labels.unmet(strategy.constraints(), node)
    if why is None and type(strategy).__name__ == "NodeAffinitySchedulingStrategy" and not strategy.soft:
        wanted = strategy.node_id.hex() if hasattr(strategy.node_id, "hex") else strategy.node_id
        if wanted != node[labels.NODE_ID_KEY]:
            why = (f"its NodeAffinitySchedulingStrategy asks for node {wanted!r} (soft=False), but this node is "
                   f"{node[labels.NODE_ID_KEY]!r}")
    if why is None:
        return None
    message = f"{name} can never be scheduled: {why}"
    warnings.warn(f"{message}; get() on it raises InfeasibleTaskError.", UserWarning, stacklevel=4)
    return message


def _client():
    """The local runtime's client (started with defaults if need be, as Ray does), or None when
    the Ray backend runs: then ``process.ray`` takes the call."""
    if process.client is None and process.ray is None and not ray_backend.attach():
        from raylite.core import api
        api.init()
    return process.client


def _pack_args(name: str, args: tuple, kwargs: dict, prefix: str):
    """Serialized arguments and the ids of the top-level refs among them, which the worker resolves."""
    try:
        return serialization.dumps_args(args, kwargs, prefix)
    except exceptions.ObjectStoreFullError:
        raise
    except Exception as e:
        raise TypeError(f"Could not serialize the arguments of {name}: {e}") from e


LARGE_FUNCTION_BYTES = 10 << 20   # Ray warns above the same size


def _pickled(obj, name: str) -> bytes:
    try:
        data = serialization.dumps_function(obj)
    except Exception as e:
        raise TypeError(f"Could not serialize {name} to send it to a worker: {e}") from e
    if len(data) > LARGE_FUNCTION_BYTES:   # every worker that runs it gets its own copy
        warnings.warn(f"{name} is very large when pickled ({len(data) / (1 << 20):.1f} MiB): its definition "
                      "probably captures a large array or other object in scope. Pass it with ray.put() and "
                      "an argument instead.", stacklevel=4)
    return data


def _warn_if_infeasible(client, name: str, request: dict, holder=None) -> None:
    """Warn at submission, as Ray does; `holder` (a remote function submitting with its own
    options, whose request never changes) remembers the model it was found feasible on."""
    model = client.resources_model
    if holder is not None and holder.__dict__.get("_feasible_on") is model:
        return
    if model.feasible(request):
        if holder is not None:
            holder._feasible_on = model
    else:
        warnings.warn(f"{name} asks for {model.describe(request)} but this node only has "
                      f"{model.describe(model.total)}; it will never be scheduled and get() on it "
                      f"raises InfeasibleTaskError.", UserWarning, stacklevel=4)


def _uses_accelerators(request: dict) -> bool:
    return any(request.get(r, 0) > 0 for r in ACCELERATOR_RESOURCES)


def _returns(num_returns) -> tuple[tuple, str | None]:
    """Return ids for num_returns, and the generator mode if it names one."""
    if num_returns == 1:
        return (next_id(),), None
    if num_returns in streams.MODES:
        return (next_id(),), num_returns
    return tuple(next_id() for _ in range(num_returns)), None


ASYNC_DEFAULT_CONCURRENCY = 1000   # calls at once on an async actor unless told otherwise, as in Ray
# code flags, not inspect (10 ms to import): CO_GENERATOR, CO_COROUTINE, CO_ASYNC_GENERATOR
_GENERATOR_FLAGS, _ASYNC_FLAGS = 0x20 | 0x200, 0x80 | 0x200


def _code_flags(fn) -> int:
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return code.co_flags if code is not None else 0


def is_coroutine_function(fn) -> bool:
    return bool(_code_flags(fn) & 0x80)


def has_async_methods(cls) -> bool:
    """Whether an actor class is async (any async def or async generator method): its calls then
    share one event loop, in the driver's spec and in the worker alike."""
    return any(_code_flags(getattr(cls, name, None)) & _ASYNC_FLAGS for name in dir(cls))


def _default_returns(fn):
    """Ray streams what a generator function yields unless told otherwise."""
    return "streaming" if _code_flags(fn) & _GENERATOR_FLAGS else 1


def _refs(spec: TaskSpec):
    """What `.remote()` returns: one ref, a list for num_returns > 1, None for num_returns=0, an
    ObjectRefGenerator for a streaming generator."""
    if spec.stream == "streaming":
        return streams.ObjectRefGenerator(ObjectRef(spec.return_ids[0], True))
    ids = spec.return_ids
    if len(ids) == 1:
        return ObjectRef(ids[0], True)
    return [ObjectRef(i, True) for i in ids] or None


def _bind(self, *args, **kwargs):
    """`.bind(...)`: a node of a lazy graph (Ray's DAG API, raylite.dag) instead of a submission;
    the graph's `execute()` submits it."""
    from raylite.dag import bind
    return bind(self, args, kwargs)


class _Options:
    """What `.options(...)` returns: the same callable with overridden options."""

    bind = _bind

    def __init__(self, target, options: dict):
        self._target, self._options = target, options

    def remote(self, *args, **kwargs):
        return self._target._remote(args, kwargs, self._options, self)


class RemoteFunction:
    """What ``@ray.remote`` makes of a function: ``f.remote(*args)`` submits a task and returns its ref."""

    def __init__(self, function, options: dict):
        self._function = function
        self._name = getattr(function, "__name__", "task")
        self._options = check(dict(options), TASK_OPTIONS, "remote functions")
        self._request = _request(self._options, 1.0)
        self._fresh = int(_uses_accelerators(self._request))   # max_calls when not given
        self._fn_id = os.urandom(8).hex()
        self._bytes: bytes | None = None
        self._returns = _default_returns(function)
        self._retry_on = _retry_on(self._options.get("retry_exceptions", False))
        self._arity = signatures.arity(function)
        self.__doc__ = getattr(function, "__doc__", None)

    def __call__(self, *args, **kwargs):
        raise TypeError(f"Remote functions cannot be called directly. Instead of running "
                        f"'{self._name}()', try '{self._name}.remote()'.")

    def __reduce__(self):
        return (RemoteFunction, (self._function, self._options))

    def options(self, **options) -> _Options:
        """The same function with these of ``remote``'s options changed, for the next ``.remote()``."""
        merged = check({**self._options, **options}, TASK_OPTIONS, "remote functions")
        if options.keys() & _RESOURCE_KEYS:
            _request(merged, 1.0)   # validate now, not at .remote()
        return _Options(self, merged)

    def remote(self, *args, **kwargs):
        """Submit a task with these arguments (refs among them are resolved first); returns its ref."""
        return self._remote(args, kwargs, self._options)

    bind = _bind

    def _remote(self, args, kwargs, options: dict, holder=None):
        client = process.client or _client()
        if client is None:
            return process.ray.submit(self, self._function, args, kwargs, options)
        request = self._request if options is self._options else _request(options, 1.0)
        name = options.get("name") or self._name
        shape = self._arity   # checked as Ray does; inline, the common call costs two comparisons
        if shape is not None and (kwargs or not shape[0] <= len(args) <= shape[1] or shape[4]):
            signatures.check(shape, args, kwargs, self._name)
        if self._bytes is None:
            self._bytes = _pickled(self._function, f"function {self._name}")
        return_ids, stream = _returns(options.get("num_returns", self._returns))
        max_calls = options.get("max_calls")
        if max_calls is None:   # accelerator tasks get a fresh process: frameworks never free device memory
            max_calls = self._fresh if request is self._request else int(_uses_accelerators(request))
        max_retries = options.get("max_retries")
        args_ser, deps = _pack_args(name, args, kwargs, client.shm_prefix)
        spec = TaskSpec("task", next_id(), name, args_ser, deps, return_ids,
                        self._fn_id, None, request, max_calls, 3 if max_retries is None else max_retries,
                        runtime_env=_env(options, name, holder or self), placement=_placement(options, request, name),
                        stream=stream, retry_exceptions=(self._retry_on if options is self._options
                                                         else _retry_on(options.get("retry_exceptions", False))),
                        unschedulable=_unschedulable(options, name))
        _warn_if_infeasible(client, name, request, self if request is self._request else None)
        client.submit(spec, self._bytes)
        return _refs(spec)


def method(*, num_returns: int | str | None = None, concurrency_group: str | None = None, **options):
    """`@ray.method(...)` on an actor method: its call options, as Ray's.

    Args:
        num_returns: refs a call returns (or "streaming" / "dynamic" for generators).
        concurrency_group: the group of the actor's `concurrency_groups` it runs in.
        **options: `name`, `max_task_retries` and `retry_exceptions` (the call runs again on those exceptions).
    """
    check({**options, "num_returns": num_returns, "concurrency_group": concurrency_group}, METHOD_OPTIONS,
              "@ray.method")

    def decorate(fn):
        if num_returns is not None:
            fn.__ray_num_returns__ = num_returns
        if concurrency_group is not None:
            fn.__ray_concurrency_group__ = concurrency_group
        retries = {k: options[k] for k in ("max_task_retries", "retry_exceptions") if k in options}
        if "retry_exceptions" in retries:
            # as type names: the actor's class meta travels in plain pickles, where a class
            # defined in the driver's __main__ would not load
            retries["retry_exceptions"] = _retry_on(retries["retry_exceptions"])
        if retries:
            fn.__ray_call_options__ = retries
        return fn
    return decorate


def _out_of_order(options: dict, is_async: bool, concurrency: int) -> bool:
    """allow_out_of_order_execution: Ray's default (True for async and threaded actors, which
    cannot keep submission order) and its checks."""
    allow = options.get("allow_out_of_order_execution")
    concurrent = is_async or concurrency > 1 or bool(options.get("concurrency_groups"))
    if allow is None:
        return concurrent
    if not isinstance(allow, bool):
        raise TypeError(f"allow_out_of_order_execution must be a bool, got {allow!r}")
    if concurrent and not allow:
        raise ValueError("allow_out_of_order_execution=False: an async or multi-threaded actor (max_concurrency > 1 "
                         "or concurrency groups) cannot run its calls in submission order")
    return allow


def _call_options(cls) -> dict[str, dict]:
    """Per-method call options from @ray.method (retries), which every handle applies."""
    return {name: attr.__ray_call_options__ for name in dir(cls)
            if (attr := getattr(cls, name, None)) is not None and hasattr(attr, "__ray_call_options__")}


def _methods(cls) -> dict[str, int | str]:
    out = {}
    for name in dir(cls):
        if name.startswith("__") and name != "__call__":
            continue
        attr = getattr(cls, name, None)
        if callable(attr):
            declared = getattr(attr, "__ray_num_returns__", None)
            out[name] = _default_returns(attr) if declared is None else declared
    return out


class ActorClassInheritanceException(TypeError):
    """`class D(SomeActorClass)`: as in Ray, an actor class cannot be a base class."""


class ActorClass:
    """What ``@ray.remote`` makes of a class: ``C.remote(*args)`` starts an actor, returning its handle."""

    def __init__(self, cls, options: dict):
        self._cls = cls
        self._name = cls.__name__
        self._options = check(dict(options), ACTOR_OPTIONS, "actors")
        _request(self._options, 0.0)
        self._fn_id = os.urandom(8).hex()
        self._bytes: bytes | None = None
        self._meta = (self._name, _methods(cls))
        self._arities = {name: signatures.method_arity(cls, name) for name in self._meta[1]}
        self._init_arity = (signatures.method_arity(cls, "__init__") if cls.__init__ is not object.__init__
                            else (0, 0, (), (), (), False))
        self._call_options = _call_options(cls)
        # an async actor runs up to 1000 calls at once unless told otherwise, as in Ray
        self._async_default = ASYNC_DEFAULT_CONCURRENCY if has_async_methods(cls) else 0
        self.__name__, self.__qualname__ = cls.__name__, getattr(cls, "__qualname__", cls.__name__)
        self.__module__, self.__doc__ = cls.__module__, cls.__doc__

    def __getattr__(self, name: str):
        """The class's own attributes (`C.LIMIT`, `C.some_staticmethod(...)`, `C.a_classmethod()`),
        from the driver and from its methods alike, as Ray's actor class inherits them."""
        cls = self.__dict__.get("_cls")
        if cls is None or name.startswith("__"):
            raise AttributeError(f"'ActorClass' object has no attribute {name!r}")
        try:
            return getattr(cls, name)
        except AttributeError:
            raise AttributeError(f"actor class {cls.__name__!r} has no attribute {name!r}") from None

    def __dir__(self):   # the class's names too (autocompletion), as Ray's actor class has them
        return sorted(set(object.__dir__(self)) | set(dir(self._cls)))

    def __mro_entries__(self, bases):
        raise ActorClassInheritanceException(
            f"Inheriting from actor classes is not allowed: subclass the plain class {self._name} "
            f"and decorate the subclass with @ray.remote instead")

    def __call__(self, *args, **kwargs):
        raise TypeError(f"Actors cannot be instantiated directly. Instead of '{self._name}()', "
                        f"use '{self._name}.remote()'.")

    def __reduce__(self):
        return (ActorClass, (self._cls, self._options))

    def options(self, **options) -> _Options:
        """The same class with these of ``remote``'s options changed (``name``, ``lifetime``, ...)."""
        merged = check({**self._options, **options}, ACTOR_OPTIONS, "actors")
        _request(merged, 0.0)
        return _Options(self, merged)

    def remote(self, *args, **kwargs) -> ActorHandle:
        """Start an actor, its constructor called with these arguments; returns its handle at once."""
        return self._remote(args, kwargs, self._options)

    bind = _bind

    def _remote(self, args, kwargs, options: dict, holder=None) -> ActorHandle:
        client = process.client or _client()
        if client is None:
            return process.ray.submit(self, self._cls, args, kwargs, options)
        name = options.get("name")
        request = _request(options, 0.0)   # held while alive: 0 CPU unless asked for
        schedule = None
        if options.get("num_cpus") is None:
            schedule = {**request, "CPU": SCALE}   # placement needs a CPU free, as in Ray
        if self._bytes is None:
            self._bytes = _pickled(self._cls, f"actor class {self._name}")
        args_ser, deps = _pack_args(self._name, args, kwargs, client.shm_prefix)
        restarts = options.get("max_restarts") or 0
        concurrency = options.get("max_concurrency") or self._async_default
        signatures.check(self._init_arity, args, kwargs, self._name)
        meta = (*self._meta, options.get("max_pending_calls") or -1, self._call_options, self._arities)
        spec = TaskSpec("actor_create", next_id(), self._name, args_ser, deps, (), self._fn_id, None, request,
                        max_retries=options.get("max_task_retries") or 0, actor_id=0,
                        actor_name=None if name is None else (options.get("namespace"), name),
                        max_restarts=restarts, schedule_request=schedule,
                        class_meta=meta, max_concurrency=concurrency,
                        concurrency_groups=options.get("concurrency_groups") or None,
                        out_of_order=_out_of_order(options, bool(self._async_default), concurrency),
                        runtime_env=_env(options, self._name, holder or self),
                        placement=_placement(options, request, self._name),
                        detached=options.get("lifetime") == "detached",
                        unschedulable=_unschedulable(options, self._name))
        spec.actor_id = spec.task_id
        if name is not None:   # at once, as in Ray: a taken name raises here (or get_if_exists returns it)
            existing = client.create_named(spec, self._bytes, bool(options.get("get_if_exists")))
            if existing is not None:
                return ActorHandle(*existing)
        _warn_if_infeasible(client, self._name, schedule or request)
        if name is None:
            client.submit(spec, self._bytes)
        return ActorHandle(spec.actor_id, meta, True)


class ActorHandle(metaclass=BackendType):
    """Calls on an actor: `handle.method.remote(...)`. Picklable, so tasks can use it."""

    def __init__(self, actor_id: int, meta: tuple, _tracked: bool = False):
        self._actor_id = actor_id
        self._class_name, self._methods, self._max_pending, self._call_options, self._arities = meta
        self._tracked = _tracked
        self._pending: list[ObjectRef] = []   # with max_pending_calls: a ref per call not known done

    def __getattr__(self, name: str):
        methods = self.__dict__.get("_methods", {})
        if name in methods:
            return ActorMethod(self, name, methods[name])
        if name in ("__ray_terminate__", "__ray_ready__"):   # Ray's graceful end (after the calls queued
            return ActorMethod(self, name, 1)                 # before it), and its "constructor done?"
        raise AttributeError(f"'{self.__dict__.get('_class_name', 'Actor')}' actor has no method {name!r}")

    def __dir__(self):   # its methods (autocompletion), as Ray's handle lists them
        return sorted(set(object.__dir__(self)) | set(self._methods))

    def __reduce__(self):   # counted like a nested ObjectRef (see raylite.core.objects)
        if not objects.record(self._actor_id) and process.client is not None:
            process.client.pin(self._actor_id)
        return (_borrowed_handle, (self._actor_id, (self._class_name, self._methods, self._max_pending,
                                                    self._call_options, self._arities)))

    def _admit(self, client, name: str) -> None:
        """max_pending_calls: refuse a call while this handle has that many unfinished."""
        if len(self._pending) < self._max_pending:
            return
        ready = client.wait([r.id for r in self._pending], len(self._pending), 0)
        self._pending = [r for r in self._pending if r.id not in ready]
        if len(self._pending) >= self._max_pending:
            from raylite.exceptions import PendingCallsLimitExceeded
            raise PendingCallsLimitExceeded(
                f"cannot submit {name}: {len(self._pending)} calls on this actor handle have not finished "
                f"and max_pending_calls={self._max_pending}; get some results first, or raise the limit with "
                f".options(max_pending_calls=...) when creating the actor")

    def __repr__(self) -> str:
        return f"Actor({self._class_name}, {self._actor_id:028x})"

    def __eq__(self, other) -> bool:   # handles of one actor are equal, as in Ray
        return isinstance(other, ActorHandle) and other._actor_id == self._actor_id

    def __hash__(self) -> int:
        return hash(self._actor_id)

    def __del__(self):
        if self.__dict__.get("_tracked") and process.client is not None:
            try:
                process.client.release(self._actor_id)
            except Exception:  # interpreter shutdown
                pass


def _borrowed_handle(actor_id: int, meta: tuple) -> ActorHandle:
    client = process.client
    if client is None:
        return ActorHandle(actor_id, meta)
    client.addref(actor_id)
    return ActorHandle(actor_id, meta, True)


class ActorMethod(metaclass=BackendType):
    def __init__(self, handle: ActorHandle, name: str, num_returns: int):
        self._handle, self._name, self._num_returns = handle, name, num_returns

    def __call__(self, *args, **kwargs):
        raise TypeError(f"Actor methods cannot be called directly. Instead of running "
                        f"'{self._name}()', try '{self._name}.remote()'.")

    def options(self, **options) -> _Options:
        check(options, METHOD_OPTIONS, "actor methods")
        return _Options(self, options)

    def remote(self, *args, **kwargs):
        return self._remote(args, kwargs, {})

    bind = _bind

    def _remote(self, args, kwargs, options: dict, holder=None):
        client = _client()
        handle = self._handle
        name = f"{handle._class_name}.{self._name}"
        shape = handle._arities.get(self._name)
        if shape is not None and (kwargs or not shape[0] <= len(args) <= shape[1] or shape[4]):
            signatures.check(shape, args, kwargs, name)
        if handle._max_pending > 0:
            handle._admit(client, name)
        return_ids, stream = _returns(options.get("num_returns", self._num_returns))
        args_ser, deps = _pack_args(name, args, kwargs, client.shm_prefix)
        declared = handle._call_options.get(self._name) or {}
        retry_on = (_retry_on(options["retry_exceptions"]) if "retry_exceptions" in options
                    else declared.get("retry_exceptions", False))   # (as type names, see `method`)
        options = {**declared, **options}
        spec = TaskSpec("actor_call", next_id(), name, args_ser, deps, return_ids,
                        max_retries=options.get("max_task_retries"),   # None: the actor's own
                        actor_id=handle._actor_id, method=self._name, stream=stream,
                        concurrency_group=options.get("concurrency_group"),
                        retry_exceptions=retry_on)
        client.submit(spec, None)
        out = _refs(spec)
        if handle._max_pending > 0 and spec.return_ids:   # (num_returns=0 calls cannot be followed)
            handle._pending.append(out._completion if spec.stream == "streaming"
                                   else out if type(out) is ObjectRef else out[0])
        return out
