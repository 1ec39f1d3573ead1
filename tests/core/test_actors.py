"""Core actors: dedicated processes, ordered methods, state, handles, names.

Covers issue #2: @remote on classes (with and without options, .options());
one dedicated process per actor; methods run in submission order and keep
state; ActorHandles passed to tasks and actors; nested calls from methods;
named actors and get_actor(); actors hold 0 CPU by default but keep explicit
resources for life; runtime context in actors; actor output prefixed with the
class name.  (Killed/crashed/restarted actors are in test_failures.py.)
"""

import os
import signal
import sys
import time
import uuid

import pytest

import raylite as ray


def _counter_class(**options):
    class Counter:
        def __init__(self, start=0):
            self.value = start

        def incr(self, by=1):
            self.value += by
            return self.value

        def get(self):
            return self.value

        def pid(self):
            return os.getpid()

    return ray.remote(**options)(Counter) if options else ray.remote(Counter)


def test_actor_keeps_state_and_runs_methods_in_submission_order(ray_start):
    Counter = _counter_class()
    c = Counter.remote()
    refs = [c.incr.remote() for _ in range(50)]  # submitted without waiting
    assert ray.get(refs) == list(range(1, 51))
    assert ray.get(c.get.remote()) == 50


@pytest.mark.local_only("Ray's own error text")
def test_a_call_waiting_for_its_argument_holds_later_ones_unless_out_of_order_is_allowed(ray_start, tmp_path):
    """Ray's "Actor Task Execution Order" page: submission order on a one-at-a-time actor, and
    `allow_out_of_order_execution=True` lets a call whose arguments are ready go first."""
    @ray.remote
    def late(value, gate):
        while not os.path.exists(gate):   # the argument is not ready until the test opens the gate
            time.sleep(0.01)
        return value

    @ray.remote
    class Adder:
        def __init__(self):
            self.value = 0

        def add(self, addition):
            self.value += addition
            return self.value

    ordered, gate = Adder.remote(), tmp_path / "ordered"
    first, second = ordered.add.remote(late.remote(1, str(gate))), ordered.add.remote(2)
    assert ray.wait([second], timeout=0.5)[0] == []   # held behind the call still waiting
    gate.touch()
    assert ray.get([first, second]) == [1, 3]
    loose, gate = Adder.options(allow_out_of_order_execution=True).remote(), tmp_path / "loose"
    first, second = loose.add.remote(late.remote(1, str(gate))), loose.add.remote(2)
    assert ray.get(second, timeout=20) == 2   # it went first: the other call's argument is not ready
    gate.touch()
    assert ray.get(first, timeout=20) == 3
    with pytest.raises(ValueError, match="cannot run its calls in submission order"):
        Adder.options(max_concurrency=2, allow_out_of_order_execution=False).remote()


def test_calls_sent_before_a_failed_constructor_say_why(ray_start):
    @ray.remote
    class Broken:
        def __init__(self):
            raise RuntimeError("boom in init")

        def method(self):
            return 1

    b = Broken.remote()
    for ref in [b.method.remote() for _ in range(3)]:   # the first ones reach the worker already
        with pytest.raises(ray.exceptions.RayActorError, match="boom in init") as excinfo:
            ray.get(ref, timeout=10)
        # as Ray: the ActorDiedError itself, showing the constructor's line, not raylite's frames
        assert not isinstance(excinfo.value, ray.exceptions.RayTaskError)
        assert 'raise RuntimeError("boom in init")' in str(excinfo.value)
        assert "raylite/core" not in str(excinfo.value)


def test_actor_constructor_args_and_kwargs(ray_start):
    @ray.remote
    class Holder:
        def __init__(self, a, b=2, *, c):
            self.items = (a, b, c)

        def items_(self):
            return self.items

    h = Holder.remote(1, c=3)
    assert ray.get(h.items_.remote()) == (1, 2, 3)


