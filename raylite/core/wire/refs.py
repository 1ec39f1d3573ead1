"""The refs a value carries. While raylite's serializer pickles a value, each ObjectRef and actor
handle in it records its id here, and the value then holds them in the driver's object table.
The client layer registers its ObjectRef class here (``ref_type``) when it is imported, so the
wire layer tells a ref argument apart without importing the layer above it."""
from __future__ import annotations

import threading

ref_type: type | None = None   # raylite.core.client.objects.ObjectRef (no ref exists before it is imported)

# .refs: ids of the refs and actor handles pickled by this thread's current serialize call
_collector = threading.local()


def collect() -> list | None:
    """Start recording pickled refs (in this thread); returns what to hand to `collected`."""
    outer = getattr(_collector, "refs", None)
    _collector.refs = []
    return outer


def collected(outer: list | None) -> tuple[int, ...]:
    """Stop recording; the distinct ids pickled since `collect`."""
    refs, _collector.refs = _collector.refs, outer
    return tuple(dict.fromkeys(refs))


def record(object_id: int) -> bool:
    """Note a ref (or actor handle) being pickled; False when no raylite serializer is running,
    and the caller must pin what it refers to instead."""
    refs = getattr(_collector, "refs", None)
    if refs is None:
        return False
    refs.append(object_id)
    return True
