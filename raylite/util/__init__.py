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
"""
from raylite.core.api import get_node_ip_address, list_named_actors
from raylite.util import accelerators, scheduling_strategies
from raylite.util.actor_pool import ActorPool
from raylite.util.check_serialize import inspect_serializability
from raylite.util.helpers import as_completed, map_unordered
from raylite.util.placement_group import (get_current_placement_group, get_placement_group, placement_group,
                                          placement_group_table, remove_placement_group)
from raylite.util.probe import probe_gpu_resources
from raylite.util.serialization import deregister_serializer, register_serializer

__all__ = ["accelerators", "ActorPool", "as_completed", "deregister_serializer",
           "get_current_placement_group", "get_node_ip_address", "get_placement_group",
           "inspect_serializability", "list_named_actors", "map_unordered", "placement_group",
           "placement_group_table", "probe_gpu_resources", "register_serializer", "remove_placement_group",
           "scheduling_strategies"]


def __getattr__(name: str):
    if name in ("queue", "multiprocessing", "state"):   # imported when asked for (asyncio is a noticeable import)
        import importlib
        return importlib.import_module(f"raylite.util.{name}")
    raise AttributeError(f"module 'raylite.util' has no attribute {name!r}")
