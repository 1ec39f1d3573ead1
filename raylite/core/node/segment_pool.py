"""The driver's pool of freed shared-memory segments (raylite.core.wire.segments writes into them):
writing fresh tmpfs pages is slow, so a later put reuses a segment no process maps any more."""
from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Callable

from raylite.core.wire.segments import _POPULATE, HUGE_MARK, SPILL_MARK, Mapping, _map_huge, _path, unlink_segments


class SegmentPool:
    """Freed segments no worker maps any more, kept (pages allocated) for the driver's next puts.
    One the driver's own arrays still read (`out = ray.get(ray.put(x))` outlives its ref) waits
    in `lingering` until they are gone. A segment no put took within IDLE_S is removed, so tasks
    that return large values (each in a new segment) do not fill the pool up to its capacity; and
    while the driver has not put a large value for IDLE_S, freed segments are not kept at all (a
    run whose tasks return arrays held about 10 s of its results in /dev/shm for nothing)."""

    IDLE_S = 10.0

    def __init__(self, capacity: int, clock: Callable[[], float] = time.monotonic):
        """``clock``: seconds, read for the idle rules above (a test drives its own)."""
        self.capacity = capacity
        self.clock = clock
        self.lock = threading.Lock()   # the node gives, user threads take
        self.free: dict[str, tuple[int, Mapping | None, float]] = {}
        self.lingering: dict[str, tuple[int, Mapping, float]] = {}
        self.bytes = 0
        self.due = float("inf")   # when the oldest entry expires
        self.last_take = -float("inf")   # when the driver last looked for a segment to put into

    def give(self, name: str, size: int, mm: Mapping | None) -> bool:
        with self.lock:
            now = self.clock()
            if self.bytes + size > self.capacity or now - self.last_take > self.IDLE_S or name.endswith(SPILL_MARK):
                return False
            if mm is not None and mm.in_use():
                self.lingering[name] = (size, mm, now)
            else:
                self.free[name] = (size, _for_writing(mm), now)
            self.bytes += size
            self.due = min(self.due, now + self.IDLE_S)
            return True

    def take(self, n: int) -> tuple[str, Mapping] | None:
        """The smallest pooled segment that holds n bytes without wasting half of it."""
        with self.lock:
            self.last_take = self.clock()
            for name, (size, mm, since) in list(self.lingering.items()):
                if not mm.in_use():
                    del self.lingering[name]
                    self.free[name] = (size, _for_writing(mm), since)
            fits = [(size, name) for name, (size, _, _) in self.free.items() if n <= size <= 2 * n]
            if not fits:
                return None
            size, name = min(fits)
            _, mm, _ = self.free.pop(name)
            self.bytes -= size
        if mm is not None:
            return name, mm
        try:
            fd = os.open(_path(name), os.O_RDWR)
        except FileNotFoundError:
            return None
        try:
            mapped = _map_huge(fd, size, writable=True) if name.endswith(HUGE_MARK) else None
            return name, mapped or Mapping(mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE), writable=True)
        finally:
            os.close(fd)

    def drop_free(self) -> bool:
        """Remove the free segments at once (new objects need their room); whether there were any."""
        with self.lock:
            dropped = list(self.free.items())
            self.free.clear()
            self.bytes -= sum(entry[0] for _, entry in dropped)
        for _, (_, mm, _) in dropped:
            if mm is not None:
                mm.close()
        unlink_segments([name for name, _ in dropped])
        return bool(dropped)

    def next_expiry(self) -> float | None:
        """Seconds until a pooled segment is due for removal (None: the pool is empty)."""
        return None if self.due == float("inf") else max(0.0, self.due - self.clock())

    def expire(self) -> None:
        """Remove the segments pooled for longer than IDLE_S. A lingering one's mapping is only
        dropped: the driver's arrays that read it keep it alive until they go."""
        now = self.clock()
        if now < self.due:
            return
        with self.lock:
            old = [(table, name) for table in (self.free, self.lingering)
                   for name, entry in table.items() if entry[2] + self.IDLE_S <= now]
            for table, name in old:
                size, mm, _ = table.pop(name)
                self.bytes -= size
                if mm is not None and table is self.free:
                    mm.close()
            self.due = min((e[2] + self.IDLE_S for table in (self.free, self.lingering) for e in table.values()),
                           default=float("inf"))
        unlink_segments([name for _, name in old])


def _for_writing(mapped: Mapping | None) -> Mapping | None:
    """A pooled segment's mapping fit to write the next put into (None: map it again then)."""
    if mapped is not None and not mapped.writable:
        mapped.close()
        return None
    return mapped