def test_each_actor_has_a_dedicated_stable_process(ray_start):
    Counter = _counter_class()

    @ray.remote
    def task_pid():
        time.sleep(0.05)
        return os.getpid()

    a, b = Counter.remote(), Counter.remote()
    a_pids = ray.get([a.pid.remote() for _ in range(5)])
    b_pids = ray.get([b.pid.remote() for _ in range(5)])
    assert len(set(a_pids)) == 1 and len(set(b_pids)) == 1
    assert a_pids[0] != b_pids[0]
    assert os.getpid() not in (a_pids[0], b_pids[0])
    # Tasks never run inside an actor's process.
    task_pids = set(ray.get([task_pid.remote() for _ in range(6)]))
    assert not task_pids & {a_pids[0], b_pids[0]}
    assert ray.get(a.pid.remote()) == a_pids[0]


def test_actors_run_concurrently(ray_start, tmp_path):
    # Each actor waits for a file only the other one writes: passes only if both run at once.
    @ray.remote
    class Peer:
        def meet(self, mine, theirs):
            open(mine, "w").close()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if os.path.exists(theirs):
                    return True
                time.sleep(0.01)
            return False

    x, y = Peer.remote(), Peer.remote()
    fx, fy = str(tmp_path / "x"), str(tmp_path / "y")
    assert ray.get([x.meet.remote(fx, fy), y.meet.remote(fy, fx)]) == [True, True]


def test_actor_method_args_resolve_refs(ray_start):
    Counter = _counter_class()

    @ray.remote
    def five():
        return 5

    c = Counter.remote(start=ray.put(10))
    assert ray.get(c.incr.remote(five.remote())) == 15
    assert ray.get(c.incr.remote(by=ray.put(1))) == 16


def test_actor_handle_passed_to_tasks(ray_start):
    Counter = _counter_class()
    c = Counter.remote()

    @ray.remote
    def bump(counter, n):
        return ray.get([counter.incr.remote() for _ in range(n)])

    results = ray.get([bump.remote(c, 5), bump.remote(c, 5)])
    seen = sorted(results[0] + results[1])
    assert seen == list(range(1, 11))
    assert results[0] == sorted(results[0]) and results[1] == sorted(results[1])
    assert ray.get(c.get.remote()) == 10


def test_actor_handle_passed_to_another_actor(ray_start):
    Counter = _counter_class()

    @ray.remote
    class Forwarder:
        def __init__(self, target):
            self.target = target

        def forward(self, n):
            return ray.get(self.target.incr.remote(n))

    c = Counter.remote()
    f = Forwarder.remote(c)
    assert ray.get(f.forward.remote(3)) == 3
    assert ray.get(f.forward.remote(4)) == 7
    assert ray.get(c.get.remote()) == 7


def test_actor_methods_use_nested_api(ray_start):
    @ray.remote
    def square(x):
        return x * x

    @ray.remote
    class Coordinator:
        def run(self, n):
            refs = [square.remote(i) for i in range(n)]
            ready, not_ready = ray.wait(refs, num_returns=n, timeout=20)
            assert not not_ready
            stored = ray.put(sum(ray.get(ready)))
            return ray.get(stored)

    c = Coordinator.remote()
    assert ray.get(c.run.remote(4)) == 0 + 1 + 4 + 9


def test_actor_method_exception_keeps_actor_alive(ray_start):
    @ray.remote
    class Fragile:
        def __init__(self):
            self.calls = 0

        def maybe_fail(self, fail):
            self.calls += 1
            if fail:
                raise ValueError("actor method failed")
            return self.calls

    a = Fragile.remote()
    assert ray.get(a.maybe_fail.remote(False)) == 1
    with pytest.raises(ValueError, match="actor method failed") as excinfo:
        ray.get(a.maybe_fail.remote(True))
    assert isinstance(excinfo.value, ray.exceptions.RayTaskError)
    assert ray.get(a.maybe_fail.remote(False)) == 3


def test_named_actor_and_get_actor(ray_start):
    Counter = _counter_class()
    name = f"counter-{uuid.uuid4().hex}"
    c = Counter.options(name=name).remote()
    assert ray.get(c.incr.remote(2)) == 2

    same = ray.get_actor(name)
    assert ray.get(same.incr.remote(3)) == 5
    assert ray.get(c.get.remote()) == 5

    @ray.remote
    def bump_by_name(n):
        return ray.get(ray.get_actor(n).incr.remote())

    assert ray.get(bump_by_name.remote(name)) == 6


