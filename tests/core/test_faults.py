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
from raylite.core.wire import segments
from raylite.core.client.link import process

from backend import ON_RAY
from helpers import REPO_ROOT, pid_alive, wait_until

REPO = str(REPO_ROOT)


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


@pytest.mark.local_only("the local runtime's shared-memory segments")
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
    wait_until(lambda: not _session_files(pid), timeout=10, what="the dead worker's segments to be removed")
    left = _session_files(pid)
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


@pytest.mark.local_only("the local runtime's shared-memory segments")
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
    before = set() if ON_RAY else set(_session_files())
    with pytest.raises(TypeError, match="Could not serialize"):
        ray.put([np.ones(1 << 20), threading.Lock()])
    if not ON_RAY:   # (the segments are the local runtime's; on Ray only the error is checked)
        assert set(_session_files()) - before == set()


_SPAWN = """
import os, subprocess
kids = [subprocess.Popen(["sleep", "600"]).pid,                       # a child
        subprocess.Popen(["sh", "-c", "sleep 600 & sleep 600; :"]).pid]   # a shell with its own child
detached = subprocess.Popen(["sleep", "600"], start_new_session=True).pid
"""


def _descendants_of_shells(pids: list[int]) -> list[int]:
    """pids and the children of each (the shell's sleep), from /proc."""
    found = list(pids)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) in pids:
                        found.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return found


@pytest.mark.local_only("Ray's raylet ends every descendant of a worker that exits, a detached (setsid) one too")
def test_a_workers_children_end_with_it_but_a_detached_one_is_left_alone(ray_start):
    """An actor starts a child, a shell with its own child, and a detached (setsid) process; once
    the actor is killed, all but the detached one are gone."""
    @ray.remote
    class Spawner:
        def spawn(self, code):
            scope = {}
            exec(code, scope)
            return scope["kids"], scope["detached"], os.getpid()

    actor = Spawner.remote()
    kids, detached, worker_pid = ray.get(actor.spawn.remote(_SPAWN), timeout=60)
    family = wait_until(lambda: (lambda f: f if len(f) >= 3 else None)(_descendants_of_shells(kids)), timeout=10)
    try:
        ray.kill(actor)
        wait_until(lambda: not pid_alive(worker_pid), timeout=15, what="the actor's worker to end")
        wait_until(lambda: not any(pid_alive(p) for p in family), timeout=15,
                   what=f"the worker's children {family} to end")
        assert pid_alive(detached), "the detached process was ended too"
    finally:
        for pid in family + [detached]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


_DRIVER = """
import json, os, sys, time
import raylite as ray
ray.init(num_cpus=1)

@ray.remote
def spawn(code):
    scope = {}
    exec(code, scope)
    return scope["kids"], scope["detached"]

kids, detached = ray.get(spawn.remote(sys.argv[1]))
print(json.dumps([kids, detached]), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
def test_a_driver_killed_with_grandchildren_leaves_no_orphan(tmp_path, how):
    """A driver SIGKILLed (or interrupted: Ctrl-C) while its task's subprocesses (and theirs) run:
    all of them end, but the one that detached."""
    import json
    import subprocess
    import sys
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER, _SPAWN], stdout=subprocess.PIPE, cwd=tmp_path,
                              env=env, text=True)
    family, detached = [], None
    try:
        kids, detached = json.loads(driver.stdout.readline())
        family = wait_until(lambda: (lambda f: f if len(f) >= 3 else None)(_descendants_of_shells(kids)),
                            timeout=10)
        driver.send_signal(how)
        driver.wait(timeout=30)
        wait_until(lambda: not any(pid_alive(p) for p in family), timeout=15,
                   what=f"the task's processes {family} to end after the driver's {how.name}")
        orphans = [p for p in family if pid_alive(p)]
        print(f"\norphans after the driver's {how.name}: {len(orphans)} of {len(family)} processes")
        assert pid_alive(detached), "the detached process was ended too"
    finally:
        driver.kill()
        for pid in family + ([detached] if detached else []):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.local_only("the local runtime's zygote")
def test_a_killed_zygote_is_restarted_once_then_tasks_fail_saying_so(ray_start, capfd):
    """The worker factory (zygote) SIGKILLed: what its workers started ends too, the next task
    restarts it and runs, in the same session; killed again, tasks fail with an error that says what happened (it was
    "[Errno 32] Broken pipe" for every task)."""
    node = process.client.node
    one = ray.remote(lambda: 1)
    assert ray.get(one.remote(), timeout=30) == 1

    def kill_zygote():
        pid = node.zygote.pid
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not pid_alive(pid), timeout=10, what="the zygote to die")
        wait_until(lambda: not node.workers, timeout=15, what="its workers' deaths to be seen")
        return pid

    @ray.remote
    class Spawner:
        def spawn(self, code):
            scope = {}
            exec(code, scope)
            return scope["kids"], scope["detached"]

    spawner = Spawner.remote()   # (kept: a dropped handle would end the actor before the kill)
    kids, detached = ray.get(spawner.spawn.remote(_SPAWN), timeout=60)
    family = wait_until(lambda: (lambda f: f if len(f) >= 3 else None)(_descendants_of_shells(kids)), timeout=10)
    try:
        first = kill_zygote()   # their subreaper gone with it, the node ends what its workers started
        wait_until(lambda: not any(pid_alive(p) for p in family), timeout=15,
                   what=f"the processes {family} a worker of the killed zygote started to end")
        assert pid_alive(detached)
    finally:
        for pid in family + [detached]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    assert ray.get(one.remote(), timeout=60) == 1
    assert node.zygote.pid != first and node.zygote.session == node.session
    assert "worker factory (the zygote process, pid %d) died; restarted it" % first in capfd.readouterr().err

    second = kill_zygote()
    with pytest.raises(exceptions.RaySystemError, match=f"zygote process, pid {second}\\) died again"):
        ray.get(one.options(max_retries=0).remote(), timeout=60)


@pytest.mark.local_only("the local runtime's shared-memory segments")
def test_enospc_in_a_worker_writing_its_result_spills_it(ray_start):
    """The same in a worker: its result's segment meets a full /dev/shm, the result spills to
    disk and the driver reads it; no partial segment stays."""
    import numpy as np
    before = set(_session_files())

    @ray.remote(max_calls=1)   # (the patched worker ends with the task)
    def result_with_full_shm():
        import errno as errno_
        import os as os_
        real_write, real_fallocate = os_.write, os_.posix_fallocate

        def full(fd):
            try:
                return os_.path.basename(os_.readlink(f"/proc/self/fd/{fd}")).endswith("-w") and \
                    os_.path.dirname(os_.readlink(f"/proc/self/fd/{fd}")) == "/dev/shm"
            except OSError:
                return False

        def write(fd, data):
            if full(fd):
                raise OSError(errno_.ENOSPC, os_.strerror(errno_.ENOSPC))
            return real_write(fd, data)

        def fallocate(fd, offset, length):
            if full(fd):
                raise OSError(errno_.ENOSPC, os_.strerror(errno_.ENOSPC))
            return real_fallocate(fd, offset, length)
        os_.write, os_.posix_fallocate = write, fallocate
        return np.arange(3 << 20, dtype=np.int64)

    if segments.SHM_DIR != "/dev/shm":
        pytest.skip("segments do not go to /dev/shm here")
    ref = result_with_full_shm.remote()
    assert np.array_equal(ray.get(ref, timeout=60), np.arange(3 << 20, dtype=np.int64))
    new = set(_session_files()) - before
    assert new and all(name.endswith(segments.SPILL_MARK) for name in new), new   # spilled, nothing partial
