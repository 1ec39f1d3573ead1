"""Shared-memory segment reuse: freed segments are recycled only when nobody maps them."""
import glob
import os
import time

import numpy as np
import pytest

import raylite as ray

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


@pytest.mark.timeout(60)
def test_put_reuses_freed_segments(ray2):
    for i in range(6):
        ref = ray.put(np.full(N, float(i)))
        assert ray.get(ref)[123] == float(i)
        del ref
        time.sleep(0.05)
    # six puts of the same size, each freed before the next: the files are recycled, not piled up
    assert len(_session_segments()) <= 2


@pytest.mark.timeout(60)
def test_driver_array_survives_reuse(ray2):
    ref = ray.put(np.full(N, 1.0))
    held = ray.get(ref)          # a zero-copy view of the segment
    del ref
    time.sleep(0.1)
    for i in range(3):
        other = ray.put(np.full(N, 7.0 + i))
        assert ray.get(other)[0] == 7.0 + i
        del other
    assert float(held.sum()) == float(N)


@pytest.mark.timeout(60)
def test_actor_held_array_survives_reuse(ray2):
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
    time.sleep(0.2)
    for i in range(3):
        other = ray.put(np.full(N, 100.0 + i))
        assert ray.get(other)[-1] == 100.0 + i
        del other
        time.sleep(0.05)
    assert ray.get(keeper.total.remote()) == 2.0 * N
    ray.get(keeper.drop.remote())


@pytest.mark.timeout(60)
def test_task_reader_releases_before_reuse(ray2):
    @ray.remote
    def total(arr):
        return float(arr.sum())

    for i in range(4):
        ref = ray.put(np.full(N, float(i + 1)))
        assert ray.get([total.remote(ref) for _ in range(3)]) == [float((i + 1) * N)] * 3
        del ref
        time.sleep(0.1)
    assert _settle(lambda: len(_session_segments()) <= 2)


@pytest.mark.timeout(60)
def test_tensor_writes_stay_private(ray2):
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
