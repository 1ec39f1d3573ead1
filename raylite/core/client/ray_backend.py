"""The Ray backend: raylite's public API carried out by a real Ray cluster.

Selected by ``init(address=...)``, ``init(backend="ray")`` or ``RAY_ADDRESS``; inside Ray's own
worker processes raylite attaches to it by itself (raylite.core.client.link.attach), so a task
that calls ``raylite.get`` or starts a ``Trainer`` uses the cluster it runs on. This module is
then ``process.ray`` and the Backend that ``link.backend()`` gives the API (its functions carry
the members of raylite.core.client.interface.Backend); the rest is what only Ray has. Nothing
above ``core`` knows which backend runs it. Ray is imported only here, and only when asked for.

Ray's errors are re-raised as raylite's exception classes of the same name, so code that catches
``raylite.exceptions.X`` behaves the same on both backends; a task's error stays an instance of
the user's exception class, with the remote traceback.
"""
from __future__ import annotations

import os
import re
import socket
import sys

from raylite import exceptions

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
INSTALL_HINT = "pip install 'raylite[ray]'"
_RAY_INIT_KEYS = ("num_cpus", "num_gpus", "resources", "object_store_memory", "namespace", "runtime_env",
                  "logging_level", "logging_format", "include_dashboard", "dashboard_host", "dashboard_port",
                  "job_config", "_temp_dir", "_system_config", "_memory", "logging_config", "labels")


def _ray():
    return sys.modules["ray"]


def connect(address: str | None, ignore_reinit_error: bool, log_to_driver: bool, configure_logging: bool,
            **kwargs):
    """``ray.init`` with the arguments that apply; a clear error when Ray is missing or unreachable."""
    try:
        import ray
    except ImportError as e:
        raise ImportError(f"init(address={address!r}) runs raylite on a Ray cluster, which needs Ray "
                          f"installed: {INSTALL_HINT} (or, for the local runtime, init(backend='local') "
                          f"or unset RAY_ADDRESS)") from e
    options = {k: v for k, v in kwargs.items() if k in _RAY_INIT_KEYS and v is not None}
    if "logging_config" in options:   # raylite's LoggingConfig, as Ray's
        options["logging_config"] = ray.LoggingConfig(**options["logging_config"].to_dict())
    if type(options.get("job_config")).__module__ == "raylite.core.api.job_config":   # raylite's JobConfig, as Ray's
        options["job_config"] = _ray_job_config(ray, options["job_config"])
    if address:
        _check_reachable(address)
    # the workers' output reaches the driver with plain prefixes, "(task pid=N) ...", as from the
    # local runtime (Ray colours them unless told otherwise)
    os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    global _breakpoint_before
    _breakpoint_before = os.environ.get(_BREAKPOINT_ENV)
    try:
        info = ray.init(address=address, ignore_reinit_error=ignore_reinit_error, log_to_driver=log_to_driver,
                        configure_logging=configure_logging, **options)
    except ConnectionError as e:
        raise ConnectionError(f"raylite could not connect to a Ray cluster at address={address!r}: {e}. Start "
                              f"one with `ray start --head`, or pass the address that `ray start` "
                              f"printed.") from e
    global _connected
    _connected = True
    return info


def _ray_job_config(ray, ours):
    """Ray's JobConfig with the fields of raylite's."""
    theirs = ray.job_config.JobConfig(
        jvm_options=ours.jvm_options, code_search_path=ours.code_search_path, runtime_env=ours.runtime_env,
        _client_job=ours._client_job, metadata=ours.metadata, ray_namespace=ours.ray_namespace,
        default_actor_lifetime=ours._default_actor_lifetime,
        _disable_job_level_lineage_reconstruction=ours._disable_job_level_lineage_reconstruction,
        _py_driver_sys_path=ours._py_driver_sys_path)
    if ours.py_logging_config is not None:
        theirs.set_py_logging_config(ray.LoggingConfig(**ours.py_logging_config.to_dict()))
    return theirs


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, not minutes, when nothing listens at a host:port address (Ray itself
    retries for minutes). Other forms ("auto", "local") are left to Ray."""
    target = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConnectionError(f"raylite could not reach a Ray cluster at address={address!r}: {e}. Is the head "
                              f"node up (`ray start --head` prints its address) and is the port open from "
                              f"here?") from None


def context():
    """What a repeated ``init(ignore_reinit_error=True)`` returns: Ray's own context."""
    return _ray().init(ignore_reinit_error=True)


_connected = False   # whether raylite's init made this process's Ray connection
# Ray's init points PYTHONBREAKPOINT at its own debugger and never takes it back: the driver's
# value before, restored when the connection ends, else a later local runtime's workers (which
# inherit the driver's environment) would send breakpoint() to a debugger nothing serves
_BREAKPOINT_ENV = "PYTHONBREAKPOINT"
_breakpoint_before: str | None = None


def shutdown(exiting_interpreter: bool = False) -> None:
    """Disconnect (the caller stops routing through Ray); at interpreter exit only a connection
    raylite made itself (a Ray worker that raylite attached to is Ray's to tear down)."""
    global _connected
    if _connected or not exiting_interpreter:
        _ray().shutdown()
    if _connected:
        _restore_breakpoint()
    _connected = False


