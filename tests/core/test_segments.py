"""Shared-memory segment reuse: freed segments are recycled only when nobody maps them."""
import glob
import os
import resource
import time

import numpy as np
import pytest

import raylite as ray
from raylite.core.node.segment_pool import SegmentPool

pytestmark = pytest.mark.local_only("the local runtime's shared-memory segments (Ray has its own object store)")

N = 300_000  # 2.4 MB of float64: above the 1 MB shared-memory threshold


def _session_segments() -> set[str]:
    return set(glob.glob(f"/dev/shm/raylite-{os.getpid()}-*"))


def _settle(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _pooled():
    """Wait until a freed segment is in the driver's pool: what the next put of its size reuses."""
    from raylite.core.wire import segments
    assert _settle(lambda: segments.pool.bytes > 0), "a freed segment never reached the driver's pool"


def _node_caught_up():
    """A round trip through the node's command queue: the releases sent before it have been handled."""
    ray.available_resources()


@pytest.mark.timeout(60)
def test_put_reuses_freed_segments(ray_start):
    for i in range(6):
        ref = ray.put(np.full(N, float(i)))
        assert ray.get(ref)[123] == float(i)
        del ref
        _pooled()
    # six puts of the same size, each freed before the next: the files are recycled, not piled up
    assert len(_session_segments()) <= 2


@pytest.mark.timeout(60)
def test_driver_array_survives_reuse(ray_start):
    ref = ray.put(np.full(N, 1.0))
    held = ray.get(ref)          # a zero-copy view of the segment
    del ref
    _node_caught_up()            # the release has been handled (the view keeps the segment from reuse)
    for i in range(3):
        other = ray.put(np.full(N, 7.0 + i))
        assert ray.get(other)[0] == 7.0 + i
        del other
    assert float(held.sum()) == float(N)


@pytest.mark.timeout(60)
def test_actor_held_array_survives_reuse(ray_start):
    @ray.remote
    class Keeper:
        def keep(self, arr):
            self.arr = arr
            return float(arr.sum())

        def total(self):
            return float(self.arr.sum())

        def drop(self):
            self.arr = None

    keeper = Keeper.remote()
    ref = ray.put(np.full(N, 2.0))
    assert ray.get(keeper.keep.remote(ref)) == 2.0 * N
    del ref
    _node_caught_up()   # the release has been handled (the actor's array keeps the segment from reuse)
    for i in range(3):
        other = ray.put(np.full(N, 100.0 + i))
        assert ray.get(other)[-1] == 100.0 + i
        del other
        _pooled()
    assert ray.get(keeper.total.remote()) == 2.0 * N
    ray.get(keeper.drop.remote())


@pytest.mark.timeout(60)
def test_task_reader_releases_before_reuse(ray_start):
    @ray.remote
    def total(arr):
        return float(arr.sum())

    for i in range(4):
        ref = ray.put(np.full(N, float(i + 1)))
        assert ray.get([total.remote(ref) for _ in range(3)]) == [float((i + 1) * N)] * 3
        del ref
        _pooled()   # once the readers have let it go
    assert _settle(lambda: len(_session_segments()) <= 2)


@pytest.mark.timeout(60)
def test_an_array_passed_by_value_is_freed_once_its_task_is_done(ray_start):
    """A large argument passed by value lives in a segment of its own, which the finished task
    gives back (into the pool, for the next put); it stayed in /dev/shm until shutdown."""
    @ray.remote
    def total(arr):
        return float(arr.sum())

    before = _session_segments()
    for i in range(4):
        assert ray.get(total.remote(np.full(N, float(i + 1)))) == float((i + 1) * N)
        _pooled()   # once the worker that read it has let go
    assert len(_session_segments() - before) == 1   # each call reused the previous call's segment


@pytest.mark.timeout(60)
def test_an_actor_keeping_an_array_passed_by_value_keeps_it_intact(ray_start):
    @ray.remote
    class Keeper:
        def keep(self, arr):
            self.arr = arr

        def total(self):
            return float(self.arr.sum())

    keeper = Keeper.remote()
    ray.get(keeper.keep.remote(np.full(N, 2.0)))   # done: its segment is freed, but the actor still reads it
    for i in range(3):
        other = ray.put(np.full(N, 100.0 + i))
        assert ray.get(other)[-1] == 100.0 + i
        del other
    assert ray.get(keeper.total.remote()) == 2.0 * N


@pytest.mark.timeout(60)
def test_tensor_writes_stay_private(ray_start):
    torch = pytest.importorskip("torch")

    @ray.remote
    def scribble(t):
        t.add_(1.0)              # in place: must not leak into the shared segment
        return float(t.sum())

    @ray.remote
    def read(t):
        return float(t.sum())

    ref = ray.put(torch.zeros(N, dtype=torch.float64))
    assert ray.get(scribble.remote(ref)) == float(N)
    assert ray.get(read.remote(ref)) == 0.0
    assert float(ray.get(ref).sum()) == 0.0


def _huge_pages_available() -> bool:
    """Whether this kernel gives a tmpfs file 2 MiB pages on request (MADV_COLLAPSE)."""
    from raylite.core.wire import segments
    path = f"/dev/shm/raylite-probe-{os.getpid()}"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, segments.HUGE_PAGE)
        mapped = segments._map_huge(fd, segments.HUGE_PAGE, writable=True, fresh=True)
        if mapped is not None:
            mapped.close()
        return mapped is not None
    finally:
        os.close(fd)
        os.unlink(path)


