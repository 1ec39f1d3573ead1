"""Helpers on top of the public API, as in ``ray.util``.

- ``raylite.util.accelerators``: accelerator type names for ``accelerator_type=``.
- ``raylite.util.probe_gpu_resources``: pick GPU or CPU resource options at run time.
- ``raylite.util.ActorPool``: spread calls over a fixed set of actors.
- ``raylite.util.queue.Queue``: a FIFO queue shared by tasks and actors (imported on first use).
- ``raylite.util.multiprocessing.Pool``: ``multiprocessing.Pool``'s API on actors (imported on first use).
- ``raylite.util.state``: Ray's state API (``list_tasks``, ``list_actors``, ...; imported on first use).
- ``raylite.util.placement_group`` and friends, ``raylite.util.scheduling_strategies``: placement
  groups, as in Ray.
- ``raylite.util.list_named_actors``: the live named actors (this namespace, or all).
- ``raylite.util.get_node_ip_address``: where other nodes reach this one (loopback on the local
  runtime; the node's IP on a Ray cluster).
- ``raylite.util.as_completed``, ``raylite.util.map_unordered``: results as tasks finish;
  ``raylite.util.inspect_serializability``; ``raylite.util.register_serializer`` /
  ``deregister_serializer``: custom pickling for a class.
- ``raylite.util.joblib.register_ray``: joblib's ``parallel_backend("ray")`` on raylite's workers.
- ``raylite.util.log_once`` and friends (``raylite.util.debug``); ``raylite.util.pdb``: Ray's
  name for ``raylite.util.rpdb``; ``connect`` / ``disconnect``: Ray Client's way to ``init``.
"""
from __future__ import annotations

import os

from raylite.core.api.runtime import get_node_ip_address, list_named_actors
from raylite.util import accelerators, scheduling_strategies
from raylite.util.actor_pool import ActorPool
from raylite.util.check_serialize import inspect_serializability
from raylite.util.debug import disable_log_once_globally, enable_periodic_logging, log_once
from raylite.util.helpers import as_completed, map_unordered
from raylite.util.placement_group import (get_current_placement_group, get_placement_group, placement_group,
                                          placement_group_table, remove_placement_group)
from raylite.util.probe import probe_gpu_resources
from raylite.util.serialization import deregister_serializer, register_serializer

__all__ = ["accelerators", "ActorPool", "as_completed", "connect", "deregister_serializer",
           "disable_log_once_globally", "disconnect", "enable_periodic_logging", "get_current_placement_group",
           "get_node_instance_id", "get_node_ip_address", "get_placement_group", "inspect_serializability",
           "list_named_actors", "log_once", "map_unordered", "pdb", "placement_group", "placement_group_table",
           "probe_gpu_resources", "register_serializer", "remove_placement_group", "scheduling_strategies"]


def get_node_instance_id() -> str:
    """The cloud instance id this node runs on, as Ray reads it (RAY_CLOUD_INSTANCE_ID; "" if unset)."""
    return os.environ.get("RAY_CLOUD_INSTANCE_ID", "")


def connect(conn_str: str, secure: bool = False, metadata: list | None = None, connection_retries: int = 3,
            job_config=None, namespace: str | None = None, *, ignore_version: bool = False,
            _credentials=None, ray_init_kwargs: dict | None = None):
    """Ray Client's connect: ``init`` as ``ray.client(conn_str).connect()`` calls it (a bare
    host:port gains "ray://", for the Ray backend). ``secure``, ``metadata`` and ``_credentials``
    are refused (init cannot pass them); Ray Client's ``connection_retries`` and ``ignore_version``
    do not apply to init."""
    if secure or metadata or _credentials is not None:
        raise ValueError("connect(secure=..., metadata=..., _credentials=...) is not supported: raylite "
                         "connects through ray.init(address='ray://...')")
    from raylite.client_builder import client
    builder = client(conn_str).namespace(namespace)
    return builder._init_args(job_config=job_config, **(ray_init_kwargs or {})).connect()


def disconnect() -> None:
    """Ray Client's disconnect: shutdown()."""
    import raylite
    raylite.shutdown()


def __getattr__(name: str):
    if name in ("queue", "multiprocessing", "state", "joblib"):   # imported when asked for (asyncio is a noticeable import)
        import importlib
        return importlib.import_module(f"raylite.util.{name}")
    if name == "pdb":   # Ray's ray.util.pdb is its remote debugger
        import importlib
        return importlib.import_module("raylite.util.rpdb")
    raise AttributeError(f"module 'raylite.util' has no attribute {name!r}")
