"""Ray Core behaviours that Ray's docs and its own tests rely on, checked the way a program
written for Ray uses them (issue 20): actor classes, get/wait, call order, placement groups,
streaming generators, CPU accounting while blocked."""

import math
import os
import time

import pytest

import raylite as ray
from backend import ON_RAY


def test_actor_class_attributes_static_and_class_methods_as_in_ray(ray_start):
    @ray.remote
    class Limited:
        """A limited actor."""
        LIMIT = 3

        def limit(self):
            return Limited.LIMIT, type(self).LIMIT

        def scaled(self, x):
            return Limited.double(x) + Limited.plus_limit(0)

        @staticmethod
        def double(x):
            return 2 * x

        @classmethod
        def plus_limit(cls, x):
            return cls.LIMIT + x

    assert Limited.LIMIT == 3
    assert Limited.double(4) == 8 and Limited.plus_limit(1) == 4   # run here, as in Ray
    assert Limited.__name__ == "Limited" and Limited.__doc__ == "A limited actor."
    a = Limited.remote()
    assert ray.get(a.limit.remote()) == (3, 3)
    assert ray.get(a.scaled.remote(5)) == 13
    assert ray.get([a.double.remote(1), a.plus_limit.remote(1)]) == [2, 4]
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        Limited.nothing


def test_an_instance_attribute_named_like_a_method_does_not_hide_it(ray_start):
    @ray.remote
    class Counter:
        def __init__(self):
            self.value = 0

        def incr(self):
            self.value += 1

        def value(self):
            return self.value

    c = Counter.remote()
    c.incr.remote()
    assert ray.get(c.value.remote()) == 1


@pytest.mark.parametrize("call", ["get", "wait"])
def test_a_nan_or_bad_timeout_is_refused_naming_it(ray_start, call):
    ref = ray.put(1)
    run = (lambda t: ray.get(ref, timeout=t)) if call == "get" else (lambda t: ray.wait([ref], timeout=t))
    with pytest.raises(ValueError, match="timeout=nan"):
        run(math.nan)
    with pytest.raises(ValueError, match="timeout=-1"):
        run(-1)
    with pytest.raises(TypeError, match="timeout='1'"):
        run("1")
    assert run(math.inf) in (1, ([ref], []))   # no limit


def test_get_and_wait_refuse_what_is_no_ref_with_rays_types(ray_start):
    """Ray 2.x: get(42) is a ValueError (not a ref or a list), get([42]) and wait([42]) TypeErrors."""
    with pytest.raises(ValueError, match="Invalid type of object refs"):
        ray.get(42)
    with pytest.raises(TypeError, match="expects ObjectRefs, got int"):
        ray.get([42])
    with pytest.raises(TypeError, match="expects ObjectRefs, got int"):
        ray.wait([42])
    with pytest.raises(TypeError, match="expects a list of ObjectRefs, got int"):
        ray.wait(42)


@pytest.mark.parametrize("ray_start", [3], indirect=True)
def test_get_of_a_list_fails_fast_on_the_first_error(ray_start):
    """Ray's get raises as soon as one ref holds an error, without waiting for the others: a task's
    exception, a crashed worker, a dead actor; in the driver, in a task, and in a wait + get loop."""
    @ray.remote
    def slow():
        time.sleep(60)

    @ray.remote
    def bad():
        raise ValueError("boom")

    @ray.remote(max_retries=0)
    def crash():
        import os
        os._exit(1)

    @ray.remote
    class Dead:
        def f(self):
            return 1

    @ray.remote
    def nested(pending):
        try:
            ray.get([pending[0], bad.remote()])
        except ValueError as e:
            return str(e)

    pending = slow.remote()
    dead = Dead.remote()
    ray.kill(dead)
    for failing, error in [(bad, ValueError), (crash, ray.exceptions.WorkerCrashedError),
                           (dead.f, ray.exceptions.ActorDiedError)]:
        with pytest.raises(error):
            ray.get([pending, failing.remote()])
    assert "boom" in ray.get(nested.remote([pending]))
    refs = [pending, bad.remote()]
    with pytest.raises(ValueError, match="boom"):
        while refs:
            ready, refs = ray.wait(refs)
            ray.get(ready)
    assert ray.wait([pending], timeout=0)[0] == []   # none of these waited for the slow task


