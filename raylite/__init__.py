"""raylite: Ray's API for one machine, starting in milliseconds. Use as `import raylite as ray`."""
from raylite import exceptions
from raylite.core.api import (available_resources, cancel, cluster_resources, get, get_actor, get_gpu_ids,
                              init, is_initialized, kill, nodes, put, remote, shutdown, wait)
from raylite.core.context import get_runtime_context
from raylite.core.objects import ObjectRef
from raylite.core.remote import ActorClass, ActorHandle, method
from raylite.core.streams import DynamicObjectRefGenerator, ObjectRefGenerator

__version__ = "0.1.0"

__all__ = ["ActorClass", "ActorHandle", "DynamicObjectRefGenerator", "ObjectRef", "ObjectRefGenerator",
           "LoggingConfig", "available_resources", "cancel", "cluster_resources",
           "exceptions", "get", "get_actor", "get_gpu_ids", "get_runtime_context", "init", "is_initialized",
           "kill", "method", "nodes", "put", "remote", "shutdown", "timeline", "wait"]


def __getattr__(name: str):
    """``ray.util`` (``ray.util.ActorPool``, ...), ``ray.actor``, ``ray.runtime_env``,
    ``ray.cloudpickle``, ``ray.dag``, ``ray.timeline`` and ``ray.LoggingConfig`` without importing
    them at ``import raylite``."""
    if name in ("util", "actor", "runtime_env", "cloudpickle", "dag"):
        import importlib
        return importlib.import_module(f"raylite.{name}")
    if name == "timeline":   # a reader, like the state API: imported when first used
        from raylite.core.state_api import timeline
        return timeline
    if name == "LoggingConfig":
        from raylite.core.logging_config import LoggingConfig
        return LoggingConfig
    raise AttributeError(f"module 'raylite' has no attribute {name!r}")