def _restore_breakpoint() -> None:
    if _breakpoint_before is None:
        os.environ.pop(_BREAKPOINT_ENV, None)
    else:
        os.environ[_BREAKPOINT_ENV] = _breakpoint_before


def disconnected() -> bool:
    """Whether Ray's own shutdown (``ray.shutdown()``, the ``disconnect()`` or ``with`` of the
    context ``init`` returned, which is Ray's) ended the connection without raylite: then it is
    forgotten, and the caller stops routing to it, so the next ``init`` starts afresh instead of
    calling itself a second one."""
    global _connected
    if _ray().is_initialized():
        return False
    if _connected:
        _restore_breakpoint()
    _connected = False
    return True


def is_initialized() -> bool:
    return _ray().is_initialized()


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------

def translate(err: BaseException) -> BaseException:
    """Ray's exception as raylite's class of the same name (nearest in its MRO)."""
    ray = _ray()
    if isinstance(err, ray.exceptions.RayTaskError):
        # Ray's dual instance (``RayTaskError(ValueError)``) keeps only the cause and its message;
        # the task's name and pid are in the message's header (``ray::my_task() (pid=1234, ...``)
        text = _ANSI.sub("", str(err))   # (Ray colours the header; raylite's errors are plain text)
        named = re.search(r"ray::([\w.<>]+)\(\)\S* \(pid=(\d+)", text)
        return exceptions.RayTaskError(named.group(1) if named else "task", text, _user_cause(err),
                                       int(named.group(2)) if named else None).as_instanceof_cause()
    for cls in type(err).__mro__:
        ours = getattr(exceptions, cls.__name__, None)
        if isinstance(ours, type) and issubclass(ours, exceptions.RayActorError):
            return ours(str(err), actor_id=getattr(err, "actor_id", None))   # (Ray's: hex, or None)
        if isinstance(ours, type) and issubclass(ours, exceptions.RayError):
            return ours(str(err))
    return err


def _user_cause(err: BaseException) -> BaseException | None:
    """The error the innermost task raised: a nested task's error comes wrapped once per task in
    the chain (Ray's RayTaskError around the one raylite raised in the task above it), and only
    the user's own exception is kept, so ``except ZeroDivisionError`` catches it at any depth."""
    ray = _ray()
    cause = err
    while isinstance(cause, (ray.exceptions.RayTaskError, exceptions.RayTaskError)):
        cause = cause.__dict__.get("cause")
    if isinstance(cause, ray.exceptions.RayError):
        return translate(cause)
    return cause if isinstance(cause, BaseException) else None


class _Translated:
    """``with _Translated():`` re-raises Ray's errors as raylite's."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is not None and isinstance(exc, _ray().exceptions.RayError):
            raise translate(exc) from None
        return False


# ---------------------------------------------------------------------------------------------
# the API
# ---------------------------------------------------------------------------------------------

def get(object_refs, timeout):
    with _Translated():
        return _ray().get(object_refs, timeout=timeout)


def wait(object_refs, num_returns: int, timeout, fetch_local: bool):
    """As raylite's: the first ``num_returns`` ready refs in the order given (Ray picks any of
    the ready ones, so a second, non-blocking look finds all that are ready)."""
    refs = list(object_refs)
    ray = _ray()
    with _Translated():
        ready, _ = ray.wait(refs, num_returns=num_returns, timeout=timeout, fetch_local=fetch_local)
        if len(ready) < len(refs):
            ready += ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=fetch_local)[0]
    done = set(ready)
    done = set([r for r in refs if r in done][:num_returns])
    return [r for r in refs if r in done], [r for r in refs if r not in done]


def put(value, owner=None):
    """``owner`` is not passed on: Ray 2.56 removed ``_owner`` (put refuses it), and raylite's
    objects outlive the actor named anyway, as the driver's own puts on Ray do."""
    _share_by_value()
    with _Translated():
        return _ray().put(value)


def kill(actor, no_restart: bool) -> None:
    _ray().kill(actor, no_restart=no_restart)


def cancel(object_ref, force: bool, recursive: bool) -> None:
    _ray().cancel(object_ref, force=force, recursive=recursive)


def get_actor(name: str, namespace: str | None):
    return _ray().get_actor(name, namespace=namespace)


def list_named_actors(all_namespaces: bool) -> list:
    import ray.util
    return ray.util.list_named_actors(all_namespaces)


def cluster_resources() -> dict:
    return _ray().cluster_resources()


def available_resources() -> dict:
    return _ray().available_resources()


def nodes() -> list[dict]:
    return _ray().nodes()


def get_gpu_ids() -> list:
    return _ray().get_gpu_ids()


def get_runtime_context():
    return _ray().get_runtime_context()


def get_node_ip_address() -> str:
    return _ray().util.get_node_ip_address()


_COUNTERPARTS = {"ActorHandle": "actor", "ActorMethod": "actor", "RuntimeContext": "runtime_context"}


