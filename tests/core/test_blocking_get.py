"""A driver thread blocked in get() serves the worker it waits on itself (raylite.core.node.reader):
whatever that worker needs meanwhile (large replies, calls from other threads, a crash, a
timeout, Ctrl-C) must still work while its socket is on loan."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import raylite as ray

BIG = 900_000   # in-band (under the 1 MB shared-memory threshold), and larger than a socket buffer


def test_large_reply_to_a_nested_get_reaches_the_worker_the_driver_waits_on(ray_start):
    blob = ray.put(b"x" * BIG)

    @ray.remote
    def reads(box):
        return len(ray.get(box[0])) + len(ray.get(box[0]))

    assert ray.get(reads.remote([blob])) == 2 * BIG


def test_other_threads_use_an_actor_while_one_waits_on_it(ray_start, tmp_path, wait_until):
    @ray.remote(max_concurrency=4)
    class Echo:
        def slow(self, started, go):
            open(started, "w").close()
            while not os.path.exists(go):
                time.sleep(0.01)
            return "slow"

        def echo(self, data):
            return len(data)

    actor = Echo.remote()
    ray.get(actor.echo.remote(b""))
    results = {}
    started, go = tmp_path / "started", tmp_path / "go"

    def waiter():
        results["slow"] = ray.get(actor.slow.remote(str(started), str(go)))

    thread = threading.Thread(target=waiter)
    thread.start()
    wait_until(started.exists, timeout=20, what="the slow call running")   # the waiter is blocked on it
    results["echo"] = [ray.get(actor.echo.remote(b"y" * BIG)) for _ in range(3)]
    go.touch()
    thread.join(10)
    assert results == {"slow": "slow", "echo": [BIG] * 3}


def test_timeout_fires_while_blocked_on_a_running_task(ray_start):
    @ray.remote
    def sleeper():
        time.sleep(5)

    start = time.monotonic()
    with pytest.raises(ray.exceptions.GetTimeoutError):
        ray.get(sleeper.remote(), timeout=0.3)
    assert time.monotonic() - start < 2.0


def test_ctrl_c_while_blocked_leaves_the_runtime_usable(ray_start):
    @ray.remote
    def sleeper(seconds):
        time.sleep(seconds)
        return seconds

    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        ray.get(sleeper.remote(3))
    assert ray.get([sleeper.remote(0) for _ in range(4)]) == [0] * 4


def test_worker_death_while_blocked_retries_on_a_new_worker(ray_start, tmp_path):
    marker = tmp_path / "died-once"

    @ray.remote(max_retries=1)
    def dies_once(path):
        if not os.path.exists(path):
            open(path, "w").close()
            os._exit(1)
        return os.getpid()

    assert ray.get(dies_once.remote(str(marker)), timeout=30) != os.getpid()


@pytest.mark.local_only("a race in the local node's worker events; 100 actor restarts outlast the timeout on Ray")
def test_actors_dying_under_a_blocked_get_leave_no_internal_error(ray_start, capfd):
    # the node thread may hold an event for a worker that the waiting thread finds dead meanwhile
    @ray.remote(max_restarts=1)
    class Flaky:
        def ping(self):
            return os.getpid()

        def die(self):
            os._exit(1)

    for _ in range(100):
        actor = Flaky.remote()
        first = ray.get(actor.ping.remote())
        actor.die.remote()
        try:
            assert ray.get(actor.ping.remote(), timeout=30) != first   # restarted
        except ray.exceptions.RayActorError:
            pass
        ray.kill(actor)
    _, err = capfd.readouterr()
    assert "internal error" not in err, err


def _key_of(pid: int):
    """The node and the selector key of the worker with this pid (white-box)."""
    from raylite.core.api import runtime as api
    node = api._node
    [w] = [w for w in node.shared.workers.values() if w.pid == pid]
    return node, node.shared.sel.get_key(w.chan.sock)


@pytest.mark.local_only("white-box: reads the local node's selector")
def test_an_idle_worker_given_back_is_watched_again_by_the_next_locked_section(ray_start):
    """After get() served it, the idle worker's socket stays parked through the rest of that
    section (no system call between the result and get's return) and is watched again at the
    end of the next one."""
    @ray.remote
    def pid():
        return os.getpid()

    node, key = _key_of(ray.get(pid.remote()))
    assert node.call_sync(lambda: key.parked)       # the next section runs with it parked ...
    assert not node.call_sync(lambda: key.parked)   # ... and watches it again as it ends


def _one_sent_to_a_worker_given_back(one):
    """A task's ref, sent to the worker a get just gave back (left unwatched one section more:
    ProducerReading.may_hold), and that worker."""
    from raylite.core.api import runtime as api
    assert ray.get(one.remote()) == 1
    ref = one.remote()
    [w] = [w for w in api._node.shared.workers.values() if w.task is not None and ref.id in w.task.return_ids]
    return ref, w


@pytest.mark.local_only("white-box: finds the local node's worker")
def test_a_loop_of_wait_with_no_timeout_sees_a_task_end_on_a_worker_left_unwatched(ray_start, wait_until):
    """wait(timeout=0) makes no locked section of its own: it reads what such a worker sent."""
    @ray.remote
    def one():
        return 1

    for _ in range(3):
        ref, _w = _one_sent_to_a_worker_given_back(one)
        wait_until(lambda: ray.wait([ref], timeout=0)[0], timeout=10,
                   message="wait(timeout=0) never saw the task end")
        assert ray.get(ref) == 1


@pytest.mark.local_only("white-box: reads the local node's worker socket")
def test_the_state_read_after_a_task_ended_on_a_worker_left_unwatched_shows_it_ended(ray_start):
    """The first read after its result was sent (no call in between) shows its CPU free again."""
    import select

    @ray.remote
    def one():
        return 1

    total = ray.cluster_resources()["CPU"]
    for _ in range(3):
        ref, w = _one_sent_to_a_worker_given_back(one)
        assert select.select([w.chan.sock], [], [], 10)[0], "the task's result never came"
        assert ray.available_resources().get("CPU") == total
        assert ray.get(ref) == 1


@pytest.mark.local_only("white-box: counts the local node's selector calls")
def test_a_submit_then_get_loop_leaves_the_worker_parked(ray_start):
    """The get reads the result in the section that borrows the worker, which stays parked from
    one get to the next: no system call to watch and park it, per round trip."""
    from raylite.core.api import runtime as api

    @ray.remote
    def one():
        return 1

    ray.get(one.remote())   # (its run time is known from now on)
    sel, calls = api._node.shared.sel, []
    park, resume = sel.park, sel.resume
    sel.park = lambda *a: calls.append("park") or park(*a)
    sel.resume = lambda *a: calls.append("resume") or resume(*a)
    try:
        for _ in range(50):
            assert ray.get(one.remote()) == 1
    finally:
        del sel.park, sel.resume
    assert calls.count("resume") <= 5, calls


@pytest.mark.local_only("white-box: finds the local node's worker")
def test_a_task_that_submits_is_served_while_the_driver_makes_no_call(ray_start, tmp_path, wait_until):
    """A function whose runs sent the node a submit (or any request) is never left unwatched:
    its nested task runs while the driver does something else."""
    @ray.remote
    def inner():
        return 1

    @ray.remote
    def outer(path):
        assert ray.get(inner.remote()) == 1
        open(path, "w").close()
        return 1

    assert ray.get(outer.remote(str(tmp_path / "first"))) == 1   # (its runs are known to submit from now on)
    for i in range(3):
        mark = tmp_path / f"done-{i}"
        assert ray.get(outer.remote(str(tmp_path / f"warm-{i}"))) == 1
        ref = outer.remote(str(mark))
        wait_until(mark.exists, timeout=10, message="the nested task never ran while the driver made no call")
        assert ray.get(ref) == 1
