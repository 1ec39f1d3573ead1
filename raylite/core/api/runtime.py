"""The public API with Ray's names. Works the same in the driver and inside workers."""
from __future__ import annotations

import atexit
import os
import threading

from raylite.core.api.local import LocalBackend
from raylite.core.api.remote import ActorClass, ActorHandle, RemoteFunction
from raylite.core.api.startup import (RayContext, accelerator_part, anonymous_namespace, node_totals,
                                      session_log_dir, use_ray)
from raylite.core.client import context, link, ray_backend
from raylite.core.client.objects import ObjectRef, check_timeout
from raylite.core.client.link import process
from raylite.core.client.streams import ObjectRefGenerator
from raylite.core.wire import segments, serialization
from raylite.core.wire.ids import NODE_IP
from raylite.core.wire.resources import ACCELERATOR_TYPE_PREFIX, SCALE

WORKER_IMPORTS = (__name__,)   # what the zygote imports for every worker: this API, which tasks call
_lock = threading.RLock()
_node = None
_endpoint = None   # the node's control endpoint (raylite.core.api.control)


def init(address: str | None = None, *, num_cpus: float | None = None, num_gpus: float | None = None,
         resources: dict | None = None, object_store_memory: int | None = None, local_mode: bool = False,
         ignore_reinit_error: bool = False, include_dashboard: bool | None = None,
         dashboard_host: str | None = None, dashboard_port: int | None = None, logging_level=None,
         logging_format=None, log_to_driver: bool = True, namespace: str | None = None,
         runtime_env: dict | None = None, configure_logging: bool = True, job_config=None,
         _temp_dir: str | None = None, _system_config: dict | None = None,
         _memory: int | None = None, backend: str | None = None, logging_config=None, labels: dict | None = None):
    """Start the local runtime (a node manager thread in this process and a zygote for workers),
    or, given an address, ``backend="ray"`` or ``RAY_ADDRESS``, connect to a Ray cluster instead.

    Args:
        address: a Ray cluster to join (``"auto"``, ``"host:6379"``, ``"ray://host:10001"``); None
            (and no ``RAY_ADDRESS``) or ``"local"`` runs on this machine.
        num_cpus: CPUs to offer; default: the process's CPU affinity, capped by a cgroup quota.
        num_gpus: GPUs to offer; default: those detected. An explicit count is logical.
        resources: custom resources and the other accelerator families, ``{"name": quantity}``.
        object_store_memory: bytes of shared memory for objects (default 30% of free memory).
        local_mode: Ray's deprecated serial mode: a warning; tasks still run in workers.
        ignore_reinit_error: a second ``init`` returns the running context instead of raising.
        include_dashboard: True serves a live page on 127.0.0.1 behind a token (``dashboard_url``).
        dashboard_host: only 127.0.0.1 / localhost (another host warns and is not used).
        dashboard_port: the dashboard's port (default Ray's 8265, else a free one; 0: any free one).
        logging_level: accepted for Ray's sake (as are ``logging_format`` and ``configure_logging``).
        log_to_driver: True: worker output is printed here; False: kept in per-worker log files.
        namespace: the job's namespace for named actors; default: a fresh anonymous one.
        runtime_env: the job's runtime environment, inherited by every task and actor.
        job_config: a ``JobConfig``: its runtime_env, ray_namespace and logging config apply
            (init's own arguments win).
        _system_config: accepted for Ray's sake (as is ``_memory``).
        _temp_dir: where session logs go (default: the system's temporary directory).
        backend: ``"local"`` or ``"ray"``, overriding what ``address`` and ``RAY_ADDRESS`` say.
        logging_config: a ``LoggingConfig`` for the root logger of the driver and every worker.
        labels: this node's labels, ``{"key": "value"}``, for label selectors.

    Returns:
        A dict-like context (``address_info``, ``dashboard_url``); as a context manager it shuts
        the runtime down on exit."""
    global _node, _endpoint
    zygote = dashboard = None
    try:
        if address is not None and not isinstance(address, str):   # init(4) meaning num_cpus=4
            raise TypeError(f"init()'s first argument is Ray's address ('auto', 'ray://host:10001', ...), "
                            f"got address={address!r}; pass num_cpus=... and the others by keyword")
        with _lock:
            if process.ray is not None and process.ray.disconnected():
                process.ray = None
            if process.client is not None or link.on_ray():
                if ignore_reinit_error:   # also true inside tasks and actors
                    return _context()
                raise RuntimeError("Maybe you called ray.init twice by accident? This error can be suppressed "
                                   "by passing in 'ignore_reinit_error=True' or by calling 'ray.shutdown()' "
                                   "prior to 'ray.init()'.")
            if local_mode:   # (on either backend: Ray is never handed it)
                import warnings
                warnings.warn("init(local_mode=True) is not supported (Ray deprecated it): tasks and actors run in "
                              "worker processes as usual", stacklevel=2)
            if use_ray(address, backend):
                info = ray_backend.connect(
                    address if address is not None else os.environ.get("RAY_ADDRESS") or None,
                    ignore_reinit_error, log_to_driver, configure_logging, num_cpus=num_cpus, num_gpus=num_gpus,
                    resources=resources, object_store_memory=object_store_memory, namespace=namespace,
                    runtime_env=runtime_env, logging_level=logging_level, logging_format=logging_format,
                    include_dashboard=include_dashboard, dashboard_host=dashboard_host,
                    dashboard_port=dashboard_port, job_config=job_config, _temp_dir=_temp_dir,
                    _system_config=_system_config, _memory=_memory,
                    **({"logging_config": logging_config} if logging_config is not None else {}),
                    **({"labels": labels} if labels is not None else {}))
                process.ray = ray_backend   # routing through Ray from now on
                return info
            from raylite.core.api import control
            from raylite.core.api.job_config import local_settings
            from raylite.core.envs import runtime_env as runtime_envs
            from raylite.core.worker import zygote as zygotes
            control_on = control.enabled()
            runtime_env, namespace, logging_config = local_settings(job_config, runtime_env, namespace,
                                                                    logging_config)
            if include_dashboard:   # binds its port now: a port in use raises before anything starts
                from raylite.core.api.dashboard import Dashboard
                dashboard = Dashboard(dashboard_host, dashboard_port)
            job_env = runtime_envs.normalize(runtime_env, "init()")   # before anything starts
            from raylite.core.wire.labels import ACCELERATOR_TYPE_KEY, node_labels as labels_of_node
            node_id = os.urandom(14).hex()
            node_labels = labels_of_node(node_id, labels)   # (checked before anything starts)
            if namespace is not None and not isinstance(namespace, str):   # the types Ray raises
                raise TypeError(f"namespace must be a string (or None), got namespace={namespace!r}")
            if namespace == "":
                raise ValueError("namespace must be a non-empty string (or None), got namespace=''")
            if logging_config is None and os.environ.get("RAY_LOGGING_CONFIG_ENCODING"):   # Ray's other way
                from raylite.core.client.logging_config import LoggingConfig
                logging_config = LoggingConfig(encoding=os.environ["RAY_LOGGING_CONFIG_ENCODING"])
            if logging_config is not None:
                from raylite.core.client.logging_config import LoggingConfig
                if not isinstance(logging_config, LoggingConfig):
                    raise TypeError(f"logging_config must be a ray.LoggingConfig, got {type(logging_config).__name__}")
            zygote = zygotes.take(WORKER_IMPORTS)   # first: its start overlaps everything below
            from raylite.core.hardware import accelerators, machine
            machine.raise_open_files_limit()
            totals = node_totals(num_cpus, resources, object_store_memory)
            segments.SHM_DIR = segments.choose_dir(totals["object_store_memory"] // SCALE)
            device_totals, device_ids, _ = accelerators.node_devices(num_gpus, accelerator_part(resources))
            totals.update(device_totals)
            from raylite.core.node.driver import DriverClient
            from raylite.core.node.manager import Node
            types = [k[len(ACCELERATOR_TYPE_PREFIX):] for k in totals if k.startswith(ACCELERATOR_TYPE_PREFIX)]
            if len(types) == 1:   # as Ray labels a node with its GPUs' type
                node_labels[ACCELERATOR_TYPE_KEY] = types[0]
            namespace = namespace or anonymous_namespace()
            log_dir = None if log_to_driver else session_log_dir(_temp_dir, zygote.session)
            _node = Node(totals, device_ids, zygote.session, node_id, "01000000", zygote, job_env, namespace,
                         log_dir, logging_config.to_dict() if logging_config is not None else None, node_labels)
            zygote = None   # the node owns it now
            try:
                serialization._pickler()   # the first .remote() needs cloudpickle: import it while the zygote starts
                _node.zygote.wait_ready()
            except BaseException:
                node, _node = _node, None
                node.shutdown()
                raise
            process.client = DriverClient(_node)
            process.index = 0
            _endpoint, dashboard = control.start(_node, control_on, dashboard, shutdown), None
            context.set_process(job_id="01000000", node_id=node_id, worker_id=0, namespace=namespace,
                                labels=node_labels)
            if logging_config is not None:
                logging_config._apply()
            return _context()
    finally:
        if zygote is not None:
            zygote.close()
        if dashboard is not None:   # init failed after binding its port
            dashboard.close()


def dashboard_url() -> str | None:
    """The dashboard's URL (``http://127.0.0.1:<port>/?token=...``) in the driver that serves one, else None."""
    return _endpoint.info["dashboard_url"] if _endpoint is not None else None


def _context():
    if process.ray is not None:
        return process.ray.context()
    return RayContext(shutdown, node_ip_address=NODE_IP, session_dir=segments.SHM_DIR, address="local",
                      dashboard_url=dashboard_url(), node_id=context.state.node_id)


def is_initialized() -> bool:
    """Whether ``init`` has run in this process (inside tasks and actors: always True)."""
    return link.is_initialized()


def shutdown(_exiting_interpreter: bool = False) -> None:
    """Stop every worker, free shared memory, and forget all objects (on the Ray backend:
    disconnect from the cluster)."""
    global _node, _endpoint
    with _lock:
        if process.ray is not None:
            ray, process.ray = process.ray, None
            ray.shutdown(_exiting_interpreter)
        node, _node = _node, None
        if node is None:
            return
        endpoint, _endpoint = _endpoint, None
        if endpoint is not None:
            endpoint.close()
        process.client = None
        node.shutdown()


atexit.register(shutdown, _exiting_interpreter=True)


def _check_refs(refs, what: str) -> list[ObjectRef]:
    out = list(refs)
    for r in out:
        if not isinstance(r, ObjectRef):
            raise TypeError(f"{what} expects ObjectRefs, got {type(r).__name__}: {r!r}")
    return out


def get(object_refs, *, timeout: float | None = None):
    """Values of one ObjectRef or a list of them, raising the task's error if it failed.

    Args:
        object_refs: an ObjectRef, or a list of them (then a list of values, in that order).
        timeout: seconds to wait at most (None: for ever); then ``GetTimeoutError``.
    """
    timeout = check_timeout(timeout)
    single = isinstance(object_refs, ObjectRef)
    if not single:
        compiled = _compiled_results(object_refs, timeout)   # (not on the ObjectRef paths: one type check)
        if compiled is not _NOT_COMPILED:
            return compiled
        if not isinstance(object_refs, (list, tuple)):
            raise ValueError(f"Invalid type of object refs, {type(object_refs).__name__}, is given: get() expects "
                             f"an ObjectRef or a list of ObjectRefs")   # (a ValueError, as Ray's)
    if not single:
        _check_refs(object_refs, "get()")
    return link.backend().get(object_refs, timeout)


_NOT_COMPILED = object()


def _compiled_results(object_refs, timeout):
    """get() of a compiled graph's result (raylite.dag.compiled_dag_node), or of a list of
    them; _NOT_COMPILED for anything else."""
    if getattr(object_refs, "_raylite_compiled", False):
        return object_refs.get(timeout)
    if not (isinstance(object_refs, list) and object_refs and getattr(object_refs[0], "_raylite_compiled", False)):
        return _NOT_COMPILED
    if not all(getattr(r, "_raylite_compiled", False) for r in object_refs):
        raise ValueError("Invalid type of object refs. 'object_refs' must be a list of CompiledDAGRefs if there "
                         "is any CompiledDAGRef within it.")
    return [r.get(timeout) for r in object_refs]


def wait(object_refs, *, num_returns: int = 1, timeout: float | None = None, fetch_local: bool = True):
    """(ready, not_ready), each in the order given; at most num_returns ready. An
    ObjectRefGenerator is ready when its next() would not block.

    Args:
        object_refs: a list of ObjectRefs (and ObjectRefGenerators), without duplicates.
        num_returns: how many ready refs to wait for, from 1 to ``len(object_refs)``.
        timeout: seconds to wait at most (None: for ever); then fewer are returned as ready.
        fetch_local: accepted for Ray's sake: every object is local here.
    """
    if isinstance(object_refs, (ObjectRef, ObjectRefGenerator)):
        raise TypeError("wait() expects a list of ObjectRefs, not a single ObjectRef")
    if not isinstance(object_refs, (list, tuple)):   # a TypeError, as Ray's
        raise TypeError(f"wait() expects a list of ObjectRefs, got {type(object_refs).__name__}: {object_refs!r}")
    refs = list(object_refs)
    _check_refs([r for r in refs if not isinstance(r, ObjectRefGenerator)], "wait()")
    timeout = check_timeout(timeout)
    if not refs:   # before the num_returns check, as in Ray
        return [], []
    if len(set(refs)) != len(refs):
        raise ValueError("wait() got duplicate ObjectRefs")
    if not isinstance(num_returns, int) or not 1 <= num_returns <= len(refs):
        raise ValueError(f"num_returns must be between 1 and the number of refs ({len(refs)}), got {num_returns!r}")
    return link.backend().wait(refs, num_returns, timeout, fetch_local)


def put(value, *, _owner: ActorHandle | None = None) -> ObjectRef:
    """Store a value once; large buffers go to shared memory and are mapped by readers.

    Args:
        value: any picklable value (not an ObjectRef).

    ``_owner`` (Ray: the actor whose lifetime the object follows) is accepted and checked; here
    the node owns every object, so it outlives that actor anyway."""
    if isinstance(value, ObjectRef):
        raise TypeError("Calling put() on an ObjectRef is not allowed; pass the ref itself instead")
    if _owner is not None and not isinstance(_owner, ActorHandle):
        raise TypeError(f"put()'s _owner must be an actor handle (or None), got {type(_owner).__name__}")
    return link.backend(start=True).put(value, _owner)


def kill(actor: ActorHandle, *, no_restart: bool = True) -> None:
    """End an actor at once: its pending calls fail with ``ActorDiedError`` and no shutdown hook runs.

    Args:
        actor: the handle of the actor to end.
        no_restart: True: for good; False: it restarts if its ``max_restarts`` allows.
    """
    link.backend().kill(actor, no_restart)


def cancel(object_ref: ObjectRef, *, force: bool = False, recursive: bool = True) -> None:
    """Cancel the task or actor call that returns ``object_ref``. As Ray, ``force=True`` (kill
    the worker) is refused for an unfinished actor call: ``ray.kill`` ends actors.

    Args:
        object_ref: the ref a task or actor call returned (or its ObjectRefGenerator).
        force: kill the task's worker instead of raising KeyboardInterrupt in it.
        recursive: cancel the tasks it submitted too.
    """
    if isinstance(object_ref, ObjectRefGenerator):
        object_ref = object_ref.completed()
    if not isinstance(object_ref, ObjectRef):
        raise TypeError(f"ray.cancel() only supported for object refs. For actors, try ray.kill(). "
                        f"Got: {type(object_ref).__name__}.")
    link.backend().cancel(object_ref, force, recursive)


def get_actor(name: str, namespace: str | None = None) -> ActorHandle:
    """A handle to the live actor of that name; ``ValueError`` if there is none.

    Args:
        name: the name given with ``.options(name=...)``.
        namespace: the namespace to look in (default: the job's).
    """
    return link.backend().get_actor(name, namespace)


def list_named_actors(all_namespaces: bool = False) -> list:
    """Names of the live named actors in the job's namespace, or with all_namespaces=True a
    {"name", "namespace"} dict for each one anywhere (as ray.util.list_named_actors)."""
    return link.backend().list_named_actors(all_namespaces)


def cluster_resources() -> dict[str, float]:
    """Every resource the node (or the Ray cluster) has, ``{"CPU": 2.0, ...}``."""
    return link.backend().cluster_resources()


def available_resources() -> dict[str, float]:
    """The resources not held by running tasks and actors right now."""
    return link.backend().available_resources()


def nodes() -> list[dict]:
    """Ray's node records (``NodeID``, ``Alive``, ``Resources``, ``Labels``, ...): one here."""
    return link.backend().nodes()


def get_node_ip_address() -> str:
    """The address other nodes reach this process's node at (loopback on the local runtime)."""
    if link.on_ray():
        return process.ray.get_node_ip_address()
    return NODE_IP


def get_gpu_ids() -> list:
    """The GPUs the current task or actor holds (ints where the ids are numbers)."""
    return link.backend(start=True).get_gpu_ids()   # (a driver without a runtime starts one, as Ray's does)


def remote(*args, **options):
    """`@remote` or `@remote(num_cpus=..., ...)` on a function or a class.

    Keyword options, as Ray's (``.options(...)`` overrides them per call):

    Args:
        num_cpus: CPUs held while running (tasks: default 1; actors: 0 while alive).
        num_gpus: GPUs held; a fraction below 1 shares one device.
        resources: custom resources and other accelerators, ``{"name": quantity}``.
        accelerator_type: the GPU type the work needs (``raylite.util.accelerators``).
        memory: bytes of memory the work reserves (scheduling only, not a limit).
        max_calls: a worker exits after this many calls (default 1 with accelerators, else 0: never).
        max_retries: times a task runs again after its worker died (default 3).
        retry_exceptions: True, or a list of exception types, that also retry the task.
        num_returns: the number of refs a call returns (or ``"streaming"``/``"dynamic"`` for generators).
        runtime_env: the environment the worker runs in (``env_vars``, ``working_dir``, ``pip``, ...).
        scheduling_strategy: ``"DEFAULT"``, ``"SPREAD"``, or a placement group / node / label strategy.
        label_selector: node labels the work needs, ``{"key": "value"}``.
        name: an actor's name, unique in its namespace (``get_actor`` finds it).
        namespace: the namespace of a named actor (default: the job's).
        lifetime: ``"detached"``: a named actor outlives its handles (until ``shutdown``).
        get_if_exists: return the live actor of that name instead of raising.
        max_restarts: times a crashed actor starts again (default 0; -1: always).
        max_task_retries: times an actor call runs again after the actor died (default 0).
        max_concurrency: calls an actor runs at once (threads, or an async actor's slots).
        concurrency_groups: named groups of an actor's methods with their own limits.
        max_pending_calls: unfinished calls a handle allows before raising (-1: no limit).
    """
    if len(args) == 1 and not options and callable(args[0]):
        return _make_remote(args[0], {})
    if args:
        raise TypeError("remote() takes a function or class, or only keyword options")

    def decorate(target):
        return _make_remote(target, options)
    return decorate


def _make_remote(target, options: dict):
    if isinstance(target, type):
        return ActorClass(target, options)
    if callable(target):
        return RemoteFunction(target, options)
    raise TypeError(f"@remote must decorate a function or a class, got {type(target).__name__}")


link.register(start=init, get=get, local=LocalBackend())   # auto-init, ObjectRef.future, link.backend()