def counterpart(cls: type) -> type:
    """Ray's class for raylite's ObjectRef, (Dynamic)ObjectRefGenerator, ActorHandle, ActorMethod
    or RuntimeContext (for isinstance): what Ray's calls return while raylite runs on it."""
    import importlib
    home = _COUNTERPARTS.get(cls.__name__)
    return getattr(importlib.import_module(f"ray.{home}") if home else _ray(), cls.__name__)


def submit(target, wrapped, args: tuple, kwargs: dict, options: dict):
    """``.remote()`` of a raylite RemoteFunction or ActorClass (``target``, wrapping the function or
    class ``wrapped``): Ray's remote object with the same options, made once and cached on target."""
    ray = _ray()
    remote = target.__dict__.get("_ray_remote")
    if remote is None:
        if isinstance(wrapped, type):
            _declare_call_options(wrapped)
        base = target._options
        remote = ray.remote(**_ray_options(base))(wrapped) if base else ray.remote(wrapped)
        target._ray_remote = remote
    if options is not target._options:
        remote = remote.options(**_ray_options(options))
    _share_by_value()
    with _Translated():
        return remote.remote(*args, **kwargs)


def _declare_call_options(cls: type) -> None:
    """``@ray.method(max_task_retries=..., retry_exceptions=...)`` as Ray reads them (its own
    attributes on the method): raylite's decorator keeps them in ``__ray_call_options__``, which
    Ray does not know, so an actor's calls were never retried on their exceptions."""
    for name in dir(cls):
        declared = getattr(getattr(cls, name, None), "__ray_call_options__", None)
        if declared is None:
            continue
        fn = getattr(cls, name)
        if "max_task_retries" in declared:
            fn.__ray_max_task_retries__ = declared["max_task_retries"]
        retry_on = declared.get("retry_exceptions")
        if retry_on is not None:
            fn.__ray_retry_exceptions__ = retry_on if isinstance(retry_on, bool) else [_by_name(retry_on)]


class _NamedTypes(type):
    """An exception type that an error is an instance of when its class or a base has one of
    ``names`` ("module.Name", as raylite's specs carry retry_exceptions: classes defined in a
    function travel as names where the class itself would not load)."""

    def __instancecheck__(cls, obj) -> bool:
        return any(f"{c.__module__}.{c.__name__}" in cls.names for c in type(obj).__mro__)


def _by_name(names: tuple) -> type:
    return _NamedTypes("RetryOn", (Exception,), {"names": frozenset(names)})


def util():
    """``ray.util``, where Ray's placement group functions live."""
    return _ray().util


def state_api():
    """``ray.util.state``, Ray's state API (imported on first use, as Ray does)."""
    import importlib
    return importlib.import_module("ray.util.state")


def timeline(filename: str | None):
    return _ray().timeline(filename=filename)


def _ray_options(options: dict) -> dict:
    """raylite's scheduling strategy objects (raylite.util.scheduling_strategies) as Ray's, and
    label selectors in Ray's spelling."""
    if options.get("label_selector"):
        options = {**options, "label_selector": _ray_selector(options["label_selector"])}
    strategy = options.get("scheduling_strategy")
    if type(strategy).__module__ not in ("raylite.core.api.scheduling", "raylite.core.wire.labels"):
        return options
    from ray.util import scheduling_strategies as theirs
    if hasattr(strategy, "hard"):
        def conditions(ours):
            return {key: getattr(theirs, type(op).__name__)(*getattr(op, "values", ())) for key, op in ours.items()}
        strategy = theirs.NodeLabelSchedulingStrategy(conditions(strategy.hard), soft=conditions(strategy.soft or {}))
    elif hasattr(strategy, "placement_group"):
        strategy = theirs.PlacementGroupSchedulingStrategy(
            strategy.placement_group, strategy.placement_group_bundle_index,
            strategy.placement_group_capture_child_tasks)
    else:
        strategy = theirs.NodeAffinitySchedulingStrategy(strategy.node_id, strategy.soft)
    return {**options, "scheduling_strategy": strategy}


_LIST_SPACES = re.compile(r"\s*([(),])\s*")


def _ray_selector(selector: dict) -> dict:
    """``in(us-1, eu-1)`` as ``in(us-1,eu-1)``: Ray keeps the spaces as part of the values (so
    nothing matches and the task waits forever); the local runtime drops them."""
    return {key: _LIST_SPACES.sub(r"\1", value) if isinstance(value, str) else value
            for key, value in selector.items()}


def _share_by_value() -> None:
    """Modules registered with ``cloudpickle.register_pickle_by_value`` (a notebook's helpers, an
    example shipping its own code) travel by value on Ray too: Ray pickles with its own copy of
    cloudpickle, which keeps its own registry."""
    ours = getattr(sys.modules.get("cloudpickle.cloudpickle"), "_PICKLE_BY_VALUE_MODULES", None)
    theirs = getattr(sys.modules.get("ray.cloudpickle.cloudpickle"), "_PICKLE_BY_VALUE_MODULES", None)
    if ours and theirs is not None and not ours <= theirs:
        theirs.update(ours)
