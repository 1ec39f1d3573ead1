"""Scheduling a burst of tasks that each fork a worker (raylite.core.node.scheduler.Scheduler.take_unsent).

While workers are starting, a new worker's task waits for its hello; a reusable worker that is
free first runs it. To make "first" certain, these tests hold back the zygote's fork of the
second worker (wrapping the driver-side Zygote.fork) until they let it go.
"""
import os
import threading
import time

import pytest

import raylite as ray
from raylite.core.worker import zygote

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def gated_forks(monkeypatch):
    """After the first fork, forks wait until `release` is set (their descriptors are kept)."""
    release, held, forks = threading.Event(), [], []
    real_fork = zygote.Zygote.fork

    def fork(self, config, fds):
        forks.append(config["index"])
        if len(forks) == 1 or release.is_set():
            return real_fork(self, config, fds)
        held.append((self, config, [os.dup(fd) for fd in fds]))

    def let_go():
        release.set()
        for self, config, fds in held:
            real_fork(self, config, fds)
            for fd in fds:
                os.close(fd)
        held.clear()

    monkeypatch.setattr(zygote.Zygote, "fork", fork)
    yield let_go
    let_go()
    ray.shutdown()


def test_a_free_worker_runs_the_task_held_for_a_starting_one(gated_forks):
    ray.init(num_cpus=2)

    @ray.remote
    def pid():
        return os.getpid()

    first, second = pid.remote(), pid.remote()   # two forks; the second worker cannot start yet
    assert ray.get(second, timeout=20) == ray.get(first)
    gated_forks()   # the second worker starts now, with nothing to run: it serves the next task
    pids = {w["pid"] for w in ray.util.state.list_workers() if w.get("pid") and w["is_alive"]}
    assert ray.get(pid.remote()) in pids


def test_a_held_task_cancelled_before_its_worker_starts(gated_forks):
    ray.init(num_cpus=2)

    @ray.remote
    def nap(s):
        time.sleep(s)
        return os.getpid()

    busy = nap.remote(30)      # the first worker is busy
    held = nap.remote(0)       # its worker is not forked yet
    ray.cancel(held)
    with pytest.raises(ray.exceptions.TaskCancelledError):
        ray.get(held, timeout=10)
    gated_forks()
    assert isinstance(ray.get(nap.remote(0), timeout=20), int)   # the CPU it held was freed
    ray.cancel(busy, force=True)


def test_tasks_in_a_burst_all_run_once():
    """Quick and slow tasks together, each forking a worker: every one runs exactly once."""
    ray.init(num_cpus=8)
    try:
        @ray.remote
        def run(i):
            if i % 2:
                time.sleep(0.3)
            return i, os.getpid()

        out = ray.get([run.remote(i) for i in range(16)], timeout=30)
        assert [i for i, _ in out] == list(range(16))
        assert len({p for _, p in out}) <= 8
    finally:
        ray.shutdown()
