"""ray.util.multiprocessing.Pool: the standard library's Pool API on raylite actors."""
from __future__ import annotations

import multiprocessing
import os
import time

import pytest

import raylite as ray
from raylite.util.multiprocessing import JoinableQueue, Pool, PoolTaskError, TimeoutError

from helpers import wait_until


def _square():   # built inside each test, so it travels by value (workers never import tests)
    return lambda x: x * x


def test_map_starmap_apply_keep_order(ray_start):
    square = _square()
    with Pool(2) as pool:
        assert pool.map(square, range(20)) == [x * x for x in range(20)]
        assert pool.map(square, range(7), chunksize=3) == [x * x for x in range(7)]
        assert pool.starmap(pow, [(2, 3), (3, 2), (10, 0)]) == [8, 9, 1]
        assert pool.apply(divmod, (17, 5)) == (3, 2)
        assert pool.apply(sorted, ([3, 1, 2],), {"reverse": True}) == [3, 2, 1]
        assert list(pool.imap(square, iter(range(10)))) == [x * x for x in range(10)]
        assert sorted(pool.imap_unordered(square, range(10), chunksize=2)) == sorted(x * x for x in range(10))


def test_initializer_runs_once_per_process_and_state_lasts(ray_start):
    def setup(tag):   # process state the initializer leaves for every later task
        os.environ["POOL_TAG"] = f"{tag}:{os.getpid()}"

    def tagged(_):
        return tuple(os.environ["POOL_TAG"].split(":"))

    with Pool(2, initializer=setup, initargs=("ready",)) as pool:
        tags = set(pool.map(tagged, range(16), chunksize=1))
    assert {t for t, _ in tags} == {"ready"} and len({pid for _, pid in tags}) == 2
    assert all(int(pid) != os.getpid() for _, pid in tags)


def test_errors_timeouts_and_callbacks(ray_start):
    square = _square()
    def fail_on_three(x):
        if x == 3:
            raise ValueError(f"bad item {x}")
        return x

    with Pool(2) as pool:
        with pytest.raises(ValueError, match="bad item 3"):
            pool.map(fail_on_three, range(6))
        slow = pool.apply_async(time.sleep, (1.0,))
        with pytest.raises(TimeoutError):
            slow.get(timeout=0.05)
        assert not slow.ready()
        with pytest.raises(ValueError, match="not ready"):
            slow.successful()
        got, errors = [], []
        pool.map_async(square, range(4), callback=got.append).wait()
        pool.apply_async(fail_on_three, (3,), error_callback=errors.append).wait()
        deadline = time.monotonic() + 5
        while (not got or not errors) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == [[0, 1, 4, 9]] and isinstance(errors[0], ValueError)


def test_maxtasksperchild_replaces_processes(ray_start):
    with Pool(1, maxtasksperchild=2) as pool:
        pids = pool.map(lambda _: os.getpid(), range(6), chunksize=1)
    assert len(set(pids)) == 3 and pids[0] == pids[1] != pids[2] == pids[3]


def test_close_join_terminate_and_bad_arguments(ray_start):
    square = _square()
    pool = Pool(2)
    result = pool.map_async(square, range(8))
    with pytest.raises(ValueError, match="still running"):
        pool.join()
    pool.close()
    with pytest.raises(ValueError, match="Pool not running"):
        pool.map(square, [1])
    pool.join()   # queued work finishes first
    assert result.get(timeout=5) == [x * x for x in range(8)]

    with Pool(1) as pool:
        pid = pool.apply(os.getpid)
    deadline = time.monotonic() + 5   # __exit__ terminates, as the stdlib's
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not os.path.exists(f"/proc/{pid}")

    with pytest.raises(ValueError, match="processes=0"):
        Pool(0)
    with pytest.raises(ValueError, match="more processes than the"):
        Pool(10_000)
    with pytest.raises(ValueError, match="maxtasksperchild='2'"):
        Pool(1, maxtasksperchild="2")


def test_the_module_has_rays_names():
    assert TimeoutError is multiprocessing.TimeoutError and JoinableQueue is multiprocessing.JoinableQueue


def _gated(gate: str):
    """A function whose item 1 waits for the file ``gate`` (the test creates it when it wants)."""
    def run(x):
        import os
        import time
        while x == 1 and not os.path.exists(gate):
            time.sleep(0.01)
        return x
    return run


