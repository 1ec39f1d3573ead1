"""What ``@ray.remote`` makes of a class (ActorClass), the handle ``.remote()`` returns
(ActorHandle) and a method call on it (ActorMethod). raylite.core.api.remote, their old home, still
names them."""
from __future__ import annotations

import os

from raylite.core.api import submission
from raylite.core.api.options import ACTOR_OPTIONS, METHOD_OPTIONS, check
from raylite.core.api.options import retry_on as _retry_on
from raylite.core.client.objects import BackendType, ObjectRef
from raylite.core.client.link import next_id, process
from raylite.core.wire import refs, signatures
from raylite.core.wire.protocol import TaskSpec
from raylite.core.wire.resources import SCALE
from raylite.core.worker.concurrency import ASYNC_DEFAULT_CONCURRENCY


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
            out[name] = signatures.default_returns(attr) if declared is None else declared
    return out


class ActorClassInheritanceException(TypeError):
    """`class D(SomeActorClass)`: as in Ray, an actor class cannot be a base class."""


class ActorClass:
    """What ``@ray.remote`` makes of a class: ``C.remote(*args)`` starts an actor, returning its handle."""

    def __init__(self, cls, options: dict):
        self._cls = cls
        self._name = cls.__name__
        self._options = check(dict(options), ACTOR_OPTIONS, "actors")
        submission.request_of(self._options, 0.0)
        self._fn_id = os.urandom(8).hex()
        self._bytes: bytes | None = None
        self._meta = (self._name, _methods(cls))
        self._arities = {name: signatures.method_arity(cls, name) for name in self._meta[1]}
        self._init_arity = (signatures.method_arity(cls, "__init__") if cls.__init__ is not object.__init__
                            else (0, 0, (), (), (), False))
        self._call_options = _call_options(cls)
        # an async actor runs up to 1000 calls at once unless told otherwise, as in Ray
        self._async_default = ASYNC_DEFAULT_CONCURRENCY if signatures.has_async_methods(cls) else 0
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

    def options(self, **options) -> submission.Options:
        """The same class with these of ``remote``'s options changed (``name``, ``lifetime``, ...)."""
        merged = check({**self._options, **options}, ACTOR_OPTIONS, "actors")
        submission.request_of(merged, 0.0)
        return submission.Options(self, merged)

    def remote(self, *args, **kwargs) -> ActorHandle:
        """Start an actor, its constructor called with these arguments; returns its handle at once."""
        return self._remote(args, kwargs, self._options)

    bind = submission.bind

    def _remote(self, args, kwargs, options: dict, holder=None) -> ActorHandle:
        client = process.client or submission.client()
        if client is None:
            return process.ray.submit(self, self._cls, args, kwargs, options)
        name = options.get("name")
        request = submission.request_of(options, 0.0)   # held while alive: 0 CPU unless asked for
        schedule = None
        if options.get("num_cpus") is None:
            schedule = {**request, "CPU": SCALE}   # placement needs a CPU free, as in Ray
        if self._bytes is None:
            self._bytes = submission.pickled(self._cls, f"actor class {self._name}")
        args_ser, deps = submission.pack_args(self._name, args, kwargs, client.shm_prefix)
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
                        runtime_env=submission.env_of(options, self._name, holder or self),
                        placement=submission.placement(options, request, self._name),
                        detached=options.get("lifetime") == "detached",
                        unschedulable=submission.unschedulable(options, self._name))
        spec.actor_id = spec.task_id
        if name is not None:   # at once, as in Ray: a taken name raises here (or get_if_exists returns it)
            existing = client.create_named(spec, self._bytes, bool(options.get("get_if_exists")))
            if existing is not None:
                return ActorHandle(*existing)
        submission.warn_if_infeasible(client, self._name, schedule or request)
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

    def __reduce__(self):   # counted like a nested ObjectRef (see raylite.core.client.objects)
        if not refs.record(self._actor_id) and process.client is not None:
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

    def options(self, **options) -> submission.Options:
        check(options, METHOD_OPTIONS, "actor methods")
        return submission.Options(self, options)

    def remote(self, *args, **kwargs):
        return self._remote(args, kwargs, {})

    bind = submission.bind

    def _remote(self, args, kwargs, options: dict, holder=None):
        client = submission.client()
        handle = self._handle
        name = f"{handle._class_name}.{self._name}"
        shape = handle._arities.get(self._name)
        if shape is not None and (kwargs or not shape[0] <= len(args) <= shape[1] or shape[4]):
            signatures.check(shape, args, kwargs, name)
        if handle._max_pending > 0:
            handle._admit(client, name)
        task_id = next_id()
        return_ids, stream = submission.returns(task_id, options.get("num_returns", self._num_returns))
        args_ser, deps = submission.pack_args(name, args, kwargs, client.shm_prefix)
        declared = handle._call_options.get(self._name) or {}
        retry_on = (_retry_on(options["retry_exceptions"]) if "retry_exceptions" in options
                    else declared.get("retry_exceptions", False))   # (as type names, see `method`)
        options = {**declared, **options}
        spec = TaskSpec("actor_call", task_id, name, args_ser, deps, return_ids,
                        max_retries=options.get("max_task_retries"),   # None: the actor's own
                        actor_id=handle._actor_id, method=self._name, stream=stream,
                        concurrency_group=options.get("concurrency_group"),
                        retry_exceptions=retry_on)
        client.submit(spec, None)
        out = submission.refs(spec)
        if handle._max_pending > 0 and spec.return_ids:   # (num_returns=0 calls cannot be followed)
            handle._pending.append(out._completion if spec.stream == "streaming"
                                   else out if type(out) is ObjectRef else out[0])
        return out
