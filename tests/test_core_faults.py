"""Fault injection: a worker killed while it writes a large result, /dev/shm filling up under a
write (ENOSPC injected), the worker factory (zygote) killed, a driver killed with grandchildren.
Each ends with nothing left behind: no segment in /dev/shm, no orphan process.
"""
from __future__ import annotations

import contextlib
import errno
import os
import signal

import pytest

import raylite as ray
from raylite import exceptions
from raylite.core import segments
from raylite.core.objects import process

from helpers import wait_until


def _session_files(pid: int | None = None) -> dict[str, int]:
    """This session's segment files (of one process, if given) in /dev/shm and the spill
    directory: name -> bytes they hold."""
    prefix = process.client.shm_prefix + (f"{pid}-" if pid is not None else "")
    found = {}
    for directory in dict.fromkeys((segments.SHM_DIR, segments.SPILL_DIR)):
        for name in os.listdir(directory):
            if name.startswith(prefix):
                try:
                    found[name] = os.stat(os.path.join(directory, name)).st_blocks * 512
                except FileNotFoundError:
                    pass
    return found


def test_a_worker_killed_while_writing_a_large_result_leaves_no_segment(ray_start, tmp_path):
    """The task's result is a 200 MB array and an object whose pickling blocks: the worker is
    SIGKILLed while its result is half written (the array's segment is filled, the value not
    finished). Once the death is seen, no segment of that worker remains."""
    gate = tmp_path / "writing"

    @ray.remote(max_retries=0)
    def big_result(path):
        import time
        import numpy as np

        class Stall:
            def __reduce__(self):   # the array before it is already in its segment
                with open(path, "w") as f:
                    f.write(str(os.getpid()))
                time.sleep(600)
                return (int, ())
        return [np.ones(200 << 17), Stall()]   # 200 MiB of float64

    ref = big_result.remote(str(gate))
    wait_until(lambda: gate.exists() and gate.read_text(), timeout=60, what="the worker writing its result")
    pid = int(gate.read_text())
    written = _session_files(pid)
    assert sum(written.values()) >= 200 << 20, written   # the array's segment, mid-value
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(exceptions.WorkerCrashedError):
        ray.get(ref, timeout=60)   # the death is seen
    left = wait_until(lambda: not _session_files(pid) or None, timeout=10) and _session_files(pid)
    print(f"\nbytes left in /dev/shm after the kill: {sum(left.values())} (written before it: "
          f"{sum(written.values())})")
    assert left == {}
    assert ray.get(ray.remote(lambda: 1).remote(), timeout=30) == 1


def _inject_enospc(monkeypatch, directory: str) -> list:
    """Make writes of new segment files under `directory` fail as a full disk does: posix_fallocate
    raises ENOSPC, os.write writes part of the data and then raises it. Returns the paths hit."""
    real_write, real_fallocate, hit = os.write, os.posix_fallocate, []

    def segment_path(fd):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None
        return path if (os.path.dirname(path) == os.path.realpath(directory)
                        and os.path.basename(path).startswith(segments.SEGMENT_PREFIX)) else None

    def write(fd, data):
        path = segment_path(fd)
        if path is None:
            return real_write(fd, data)
        hit.append(path)
        if os.fstat(fd).st_size == 0:
            return real_write(fd, memoryview(data)[:len(data) // 2])   # part of it, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fallocate(fd, offset, length):
        path = segment_path(fd)
        if path is None:
            return real_fallocate(fd, offset, length)
        hit.append(path)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    return hit


def test_enospc_while_writing_spills_to_disk_or_raises_object_store_full(ray_start, monkeypatch, tmp_path):
    """/dev/shm filling up between the free-space check and the write: put() spills the value to
    disk (or, with nowhere to spill, raises ObjectStoreFullError), never a TypeError, and the
    partial segment is gone either way."""
    import numpy as np
    value = np.arange(3 << 20, dtype=np.int64)   # 24 MiB
    before = set(_session_files())
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    monkeypatch.setattr(segments, "SPILL_DIR", str(spill_dir))
    hit = _inject_enospc(monkeypatch, segments.SHM_DIR)
    with pytest.warns(UserWarning, match="spilled") if not segments._spill_warned else contextlib.nullcontext():
        ref = ray.put(value)
    assert hit, "the injected ENOSPC was never reached"
    assert np.array_equal(ray.get(ref), value)
    assert [n for n in os.listdir(spill_dir)], "the value was not spilled"
    assert set(_session_files()) - before - set(os.listdir(spill_dir)) == set()   # nothing partial in /dev/shm
    del ref

    monkeypatch.setattr(segments, "SPILL_DIR", segments.SHM_DIR)   # nowhere to spill to
    spilled = set(os.listdir(spill_dir))
    with pytest.raises(exceptions.ObjectStoreFullError, match="No space left on device"):
        ray.put(value)
    assert set(_session_files()) - before - spilled == set()
    monkeypatch.undo()
    assert ray.get(ray.remote(lambda: 1).remote(), timeout=30) == 1


def test_a_value_that_fails_half_way_through_serialization_leaves_no_segment(ray_start):
    """A put whose pickling fails after a large buffer was written (a lock in the same list)
    raises the serialization error and removes that buffer's segment."""
    import threading
    import numpy as np
    before = set(_session_files())
    with pytest.raises(TypeError, match="Could not serialize"):
        ray.put([np.ones(1 << 20), threading.Lock()])
    assert set(_session_files()) - before == set()