def test_actor_calls_keep_order_per_caller_only(ray_start, tmp_path):
    """Ray orders a one-at-a-time actor's calls per submitter: a call waiting for its argument holds
    back its caller's later calls, not another caller's."""
    gate = tmp_path / "gate"

    @ray.remote
    def late(path, value):
        import os
        while not os.path.exists(path):
            time.sleep(0.01)
        return value

    @ray.remote
    class Adder:
        def __init__(self):
            self.value = 0

        def add(self, x):
            self.value += x
            return self.value

    @ray.remote
    def other_caller(adder):
        return ray.get(adder.add.remote(10), timeout=20)

    adder = Adder.remote()
    first = adder.add.remote(late.remote(str(gate), 1))
    second = adder.add.remote(2)
    assert ray.get(other_caller.remote(adder)) == 10
    assert ray.wait([second], timeout=0)[0] == []   # still behind the driver's first call
    gate.touch()
    assert ray.get([first, second]) == [11, 13]


def test_a_blocked_actor_keeps_its_cpu_while_a_blocked_task_lends_it(ray_start):
    """Ray releases the CPUs of a task blocked in get, never an actor's: what a probe (0 CPUs)
    started from inside the get sees free."""
    @ray.remote(num_cpus=0)
    def probe(lent, patience):
        deadline = time.monotonic() + patience
        while ray.available_resources().get("CPU", 0.0) != lent and time.monotonic() < deadline:
            time.sleep(0.01)
        return ray.available_resources().get("CPU", 0.0)

    @ray.remote(num_cpus=1)
    def task_blocked():
        return ray.get(probe.remote(2.0, 20))

    @ray.remote(num_cpus=1)
    class Blocked:
        def run(self):
            # Ray's resource view lags behind its scheduler: it may not show this actor's CPU yet
            deadline = time.monotonic() + 20
            while ray.available_resources().get("CPU", 0.0) != 1.0 and time.monotonic() < deadline:
                time.sleep(0.01)
            return ray.get(probe.remote(2.0, 1))

    assert ray.get(task_blocked.remote()) == 2.0
    assert ray.get(Blocked.remote().run.remote()) == 1.0


def test_what_fits_no_bundle_of_its_placement_group_is_a_value_error_at_remote(ray_start):
    from raylite.util.placement_group import placement_group, remove_placement_group
    from raylite.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = placement_group([{"CPU": 1}, {"CPU": 0.5}])
    ray.get(pg.ready(), timeout=30)
    in_pg = PlacementGroupSchedulingStrategy(pg)

    @ray.remote(num_gpus=1)
    def needs_a_gpu():
        return 1

    @ray.remote
    class Big:
        def ok(self):
            return True

    # (Ray's text names the function by its qualified name and the request's integers as given)
    no_gpu_fits = r"Cannot schedule (\S+\.)?needs_a_gpu .*'GPU': 1(\.0)?\} cannot fit into any bundle"
    with pytest.raises(ValueError, match=no_gpu_fits):
        needs_a_gpu.options(scheduling_strategy=in_pg).remote()
    with pytest.raises(ValueError, match=r"Cannot schedule (\S+\.)?Big .*\{'CPU': 2(\.0)?\}"):
        Big.options(num_cpus=2, scheduling_strategy=in_pg).remote()
    if not ON_RAY:   # (Ray checks only "any bundle" at remote(): a named one too small leaves it pending)
        with pytest.raises(ValueError, match="cannot fit into bundle 1"):   # the one bundle it names
            needs_a_gpu.options(num_gpus=0, num_cpus=1,
                                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 1)).remote()
    assert ray.get(Big.options(num_cpus=1, scheduling_strategy=in_pg).remote().ok.remote()) is True
    remove_placement_group(pg)


