"""Threaded actors (`max_concurrency=N`) and async actors run calls side by side, as in Ray's
"AsyncIO / Concurrency for Actors" docs; plain actors still run one call at a time, in order.

Each test that needs concurrency would deadlock without it (a call waits for one submitted after
it), so a regression fails by timeout rather than by a timing threshold.
"""
import asyncio
import os
import threading
import time

import pytest

import raylite as ray

pytestmark = pytest.mark.timeout(60)


@ray.remote
class AsyncSignal:   # Ray's SignalActor test utility
    def __init__(self):
        self.ready = asyncio.Event()
        self.waiting = 0

    def send(self):
        self.ready.set()

    async def wait(self):
        self.waiting += 1
        await self.ready.wait()
        return "released"

    def waiters(self):
        return self.waiting


@ray.remote
class ThreadedGate:
    def __init__(self):
        self.ready = threading.Event()

    def open(self):
        self.ready.set()
        return "opened"

    def wait(self):
        return "passed" if self.ready.wait(timeout=30) else "timed out"


def test_async_actor_call_waits_for_a_later_call(ray_start):
    signal = AsyncSignal.remote()
    waiting = signal.wait.remote()
    ready, _ = ray.wait([waiting], timeout=0.3)
    assert not ready
    ray.get(signal.send.remote())
    assert ray.get(waiting) == "released"


def test_task_blocked_on_an_async_signal_actor_is_released(ray_start, wait_until):
    @ray.remote
    def blocked(signal):
        return ray.get(signal.wait.remote())

    signal = AsyncSignal.remote()
    out = [blocked.remote(signal) for _ in range(2)]
    wait_until(lambda: ray.get(signal.waiters.remote()) == 2, timeout=20, what="both tasks waiting on the signal")
    signal.send.remote()
    assert ray.get(out) == ["released", "released"]


def test_async_actor_doc_snippet_runs_calls_concurrently(ray_start):
    @ray.remote
    class AsyncActor:
        async def run_concurrent(self):
            start = time.monotonic()
            await asyncio.sleep(0.5)
            return start, time.monotonic()

    actor = AsyncActor.remote()
    spans = ray.get([actor.run_concurrent.remote() for _ in range(4)])
    # every call started before any finished
    assert max(start for start, _ in spans) < min(end for _, end in spans)


def test_threaded_actor_runs_two_calls_at_once(ray_start):
    gate = ThreadedGate.options(max_concurrency=2).remote()
    waiting = gate.wait.remote()
    assert ray.get(gate.open.remote()) == "opened"
    assert ray.get(waiting) == "passed"


def test_threaded_actor_nested_gets_get_their_own_replies(ray_start):
    @ray.remote
    def square(x):
        time.sleep(0.05 * (x % 3))
        return x * x

    @ray.remote(max_concurrency=4)
    class Fanout:
        def compute(self, x):
            return ray.get(square.remote(x)) + ray.get(square.remote(x + 1))

    fan = Fanout.remote()
    assert ray.get([fan.compute.remote(x) for x in range(12)]) == [x * x + (x + 1) ** 2 for x in range(12)]


def test_async_actor_max_concurrency_caps_calls_in_flight(ray_start):
    @ray.remote(max_concurrency=2)
    class Capped:
        def __init__(self):
            self.now = self.peak = 0

        async def work(self):
            self.now += 1
            self.peak = max(self.peak, self.now)
            await asyncio.sleep(0.05)
            self.now -= 1

        def peak_seen(self):
            return self.peak

    capped = Capped.remote()
    ray.get([capped.work.remote() for _ in range(8)])
    assert ray.get(capped.peak_seen.remote()) == 2