def test_get_actor_unknown_name_raises_value_error(ray_start):
    with pytest.raises(ValueError):
        ray.get_actor(f"no-such-actor-{uuid.uuid4().hex}")

    @ray.remote
    def look_up(n):
        try:
            ray.get_actor(n)
        except ValueError as e:
            return str(e)
        return "found"

    assert "no-such" in ray.get(look_up.remote(f"no-such-actor-{uuid.uuid4().hex}"))


@pytest.mark.local_only("Ray's own error text")
def test_actor_names_are_unique_per_namespace(ray_init):
    ray_init(num_cpus=2, namespace="team-a")
    Counter = _counter_class()
    a = Counter.options(name="counter").remote(1)
    with pytest.raises(ray.exceptions.ActorAlreadyExistsError, match="'counter' is already taken in namespace 'team-a'"):
        Counter.options(name="counter").remote()   # at once, as in Ray, not at the first call
    # get_if_exists hands back the live actor instead of raising
    same = Counter.options(name="counter", get_if_exists=True).remote(99)
    assert ray.get(same.incr.remote()) == 2 and ray.get(a.get.remote()) == 2
    # another namespace has names of its own; lookups default to the job's namespace
    b = Counter.options(name="counter", namespace="team-b").remote(10)
    assert ray.get(ray.get_actor("counter").get.remote()) == 2
    assert ray.get(ray.get_actor("counter", namespace="team-b").get.remote()) == 10
    with pytest.raises(ValueError, match="namespace 'team-c'"):
        ray.get_actor("counter", namespace="team-c")
    # a name is free again once its actor is dead
    ray.kill(b)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(b.get.remote())
    assert ray.util.list_named_actors() == ["counter"]
    assert ray.util.list_named_actors(all_namespaces=True) == [{"name": "counter", "namespace": "team-a"}]
    again = Counter.options(name="counter", namespace="team-b").remote(20)
    assert ray.get(again.get.remote()) == 20

    @ray.remote
    def names():
        return sorted((d["namespace"], d["name"]) for d in ray.util.list_named_actors(all_namespaces=True))

    assert ray.get(names.remote()) == [("team-a", "counter"), ("team-b", "counter")]


def test_named_actor_is_collected_without_handles_unless_detached(ray_start, wait_pids_gone):
    Counter = _counter_class()
    named = Counter.options(name="short-lived").remote()
    detached = Counter.options(name="long-lived", lifetime="detached").remote()
    pid, kept_pid = ray.get(named.pid.remote()), ray.get(detached.pid.remote())
    del named, detached
    wait_pids_gone([pid], timeout=10)   # as in Ray: a named actor goes with its last handle
    with pytest.raises(ValueError, match="short-lived"):
        ray.get_actor("short-lived")
    assert ray.get(ray.get_actor("long-lived").pid.remote()) == kept_pid
    with pytest.raises(ValueError, match="lifetime='forever'"):
        Counter.options(lifetime="forever")


@pytest.mark.local_only("Ray's own error text")
def test_bad_actor_name_or_namespace_is_a_clear_error(ray_start):
    Counter = _counter_class()
    with pytest.raises(ValueError, match="name must be a non-empty string.*name=''"):
        Counter.options(name="").remote()
    with pytest.raises(TypeError, match="namespace=3"):
        Counter.options(name="x", namespace=3).remote()
    with pytest.raises(ValueError, match="non-empty actor name"):
        ray.get_actor("")
    with pytest.raises(ValueError, match="max_pending_calls must be an integer >= -1"):
        Counter.options(max_pending_calls=-2)