@pytest.mark.local_only("ray.util.state needs Ray's dashboard, which the test clusters do not start")
@pytest.mark.parametrize("where", ["task", "actor"])
def test_streaming_generator_values_are_freed_once_the_consumer_drops_them(ray_start, where):
    """Each yielded value goes once the caller's ref to it is gone, while the generator lives on."""
    from raylite.util.state import list_objects

    def values(n):
        import numpy as np
        for i in range(n):
            yield np.full(1 << 20, i, dtype=np.uint8)

    @ray.remote
    class Source:
        def values(self, n):
            yield from values(n)

    gen = ray.remote(values).remote(20) if where == "task" else Source.remote().values.remote(20)
    ray.wait([gen.completed()], timeout=30)
    for i, ref in enumerate(gen):
        assert ray.get(ref)[0] == i
        del ref
    held = sum(o.object_size or 0 for o in list_objects())
    assert held < 1 << 20, f"{held} bytes still stored after the consumer dropped every value"


def test_a_call_made_after_kill_fails_or_runs_on_the_restarted_actor(ray_start, wait_until):
    """kill() takes effect for the calls made after it (Ray's test_actor_failures): they never run
    on the process being killed."""
    import os

    @ray.remote(max_restarts=1)
    class Pid:
        def pid(self):
            return os.getpid()

    for _ in range(5):   # a call sent to the dying process would run there before the signal lands
        doomed = Pid.remote()
        ray.kill(doomed)
        with pytest.raises(ray.exceptions.ActorDiedError):
            ray.get(doomed.pid.remote(), timeout=30)
    restarted = Pid.remote()
    first = ray.get(restarted.pid.remote())
    ray.kill(restarted, no_restart=False)
    if ON_RAY:
        # Ray's kill lands later: a call may still run on the old process, or fail while the actor
        # restarts; the calls after that run on the new one
        def answer():
            try:
                return ray.get(restarted.pid.remote(), timeout=30) != first
            except ray.exceptions.ActorUnavailableError:
                return False
        wait_until(answer, timeout=30, message="the killed actor never came back in a new process")
    else:
        assert ray.get(restarted.pid.remote(), timeout=30) != first


def test_an_actor_class_cannot_be_inherited_from(ray_start):
    @ray.remote
    class Base:
        pass

    with pytest.raises(ray.actor.ActorClassInheritanceException, match="Inheriting from actor classes is not allowed"):
        class Derived(Base):
            pass


def test_handles_to_one_actor_are_equal(ray_start):
    @ray.remote
    class Me:
        def me(self):
            return ray.get_runtime_context().current_actor

    @ray.remote
    def echo(handle):
        return handle

    me, other = Me.remote(), Me.remote()
    assert ray.get(echo.remote(me)) == me and ray.get(me.me.remote()) == me
    assert len({me, ray.get(echo.remote(me)), other}) == 2 and me != other


@pytest.mark.parametrize("kind", ["async", "threaded"])
def test_a_concurrent_actor_whose_handle_is_gone_finishes_a_call_waiting_on_a_nested_get(ray_start, kind, tmp_path,
                                                                                          wait_until):
    """Its handle dropped, an actor ends once its calls are done; a concurrent actor's call waiting
    on another task's result must still get it (it hung: the actor was told to exit meanwhile)."""
    started, go = str(tmp_path / "started"), str(tmp_path / "go")

    @ray.remote
    def seven(started, go):
        open(started, "w").close()
        while not os.path.exists(go):   # runs on until the actor has learned its handle is gone
            time.sleep(0.01)
        return 7

    @ray.remote
    class Async:
        async def nested(self, started, go):
            return await seven.remote(started, go)

    @ray.remote(max_concurrency=2)
    class Threaded:
        def nested(self, started, go):
            return ray.get(seven.remote(started, go))

    cls = Async if kind == "async" else Threaded
    ref = cls.remote().nested.remote(started, go)   # (outside the assert, which would keep the handle)
    wait_until(lambda: os.path.exists(started), timeout=20, what="the nested task running")
    ray.available_resources()   # a round trip through the node: the dropped handle has reached it
    open(go, "w").close()
    assert ray.get(ref, timeout=30) == 7