def test_imap_is_an_iterator_with_next_timeout(ray_start, tmp_path):
    gate = str(tmp_path / "gate")
    with Pool(2) as pool:
        it = pool.imap(_gated(gate), range(5))
        assert iter(it) is it
        assert it.next() == 0
        with pytest.raises(TimeoutError):   # multiprocessing.TimeoutError, as the stdlib's
            it.next(timeout=0.05)
        open(gate, "w").close()
        assert it.next(timeout=30) == 1 and list(it) == [2, 3, 4]
        with pytest.raises(StopIteration):
            it.next()

        gate = str(tmp_path / "gate2")
        it = pool.imap_unordered(_gated(gate), range(4))
        firsts = {it.next(timeout=30) for _ in range(3)}   # item 1 is held back
        with pytest.raises(TimeoutError):
            it.next(timeout=0.05)
        open(gate, "w").close()
        assert firsts == {0, 2, 3} and it.next(timeout=30) == 1


def test_imap_starts_work_when_called(ray_start, tmp_path):
    def touch(x):
        open(os.path.join(str(tmp_path), str(x)), "w").close()
        return x

    with Pool(2) as pool:
        it = pool.imap(touch, range(2))   # submitted at once, as the stdlib's (not when first read)
        wait_until(lambda: sorted(os.listdir(tmp_path)) == ["0", "1"], timeout=30)
        assert list(it) == [0, 1]


def test_imap_failed_items_come_back_in_place_and_spare_their_chunk(ray_start):
    def fail_on_three_and_six(x):
        if x in (3, 6):
            raise ValueError(f"bad item {x}")
        return x

    with Pool(2) as pool:
        ordered = list(pool.imap(fail_on_three_and_six, range(8), chunksize=3))
        unordered = list(pool.imap_unordered(fail_on_three_and_six, range(8), chunksize=3))
    assert [r for r in ordered if not isinstance(r, PoolTaskError)] == [0, 1, 2, 4, 5, 7]
    for i in (3, 6):   # Ray's Pool: the error in the item's place, the iteration goes on
        assert isinstance(ordered[i].underlying, ValueError) and f"bad item {i}" in str(ordered[i].underlying)
    assert sorted(r for r in unordered if not isinstance(r, PoolTaskError)) == [0, 1, 2, 4, 5, 7]
    assert sum(isinstance(r, PoolTaskError) for r in unordered) == 2


def test_imap_finishes_after_close(ray_start):
    square = _square()
    pool = Pool(1)
    it = pool.imap(square, range(10))
    assert next(it) == 0
    pool.close()   # the stdlib lets work already given to imap finish
    assert list(it) == [x * x for x in range(1, 10)]
    pool.join()
    with pytest.raises(ValueError, match="Pool not running"):
        pool.imap(square, [1])


def test_imap_bad_arguments_raise_before_any_work(ray_start):
    with Pool(1) as pool:
        with pytest.raises(TypeError, match="not iterable"):
            pool.imap(abs, 3)
        with pytest.raises(ValueError, match="chunksize=0"):
            pool.imap_unordered(abs, [1], chunksize=0)


def test_a_pool_starts_a_local_runtime_sized_to_it_or_connects_as_given(monkeypatch):
    pool = Pool(processes=1, ray_address="local")   # Ray's test_connect_to_ray: a local runtime of 1 CPU
    try:
        assert ray.is_initialized() and ray.cluster_resources()["CPU"] == 1
    finally:
        pool.terminate()
        ray.shutdown()
    calls = []

    def init(address=None, **kwargs):   # stands in for a Ray cluster: only what init is given matters
        calls.append((address, kwargs))
        raise ConnectionError("no cluster here")

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setenv("RAY_ADDRESS", "ray://10.0.0.1:10001")
    with pytest.raises(ConnectionError):
        Pool(processes=2)   # a cluster's CPUs are its own: no num_cpus (Ray refuses one when connecting)
    with pytest.raises(ConnectionError):
        Pool(processes=2, ray_address="ray://10.0.0.2:10001")
    assert calls == [(None, {}), ("ray://10.0.0.2:10001", {})]


def test_rays_module_path_of_the_pool():
    from raylite.util.multiprocessing.pool import Pool as PoolAtRaysPath, PoolTaskError as ErrorAtRaysPath
    assert PoolAtRaysPath is Pool and ErrorAtRaysPath is PoolTaskError


def test_terminate_stops_an_imap_without_reading_the_rest_of_its_input(ray_start):
    read = []

    def items():
        for i in range(1000):
            read.append(i)
            yield i

    pool = Pool(1)
    it = pool.imap(_square(), items())
    assert next(it) == 0
    pool.terminate()
    rest = list(it)   # what was already running, then the end
    assert len(rest) <= 2 and len(read) <= 3


def test_imap_chunksize_none_is_rays_default_not_one_chunk(ray_start):
    with Pool(2) as pool:
        pids = list(pool.imap(lambda _: os.getpid(), range(16), chunksize=None))   # 2 per chunk here
        assert len(pids) == 16 and len(set(pids)) == 2   # both processes got work
        assert sorted(pool.imap_unordered(abs, iter([-1, -2]), chunksize=None)) == [1, 2]   # an iterator: 1
