"""Ray's ID classes (``ray.JobID``, ``ray.NodeID``, ``ray.ActorID``, ...) for code that names
them: build one from the hex string a getter returns (``ray.NodeID.from_hex(ctx.get_node_id())``),
compare, hash, and give it back with ``.hex()`` / ``.binary()``.

raylite's ids are shorter than Ray's (the local runtime needs fewer bytes to tell its tasks and
actors apart), so ``from_hex`` takes any whole number of bytes; ``size()``, ``nil()`` and
``from_random()`` use Ray's sizes. Also the node's address, a value every layer may name.
"""
from __future__ import annotations

import os

NODE_IP = "127.0.0.1"   # the one node's address: nothing listens beyond loopback


class BaseID:
    """An id as bytes, equal to another of the same class with the same bytes."""

    _size = 28

    __slots__ = ("_bytes",)

    def __init__(self, id_bytes: bytes):
        if not isinstance(id_bytes, bytes):
            raise TypeError(f"{type(self).__name__} takes bytes, got {type(id_bytes).__name__}: {id_bytes!r}")
        self._bytes = id_bytes

    @classmethod
    def from_hex(cls, hex_id: str | bytes):
        text = hex_id.decode() if isinstance(hex_id, bytes) else hex_id
        try:
            return cls(bytes.fromhex(text))
        except (TypeError, ValueError):
            raise ValueError(f"{cls.__name__}.from_hex takes a hex string, got {hex_id!r}") from None

    @classmethod
    def from_random(cls):
        return cls(os.urandom(cls._size))

    @classmethod
    def nil(cls):
        return cls(b"\xff" * cls._size)

    @classmethod
    def size(cls) -> int:
        return cls._size

    def binary(self) -> bytes:
        return self._bytes

    def hex(self) -> str:
        return self._bytes.hex()

    def is_nil(self) -> bool:
        return self._bytes == b"\xff" * len(self._bytes)

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other._bytes == self._bytes

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._bytes))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.hex()})"

    def __reduce__(self):
        return type(self), (self._bytes,)


class UniqueID(BaseID):
    pass


class JobID(BaseID):
    _size = 4

    @classmethod
    def from_int(cls, value: int) -> JobID:
        return cls(value.to_bytes(4, "little"))

    def int(self) -> int:
        return int.from_bytes(self._bytes, "little")


class ActorID(BaseID):
    _size = 16


class TaskID(BaseID):
    _size = 24


class NodeID(UniqueID):
    pass


class WorkerID(UniqueID):
    pass


class FunctionID(UniqueID):
    pass


class ActorClassID(UniqueID):
    pass


class PlacementGroupID:
    """A placement group's id (``PlacementGroup.id``): the node's number for it, as 28 hex digits."""

    def __init__(self, pg_id: int):
        self._id = pg_id

    def hex(self) -> str:
        return f"{self._id:028x}"

    def __repr__(self) -> str:
        return f"PlacementGroupID({self.hex()})"