def test_async_actor_batches_as_rays_docs_show(ray_start):
    """Ray's "Setting concurrency in Async Actors" example: with max_concurrency=2, the call
    that fills the batch wakes the waiting one, and the next call starts only after both went."""
    @ray.remote
    class Batcher:
        def __init__(self, batch_size):
            self.event, self.current, self.batch_size, self.log = asyncio.Event(), 0, batch_size, []

        async def run_task(self):
            self.log.append("started")
            self.current += 1
            if self.current == self.batch_size:
                self.event.set()
            else:
                await self.event.wait()
                self.event.clear()
                self.current = 0
            self.log.append("finished")

        def events(self):
            return self.log

    batcher = Batcher.options(max_concurrency=2).remote(2)
    ray.get([batcher.run_task.remote() for _ in range(8)], timeout=20)
    assert ray.get(batcher.events.remote()) == ["started", "started", "finished", "finished"] * 4


def test_a_cancelled_async_call_still_waiting_for_a_slot_ends_at_once(ray_start):
    @ray.remote(max_concurrency=1)
    class Gate:
        def __init__(self):
            self.opened = asyncio.Event()

        async def wait_open(self):
            await self.opened.wait()
            return "opened"

        async def later(self):
            return "later ran"

    gate = Gate.remote()
    first, queued = gate.wait_open.remote(), gate.later.remote()
    ray.cancel(queued)
    with pytest.raises(ray.exceptions.TaskCancelledError):
        ray.get(queued, timeout=20)   # without waiting for the slot `first` holds
    ray.cancel(first)


def test_errors_in_concurrent_calls_keep_their_type(ray_start):
    @ray.remote(max_concurrency=2)
    class Faulty:
        def fail(self):
            raise KeyError("threaded")

    @ray.remote
    class AsyncFaulty:
        async def fail(self):
            raise ValueError("async")

    with pytest.raises(KeyError, match="threaded"):
        ray.get(Faulty.remote().fail.remote())
    with pytest.raises(ValueError, match="async"):
        ray.get(AsyncFaulty.remote().fail.remote())


def test_dropped_concurrent_actor_finishes_its_calls_then_exits(ray_start, wait_until, pid_alive, tmp_path):
    @ray.remote(max_concurrency=3)
    class Slow:
        def pid(self):
            import os
            return os.getpid()

        def nap(self, i, started, gate):
            import os
            open(f"{started}-{i}", "w").close()
            while not os.path.exists(gate):
                time.sleep(0.01)
            return i

    slow = Slow.remote()
    pid = ray.get(slow.pid.remote())
    started, gate = tmp_path / "started", tmp_path / "gate"
    naps = [slow.nap.remote(i, str(started), str(gate)) for i in range(3)]
    wait_until(lambda: all(os.path.exists(f"{started}-{i}") for i in range(3)), what="all three calls running")
    del slow   # while its calls run: they finish, then the actor exits
    assert ray.wait(naps, timeout=0.2)[0] == [] and pid_alive(pid)
    gate.write_text("go")
    assert ray.get(naps, timeout=20) == [0, 1, 2]
    wait_until(lambda: not pid_alive(pid), timeout=10, message="the actor did not exit")


def test_plain_actor_still_runs_calls_in_order(ray_start):
    @ray.remote
    class Log:
        def __init__(self):
            self.items = []

        def add(self, i):
            time.sleep(0.001 * (5 - i % 5))
            self.items.append(i)
            return list(self.items)

    log = Log.remote()
    assert ray.get([log.add.remote(i) for i in range(20)])[-1] == list(range(20))


def test_each_concurrent_call_sees_its_own_runtime_context(ray_start):
    @ray.remote(max_concurrency=4)
    class Threaded:
        def __init__(self):
            self.barrier = threading.Barrier(4)

        def who(self):
            self.barrier.wait(timeout=20)   # all four calls are running now
            return ray.get_runtime_context().get_task_id()

    @ray.remote
    class Async:
        async def who(self, gate):
            await asyncio.sleep(0.1 * gate)
            return ray.get_runtime_context().get_task_id()

    threaded = Threaded.remote()
    ids = ray.get([threaded.who.remote() for _ in range(4)])
    assert len(set(ids)) == 4 and None not in ids
    asynchronous = Async.remote()
    ids = ray.get([asynchronous.who.remote(3 - i) for i in range(4)])
    assert len(set(ids)) == 4 and None not in ids


