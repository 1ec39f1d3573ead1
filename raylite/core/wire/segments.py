"""Shared-memory segments: one file under /dev/shm per large buffer.

Writing fresh tmpfs pages is slow (the kernel allocates and maps every page), so the driver keeps
freed segments in a pool and writes later puts into them. A segment is reused only once no
process can still see it: every worker that was sent it has closed its mapping (CPython refuses
to close an mmap while a buffer view of it is alive, which is exactly "some array still uses it")
and no array in the driver reads it any more (until then it lingers in the pool, never handed out).

Huge pages. A segment of at least 2 MiB is asked for 2 MiB pages with MADV_COLLAPSE (Linux 6.1+),
which works on tmpfs even where the kernel's shmem_enabled is "never" (the default). Workers
then read a large array at the speed of the driver's own (numpy's memory is on huge pages too):
with 4 KiB pages, summing 100 MB ran 1.5-3 ms slower here, and writing a fresh segment faulted
in 25,600 pages. For the huge page-table entries, every mapping starts on a 2 MiB boundary
(MAP_FIXED inside a reservation that Python's mmap object owns), and readers ask for them with
MADV_COLLAPSE too, which for pages already huge only installs them. Such a segment's name ends
in HUGE_MARK; where the kernel declines, segments are written and mapped as before, and after
one slow collapse, for HUGE_PAUSE_S.
"""
from __future__ import annotations

import errno
import itertools
import mmap
import os
import sys
import time

from raylite import exceptions

SHM_DIR_ENV = "RAYLITE_SHM_DIR"   # where segments go, chosen by the user (see choose_dir)
_DISK_DIR = os.environ.get("TMPDIR", "/tmp")
# this process's choice: the driver's (choose_dir), which workers get with their config
SHM_DIR = os.environ.get(SHM_DIR_ENV) or ("/dev/shm" if os.path.isdir("/dev/shm") else _DISK_DIR)
SEGMENT_PREFIX = "raylite-"
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_counter = itertools.count()
HUGE_PAGE = 2 << 20
HUGE_MARK = "-h"
SPILL_MARK = "-s"    # a segment in SPILL_DIR (see _spills)
WRITING_MARK = "-w"  # a file still being written: its name without it is not in use yet
SPILL_DIR = _DISK_DIR   # the driver's, which workers get with their config
_spill_warned = False
_MAP_FIXED, _MADV_POPULATE_READ, _MADV_COLLAPSE = 0x10, 22, 25
_libc = None   # see libc(); False where unavailable
# Fresh huge pages cost more than small ones where the hypervisor must first back the memory
# (free page reporting) or the kernel must compact: slower than 0.5 ms per MB (writing small
# pages costs about 0.7 ms per MB with the copy), new segments use small pages for a while.
SLOW_HUGE_S_PER_BYTE = 0.5e-3 / (1 << 20)
HUGE_PAUSE_S = 60.0
_huge_paused_until = 0.0


class Mapping:
    """A segment mapped at `off` inside `mm` (0, or past the alignment gap of a huge one)."""

    __slots__ = ("mm", "off", "writable")

    def __init__(self, mm: mmap.mmap, off: int = 0, writable: bool = False):
        self.mm, self.off, self.writable = mm, off, writable

    def view(self, size: int) -> memoryview:
        return memoryview(self.mm)[self.off:self.off + size]

    def in_use(self) -> bool:
        """Whether a buffer (an array) still uses the mapping."""
        try:
            self.mm.resize(len(self.mm))   # fails like close() while views exist, but keeps it open
        except BufferError:
            return True
        except (OSError, TypeError, ValueError):   # not resizable, but no view either (checked first)
            pass
        return False

    def close(self) -> None:
        """Unmap now, or, while an array still uses the mapping, once the last one goes."""
        try:
            self.mm.close()
        except BufferError:
            pass


def libc():
    """libc through ctypes, with mmap and madvise typed (Linux only; None elsewhere). The zygote
    uses it too (prctl, malloc_trim)."""
    global _libc
    if _libc is None:
        _libc = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes
                lib = ctypes.CDLL(None, use_errno=True)
                lib.mmap.restype = ctypes.c_void_p
                lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                     ctypes.c_long]
                lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                _libc = lib
            except (ImportError, OSError, AttributeError):
                pass
    return _libc if _libc is not False else None


