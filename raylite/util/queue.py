"""`Queue`: a first-in first-out queue shared by the driver, tasks and actors, as
``ray.util.queue.Queue``.

The items live in an async actor, so a blocked ``get`` or ``put`` (waiting for an item or for
room) never stops other callers from reaching the queue. A ``Queue`` is picklable: pass it to
tasks and actors like any argument.
"""
from __future__ import annotations

import asyncio
import queue as _queue
from collections.abc import Iterable
from typing import Any

import raylite as ray


class Empty(_queue.Empty):
    pass


class Full(_queue.Full):
    pass


class Queue:
    """Ray's ``Queue``: ``put``/``get`` with ``block`` and ``timeout``, batches, ``Empty``/``Full``.

    Args:
        maxsize: the most items it holds (0: no limit); a blocking ``put`` waits for room.
        actor_options: ``.options(...)`` of the actor that holds the items (e.g. ``{"num_cpus": 0}``).
    """

    def __init__(self, maxsize: int = 0, actor_options: dict | None = None):
        if not isinstance(maxsize, int) or maxsize < 0:
            raise ValueError(f"maxsize must be a non-negative int, got maxsize={maxsize!r}")
        self.maxsize = maxsize
        self.actor = _actor_class().options(**(actor_options or {})).remote(maxsize)

    def __len__(self) -> int:
        return self.size()

    def size(self) -> int:
        return ray.get(self.actor.qsize.remote())

    qsize = size

    def empty(self) -> bool:
        return ray.get(self.actor.empty.remote())

    def full(self) -> bool:
        return ray.get(self.actor.full.remote())

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """Add an item; with ``block``, wait (up to ``timeout`` s) for room, else raise Full."""
        _check_timeout(timeout)
        if not block:
            return ray.get(self.actor.put_nowait.remote(item))
        ray.get(self.actor.put.remote(item, timeout))

    async def put_async(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        _check_timeout(timeout)
        await (self.actor.put.remote(item, timeout) if block else self.actor.put_nowait.remote(item))

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Take the oldest item; with ``block``, wait (up to ``timeout`` s) for one, else raise Empty."""
        _check_timeout(timeout)
        if not block:
            return ray.get(self.actor.get_nowait.remote())
        return ray.get(self.actor.get.remote(timeout))

    async def get_async(self, block: bool = True, timeout: float | None = None) -> Any:
        _check_timeout(timeout)
        return await (self.actor.get.remote(timeout) if block else self.actor.get_nowait.remote())

    def put_nowait(self, item: Any) -> None:
        self.put(item, block=False)

    def put_nowait_batch(self, items: Iterable) -> None:
        """Add all items, or none of them (Full) if they do not fit."""
        if not isinstance(items, Iterable):
            raise TypeError(f"Argument 'items' must be an Iterable, got items={items!r}")
        ray.get(self.actor.put_nowait_batch.remote(list(items)))

    def get_nowait(self) -> Any:
        return self.get(block=False)

    def get_nowait_batch(self, num_items: int) -> list:
        """Take ``num_items`` items, or none of them (Empty) if there are fewer."""
        if not isinstance(num_items, int) or isinstance(num_items, bool):   # the types Ray raises
            raise TypeError(f"Argument 'num_items' must be an int, got num_items={num_items!r}")
        if num_items < 0:
            raise ValueError(f"'num_items' must be nonnegative, got num_items={num_items!r}")
        return ray.get(self.actor.get_nowait_batch.remote(num_items))

    def shutdown(self, force: bool = False, grace_period_s: int = 5) -> None:
        """Stop the queue's actor (items still in it are lost)."""
        if self.actor is not None:
            ray.kill(self.actor)
            self.actor = None


_remote_class = None


def _actor_class():
    global _remote_class
    if _remote_class is None:
        _remote_class = ray.remote(_QueueActor)
    return _remote_class


def _check_timeout(timeout) -> None:
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
        raise ValueError(f"timeout must be a non-negative number or None, got timeout={timeout!r}")


class _QueueActor:
    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self.queue: asyncio.Queue | None = None   # made on the actor's event loop

    def _q(self) -> asyncio.Queue:
        if self.queue is None:
            self.queue = asyncio.Queue(self.maxsize)
        return self.queue

    async def qsize(self) -> int:
        return self._q().qsize()

    async def empty(self) -> bool:
        return self._q().empty()

    async def full(self) -> bool:
        return self._q().full()

    async def put(self, item, timeout: float | None = None) -> None:
        try:
            await asyncio.wait_for(self._q().put(item), timeout)
        except asyncio.TimeoutError:
            raise Full(f"the queue stayed full for {timeout} s") from None

    async def put_nowait(self, item) -> None:
        try:
            self._q().put_nowait(item)
        except asyncio.QueueFull:
            raise Full(f"the queue is full ({self.maxsize} items)") from None

    async def put_nowait_batch(self, items: list) -> None:
        q = self._q()
        if self.maxsize and q.qsize() + len(items) > self.maxsize:
            raise Full(f"{len(items)} items do not fit: {q.qsize()} of {self.maxsize} places are taken")
        for item in items:
            q.put_nowait(item)

    async def get(self, timeout: float | None = None):
        try:
            return await asyncio.wait_for(self._q().get(), timeout)
        except asyncio.TimeoutError:
            raise Empty(f"the queue stayed empty for {timeout} s") from None

    async def get_nowait(self):
        try:
            return self._q().get_nowait()
        except asyncio.QueueEmpty:
            raise Empty("the queue is empty") from None

    async def get_nowait_batch(self, num_items: int) -> list:
        q = self._q()
        if num_items > q.qsize():
            raise Empty(f"asked for {num_items} items, the queue has {q.qsize()}")
        return [q.get_nowait() for _ in range(num_items)]