@pytest.mark.local_only("Ray's ActorID is not raylite's integer id")
def test_runtime_context_namespace_actor_name_and_current_actor(ray_init):
    ray_init(num_cpus=2, namespace="ctx-ns")
    ctx = ray.get_runtime_context()
    assert ctx.namespace == "ctx-ns"
    assert ctx.get()["namespace"] == "ctx-ns" and "actor_id" not in ctx.get()
    assert ctx.get_actor_name() is None

    @ray.remote
    class Self:
        def __init__(self):
            self.me_at_init = ray.get_runtime_context().current_actor   # usable in the constructor

        def info(self):
            c = ray.get_runtime_context()
            return c.namespace, c.get_actor_name(), c.get()["actor_id"]

        def me(self):
            return ray.get_runtime_context().current_actor

        def ping(self):
            return "pong"

    named = Self.options(name="self-aware").remote()
    namespace, name, actor_id = ray.get(named.info.remote())
    assert (namespace, name) == ("ctx-ns", "self-aware")
    assert actor_id == ray.get(named.me.remote())._actor_id.to_bytes(14, "big").hex()
    assert ray.get(ray.get(named.me.remote()).ping.remote()) == "pong"
    assert ray.get(Self.remote().info.remote())[1] == ""   # an actor without a name
    with pytest.raises(RuntimeError, match="only available inside an actor"):
        ctx.current_actor


def test_anonymous_namespace_per_job(ray_init):
    ray_init(num_cpus=1)
    first = ray.get_runtime_context().namespace
    assert len(first) == 36 and first.count("-") == 4
    ray.shutdown()
    ray_init(num_cpus=1)
    assert ray.get_runtime_context().namespace != first


@pytest.mark.local_only("Ray's PendingCallsLimitExceeded text says 'more than 2 tasks are queued'")
def test_max_pending_calls_refuses_calls_beyond_the_limit(ray_start):
    @ray.remote
    class Slow:
        def wait(self, seconds):
            time.sleep(seconds)
            return seconds

    a = Slow.options(max_pending_calls=2).remote()
    first, second = a.wait.remote(0.5), a.wait.remote(0)
    with pytest.raises(ray.exceptions.PendingCallsLimitExceeded, match="max_pending_calls=2"):
        a.wait.remote(0)
    assert ray.get([first, second]) == [0.5, 0]
    assert ray.get(a.wait.remote(0)) == 0   # room again once calls finished

    @ray.remote
    def flood(handle):   # the limit travels with the handle (counted per handle, as in Ray)
        refs = [handle.wait.remote(0.5), handle.wait.remote(0)]
        try:
            handle.wait.remote(0)
        except ray.exceptions.PendingCallsLimitExceeded:
            return ray.get(refs)
        return "no limit"

    assert ray.get(flood.remote(a)) == [0.5, 0]
    unlimited = Slow.remote()
    assert ray.get([unlimited.wait.remote(0) for _ in range(50)]) == [0] * 50


def test_actor_decorator_options_and_options_override(ray_start):
    @ray.remote(num_cpus=1)
    class Res:
        def assigned(self):
            return ray.get_runtime_context().get_assigned_resources()

    a = Res.remote()
    assert ray.get(a.assigned.remote()).get("CPU") == 1.0
    b = Res.options(num_cpus=0.5).remote()
    assert ray.get(b.assigned.remote()).get("CPU") == 0.5


@pytest.mark.parametrize("ray_start", [1], indirect=True)
def test_default_actors_hold_no_cpu_while_alive(ray_start, wait_until):
    Counter = _counter_class()
    actors = [Counter.remote() for _ in range(3)]  # more actors than CPUs
    assert ray.get([a.incr.remote() for a in actors]) == [1, 1, 1]

    @ray.remote
    def one():
        return 1

    assert ray.get(one.remote(), timeout=20) == 1
    wait_until(
        lambda: ray.available_resources().get("CPU") == 1.0,
        message=f"default actors hold CPU: {ray.available_resources()}",
    )


def test_explicit_actor_resources_are_held_for_life(ray_start, wait_until):
    Counter = _counter_class()
    a = Counter.options(num_cpus=1).remote()
    assert ray.get(a.incr.remote()) == 1
    wait_until(
        lambda: ray.available_resources().get("CPU") == 1.0,
        message=f"actor's CPU not held: {ray.available_resources()}",
    )
    ray.kill(a)
    wait_until(
        lambda: ray.available_resources().get("CPU") == 2.0,
        message=f"killed actor's CPU not returned: {ray.available_resources()}",
    )


