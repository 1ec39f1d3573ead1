"""`ray.util.register_serializer` / `deregister_serializer`: custom pickling for one class."""
from __future__ import annotations

from raylite.core.client import link
from raylite.core.wire import serialization


def register_serializer(cls: type, *, serializer, deserializer) -> None:
    """Serialize instances of `cls` (exactly that class) as `serializer(obj)`, rebuilt with
    `deserializer(...)`, which travels with the data. Applies to what this process sends (the
    driver, or the task or actor that calls it), as in Ray."""
    serialization.check_serializer(cls, serializer, deserializer)   # (before either backend takes it)
    if link.on_ray():
        import ray.util
        return ray.util.register_serializer(cls, serializer=serializer, deserializer=deserializer)
    serialization.register_serializer(cls, serializer=serializer, deserializer=deserializer)


def deregister_serializer(cls: type) -> None:
    """Back to plain pickling for `cls`; nothing happens if none was registered."""
    if link.on_ray():
        import ray.util
        return ray.util.deregister_serializer(cls)
    serialization.deregister_serializer(cls)