@pytest.mark.local_only("Ray cancels a queued async call before it starts: its finally never runs")
def test_cancel_stops_a_running_async_call_and_the_actor_lives_on(ray_start, tmp_path, wait_until):
    @ray.remote(max_concurrency=1)
    class Sleeper:
        def __init__(self):
            self.cleaned = 0

        async def nap(self, seconds, started=None):
            try:
                if started:
                    open(started, "w").close()
                await asyncio.sleep(seconds)
                return "woke"
            finally:
                self.cleaned += 1   # the coroutine saw the cancellation and cleaned up

        async def cleaned_up(self):
            return self.cleaned

    sleeper = Sleeper.remote()
    long = sleeper.nap.remote(60, str(tmp_path / "long"))
    waiting = sleeper.nap.remote(60)   # queued behind max_concurrency=1
    wait_until((tmp_path / "long").exists, timeout=20, what="the long nap running")
    # The queued call first: cancelling the long nap first frees its slot, and the queued
    # nap may start (and then run its finally when cancelled) before its own cancel lands.
    ray.cancel(waiting)
    ray.cancel(long)
    for ref in (long, waiting):
        with pytest.raises(ray.exceptions.TaskCancelledError):
            ray.get(ref, timeout=10)
    assert ray.get(sleeper.nap.remote(0)) == "woke"
    assert ray.get(sleeper.cleaned_up.remote()) == 2   # the long nap's finally, then the short one's


@pytest.mark.local_only("Ray raises TaskCancelledError alone, not as a RayTaskError")
def test_cancelled_async_call_is_a_ray_task_error_even_if_it_swallows_it(ray_start, wait_until):
    """Ray's doc catches a cancelled actor call with `except RayTaskError`."""
    @ray.remote
    class Swallower:
        def __init__(self):
            self.started = 0

        async def nap(self):
            self.started += 1
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                return "swallowed"

        async def raises(self):
            self.started += 1
            await asyncio.sleep(60)

        async def running(self):
            return self.started

    actor = Swallower.remote()
    refs = [actor.nap.remote(), actor.raises.remote()]
    wait_until(lambda: ray.get(actor.running.remote()) == 2, timeout=20, what="both calls running")
    for ref in refs:
        ray.cancel(ref)
        with pytest.raises(ray.exceptions.RayTaskError) as info:
            ray.get(ref, timeout=10)
        assert isinstance(info.value, ray.exceptions.TaskCancelledError)


@pytest.mark.local_only("a call to an unknown concurrency group crashes Ray's actor process (ActorDiedError)")
@pytest.mark.parametrize("kind", ["threaded", "async"])
def test_concurrency_groups_run_side_by_side_each_within_its_limit(ray_start, kind):
    @ray.remote(concurrency_groups={"io": 1, "compute": 2})
    class Threaded:
        def __init__(self):
            self.event, self.lock, self.inside, self.most = threading.Event(), threading.Lock(), 0, 0

        @ray.method(concurrency_group="compute")
        def wait_for_io(self):
            return self.event.wait(20)   # needs an "io" call to run meanwhile

        @ray.method(concurrency_group="io")
        def release(self):
            self.event.set()

        @ray.method(concurrency_group="io")
        def one_at_a_time(self):
            with self.lock:
                self.inside += 1
                self.most = max(self.most, self.inside)
            time.sleep(0.1)
            with self.lock:
                self.inside -= 1
            return self.most

    @ray.remote(concurrency_groups={"io": 1, "compute": 2})
    class Async:
        def __init__(self):
            self.event, self.inside, self.most = asyncio.Event(), 0, 0

        @ray.method(concurrency_group="compute")
        async def wait_for_io(self):
            await asyncio.wait_for(self.event.wait(), 20)
            return True

        @ray.method(concurrency_group="io")
        async def release(self):
            self.event.set()

        @ray.method(concurrency_group="io")
        async def one_at_a_time(self):
            self.inside += 1
            self.most = max(self.most, self.inside)
            await asyncio.sleep(0.1)
            self.inside -= 1
            return self.most

    actor = (Threaded if kind == "threaded" else Async).remote()
    waiting = actor.wait_for_io.remote()
    actor.release.remote()
    assert ray.get(waiting, timeout=30) is True
    assert max(ray.get([actor.one_at_a_time.remote() for _ in range(4)], timeout=30)) == 1
    # .options() moves a call to another group: two of them may now overlap
    refs = [actor.one_at_a_time.options(concurrency_group="compute").remote() for _ in range(2)]
    assert max(ray.get(refs, timeout=30)) == 2
    with pytest.raises(ValueError, match="concurrency group 'nope'"):
        ray.get(actor.release.options(concurrency_group="nope").remote(), timeout=30)