def _map_huge(fd: int, size: int, writable: bool, fresh: bool = False) -> Mapping | None:
    """Map fd's first `size` bytes from a 2 MiB boundary and get them huge page-table entries;
    None (nothing left mapped) where the kernel declines. `fresh`: the file is empty, so give
    every 2 MiB one page first (MADV_COLLAPSE skips ranges with none) and let the kernel fill in
    the rest as huge pages."""
    lib = libc()
    if lib is None or size < HUGE_PAGE:
        return None
    import ctypes
    reserve = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    anchor = ctypes.c_char.from_buffer(reserve)
    base = ctypes.addressof(anchor)
    del anchor   # releases the export, so the reservation can close later
    start = -(-base // HUGE_PAGE) * HUGE_PAGE
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    whole = size // HUGE_PAGE * HUGE_PAGE
    if lib.mmap(start, size, prot, mmap.MAP_SHARED | _MAP_FIXED, fd, 0) != start:
        reserve.close()
        return None
    if fresh:
        try:   # give every page written below its memory first: a full /dev/shm is ENOSPC here, not SIGBUS
            for offset in range(0, whole, HUGE_PAGE):
                os.posix_fallocate(fd, offset, 1)
            if size > whole:
                os.posix_fallocate(fd, whole, size - whole)
        except OSError:
            reserve.close()
            raise
        for page in range(start, start + whole, HUGE_PAGE):
            ctypes.memset(page, 0, 1)
    if lib.madvise(start, whole, _MADV_COLLAPSE) != 0:
        reserve.close()
        return None
    if size > whole and not writable:   # the tail has small pages: fault them in at once
        lib.madvise(start + whole, size - whole, _MADV_POPULATE_READ)
    return Mapping(reserve, start - base, writable)


def choose_dir(store_bytes: int) -> str:
    """Where a session's segments go, decided once by the driver as Ray places its object store:
    /dev/shm, unless it has less room than the object store may use (Docker gives a container
    64 MB), then the temporary directory, on disk, with a warning. RAYLITE_SHM_DIR decides."""
    if os.environ.get(SHM_DIR_ENV):
        return os.environ[SHM_DIR_ENV]
    if not os.path.isdir("/dev/shm"):
        return _DISK_DIR
    free = _free_bytes("/dev/shm")
    if free >= store_bytes:
        return "/dev/shm"
    import warnings
    warnings.warn(f"raylite: /dev/shm has only {free / 2**20:.0f} MB free, less than the object store's "
                  f"{store_bytes / 2**20:.0f} MB, so large objects go to {_DISK_DIR} instead, which is slower. "
                  f"In Docker, give the container more with --shm-size; or pass a smaller object_store_memory "
                  f"to init(); {SHM_DIR_ENV} names the directory to use.", stacklevel=3)
    return _DISK_DIR


def _free_bytes(directory: str) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def _spills(n: int) -> bool:
    """Whether a new segment of n bytes goes to SPILL_DIR: it does not fit in SHM_DIR (even after
    the driver's pool let go of its free segments), as Ray spills when its store is full. One
    that fits nowhere is an error here, not a SIGBUS when its pages are written."""
    if n + HUGE_PAGE <= _free_bytes(SHM_DIR):   # (a huge-page segment may take up to one page more)
        return False
    if pool is not None and pool.drop_free() and n + HUGE_PAGE <= _free_bytes(SHM_DIR):
        return False
    _spill_or_fail(n)
    return True


def _spill_or_fail(n: int, why: str = "") -> None:
    """A segment of n bytes goes to SPILL_DIR (warned once), or, where that has no room either,
    ObjectStoreFullError."""
    free = _free_bytes(SHM_DIR)
    spill_free = _free_bytes(SPILL_DIR) if os.path.realpath(SPILL_DIR) != os.path.realpath(SHM_DIR) else 0
    if n > spill_free:
        raise exceptions.ObjectStoreFullError(
            f"an object of {n / 2**20:.1f} MB does not fit in {SHM_DIR} ({free / 2**20:.1f} MB free{why})"
            + (f" nor in {SPILL_DIR}, where objects spill ({spill_free / 2**20:.1f} MB free)" if spill_free else "")
            + f". Free objects (drop their refs), or give the object store more room: a larger /dev/shm "
            f"(Docker: --shm-size), or {SHM_DIR_ENV} set to a directory on disk")
    global _spill_warned
    if not _spill_warned:
        _spill_warned = True
        import warnings
        warnings.warn(f"raylite: {SHM_DIR} is full ({free / 2**20:.0f} MB free{why}): objects that do not fit are "
                      f"spilled to {SPILL_DIR}, which is slower (Ray spills its object store to disk the same "
                      f"way). Free objects, or give /dev/shm more room (Docker: --shm-size).", stacklevel=3)


def session_prefix(session: str) -> str:
    return f"{SEGMENT_PREFIX}{session}-"


def session_of(prefix: str) -> str:
    """The session id a session_prefix() was made from."""
    return prefix[len(SEGMENT_PREFIX):-1]


def _path(name: str) -> str:
    return os.path.join(SPILL_DIR if name.endswith(SPILL_MARK) else SHM_DIR, name)


def write_segment(prefix: str, raw: memoryview, staged: list | None = None) -> tuple[str, int]:
    """Copy a buffer into a segment: a pooled one in the driver (pages ready), else a new file.

    A new file is written under its name plus WRITING_MARK, so a worker killed while writing it
    leaves a name the node recognises as unfinished (remove_unfinished); it takes its real name
    once filled, or, with `staged`, once the caller publishes every buffer of its value (which
    then travels at once). Running out of room while writing (another process filled /dev/shm)
    removes the partial file and spills to disk, or raises ObjectStoreFullError."""
    view = raw.cast("B")
    n = len(view)
    reused = pool.take(n) if pool is not None else None
    if reused is not None:
        name, mapped = reused
        mapped.mm[mapped.off:mapped.off + n] = view
        mappings.adopt(name, mapped, n)   # the driver's own get() reads through it for free
        return (name, n)
    spill = _spills(n)
    base = f"{prefix}{os.getpid()}-{next(_counter)}"
    try:
        name = _write_new(base + (SPILL_MARK if spill else ""), view, spill)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        if spill:
            raise exceptions.ObjectStoreFullError(
                f"an object of {n / 2**20:.1f} MB does not fit in {SPILL_DIR}, where objects spill: it filled "
                f"up while the object was written ({e.strerror}). Free objects (drop their refs), or make room "
                f"there") from None
        if pool is not None:
            pool.drop_free()
        _spill_or_fail(n, f", filled up by another process while the object was written: {e.strerror}")
        name = _write_new(base + SPILL_MARK, view, True)
    if staged is None:
        publish([name])
    else:
        staged.append(name)
    return (name, n)


def _write_new(name: str, view: memoryview, spill: bool) -> str:
    """Write `view` into a new file under the writing name of `name` (which may gain HUGE_MARK,
    returned); on any error the partial file is removed."""
    global _huge_paused_until
    n = len(view)
    writing = _path(name) + WRITING_MARK
    fd = os.open(writing, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        mapped = None
        if n >= HUGE_PAGE and not spill and time.monotonic() >= _huge_paused_until:
            os.ftruncate(fd, n)
            started = time.monotonic()
            mapped = _map_huge(fd, n, writable=True, fresh=True)
            if mapped is not None and time.monotonic() - started > n * SLOW_HUGE_S_PER_BYTE:
                _huge_paused_until = time.monotonic() + HUGE_PAUSE_S
        if mapped is None:
            done = 0
            while done < n:
                done += os.write(fd, view[done:])
        else:
            mapped.mm[mapped.off:mapped.off + n] = view
            os.rename(writing, _path(name + HUGE_MARK) + WRITING_MARK)
            writing = _path(name + HUGE_MARK) + WRITING_MARK
            name += HUGE_MARK
            if pool is not None:   # in the driver: keep the mapping, as for a pooled segment
                mappings.adopt(name, mapped, n)
            else:
                mapped.close()
    except BaseException:
        os.unlink(writing)
        raise
    finally:
        os.close(fd)
    return name


def publish(names: list) -> None:
    """Give staged segments (see write_segment) their real names: their value may travel now."""
    for name in names:
        os.rename(_path(name) + WRITING_MARK, _path(name))
    names.clear()


def discard(segments_written: list, staged: list) -> None:
    """Remove what a failed serialization wrote (staged files, and pooled segments it took)."""
    for name, _ in segments_written:
        mapped = mappings._drop(name)
        if mapped is not None:
            mapped.close()
        path = _path(name) + (WRITING_MARK if name in staged else "")
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    staged.clear()


def remove_unfinished(prefix: str, pid: int) -> int:
    """Remove the segments a dead process of the session was still writing (no value names them
    yet); how many bytes they held."""
    start, freed = f"{prefix}{pid}-", 0
    for directory in dict.fromkeys((SHM_DIR, SPILL_DIR)):
        try:
            names = [n for n in os.listdir(directory) if n.startswith(start) and n.endswith(WRITING_MARK)]
        except OSError:
            continue
        for name in names:
            path = os.path.join(directory, name)
            try:
                freed += os.stat(path).st_blocks * 512
                os.unlink(path)
            except FileNotFoundError:
                pass
    return freed


def map_segment(name: str, size: int, private: bool = False) -> Mapping:
    """Map read-only and shared, or copy-on-write when a writer (a torch tensor) needs its own pages."""
    fd = os.open(_path(name), os.O_RDONLY)
    try:
        if private:
            return Mapping(mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE))
        if name.endswith(HUGE_MARK):
            mapped = _map_huge(fd, size, writable=False)
            if mapped is not None:
                return mapped
        return Mapping(mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ))
    finally:
        os.close(fd)


