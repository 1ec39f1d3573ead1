"""This process's link to the runtime: the client it talks through (the driver's or a worker's, see
raylite.core.client.interface), Ray while raylite runs on it, how it mints ids, and the hooks the
API layer registers when it is imported. Code below the API reaches the runtime only through here:
``require()`` for the client, ``on_ray()`` for the Ray backend, ``local_or_start()`` where Ray's
API starts a runtime by itself."""
from __future__ import annotations

import itertools
import sys

from raylite import exceptions

TYPE_CHECKING = False   # typing's flag (type checkers read it as True) without importing typing here
if TYPE_CHECKING:
    from collections.abc import Callable

    from raylite.core.client.interface import Backend, Client


class _Process:
    """Which client this process talks through, and how it mints ids."""

    client: Client | None = None   # DriverClient in the driver, WorkerClient in a worker
    ray = None             # the ray_backend module while raylite runs on Ray (then client is None)
    index = 0              # 0 for the driver; workers get 1, 2, ...
    runtime_env = None     # a worker's own runtime_env, inherited by what it submits
    counter = itertools.count(1)


process = _Process()

# what the layers above register when they are imported, so that nothing below imports them:
# "start" and "get", the API's init (with its defaults) and get (raylite.core.api.runtime), for
# auto-init and ObjectRef.future; "local", the local runtime's Backend (raylite.core.api.local);
# "bind", raylite.dag's node builder (raylite/__init__.py)
_hooks: dict[str, Callable | Backend] = {}


def register(**hooks: Callable | Backend) -> None:
    _hooks.update(hooks)


def hook(name: str) -> Callable | Backend:
    found = _hooks.get(name)
    if found is None:   # registered when `raylite` and its API are imported
        raise exceptions.RaySystemError(f"raylite is not initialized (nothing registered {name!r}): import "
                                        "raylite and call raylite.init() first")
    return found


def attach() -> bool:
    """True (and routing through Ray from now on) inside a process Ray has initialised: Ray's
    workers, or a driver whose user called ``ray.init`` directly."""
    ray = sys.modules.get("ray")
    if ray is None or not hasattr(ray, "is_initialized") or not ray.is_initialized():
        return False
    from raylite.core.client import ray_backend
    process.ray = ray_backend
    return True


def on_ray() -> bool:
    """Whether raylite runs on Ray in this process: connected by ``init``, or inside a process Ray
    has initialised (a Ray worker, attached to here on first use)."""
    return process.ray is not None or (process.client is None and attach())


def is_initialized() -> bool:
    """Whether ``init`` has run in this process (inside tasks and actors: always True)."""
    if process.client is not None:
        return True
    if process.ray is not None:
        return process.ray.is_initialized()
    return attach()


def require() -> Client | None:
    """The local runtime's client, or None while the Ray backend runs (``process.ray`` takes the
    call); RaySystemError when no runtime runs."""
    client = process.client
    if client is None and not on_ray():
        raise exceptions.RaySystemError("raylite is not initialized: call raylite.init() first")
    return client


def local_or_start() -> Client | None:
    """The local runtime's client, started with init()'s defaults if none runs (as Ray's API
    does), or None while the Ray backend runs."""
    if process.client is None and not on_ray():
        hook("start")()
    return process.client


def backend(start: bool = False) -> Backend:
    """The Backend that takes the API's whole calls (raylite.core.client.interface): the local
    runtime's front end over its client, or the Ray adapter while raylite runs on Ray.
    ``start``: a driver without a runtime starts one with init()'s defaults first, as Ray's API
    does; else RaySystemError when none runs."""
    client = local_or_start() if start else require()
    return process.ray if client is None else hook("local")


def get(refs, timeout: float | None = None):
    """The API's ``get`` (for ObjectRef.future, which the layer below it holds)."""
    return hook("get")(refs, timeout=timeout)


def next_id() -> int:
    """Ids unique in the session without a round trip: process index in the high bits (a task's
    id, and the low 64 bits of every object id below, while indexes stay under 2**23)."""
    return (process.index << 40) | next(process.counter)


# An object's id names the task that made it, as Ray's do, so ObjectRef.task_id() needs no round
# trip: a task's return i is its id | (i + 1) << 64; a generator's yielded value is ITEM_TAG |
# its completion (return) id << ITEM_INDEX_BITS | index (raylite.core.client.streams); a put
# value is PUT_TAG | next_id() << 64 | the putting task's id (0 outside tasks). Other refs (a
# placement group's ready()) are plain next_id()s, made by no task: they name themselves.
_TASK_BITS = (1 << 64) - 1
ITEM_TAG = 1 << 100
ITEM_INDEX_BITS = 24
PUT_TAG = 1 << 127


def return_id(task_id: int, index: int) -> int:
    return task_id | (index + 1) << 64


def put_id(task_id: int | None) -> int:
    """A new put value's id, made in the task `task_id` (None: the driver, or no task)."""
    return PUT_TAG | next_id() << 64 | (task_id or 0)


def made_by(object_id: int) -> int:
    """The id of the task that made an object (see return_id and put_id)."""
    if object_id < PUT_TAG and object_id & ITEM_TAG:
        object_id >>= ITEM_INDEX_BITS
    return object_id & _TASK_BITS


def minted_by(object_id: int) -> int:
    """The index of the process whose next_id() made an id: for a task, who submitted it."""
    return object_id >> 40
