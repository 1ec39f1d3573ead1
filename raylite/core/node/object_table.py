"""The node's object table: every object's value and ref count, the waiters (`get`, `wait`, a
task's ref arguments) on objects not yet computed, and the shared-memory segments of freed
objects, which go back to the pool only once no worker maps them any more.

Like the rest of the node's state it is touched only by the node manager thread.
"""
from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from typing import Callable

from raylite.core.client.streams import Stream
from raylite.core.node.records import Actor, ObjectEntry, Waiter
from raylite.core.node.state import SETTLED
from raylite.core.wire import segments


class ObjectTable:
    def __init__(self, actors: dict[int, Actor], release_actor: Callable[[Actor], None],
                 workers: dict, forget: Callable[[int, list], None]):
        self.objects: dict[int, ObjectEntry] = {}
        self.readers: dict[str, set[int]] = {}    # segment -> workers it was sent to
        self.releasing: dict[str, tuple] = {}     # segment -> (size, workers still mapping it, driver mmap)
        self.streams: dict[int, Stream] = {}      # generator task's completion id -> its values
        self.timers: list = []                    # (deadline, seq, waiter): get/wait timeouts
        self._timer_seq = itertools.count()
        self._timers_max = 64                     # compact the heap past this (see add_waiter)
        # A counted id that is no object is an actor handle: the node's actors share the counting.
        self.actors, self.release_actor = actors, release_actor
        self.workers, self.forget = workers, forget   # worker index -> process; ask one to unmap
        self.dropped: deque[int] = deque()   # refs the driver let go of, not counted down yet (see drop_later)

    # -- waiting --
    def add_timer(self, delay: float, item) -> None:
        """Call item.expire() in `delay` seconds (unless item.done by then)."""
        heapq.heappush(self.timers, (time.monotonic() + max(0.0, delay), next(self._timer_seq), item))

    def add_waiter(self, waiter: Waiter, ids, timeout: float | None) -> None:
        """Register waiter on ids; it fires when enough are ready (or at timeout)."""
        unique, ready = set(ids), 0
        for oid in unique:
            if oid < 0:   # -id: the next value of the generator whose completion id is id
                if self._ready(oid):
                    ready += 1
                else:
                    self.streams[-oid].waiters.append(waiter)
                    waiter.entries.append(self.streams[-oid])
                continue
            entry = self.objects.get(oid)
            if entry is None:
                waiter.lost(oid)
            elif entry.value is not None:
                ready += 1
                if entry.value.is_error:
                    waiter.error()
            else:
                if entry.infeasible is not None:
                    waiter.infeasible(entry.infeasible)
                if entry.waiters:
                    entry.waiters.append(waiter)
                else:
                    entry.waiters = [waiter]
                waiter.entries.append(entry)
        waiter.arm(ready, len(unique))
        if not waiter.done and timeout is not None:
            self.add_timer(timeout, waiter)
            if len(self.timers) > self._timers_max:   # drop the timers of waiters already done
                self.timers = [t for t in self.timers if not t[2].done]
                heapq.heapify(self.timers)
                self._timers_max = max(64, 2 * len(self.timers))

    def next_timeout(self) -> float | None:
        """Seconds until the first get/wait timeout is due (None: no timeout pending)."""
        return max(0.0, self.timers[0][0] - time.monotonic()) if self.timers else None

    def fire_timers(self) -> None:
        now = time.monotonic()
        while self.timers and self.timers[0][0] <= now:
            _, _, waiter = heapq.heappop(self.timers)
            waiter.expire()

    def ready_ids(self, ids) -> set[int]:
        return {i for i in ids if self._ready(i)}

    def _ready(self, oid: int) -> bool:
        if oid < 0:   # a generator's next value (see add_waiter)
            stream = self.streams.get(-oid)
            return stream is None or stream.ready()
        entry = self.objects.get(oid)
        return entry is not None and entry.value is not None

    def values(self, ids, waiter) -> list:
        """What a get() that `waiter` ended returns: every value, or, when it failed fast, the
        first error among them (the caller raises it; the rest may not be computed yet)."""
        if waiter.failed:
            return [next(v for i in ids if (v := self.objects[i].value) is not None and v.is_error)]
        return [self.objects[i].value for i in ids]

    def missing(self, ids) -> list[int]:
        """Those of ids (all in the table) whose value is not computed yet."""
        return [i for i in ids if self.objects[i].value is None]

    def mark_infeasible(self, ids, message: str) -> None:
        for oid in ids:
            entry = self.objects[oid]
            entry.infeasible = message
            for waiter in list(entry.waiters):   # a get that fires leaves the list
                waiter.infeasible(message)

    # -- values --
    def new_entries(self, ids) -> None:
        for oid in ids:
            self.objects[oid] = ObjectEntry()

    def set_value(self, oid: int, value) -> None:
        entry = self.objects.get(oid)
        if entry is None:   # nobody holds it any more: drop its segments at once
            segments.unlink_segments(name for name, _ in value.segments())
            return
        entry.value = value
        if value.refs:
            self.hold(value.refs)
        waiters = entry.waiters
        if waiters:
            entry.waiters = ()
            for waiter in waiters:
                if value.is_error:
                    waiter.error()
                waiter.hit()
        if entry.refs <= 0 and not entry.pinned:
            self._free(oid)

    def put(self, oid: int, value) -> None:
        self.objects[oid] = ObjectEntry(value)
        self.hold(value.refs)

    # -- counting --
    def hold(self, oids) -> None:
        """Count refs (and actor handles) pickled inside a stored value or a task's arguments."""
        for oid in oids:
            self.addref(oid)

    def addref(self, oid: int) -> None:
        entry = self.objects.get(oid)
        if entry is not None:
            entry.refs += 1
        elif oid in self.actors:
            self.actors[oid].refs += 1

    def pin(self, oid: int) -> None:
        entry = self.objects.get(oid)
        if entry is not None:
            entry.pinned = True
        elif oid in self.actors:
            self.actors[oid].pinned = True

    def release(self, oid: int, freeing: list | None = None) -> object | None:
        """Drop one ref. An object nobody refers to any more is freed, or, while `_free` runs,
        queued in `freeing`: a long chain of nested refs is then freed without deep recursion.
        SETTLED for an object (freeing one changes nothing a scheduling pass reads: the driver's
        dropped refs cost no pass each); an actor handle's may end the actor, and free its resources."""
        entry = self.objects.get(oid)
        if entry is not None:
            entry.refs -= 1
            if entry.refs <= 0 and not entry.pinned and entry.value is not None:
                if freeing is None:
                    self._free(oid)
                else:
                    freeing.append(oid)
            return SETTLED
        if oid in self.actors:
            self.release_actor(self.actors[oid])

    DROPPED_MAX = 256      # refs drop_later may hold back
    DROPPED_BYTES = 1024   # of values this small at most: while the driver idles, 256 KiB wait at most

    def drop_later(self, oid: int) -> bool:
        """From a driver thread, without the lock: queue the release of one ref to a tiny stored
        value (no segments, no nested refs, no stream), which the node counts down at the end of
        its next locked section, after that section's messages went out, or before an observation
        (Loop.call_sync). A dropped result ref so costs `get(f.remote())` no locked section of its
        own: its release happens while the next task runs. False when it must go the usual way
        (the entry is read unlocked, as a hint: a stored value never changes, and this ref keeps
        it stored); larger values are freed at once, the idle node thread woken for them. The
        caller goes the usual way while commands are queued, so that none it queued is overtaken."""
        entry = self.objects.get(oid)
        value = entry.value if entry is not None else None
        if (value is None or value.buffers or value.refs or len(value.data) > self.DROPPED_BYTES
                or len(self.dropped) >= self.DROPPED_MAX or oid in self.streams):
            return False
        self.dropped.append(oid)
        return True

    def release_dropped(self) -> None:
        """Under the lock: count down what drop_later queued."""
        dropped = self.dropped
        while dropped:
            self.release(dropped.popleft())

    def _free(self, oid: int) -> None:
        """Drop a stored object, then the refs (and actor handles) its value held."""
        todo = [oid]
        while todo:
            oid = todo.pop()
            value = self.objects.pop(oid).value
            if value.buffers:
                self.retire_segments(value)
            for inner in value.refs:
                self.release(inner, todo)
            stream = self.streams.pop(oid, None) if self.streams else None
            if stream is not None:   # the generator was dropped: so are the values nobody took
                for inner in stream.items[stream.taken:]:
                    self.release(inner, todo)

    # -- segments --
    def retire_segments(self, value) -> None:
        """A value nobody reads again (a freed object's, or a finished task's arguments passed by
        value): its segments go to the pool once the workers sent them have let go."""
        for name, size in value.segments():
            self._retire(name, size)

    def sent(self, index: int, values) -> None:
        """Remember which workers may map which segments."""
        for value in values:
            if value is not None and value.buffers:
                for name, _ in value.segments():
                    self.readers.setdefault(name, set()).add(index)

    def _retire(self, name: str, size: int) -> None:
        """A freed object's segment: pool it once no process maps it (workers confirm)."""
        readers = {i for i in self.readers.pop(name, ()) if i in self.workers}
        unused, mm = segments.mappings.detach(name)
        if not unused:   # a tensor in the driver has a private mapping of it: just unlink
            segments.unlink_segments([name])
            return
        if not readers:
            return self._recycle(name, size, mm)
        self.releasing[name] = (size, readers, mm)
        for index in readers:
            self.forget(index, [name])

    def _recycle(self, name: str, size: int, mm=None) -> None:
        if not segments.pool.give(name, size, mm):
            if mm is not None:
                mm.close()
            segments.unlink_segments([name])

    def reader_done(self, name: str, index: int) -> None:
        entry = self.releasing.get(name)
        if entry is not None:
            entry[1].discard(index)
            if not entry[1]:
                del self.releasing[name]
                self._recycle(name, entry[0], entry[2])

    def reader_gone(self, index: int) -> None:
        """A worker died: its mappings died with it."""
        for name in [n for n, (_, pending, _) in self.releasing.items() if index in pending]:
            self.reader_done(name, index)
