"""Generator tasks, as Ray runs them: a remote function (or actor method) that yields.

With ``num_returns="streaming"`` (the default for a generator function) ``.remote()`` returns an
ObjectRefGenerator: iterating it gives one ObjectRef per yielded value, as soon as that value is
yielded, while the task runs on. An exception in the generator comes out of the ref after the
last value it yielded. With ``num_returns="dynamic"`` ``.remote()`` returns one ref, ready when the
task ends, whose value is a DynamicObjectRefGenerator over all the values' refs.

Each yielded value becomes an object of its own, with an id made from the task's completion id
and its index, so a retried task (its worker crashed) yields the same ids and repeats nothing.
The node keeps a Stream per generator task; the stream holds each value until a caller takes its
ref, and lets go of the rest when the generator (its completion ref) is dropped.
"""
from __future__ import annotations

from raylite.core.client.objects import BackendType, ObjectRef

from raylite.core.client.link import ITEM_INDEX_BITS, ITEM_TAG, process

MODES = ("streaming", "dynamic")


def item_id(completion_id: int, index: int) -> int:
    if index >> ITEM_INDEX_BITS:
        raise ValueError(f"a generator task may yield at most {1 << ITEM_INDEX_BITS} values")
    return ITEM_TAG | (completion_id << ITEM_INDEX_BITS) | index


class Stream:
    """The node's record of one generator task: the values' ids so far and who waits for more."""

    __slots__ = ("items", "taken", "done", "failed", "waiting", "waiters")

    def __init__(self):
        self.items: list[int] = []   # object ids, in yield order
        self.taken = 0               # items handed to the caller (their refs went with them)
        self.done = False
        self.failed = False          # the task raised (or died) after yielding `items`
        self.waiting: list = []      # (index, reply) of callers blocked in next()
        self.waiters: list = []      # ray.wait() calls until next() would not block

    def ready(self) -> bool:
        """Whether the caller's next() would return at once (ray.wait's test for a generator)."""
        return self.done or len(self.items) > self.taken

    def answer(self, index: int) -> tuple | None:
        """("item", id), ("error",) for the ref that raises, ("end",), or None: not yet known."""
        if index < len(self.items):
            self.taken = max(self.taken, index + 1)
            return ("item", self.items[index])
        if not self.done:
            return None
        return ("error",) if self.failed and index == len(self.items) else ("end",)

    def wake(self) -> list:
        """The (reply, answer) pairs now due; the rest keep waiting. Fires ray.wait()s."""
        if self.waiters and self.ready():
            waiters, self.waiters = self.waiters, []
            for waiter in waiters:
                waiter.hit()
        due, still = [], []
        for index, reply in self.waiting:
            found = self.answer(index)
            if found is None:
                still.append((index, reply))
            else:
                due.append((reply, found))
        self.waiting = still
        return due


class ObjectRefGenerator(metaclass=BackendType):
    """What `.remote()` returns for a streaming generator: iterate it (or `async for`) for refs."""

    def __init__(self, completion: ObjectRef):
        self._completion = completion
        self._next: int | None = 0   # None once the end was reached

    def __iter__(self) -> ObjectRefGenerator:
        return self

    def __next__(self) -> ObjectRef:
        if self._next is None:
            raise StopIteration
        found = process.client.stream_next(self._completion.id, self._next)
        if found[0] == "item":
            self._next += 1
            return ObjectRef(found[1], True)   # the stream's count on it now belongs to this ref
        self._next = None
        if found[0] == "error":
            return ObjectRef(self._completion.id, True)   # counted for us by the node; get() raises
        raise StopIteration

    def __aiter__(self) -> ObjectRefGenerator:
        return self

    async def __anext__(self) -> ObjectRef:
        import asyncio
        ref = await asyncio.get_running_loop().run_in_executor(None, next, self, None)
        if ref is None:   # StopIteration cannot cross a Future
            raise StopAsyncIteration
        return ref

    def completed(self) -> ObjectRef:
        """A ref that is ready when the task has ended (get() raises its error, if any)."""
        return self._completion

    def is_finished(self) -> bool:
        return self._next is None

    def __repr__(self) -> str:
        return f"ObjectRefGenerator({self._completion.hex()})"

    def __reduce__(self):
        raise TypeError("an ObjectRefGenerator cannot be passed to other tasks or actors (as in Ray); "
                        "pass the refs it yields, or its completed() ref")


class DynamicObjectRefGenerator(metaclass=BackendType):
    """The value of a ``num_returns="dynamic"`` task: the refs of everything it yielded."""

    def __init__(self, refs: list[ObjectRef]):
        self._refs = refs

    def __iter__(self):
        return iter(self._refs)

    def __len__(self) -> int:
        return len(self._refs)

    def __repr__(self) -> str:
        return f"DynamicObjectRefGenerator({len(self._refs)} refs)"