def test_dir_lists_an_actors_methods_as_in_ray(ray_start):
    """Ray's test_actor_autocomplete: dir() of the class, a handle and a method."""
    @ray.remote
    class Foo:
        def method_one(self):
            pass

    handle = Foo.remote()
    assert {n for n in dir(Foo) if not n.startswith("_")} == {"method_one", "options", "remote", "bind"}
    assert [n for n in dir(handle) if not n.startswith("_")] == ["method_one"]
    assert {n for n in dir(handle.method_one) if not n.startswith("_")} == {"options", "remote", "bind"}


def test_an_actor_error_names_the_actor(ray_start):
    @ray.remote
    class Gone:
        def me(self):
            return ray.get_runtime_context().get_actor_id()

    @ray.remote
    def call(handle):
        try:
            ray.get(handle.me.remote())
        except ray.exceptions.RayActorError as e:
            return e.actor_id

    gone = Gone.remote()
    actor_id = ray.get(gone.me.remote())
    ray.kill(gone)
    deadline = time.monotonic() + 30
    while True:   # Ray's kill is asynchronous: a call made before it lands may still run
        try:
            answered = ray.get(gone.me.remote())
        except ray.exceptions.RayActorError as e:
            error = e
            break
        assert answered == actor_id and time.monotonic() < deadline, "the killed actor still answers"
    assert isinstance(error, ray.exceptions.ActorDiedError) and error.actor_id == actor_id
    assert ray.get(call.remote(gone)) == actor_id   # (it crosses processes)


def test_a_killed_named_actors_name_is_free_at_once(ray_start):
    @ray.remote
    class Named:
        def pid(self):
            import os
            return os.getpid()

    first = Named.options(name="taken").remote()
    pid = ray.get(first.pid.remote())
    ray.kill(first)
    with pytest.raises(ValueError, match="Failed to look up actor"):
        ray.get_actor("taken")
    second = Named.options(name="taken").remote()
    assert ray.get(ray.get_actor("taken").pid.remote()) == ray.get(second.pid.remote()) != pid


@pytest.mark.local_only("the warning is the local node's: Ray leaves the task pending and warns in its own "
                        "words, if its autoscaler runs")
@pytest.mark.parametrize("ray_start", [1], indirect=True)
def test_a_task_starved_by_an_actor_blocked_on_it_is_explained(ray_start, monkeypatch, read_output):
    """The other side of an actor keeping its CPU: a task it waits for cannot start on a 1-CPU node.
    Ray warns that the resources are claimed by actors; so does raylite, once, naming the task."""
    from raylite.core.node import actors
    monkeypatch.setattr(actors, "STARVED_WARN_S", 0.1)

    @ray.remote
    def nested():
        return 1

    @ray.remote(num_cpus=1)
    class Holder:
        def run(self):
            try:
                return ray.get(nested.remote(), timeout=20)
            except ray.exceptions.GetTimeoutError:
                return "starved"

    holder = Holder.remote()
    ref = holder.run.remote()
    _, err = read_output(lambda out, err: "actor(s) blocked in get hold" in err, timeout=15)
    assert "nested is waiting for {CPU: 1}" in err and "num_cpus=0 holds none" in err
    ray.kill(holder)   # (its CPU back: the nested task runs, the test ends)
    with pytest.raises(ray.exceptions.ActorDiedError):
        ray.get(ref)


@pytest.mark.local_only("Ray leaves an infeasible task pending (an autoscaler may add a node), and an actor "
                        "call on its result waits with it")
def test_an_actor_call_whose_argument_can_never_be_computed_fails_alone(ray_start, capfd):
    @ray.remote(num_gpus=64)
    def never():
        return 1

    @ray.remote
    class Runs:
        def f(self, x=None):
            return "ran"

    actor = Runs.remote()
    with pytest.warns(UserWarning, match="will never be scheduled"):
        doomed = actor.f.remote(never.remote())
    after = actor.f.remote()
    with pytest.raises(ray.exceptions.RayTaskError, match="can never be computed"):
        ray.get(doomed, timeout=30)
    assert ray.get(after, timeout=30) == "ran"
    assert "internal error" not in capfd.readouterr().err
