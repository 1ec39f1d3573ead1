"""Shared-memory segments: one file under /dev/shm per large buffer.

Writing fresh tmpfs pages is slow (the kernel allocates and maps every page), so the driver keeps
freed segments in a pool and writes later puts into them. A segment is reused only once no
process can still see it: every worker that was sent it has closed its mapping (CPython refuses
to close an mmap while a buffer view of it is alive, which is exactly "some array still uses it")
and so has the driver. Until then it is merely unlinked-later, never overwritten.
"""
from __future__ import annotations

import itertools
import mmap
import os
import threading

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else os.environ.get("TMPDIR", "/tmp")
SEGMENT_PREFIX = "raylite-"
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_counter = itertools.count()


def session_prefix(session: str) -> str:
    return f"{SEGMENT_PREFIX}{session}-"


def _path(name: str) -> str:
    return os.path.join(SHM_DIR, name)


def write_segment(prefix: str, raw: memoryview) -> tuple[str, int]:
    """Copy a buffer into a segment: a pooled one in the driver (pages ready), else a new file."""
    view = raw.cast("B")
    reused = pool.take(len(view)) if pool is not None else None
    if reused is not None:
        name, mm = reused
        mm[:len(view)] = view
        mappings.adopt(name, mm, len(view))   # the driver's own get() reads through it for free
        return (name, len(view))
    name = f"{prefix}{os.getpid()}-{next(_counter)}"
    fd = os.open(_path(name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        done = 0
        while done < len(view):
            done += os.write(fd, view[done:])
    finally:
        os.close(fd)
    return (name, len(view))


def map_segment(name: str, size: int, private: bool = False) -> mmap.mmap:
    """Map read-only and shared, or copy-on-write when a writer (a torch tensor) needs its own pages."""
    fd = os.open(_path(name), os.O_RDONLY)
    try:
        if private:
            return mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
    finally:
        os.close(fd)


class MappingCache:
    """The segments this process has mapped, so a value read by many tasks is mapped once."""

    MAX_BYTES = 1 << 30

    def __init__(self):
        self.maps: dict[str, mmap.mmap] = {}
        self.private: dict[str, list[mmap.mmap]] = {}
        self.names: dict[int, str] = {}   # id(mmap) -> segment name, to re-map tensors privately
        self.sizes: dict[str, int] = {}
        self.writable: set[str] = set()   # the driver's pooled segments, mapped for writing
        self.bytes = 0

    def view(self, name: str, size: int) -> memoryview:
        """A read-only view; while it (or an array on it) lives, the mapping cannot close."""
        if size == 0:
            return memoryview(b"")
        mm = self.maps.get(name)
        if mm is None:
            mm = map_segment(name, size)
            self._add(name, mm, size)
        return memoryview(mm)[:size].toreadonly()

    def adopt(self, name: str, mm: mmap.mmap, size: int) -> None:
        self._add(name, mm, size)
        self.writable.add(name)

    def _add(self, name: str, mm: mmap.mmap, size: int) -> None:
        self.maps[name] = mm
        self.names[id(mm)] = name
        self.sizes[name] = size
        self.bytes += size
        while self.bytes > self.MAX_BYTES and len(self.maps) > 1:
            self._drop(next(iter(self.maps)))

    def private_view(self, name: str, size: int) -> memoryview:
        mm = map_segment(name, size, private=True)
        self.private.setdefault(name, []).append(mm)
        return memoryview(mm)

    def _drop(self, name: str) -> mmap.mmap | None:
        mm = self.maps.pop(name, None)
        if mm is not None:
            self.names.pop(id(mm), None)
            self.bytes -= self.sizes.pop(name, 0)
        self.writable.discard(name)
        return mm

    def release(self, name: str) -> bool:
        """Close every mapping of the segment; False while some buffer still uses one."""
        return self.detach(name)[0]

    def detach(self, name: str) -> tuple[bool, mmap.mmap | None]:
        """Forget the segment: (False, None) while a buffer still uses it; else (True, the
        driver's writable mapping, kept open for the pool, or None)."""
        writable = name in self.writable
        mappings = [m for m in [self._drop(name)] + self.private.pop(name, []) if m is not None]
        busy, kept = [], None
        for mm in mappings:
            try:
                if writable and kept is None and mm is mappings[0]:
                    mm.resize(len(mm))   # fails like close() while views exist, but keeps it open
                    kept = mm
                else:
                    mm.close()
            except BufferError:
                busy.append(mm)
        if busy:   # they close themselves when the last array on them goes
            return False, None
        return True, kept

    def segment_of(self, array) -> str | None:
        """The segment an array from `view` lives in (None for in-band data)."""
        base = array
        while base is not None and not isinstance(base, memoryview):
            base = getattr(base, "base", None)
        return self.names.get(id(base.obj)) if base is not None else None


class SegmentPool:
    """Segments no process maps any more, kept (pages allocated) for the driver's next puts."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.lock = threading.Lock()   # the node thread gives, user threads take
        self.free: dict[str, tuple[int, mmap.mmap | None]] = {}
        self.bytes = 0

    def give(self, name: str, size: int, mm: mmap.mmap | None) -> bool:
        with self.lock:
            if self.bytes + size > self.capacity:
                return False
            self.free[name] = (size, mm)
            self.bytes += size
            return True

    def take(self, n: int) -> tuple[str, mmap.mmap] | None:
        """The smallest pooled segment that holds n bytes without wasting half of it."""
        with self.lock:
            fits = [(size, name) for name, (size, _) in self.free.items() if n <= size <= 2 * n]
            if not fits:
                return None
            size, name = min(fits)
            _, mm = self.free.pop(name)
            self.bytes -= size
        if mm is not None:
            return name, mm
        try:
            fd = os.open(_path(name), os.O_RDWR)
        except FileNotFoundError:
            return None
        try:
            return name, mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE)
        finally:
            os.close(fd)


mappings = MappingCache()
pool: SegmentPool | None = None   # set in the driver by the node


def unlink_segments(names) -> None:
    for name in names:
        try:
            os.unlink(_path(name))
        except FileNotFoundError:
            pass


def remove_session_segments(session: str) -> None:
    prefix = session_prefix(session)
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(prefix)]
    except OSError:
        return
    unlink_segments(names)
