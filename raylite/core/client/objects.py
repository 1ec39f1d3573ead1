"""ObjectRef: a handle to a value in the driver's object table (this process's link to the runtime
that owns the objects is raylite.core.client.link).

Each live ObjectRef, in any process, counts as one reference in the driver's object table; when
it is garbage collected the count drops and the value (and its shared-memory segments) is freed
at zero. A ref pickled by raylite's serializer (nested in an argument, a put value or a return
value) is recorded in that value's `refs`: the driver holds it for as long as the value lives,
and every copy unpickled from it is a new counted ref. A ref pickled any other way (plain
`pickle.dumps`, a function's closure) cannot be followed, so it pins its object until shutdown.
"""
from __future__ import annotations

import math
import numbers
import threading

from raylite.core.client import link
from raylite.core.client.link import process
from raylite.core.wire import refs
from raylite.core.wire.ids import TaskID


def check_timeout(timeout: float | None) -> float | None:
    """get's and wait's timeout, checked before anything waits: None or infinity wait for ever."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds or None, got timeout={timeout!r}")
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be a non-negative number of seconds or None, got timeout={timeout!r}")
    return None if math.isinf(timeout) else float(timeout)


def _borrowed(object_id: int) -> ObjectRef:
    """An unpickled ref: counted like any other while a runtime is up."""
    client = process.client
    if client is None:
        return ObjectRef(object_id)
    client.addref(object_id)
    return ObjectRef(object_id, True)


class BackendType(type):
    """``isinstance(x, raylite.ObjectRef)`` (or ``ActorHandle``) also holds for Ray's own refs and
    handles while the Ray backend runs, so code written against raylite's names ports as is."""

    def __instancecheck__(cls, obj) -> bool:
        if type.__instancecheck__(cls, obj):
            return True
        return link.on_ray() and isinstance(obj, process.ray.counterpart(cls))   # (attaches in a Ray worker)


class ObjectRef(metaclass=BackendType):
    """A handle to a value that is, or will be, in the object table."""

    __slots__ = ("id", "_tracked", "__weakref__")

    def __init__(self, object_id: int | bytes, _tracked: bool = False):
        self._tracked = _tracked   # first: __del__ reads it even when the id below is refused
        if type(object_id) is not int:   # ray.ObjectRef(ref.binary()) or (bytes.fromhex(ref.hex()))
            if not isinstance(object_id, (bytes, bytearray)):
                raise TypeError(f"ObjectRef takes the id's bytes (ref.binary()), got {type(object_id).__name__}")
            object_id = int.from_bytes(object_id, "big")
        self.id = object_id

    def hex(self) -> str:
        return f"{self.id:028x}"

    @classmethod
    def from_hex(cls, hex_id: str) -> ObjectRef:
        return cls(bytes.fromhex(hex_id))

    @classmethod
    def nil(cls) -> ObjectRef:
        """The id no object has (Ray's all-zero id)."""
        return cls(0)

    def is_nil(self) -> bool:
        return self.id == 0

    def binary(self) -> bytes:
        return self.id.to_bytes(max(14, (self.id.bit_length() + 7) // 8), "big")   # a put's id: 16

    def task_id(self) -> TaskID:
        """The task that made the object, as Ray's: its ``.hex()`` is what
        ``get_runtime_context().get_task_id()`` gave inside that task (for a put value, the putting
        task; from the driver, an id of zeros, as the driver runs no task)."""
        return TaskID(link.made_by(self.id).to_bytes(14, "big"))

    def __repr__(self) -> str:
        return f"ObjectRef({self.hex()})"

    def __eq__(self, other) -> bool:
        return isinstance(other, ObjectRef) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __reduce__(self):
        if not refs.record(self.id) and process.client is not None:   # nobody can follow this copy: keep it
            process.client.pin(self.id)
        return (_borrowed, (self.id,))

    def __del__(self):
        if self._tracked:
            client = process.client
            if client is not None:
                try:
                    client.release(self.id)
                except Exception:  # interpreter shutdown
                    pass

    def future(self):
        """A concurrent.futures.Future resolved with the value (or the error)."""
        from concurrent.futures import Future
        fut: Future = Future()

        def resolve():
            try:
                fut.set_result(link.get(self))
            except BaseException as e:  # noqa: BLE001 - handed to the future
                fut.set_exception(e)

        threading.Thread(target=resolve, daemon=True).start()
        return fut

    def as_future(self):
        """An asyncio future of the value, on the running event loop (Ray's ``ref.as_future()``)."""
        import asyncio
        return asyncio.wrap_future(self.future())

    def __await__(self):
        """`await ref` inside async actors and coroutines, as in Ray."""
        import asyncio
        return asyncio.wrap_future(self.future()).__await__()


refs.ref_type = ObjectRef