class MappingCache:
    """The segments this process has mapped, so a value read by many tasks is mapped once."""

    MAX_BYTES = 1 << 30

    def __init__(self):
        self.maps: dict[str, Mapping] = {}
        self.private: dict[str, list[Mapping]] = {}
        self.names: dict[int, str] = {}   # id(mmap) -> segment name, to re-map tensors privately
        self.sizes: dict[str, int] = {}
        self.bytes = 0

    def view(self, name: str, size: int) -> memoryview:
        """A read-only view; while it (or an array on it) lives, the mapping cannot close."""
        if size == 0:
            return memoryview(b"")
        mapped = self.maps.get(name)
        if mapped is None:
            mapped = map_segment(name, size)
            self._add(name, mapped, size)
        return mapped.view(size).toreadonly()

    def adopt(self, name: str, mapped: Mapping, size: int) -> None:
        """The driver's own writable mapping of a segment it just wrote: its get() reads through it."""
        self._add(name, mapped, size)

    def _add(self, name: str, mapped: Mapping, size: int) -> None:
        self.maps[name] = mapped
        self.names[id(mapped.mm)] = name
        self.sizes[name] = size
        self.bytes += size
        while self.bytes > self.MAX_BYTES and len(self.maps) > 1:
            self._drop(next(iter(self.maps)))

    def private_view(self, name: str, size: int) -> memoryview:
        mapped = map_segment(name, size, private=True)
        self.private.setdefault(name, []).append(mapped)
        return mapped.view(size)

    def _drop(self, name: str) -> Mapping | None:
        mapped = self.maps.pop(name, None)
        if mapped is not None:
            self.names.pop(id(mapped.mm), None)
            self.bytes -= self.sizes.pop(name, 0)
        return mapped

    def release(self, name: str) -> bool:
        """Close every mapping of the segment (a worker asked to forget it); False while some
        array still uses one. They stay known until then, so that asking again says True only
        once the last array has gone: the node may hand the segment out for another value."""
        mapped = [m for m in (self.maps.get(name), *self.private.get(name, ())) if m is not None]
        if any(m.in_use() for m in mapped):
            return False
        self._drop(name)
        self.private.pop(name, None)
        for m in mapped:
            m.mm.close()
        return True

    def detach(self, name: str) -> tuple[bool, Mapping | None]:
        """The driver forgets the segment: (False, None) while an array on a private
        (copy-on-write) mapping of it lives; else (True, its shared mapping, if any), which the
        pool hands out again only once no array reads it."""
        kept, busy = self._drop(name), False
        for mapped in self.private.pop(name, []):
            try:
                mapped.mm.close()
            except BufferError:
                busy = True
        return (False, None) if busy else (True, kept)

    def segment_of(self, array) -> str | None:
        """The segment an array from `view` lives in (None for in-band data)."""
        base = array
        while base is not None and not isinstance(base, memoryview):
            base = getattr(base, "base", None)
        return self.names.get(id(base.obj)) if base is not None else None


mappings = MappingCache()
pool = None   # the driver's raylite.core.node.segment_pool.SegmentPool, set by the node


def unlink_segments(names) -> None:
    for name in names:
        try:
            os.unlink(_path(name))
        except FileNotFoundError:
            pass


def remove_session_segments(session: str) -> None:
    """Every segment of the session, in any directory choose_dir could have picked (the zygote
    learns the driver's choice only with its first fork request)."""
    prefix = session_prefix(session)
    for directory in dict.fromkeys((SHM_DIR, "/dev/shm", _DISK_DIR, SPILL_DIR)):
        try:
            names = [n for n in os.listdir(directory) if n.startswith(prefix)]
        except OSError:
            continue
        for name in names:
            try:
                os.unlink(os.path.join(directory, name))
            except FileNotFoundError:
                pass