@pytest.mark.parametrize("concurrency", [1, 2])
def test_is_canceled_lets_a_running_sync_call_stop_gracefully(ray_start, concurrency, tmp_path, wait_until):
    @ray.remote(max_concurrency=concurrency)
    class Worker:
        def __init__(self):
            self.saw_cancel = False

        def loop(self, started):
            open(started, "w").close()
            for _ in range(1000):
                if ray.get_runtime_context().is_canceled():
                    self.saw_cancel = True
                    return "stopped"
                time.sleep(0.01)
            return "ran to the end"

        def saw(self):
            return self.saw_cancel, ray.get_runtime_context().is_canceled()

    w = Worker.remote()
    ray.get(w.saw.remote())   # the actor is up (on Ray that takes a while): the cancel finds the loop running
    ref = w.loop.remote(str(tmp_path / "started"))
    wait_until((tmp_path / "started").exists, timeout=20, what="the loop running")
    ray.cancel(ref)
    with pytest.raises(ray.exceptions.TaskCancelledError):
        ray.get(ref, timeout=10)
    assert ray.get(w.saw.remote()) == (True, False)   # the flag is the cancelled call's only
    with pytest.raises(RuntimeError, match="only available (inside a task or actor|when the process is a worker)"):
        ray.get_runtime_context().is_canceled()


def test_async_constructor_is_awaited_on_the_actors_loop(ray_start):
    @ray.remote
    class Connection:
        async def __init__(self, name):
            await asyncio.sleep(0.01)
            self.name, self.loop = name, asyncio.get_running_loop()

        async def same_loop(self):
            return self.name, asyncio.get_running_loop() is self.loop

    assert ray.get(Connection.remote("db").same_loop.remote()) == ("db", True)

    @ray.remote
    class Refused:
        async def __init__(self):
            await asyncio.sleep(0)
            raise ConnectionError("no route")

        async def ping(self):
            return "pong"

    with pytest.raises(ray.exceptions.RayActorError, match="no route"):
        ray.get(Refused.remote().ping.remote(), timeout=10)


@pytest.mark.parametrize("kind", ["async", "threaded", "plain"])
def test_calls_waiting_for_arguments_let_later_calls_overtake_on_concurrent_actors(ray_start, kind, tmp_path):
    """Ray promises submission order only for one-at-a-time actors (task-orders.rst)."""
    gate = str(tmp_path / "gate")

    @ray.remote
    def later(value):
        import os
        while not os.path.exists(gate):   # the argument is not ready until the test opens the gate
            time.sleep(0.01)
        return value

    class Log:
        def __init__(self):
            self.seen = []

        def add(self, value):
            self.seen.append(value)
            return list(self.seen)

    class AsyncLog(Log):
        async def add(self, value):
            self.seen.append(value)
            return list(self.seen)

    cls = {"async": ray.remote(AsyncLog), "threaded": ray.remote(max_concurrency=2)(Log),
           "plain": ray.remote(Log)}[kind]
    log = cls.remote()
    first, second = log.add.remote(later.remote("slow")), log.add.remote("ready")
    if kind != "plain":   # it overtakes the call whose argument is not ready
        assert ray.get(second, timeout=20) == ["ready"]
    else:                 # it waits behind that call
        assert ray.wait([second], timeout=0.5)[0] == []
    open(gate, "w").close()
    assert ray.get(first, timeout=20) == (["ready", "slow"] if kind != "plain" else ["slow"])
    assert ray.get(second, timeout=20) == (["ready"] if kind != "plain" else ["slow", "ready"])
