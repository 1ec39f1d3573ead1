"""raylite: Ray's API for one machine, starting in milliseconds. Use as `import raylite as ray`.

``import raylite`` imports almost nothing: each public name is imported on first use, so that
``ray.init()`` can start the worker zygote (about 0.1 s of Python start and imports) before the
driver imports the runtime, and the two run side by side.
"""
import os
import sys

from raylite import exceptions

__version__ = "0.1.0"

_API = "raylite.core.api.runtime"   # init, get, put, ...: also what the zygote imports for every worker

# where each public name lives
_HOMES = {
    **dict.fromkeys(("available_resources", "cancel", "cluster_resources", "get", "get_actor", "get_gpu_ids",
                     "is_initialized", "kill", "nodes", "put", "remote", "shutdown", "wait"), _API),
    "get_runtime_context": "raylite.core.api.context",
    "ObjectRef": "raylite.core.client.objects",
    "ActorClass": "raylite.core.api.remote", "ActorHandle": "raylite.core.api.remote", "method": "raylite.core.api.remote",
    "DynamicObjectRefGenerator": "raylite.core.client.streams", "ObjectRefGenerator": "raylite.core.client.streams",
    "timeline": "raylite.core.api.state",
    "LoggingConfig": "raylite.core.client.logging_config",
    # Ray's ID types (ObjectID is ObjectRef's other name, as in Ray)
    **dict.fromkeys(("ActorClassID", "ActorID", "FunctionID", "JobID", "NodeID", "PlacementGroupID", "TaskID",
                     "UniqueID", "WorkerID"), "raylite.core.wire.ids"),
    "ObjectID": "raylite.core.client.objects:ObjectRef",
    **dict.fromkeys(("Language", "cpp_function", "java_actor_class", "java_function"), "raylite.cross_language"),
    "client": "raylite.client_builder", "ClientBuilder": "raylite.client_builder",
}
_SUBMODULES = ("util", "actor", "runtime_env", "cloudpickle", "dag", "job_config", "runtime_context",
               "remote_function", "types", "experimental", "cross_language", "client_builder")

SCRIPT_MODE, WORKER_MODE = 0, 1   # Ray's worker modes (a driver runs a script; a worker, tasks)

__all__ = ["exceptions", "init", "SCRIPT_MODE", "WORKER_MODE", *_HOMES]

TYPE_CHECKING = False
if TYPE_CHECKING:   # what static analysers see (init with its full signature)
    from raylite.client_builder import ClientBuilder, client
    from raylite.core.api.remote import ActorClass, ActorHandle, method
    from raylite.core.api.runtime import (available_resources, cancel, cluster_resources, get, get_actor, get_gpu_ids,
                                          init, is_initialized, kill, nodes, put, remote, shutdown, wait)
    from raylite.core.api.state import timeline
    from raylite.core.api.context import get_runtime_context
    from raylite.core.client.logging_config import LoggingConfig
    from raylite.core.client.objects import ObjectRef
    from raylite.core.client.objects import ObjectRef as ObjectID
    from raylite.core.client.streams import DynamicObjectRefGenerator, ObjectRefGenerator
    from raylite.core.wire.ids import (ActorClassID, ActorID, FunctionID, JobID, NodeID, PlacementGroupID, TaskID,
                                       UniqueID, WorkerID)
    from raylite.cross_language import Language, cpp_function, java_actor_class, java_function
else:
    def init(address: str | None = None, **kwargs):
        """Ray's ``ray.init``; its arguments are those of :func:`raylite.core.api.runtime.init`.

        The first call in a process starts the worker zygote before importing the runtime, so the
        zygote's start overlaps the driver's imports instead of following them; init takes it."""
        zygotes = None
        if _API not in sys.modules and _local(address, kwargs.get("backend")):
            from raylite.core.worker import zygote as zygotes
            zygotes.start_ahead((_API,))
        from raylite.core.api.runtime import init as start
        try:
            return start(address, **kwargs)
        finally:   # init failed (a TypeError before it ran too: an unknown keyword), or found a runtime
            if zygotes is not None:
                zygotes.discard_ahead()


def _bind(target, args: tuple, kwargs: dict):
    """``.bind()`` of a remote function, actor class or method: a raylite.dag node (imported on first use)."""
    from raylite.dag.nodes import bind
    return bind(target, args, kwargs)


from raylite.core.client import link as _link  # noqa: E402 (small: the hooks core calls up through)

_link.register(bind=_bind)   # core's .bind() builds raylite.dag's nodes, wired here above both


def _local(address, backend) -> bool:
    """Whether init() will run the local runtime (api.init decides for sure; this only guesses)."""
    if address is None and backend is None:
        address = os.environ.get("RAY_ADDRESS") or None
    return address in (None, "local") and backend in (None, "local")


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is not None:
        import importlib
        home, _, attribute = home.partition(":")
        value = getattr(importlib.import_module(home), attribute or name)
        globals()[name] = value   # once: later lookups are plain attribute reads
        return value
    if name in _SUBMODULES:   # ray.util (ray.util.ActorPool, ...), ray.actor, ray.dag, ...
        import importlib
        return importlib.import_module(f"raylite.{name}")
    raise AttributeError(f"module 'raylite' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES, *_SUBMODULES})
