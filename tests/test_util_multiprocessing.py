"""ray.util.multiprocessing.Pool: the standard library's Pool API on raylite actors."""
from __future__ import annotations

import multiprocessing
import os
import time

import pytest

import raylite as ray
from raylite.util.multiprocessing import JoinableQueue, Pool, TimeoutError


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