def _pmd_mapped_kb() -> int:
    """Shared memory this process maps with 2 MiB page-table entries."""
    with open("/proc/self/smaps") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith("ShmemPmdMapped:"))


@pytest.mark.timeout(60)
def test_large_values_are_read_through_huge_pages(ray_start, monkeypatch):
    from raylite.core.wire import segments
    if not _huge_pages_available():
        pytest.skip("this kernel gives tmpfs no huge pages on request (MADV_COLLAPSE)")
    monkeypatch.setattr(segments, "_huge_paused_until", 0.0)   # an earlier slow collapse may have paused them
    n = (5 << 20) // 8 + 3   # 2 full huge pages, then a tail in small pages

    @ray.remote
    def read(arr):
        return float(arr[:-3].sum()), arr[-3:].tolist(), _pmd_mapped_kb()

    ref = ray.put(np.concatenate([np.ones(n - 3), [7.0, 8.0, 9.0]]))
    assert any(name.endswith("-h") for name in _session_segments())
    total, tail, pmd_kb = ray.get(read.remote(ref))
    assert total == float(n - 3) and tail == [7.0, 8.0, 9.0]
    assert pmd_kb >= 4096   # the worker's mapping uses the huge pages, not 4 KiB entries for them

    del ref
    _pooled()
    smaller = ray.put(np.arange((4 << 20) // 8 + 1, dtype=np.float64))   # reuses the pooled segment
    assert ray.get(read.remote(smaller))[1][-1] == float((4 << 20) // 8)


@pytest.mark.timeout(60)
def test_task_results_use_huge_pages_too(ray_start):
    @ray.remote
    def make(n):
        return np.arange(n, dtype=np.float64)

    n = (3 << 20) // 8 + 1
    out = ray.get(make.remote(n))
    assert out[-1] == float(n - 1) and float(out.sum()) == float(n - 1) * n / 2


@pytest.mark.timeout(60)
def test_segments_without_huge_pages_still_work(ray_start, monkeypatch):
    from raylite.core.wire import segments
    monkeypatch.setattr(segments, "_libc", False)   # as on a kernel without MADV_COLLAPSE
    before = _session_segments()
    ref = ray.put(np.full((3 << 20) // 8, 2.0))
    new = _session_segments() - before
    assert new and not any(name.endswith("-h") for name in new)

    @ray.remote
    def total(arr):
        return float(arr.sum())

    assert ray.get(total.remote(ref)) == 2.0 * ((3 << 20) // 8)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("huge", [True, False], ids=["huge-pages", "small-pages"])
def test_segment_read_by_a_driver_array_is_reused_once_the_array_goes(ray_start, monkeypatch, huge):
    from raylite.core.wire import segments
    if not huge:
        monkeypatch.setattr(segments, "_libc", False)
    out = ray.get(ray.put(np.full(N, 1.0)))   # the ref is gone at once; `out` still reads the segment
    (name,) = _session_segments()
    other = ray.put(np.full(N, 5.0))          # must not take the segment `out` reads
    assert float(out.sum()) == float(N) and ray.get(other)[0] == 5.0
    del other, out
    again = ray.put(np.full(N, 2.0))
    assert name in _session_segments()   # pooled once `out` went, not unlinked
    assert ray.get(again)[0] == 2.0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("huge", [True, False], ids=["huge-pages", "small-pages"])
def test_a_reused_segment_is_written_through_the_drivers_own_mapping_without_faults(ray_start, monkeypatch, huge):
    """put + get of a large array is one copy into pages already faulted in (issue 24): the pool
    hands the driver back its writable mapping of the freed segment, so the next put neither maps
    nor faults, and its get reads through that same mapping."""
    from raylite.core.wire import segments
    if not huge:
        monkeypatch.setattr(segments, "_libc", False)
    value = np.full(N, 3.0)
    for _ in range(2):   # a new segment; then (small pages: written by os.write) a writable mapping of it
        ref = ray.put(value)
        out = ray.get(ref)
        (name,) = _session_segments()
        mapping = segments.mappings.maps[os.path.basename(name)]
        del ref, out
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    ref = ray.put(value)
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faults
    out = ray.get(ref)
    assert _session_segments() == {name}
    assert faults <= 4, f"the put faulted {faults} times: it wrote into pages it had not mapped yet"
    assert segments.mappings.maps[os.path.basename(name)] is mapping and mapping.writable
    assert not out.flags.writeable and out[-1] == 3.0   # read-only, as Ray's


class _Clock:
    """The pool's clock, moved by the test: its idle rules then never depend on the machine's speed."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def segment_file():
    """factory: a segment-sized file under the pool's directory, removed after the test."""
    from raylite.core.wire import segments
    made = []

    def make(size: int = 4096) -> str:
        name = f"raylite-pooltest-{os.getpid()}-{len(made)}"
        with open(segments._path(name), "wb") as f:
            f.truncate(size)
        made.append(name)
        return name

    yield make
    segments.unlink_segments(made)


def test_the_pool_keeps_segments_only_while_the_driver_puts(segment_file):
    """Nothing is pooled before the driver's first look for a segment, nor once it has not looked
    for IDLE_S (nothing would take the segment); within IDLE_S a freed segment is pooled for it."""
    from raylite.core.wire import segments
    clock = _Clock()
    pool = SegmentPool(1 << 20, clock)
    name = segment_file()
    assert not pool.give(name, 4096, None) and pool.bytes == 0   # the driver never put
    assert pool.take(4096) is None   # the driver puts now: nothing pooled yet
    clock.now += SegmentPool.IDLE_S
    assert pool.give(name, 4096, None) and pool.bytes == 4096
    taken, mapping = pool.take(3000)   # fits without wasting half of it
    assert taken == name and len(mapping.mm) == 4096 and pool.bytes == 0
    mapping.close()
    clock.now += SegmentPool.IDLE_S + 1
    assert not pool.give(name, 4096, None) and pool.bytes == 0   # last take too long ago
    assert os.path.exists(segments._path(name))   # refused: the caller unlinks it, not the pool


def test_a_pooled_segment_is_removed_idle_s_after_it_was_freed(segment_file):
    from raylite.core.wire import segments
    clock = _Clock()
    pool = SegmentPool(1 << 20, clock)
    assert pool.next_expiry() is None and pool.take(4096) is None
    first, second = segment_file(), segment_file()
    assert pool.give(first, 4096, None)
    clock.now += 4
    assert pool.give(second, 4096, None) and pool.next_expiry() == SegmentPool.IDLE_S - 4
    clock.now += SegmentPool.IDLE_S - 4 - 0.5
    pool.expire()   # not due yet
    assert pool.bytes == 8192 and pool.next_expiry() == 0.5
    clock.now += 0.5
    pool.expire()
    assert not os.path.exists(segments._path(first)) and os.path.exists(segments._path(second))
    assert pool.bytes == 4096 and pool.next_expiry() == 4
    clock.now += 4
    pool.expire()
    assert not os.path.exists(segments._path(second)) and pool.bytes == 0 and pool.next_expiry() is None


@pytest.mark.timeout(60)
def test_pooled_segments_nobody_reuses_are_removed(ray_start, monkeypatch):
    """Each large task result is a new segment; freed, it is pooled for a later put. Results
    that no put reuses must not pile up in /dev/shm until shutdown: the node trims them once
    IDLE_S has passed on the pool's clock, which the test holds still and then moves."""
    from raylite.core.wire import segments
    clock = _Clock()
    monkeypatch.setattr(segments.pool, "clock", clock)

    @ray.remote
    def make(i):
        return np.full(N, float(i))

    @ray.remote
    def nothing():
        """A round trip through the node thread, which trims the pool after the messages it handles."""

    def pooled() -> set[str]:
        with segments.pool.lock:
            return {os.path.join(segments.SHM_DIR, n) for n in (*segments.pool.free, *segments.pool.lingering)}

    before = _session_segments()
    kept = ray.get(ray.put(np.ones(N)))   # the driver puts: freed segments are pooled from now on
    for i in range(8):
        assert ray.get(make.remote(i))[0] == float(i)
    made = _session_segments() - before
    assert len(made) == 9 and _settle(lambda: pooled() == made), "the results' segments were not all pooled"
    clock.now += SegmentPool.IDLE_S - 0.5
    ray.get(nothing.remote())
    assert _session_segments() - before == made == pooled()   # not due yet
    clock.now += 0.5
    ray.get(nothing.remote())
    assert _settle(lambda: not (_session_segments() - before), timeout=10)
    assert segments.pool.bytes == 0
    assert float(kept.sum()) == float(N)   # unlinking did not touch what the driver still reads


@pytest.mark.timeout(60)
def test_a_segment_the_driver_frees_is_removed_when_unused(ray_start, monkeypatch):
    """The driver's own release (a dropped put) pools the segment in the caller's thread: the
    node thread, asleep, must still wake to remove it once it has not been reused."""
    monkeypatch.setattr(SegmentPool, "IDLE_S", 0.3)
    before = _session_segments()
    ref = ray.put(np.ones(N))
    assert _session_segments() - before
    del ref
    assert _settle(lambda: not (_session_segments() - before), timeout=10)


@pytest.mark.timeout(60)
def test_results_are_not_pooled_while_the_driver_puts_nothing(ray_start):
    """A run whose tasks return arrays, with no large put from the driver, must not keep its freed
    results in /dev/shm for the pool's idle time: nothing would take them."""
    @ray.remote
    def make(i):
        return np.full(N, float(i))

    before = _session_segments()
    for i in range(8):
        assert ray.get(make.remote(i))[0] == float(i)
    assert _settle(lambda: not (_session_segments() - before), timeout=3)


# --------------------------------------------------------------------------
# where segments go, and an object that does not fit
# --------------------------------------------------------------------------

def test_a_small_dev_shm_sends_segments_to_disk_with_a_warning(monkeypatch):
    """As Ray places its object store: /dev/shm unless it has less room than the store (Docker's
    64 MB), then the temporary directory; RAYLITE_SHM_DIR decides."""
    from raylite.core.wire import segments
    monkeypatch.delenv(segments.SHM_DIR_ENV, raising=False)
    monkeypatch.setattr(segments, "_free_bytes", lambda directory: 64 << 20)
    with pytest.warns(UserWarning, match=r"/dev/shm has only 64 MB free.*--shm-size"):
        assert segments.choose_dir(1 << 30) == segments._DISK_DIR
    assert segments.choose_dir(32 << 20) == "/dev/shm"
    monkeypatch.setenv(segments.SHM_DIR_ENV, "/somewhere/chosen")
    assert segments.choose_dir(1 << 30) == "/somewhere/chosen"


def test_an_object_that_does_not_fit_is_a_clear_error_not_a_crash(ray_start, monkeypatch):
    from raylite.core.wire import segments
    monkeypatch.setattr(segments, "_free_bytes", lambda directory: 3 << 20)
    with pytest.raises(ray.exceptions.ObjectStoreFullError, match=r"object of 4\.0 MB does not fit .*3\.0 MB free"):
        ray.put(np.zeros(4 << 17))   # 4 MB

    @ray.remote
    def size(a):
        return a.nbytes

    with pytest.raises(ray.exceptions.ObjectStoreFullError, match="does not fit"):
        size.remote(np.zeros(4 << 17))
    monkeypatch.undo()
    assert ray.get(size.remote(np.zeros(4 << 17))) == 4 << 20   # the runtime goes on


def test_objects_spill_to_disk_when_dev_shm_is_full(ray_init, monkeypatch, tmp_path):
    """As Ray spills its object store: a put, or a task's result, that does not fit goes to the
    spill directory (a warning, once), and reads back as usual."""
    from raylite.core.wire import segments
    monkeypatch.setattr(segments, "SPILL_DIR", str(tmp_path))
    monkeypatch.setattr(segments, "_spill_warned", False)
    ray_init(num_cpus=1)
    real = segments._free_bytes
    monkeypatch.setattr(segments, "_free_bytes", lambda d: (1 << 20) if d == segments.SHM_DIR else real(d))

    def spilled():
        return sorted(p for p in os.listdir(tmp_path) if p.startswith("raylite-"))

    with pytest.warns(UserWarning, match="is full .* spilled to"):
        ref = ray.put(np.arange(N, dtype=np.float64))
    assert len(spilled()) == 1 and spilled()[0].endswith(segments.SPILL_MARK)

    @ray.remote
    def total(a):
        return float(a.sum())

    @ray.remote(max_calls=1)   # (its worker, made to see /dev/shm full, is not reused)
    def make_while_full():
        from raylite.core.wire import segments as theirs
        full = theirs._free_bytes
        theirs._free_bytes = lambda d: (1 << 20) if d == theirs.SHM_DIR else full(d)
        return np.ones(N)

    assert ray.get(total.remote(ref)) == float(np.arange(N).sum())   # a worker reads it from disk
    made = make_while_full.remote()
    out = ray.get(made)   # the worker spills its result, the driver reads it
    assert out.sum() == N and len(spilled()) == 2
    del ref, made, out
    ray.shutdown()
    assert spilled() == []


def test_segments_follow_raylite_shm_dir(ray_init, monkeypatch, tmp_path):
    """Driver, workers and cleanup all use the directory the driver chose."""
    monkeypatch.setenv("RAYLITE_SHM_DIR", str(tmp_path))
    ray_init(num_cpus=1)

    @ray.remote
    def make():
        return np.ones(N)

    ref, made = ray.put(np.zeros(N)), make.remote()
    assert ray.get(made).sum() == N and ray.get(ref).sum() == 0
    assert len([p for p in os.listdir(tmp_path) if p.startswith("raylite-")]) >= 2
    del ref, made
    ray.shutdown()
    assert [p for p in os.listdir(tmp_path) if p.startswith("raylite-")] == []
