"""`@remote` functions and `@ray.method`; actor classes and handles live in raylite.core.api.actor_class
(imported here too, their old home), and what both submit with in raylite.core.api.submission."""
from __future__ import annotations

import os

from raylite.core.api import submission

from raylite.core.api.actor_class import ActorClass, ActorClassInheritanceException, ActorHandle, ActorMethod
from raylite.core.api.options import METHOD_OPTIONS, TASK_OPTIONS, check
from raylite.core.api.options import retry_on as _retry_on
from raylite.core.client import context
from raylite.core.client.link import next_id, process, return_id
from raylite.core.wire import signatures
from raylite.core.wire.signatures import is_coroutine_function
from raylite.core.wire.protocol import TaskSpec, call_of, call_template
from raylite.core.wire.resources import ACCELERATOR_RESOURCES

__all__ = ["ActorClass", "ActorClassInheritanceException", "ActorHandle", "ActorMethod", "RemoteFunction",
           "is_coroutine_function", "method"]

_RESOURCE_KEYS = {"num_cpus", "num_gpus", "resources", "memory", "accelerator_type"}


def _uses_accelerators(request: dict) -> bool:
    return any(request.get(r, 0) > 0 for r in ACCELERATOR_RESOURCES)


class RemoteFunction:
    """What ``@ray.remote`` makes of a function: ``f.remote(*args)`` submits a task and returns its ref."""

    def __init__(self, function, options: dict):
        self._function = function
        self._name = getattr(function, "__name__", "task")
        self._options = check(dict(options), TASK_OPTIONS, "remote functions")
        self._request = submission.request_of(self._options, 1.0)
        self._fresh = int(_uses_accelerators(self._request))   # max_calls when not given
        self._fn_id = os.urandom(8).hex()
        self._bytes: bytes | None = None
        self._returns = signatures.default_returns(function)
        self._retry_on = _retry_on(self._options.get("retry_exceptions", False))
        self._arity = signatures.arity(function)
        self._plain: bool | None = None   # whether its own options take _plain_spec (known after a call)
        self._plain_fields: tuple = ()    # its name and its calls' shared spec fields as _spec resolved them
        self._feasible_on = None          # the resources model its request was found feasible on
        self.__doc__ = getattr(function, "__doc__", None)

    def __call__(self, *args, **kwargs):
        raise TypeError(f"Remote functions cannot be called directly. Instead of running "
                        f"'{self._name}()', try '{self._name}.remote()'.")

    def __reduce__(self):
        # the signature goes along: a function that calls itself is rebuilt here while cloudpickle
        # still builds it, before its defaults are set (its arity would then miss them)
        return (RemoteFunction, (self._function, self._options), {"_arity": self._arity, "__doc__": self.__doc__})

    def options(self, **options) -> submission.Options:
        """The same function with these of ``remote``'s options changed, for the next ``.remote()``."""
        merged = check({**self._options, **options}, TASK_OPTIONS, "remote functions")
        if options.keys() & _RESOURCE_KEYS:
            submission.request_of(merged, 1.0)   # validate now, not at .remote()
        return submission.Options(self, merged)

    def remote(self, *args, **kwargs):
        """Submit a task with these arguments (refs among them are resolved first); returns its ref."""
        return self._remote(args, kwargs, self._options)

    bind = submission.bind

    def _remote(self, args, kwargs, options: dict, holder=None):
        client = process.client or submission.client()
        if client is None:
            return process.ray.submit(self, self._function, args, kwargs, options)
        shape = self._arity   # checked as Ray does; inline, the common call costs two comparisons
        if shape is not None and (kwargs or not shape[0] <= len(args) <= shape[1] or shape[4]):
            signatures.check(shape, args, kwargs, self._name)
        if self._bytes is None:
            self._bytes = submission.pickled(self._function, f"function {self._name}")
        if options is self._options and self._plain is not False:
            spec = self._plain_spec(client, args, kwargs)
        else:
            spec = self._spec(client, args, kwargs, options, holder)
        client.submit(spec, self._bytes)
        return submission.refs(spec)

    def _spec(self, client, args, kwargs, options: dict, holder) -> TaskSpec:
        request = self._request if options is self._options else submission.request_of(options, 1.0)
        name = options.get("name") or self._name
        task_id = next_id()
        return_ids, stream = submission.returns(task_id, options.get("num_returns", self._returns))
        max_calls = options.get("max_calls")
        if max_calls is None:   # accelerator tasks get a fresh process: frameworks never free device memory
            max_calls = self._fresh if request is self._request else int(_uses_accelerators(request))
        max_retries = options.get("max_retries")
        args_ser, deps = submission.pack_args(name, args, kwargs, client.shm_prefix)
        spec = TaskSpec("task", task_id, name, args_ser, deps, return_ids,
                        self._fn_id, None, request, max_calls, 3 if max_retries is None else max_retries,
                        runtime_env=submission.env_of(options, name, holder or self),
                        placement=submission.placement(options, request, name),
                        stream=stream, retry_exceptions=(self._retry_on if options is self._options
                                                         else _retry_on(options.get("retry_exceptions", False))),
                        unschedulable=submission.unschedulable(options, name))
        submission.warn_if_infeasible(client, name, request, self if request is self._request else None)
        if options is self._options and self._plain is None:
            self._plain = (spec.placement is None and spec.unschedulable is None and stream is None
                           and len(return_ids) == 1 and submission.placement_free(options)
                           and self._feasible_on is client.resources_model)
            self._plain_fields = (name, call_template(spec))
        return spec

    def _plain_spec(self, client, args, kwargs) -> TaskSpec:
        """The spec of a call with the function's own options when they ask for nothing the
        general path works out per call (no placement, label selector, stream or several
        returns; found feasible): `_spec`'s result, with the fields it resolved kept (_plain_fields)."""
        if self._feasible_on is not client.resources_model or context.current_placement() is not None:
            return self._spec(client, args, kwargs, self._options, None)
        name, template = self._plain_fields
        args_ser, deps = submission.pack_args(name, args, kwargs, client.shm_prefix)
        task_id = next_id()
        return call_of(template, task_id, args_ser, deps, (return_id(task_id, 0),),
                       submission.env_of(self._options, name, self))

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