def test_runtime_context_in_actor(ray_start):
    @ray.remote
    class Ctx:
        def ids(self):
            c = ray.get_runtime_context()
            return c.get_actor_id(), c.get_job_id(), c.get_node_id(), c.get_task_id()

    a, b = Ctx.remote(), Ctx.remote()
    a1, a2, b1 = ray.get([a.ids.remote(), a.ids.remote(), b.ids.remote()])
    assert a1[0] is not None and b1[0] is not None
    assert a1[0] == a2[0]
    assert a1[0] != b1[0]
    driver = ray.get_runtime_context()
    assert a1[1] == driver.get_job_id()
    assert a1[2] == driver.get_node_id()
    assert a1[3] is not None


def test_actor_stdout_prefixed_with_class_name(ray_start, read_output):
    tag = uuid.uuid4().hex

    @ray.remote
    class Talker:
        def say(self, tag):
            print(f"said {tag}")
            print(f"complained {tag}", file=sys.stderr)
            return os.getpid()

    t = Talker.remote()
    pid = ray.get(t.say.remote(tag))
    out, err = read_output(lambda o, e: f"said {tag}" in o and f"complained {tag}" in e)
    assert f"(Talker pid={pid}) said {tag}" in out, out
    assert f"(Talker pid={pid}) complained {tag}" in err, err


def test_call_on_temporary_handle_still_runs(ray_init):
    ray_init(num_cpus=1)

    @ray.remote
    class Echo:
        def echo(self, x):
            return x

    # the handle is dropped right after the call is submitted: the call runs, then the actor exits
    assert ray.get(Echo.remote().echo.remote(7)) == 7


@pytest.mark.local_only("white-box: reads the local node's actor table")
def test_dead_actors_are_forgotten_once_no_handle_remains(ray_start, wait_until):
    """A sweep may create thousands of short-lived actors: the driver keeps a dead one's record
    (constructor arguments included) only while a handle could still call it (white-box)."""
    import gc

    from raylite.core.api import runtime as api
    node = api._node

    @ray.remote
    class Holder:
        def __init__(self, blob):
            self.n = len(blob)

        def size(self):
            return self.n

    kept = Holder.remote(b"k")
    ray.get(kept.size.remote())
    for i in range(10):
        h = Holder.remote(b"x" * 100_000)
        assert ray.get(h.size.remote()) == 100_000
        if i % 2:
            ray.kill(h)   # killed, or exits once its last handle goes
        del h
    ray.kill(kept)
    gc.collect()
    wait_until(lambda: node.call_sync(lambda: len(node.actors)) == 1, timeout=20,
               message="dead actors without handles were kept")
    with pytest.raises(ray.exceptions.ActorDiedError, match="killed"):
        ray.get(kept.size.remote())   # the live handle still learns why


@pytest.mark.parametrize("kind", ["plain", pytest.param("async", marks=pytest.mark.local_only("async calls overlap"))])
def test_exit_actor_ends_it_for_good(ray_start, wait_pids_gone, kind):
    @ray.remote(max_restarts=2)
    class Quitter:
        def pid(self):
            return os.getpid()

        def quit(self):
            ray.actor.exit_actor()

    @ray.remote(max_restarts=2)
    class AsyncQuitter:
        async def pid(self):
            return os.getpid()

        async def quit(self):
            ray.actor.exit_actor()

    actor = (Quitter if kind == "plain" else AsyncQuitter).remote()
    pid = ray.get(actor.pid.remote())
    bye, after = actor.quit.remote(), actor.pid.remote()
    for ref in (bye, after):   # the call that exited and the one queued behind it
        with pytest.raises(ray.exceptions.ActorDiedError, match="exit_actor"):
            ray.get(ref, timeout=20)
    wait_pids_gone([pid])
    with pytest.raises(ray.exceptions.ActorDiedError):   # not restarted, despite max_restarts
        ray.get(actor.pid.remote(), timeout=20)


def test_exit_actor_outside_an_actor_is_a_type_error(ray_start):
    @ray.remote
    def task():
        try:
            ray.actor.exit_actor()
        except TypeError as e:
            return str(e)

    assert "inside an actor" in ray.get(task.remote())
    with pytest.raises(TypeError, match="inside an actor"):
        ray.actor.exit_actor()


@pytest.mark.local_only("Ray's own error text")
def test_ray_terminate_ends_the_actor_after_the_calls_before_it(ray_start, wait_pids_gone):
    counter = _counter_class(max_restarts=1).remote()
    pid = ray.get(counter.pid.remote())
    before = [counter.incr.remote() for _ in range(3)]
    counter.__ray_terminate__.remote()
    assert ray.get(before) == [1, 2, 3]
    with pytest.raises(ray.exceptions.ActorDiedError, match="__ray_terminate__"):
        ray.get(counter.get.remote(), timeout=20)
    wait_pids_gone([pid])


def test_a_graceful_end_runs_ray_shutdown_and_atexit_but_kill_does_not(ray_start, tmp_path, wait_pids_gone):
    """Ray's "Actor cleanup with __ray_shutdown__": on handles dropped, __ray_terminate__ and
    exit_actor; ray.kill skips it (and the atexit handlers the actor registered)."""
    @ray.remote
    class Cleaner:
        def __init__(self, path):
            import atexit
            self.path = path
            atexit.register(lambda: open(path + ".atexit", "w").close())

        def __ray_shutdown__(self):
            open(self.path, "w").close()

        def pid(self):
            return os.getpid()

        def leave(self):
            ray.actor.exit_actor()

    def ended(how):
        path = str(tmp_path / how)
        actor = Cleaner.remote(path)
        pid = ray.get(actor.pid.remote())
        if how == "dropped":
            del actor
        elif how == "terminated":
            actor.__ray_terminate__.remote()
        elif how == "exited":
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(actor.leave.remote(), timeout=20)
        else:
            ray.kill(actor)
        wait_pids_gone([pid])
        return os.path.exists(path), os.path.exists(path + ".atexit")

    assert ended("dropped") == (True, True)
    assert ended("terminated") == (True, True)
    assert ended("exited") == (True, True)
    assert ended("killed") == (False, False)


@pytest.mark.local_only("Ray fails a call whose actor died mid-call with ActorUnavailableError while restarts are left")
def test_max_task_retries_runs_a_call_again_on_the_restarted_actor(ray_start, tmp_path):
    class Fragile:
        def crash_once(self, marker):
            if not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(1)   # the process dies mid-call
            return os.getpid()

        def restarted(self):
            return ray.get_runtime_context().was_current_actor_reconstructed

    actor = ray.remote(max_restarts=2, max_task_retries=1)(Fragile).remote()
    assert ray.get(actor.restarted.remote()) is False
    assert ray.get(actor.crash_once.remote(str(tmp_path / "a")), timeout=30) > 0
    assert ray.get(actor.restarted.remote()) is True
    with pytest.raises(ray.exceptions.ActorDiedError):   # the method's own setting wins
        ray.get(actor.crash_once.options(max_task_retries=0).remote(str(tmp_path / "b")), timeout=30)
    plain = ray.remote(max_restarts=1)(Fragile).remote()
    with pytest.raises(ray.exceptions.ActorDiedError):   # default: no call retries, as in Ray
        ray.get(plain.crash_once.remote(str(tmp_path / "c")), timeout=30)


@pytest.mark.local_only("Ray's own error text")
def test_actors_die_with_an_owner_that_crashes(ray_start):
    Counter = _counter_class()

    @ray.remote
    class Parent:
        def spawn(self):
            self.child = Counter.remote()
            self.kept = Counter.options(name="kept-child", lifetime="detached").remote()
            return self.child, self.kept, os.getpid()

    @ray.remote(max_calls=1)
    def make():   # its worker exits after the task: told to, so what it made lives on
        return Counter.remote(5)

    parent = Parent.remote()
    child, kept, parent_pid = ray.get(parent.spawn.remote())
    from_task = ray.get(make.remote())
    assert ray.get([child.incr.remote(), kept.incr.remote()]) == [1, 1]
    os.kill(parent_pid, signal.SIGKILL)
    with pytest.raises(ray.exceptions.RayActorError):   # the node has seen the parent go
        ray.get(parent.spawn.remote(), timeout=10)
    with pytest.raises(ray.exceptions.RayActorError, match=rf"its owner \(pid {parent_pid}"):
        ray.get(child.incr.remote(), timeout=10)   # as in Ray: it shares its owner's fate
    assert ray.get(kept.incr.remote()) == 2         # detached: outlives its owner
    assert ray.get(from_task.incr.remote()) == 6
    ray.kill(kept)
