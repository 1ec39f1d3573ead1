"""Core tasks: @remote, options, argument resolution, get/wait, nesting, scheduling.

Covers issue #2: @remote with and without options and .options(); option
validation; ObjectRef args resolved at top level only; get/wait semantics;
nested .remote()/get/wait/put inside tasks (no deadlock on one CPU, CPU
released while blocked); workers are separate processes and reused; max_calls;
the scheduler never oversubscribes (fixed-point, fractional, custom resources);
get_runtime_context() inside tasks; worker stdout/stderr prefixed like Ray.
"""

import os
import re
import subprocess
import sys
import time
import uuid

import pytest

import raylite as ray
from helpers import wait_until


# --------------------------------------------------------------------------
# basics
# --------------------------------------------------------------------------


def test_remote_function_returns_object_ref_and_value(ray_start):
    @ray.remote
    def add(a, b):
        return a + b

    ref = add.remote(1, 2)
    assert isinstance(ref, ray.ObjectRef)
    assert ray.get(ref) == 3


def test_get_list_preserves_order(ray_start):
    @ray.remote
    def ident(x):
        time.sleep(0.01 * (5 - x))  # later submissions finish first
        return x

    refs = [ident.remote(i) for i in range(6)]
    assert ray.get(refs) == list(range(6))


def test_kwargs_defaults_and_complex_values(ray_start):
    @ray.remote
    def describe(a, b=10, *args, c="c", **kwargs):
        return {"a": a, "b": b, "args": args, "c": c, "kwargs": kwargs}

    assert ray.get(describe.remote(1)) == {"a": 1, "b": 10, "args": (), "c": "c", "kwargs": {}}
    assert ray.get(describe.remote(1, 2, 3, 4, c="x", d={"k": [1, 2]})) == {
        "a": 1, "b": 2, "args": (3, 4), "c": "x", "kwargs": {"d": {"k": [1, 2]}},
    }


def test_closure_over_local_state_travels_with_function(ray_start):
    factor = 7
    table = {"x": 3}

    @ray.remote
    def scaled(key):
        return table[key] * factor

    assert ray.get(scaled.remote("x")) == 21


def test_tasks_run_in_other_processes(ray_start):
    @ray.remote
    def pid():
        return os.getpid()

    pids = ray.get([pid.remote() for _ in range(4)])
    assert os.getpid() not in pids


def test_calling_remote_function_directly_is_type_error(ray_start):
    @ray.remote
    def f():
        return 1

    with pytest.raises(TypeError):
        f()


def test_get_of_something_else_than_refs_says_so_as_ray(ray_start):
    with pytest.raises(ValueError, match="Invalid type of object refs, dict, is given"):
        ray.get({"a": ray.put(1)})
    with pytest.raises(ValueError, match="timeout must be a non-negative number"):
        ray.get(ray.put(1), timeout=-1)


def test_decorator_with_options_and_options_override(ray_start):
    @ray.remote(num_cpus=1, max_retries=0)
    def resources():
        return ray.get_runtime_context().get_assigned_resources()

    assert ray.get(resources.remote()).get("CPU") == 1.0
    assert ray.get(resources.options(num_cpus=0.5).remote()).get("CPU") == 0.5
    # .options() does not change the original function's defaults
    assert ray.get(resources.remote()).get("CPU") == 1.0


def test_num_returns(ray_start):
    @ray.remote(num_returns=2)
    def pair():
        return "a", "b"

    a, b = pair.remote()
    assert isinstance(a, ray.ObjectRef) and isinstance(b, ray.ObjectRef)
    assert ray.get([a, b]) == ["a", "b"]

    @ray.remote
    def triple():
        return 1, 2, 3

    refs = triple.options(num_returns=3).remote()
    assert ray.get(list(refs)) == [1, 2, 3]


def test_many_small_tasks(ray_start):
    @ray.remote
    def inc(x):
        return x + 1

    refs = [inc.remote(i) for i in range(300)]
    assert ray.get(refs) == list(range(1, 301))


def test_module_level_remote_function(ray_start):
    # Module-level functions of an importable module are pickled by reference:
    # workers must see the driver's sys.path, as Ray's workers do.
    assert ray.get(_module_level_double.remote(21)) == 42


@ray.remote
def _module_level_double(x):
    return 2 * x


# --------------------------------------------------------------------------
# option validation
# --------------------------------------------------------------------------

INVALID_OPTIONS = [
    ("num_cpus", -1),
    ("num_cpus", float("nan")),
    ("num_cpus", "two"),
    ("num_gpus", -0.5),
    ("num_gpus", float("nan")),
    ("resources", {"foo": -1}),
    ("max_calls", -1),
    ("not_a_real_option", 1),
]


@pytest.mark.parametrize("field,value", INVALID_OPTIONS, ids=[f"{f}={v!r}" for f, v in INVALID_OPTIONS])
def test_invalid_option_in_decorator_names_field(field, value):
    def f():
        return 1

    with pytest.raises((ValueError, TypeError), match=field):
        ray.remote(**{field: value})(f)


@pytest.mark.parametrize("field,value", INVALID_OPTIONS, ids=[f"{f}={v!r}" for f, v in INVALID_OPTIONS])
def test_invalid_option_in_options_names_field(field, value):
    @ray.remote
    def f():
        return 1

    with pytest.raises((ValueError, TypeError), match=field):
        f.options(**{field: value})


def test_invalid_actor_options_name_field():
    class A:
        pass

    with pytest.raises((ValueError, TypeError), match="num_cpus"):
        ray.remote(num_cpus=-2)(A)
    RemoteA = ray.remote(A)
    with pytest.raises((ValueError, TypeError), match="num_gpus"):
        RemoteA.options(num_gpus=float("nan"))
    with pytest.raises((ValueError, TypeError), match="bogus_actor_option"):
        RemoteA.options(bogus_actor_option=3)


# --------------------------------------------------------------------------
# ObjectRef arguments
# --------------------------------------------------------------------------


def test_top_level_ref_args_are_resolved(ray_start):
    @ray.remote
    def make(x):
        return {"value": x}

    @ray.remote
    def inspect(arg, kwarg=None):
        return type(arg).__name__, arg, type(kwarg).__name__, kwarg

    a = make.remote(1)
    b = ray.put([1, 2, 3])
    assert ray.get(inspect.remote(a, kwarg=b)) == ("dict", {"value": 1}, "list", [1, 2, 3])



def test_ref_args_beside_plain_values_and_tuples(ray_start):
    """Refs among plain arguments and among others travel differently; a tuple (a value, or a
    user's argument) never passes for a ref."""
    @ray.remote
    def echo(*args, **kwargs):
        return args, kwargs

    one, pair = ray.put((7,)), ray.put((8, 9))
    assert ray.get(echo.remote(one, 3, "s", None, kw=pair, n=1.5)) == (((7,), 3, "s", None), {"kw": (8, 9), "n": 1.5})
    assert ray.get(echo.remote(one, (1,), kw=pair, t=(2,))) == (((7,), (1,)), {"kw": (8, 9), "t": (2,)})
    assert ray.get(echo.remote((5,), k=(6,))) == (((5,),), {"k": (6,)})

def test_nested_refs_stay_refs(ray_start):
    @ray.remote
    def inspect(items, mapping):
        assert all(isinstance(r, ray.ObjectRef) for r in items)
        assert isinstance(mapping["ref"], ray.ObjectRef)
        return ray.get(items) + [ray.get(mapping["ref"])]

    refs = [ray.put(i) for i in range(3)]
    assert ray.get(inspect.remote(refs, {"ref": ray.put("x")})) == [0, 1, 2, "x"]


def test_chained_tasks(ray_start):
    @ray.remote
    def inc(x):
        return x + 1

    ref = ray.put(0)
    for _ in range(10):
        ref = inc.remote(ref)
    assert ray.get(ref) == 10


# --------------------------------------------------------------------------
# wait
# --------------------------------------------------------------------------


def test_wait_returns_ready_and_not_ready_in_submission_order(ray_start, tmp_path):
    release = str(tmp_path / "release")

    @ray.remote
    def fast(x):
        return x

    @ray.remote
    def blocked(path):
        while not os.path.exists(path):
            time.sleep(0.01)
        return "late"

    refs = [fast.remote(0), blocked.remote(release), fast.remote(2), fast.remote(3)]

    ready, not_ready = ray.wait(refs, num_returns=3, timeout=20)
    assert ready == [refs[0], refs[2], refs[3]]
    assert not_ready == [refs[1]]

    t0 = time.monotonic()
    ready, not_ready = ray.wait(refs, num_returns=4, timeout=0.3)
    elapsed = time.monotonic() - t0
    assert ready == [refs[0], refs[2], refs[3]]
    assert not_ready == [refs[1]]
    assert 0.2 <= elapsed < 3

    open(release, "w").close()
    ready, not_ready = ray.wait(refs, num_returns=4, timeout=20)
    assert ready == refs and not_ready == []
    assert ray.get(refs[1]) == "late"


def test_wait_default_num_returns_is_one(ray_start):
    @ray.remote
    def ident(x):
        return x

    refs = [ident.remote(i) for i in range(4)]
    ray.get(refs)
    ready, not_ready = ray.wait(refs)
    assert len(ready) == 1 and len(not_ready) == 3
    assert ready + not_ready == refs  # both parts keep submission order
    assert ray.wait([]) == ([], [])     # as in Ray, whatever num_returns says
    for bad in (0, 5):
        with pytest.raises(ValueError, match=f"num_returns must be between 1 and the number of refs \\(4\\), got {bad}"):
            ray.wait(refs, num_returns=bad)


def test_wait_ready_order_is_submission_order_not_completion_order(ray_start):
    @ray.remote
    def sleep_then(x, seconds):
        time.sleep(seconds)
        return x

    refs = [sleep_then.remote("slow", 0.4), sleep_then.remote("fast", 0.0)]
    ready, not_ready = ray.wait(refs, num_returns=2, timeout=20)
    assert ready == refs and not_ready == []


def test_wait_timeout_zero_returns_immediately(ray_start, tmp_path):
    @ray.remote
    def blocked(path):
        while not os.path.exists(path):
            time.sleep(0.01)

    ref = blocked.remote(str(tmp_path / "never"))
    t0 = time.monotonic()
    ready, not_ready = ray.wait([ref], timeout=0)
    assert time.monotonic() - t0 < 1
    assert ready == [] and not_ready == [ref]


@pytest.mark.local_only("white-box: reads the local node's object table")
def test_polling_a_running_task_leaves_nothing_behind(ray_start, tmp_path):
    """A loop polling with wait(timeout) or get(timeout) (as a trainer does for days) must not
    leave one record per poll on the object, nor a timer per early get (white-box)."""
    from raylite.core.api import runtime as api
    node = api._node

    def state():
        return ([len(e.waiters) for e in node.table.objects.values()],
                sum(not t[2].done for t in node.table.timers), len(node.table.timers))

    @ray.remote
    def blocked(path):
        while not os.path.exists(path):
            time.sleep(0.01)
        return 1

    ref = blocked.remote(str(tmp_path / "go"))
    other = blocked.remote(str(tmp_path / "go"))
    for _ in range(50):
        assert ray.wait([ref, other], num_returns=1, timeout=0.001) == ([], [ref, other])
        with pytest.raises(ray.exceptions.GetTimeoutError):
            ray.get(ref, timeout=0.001)
    assert node.call_sync(state)[:2] == ([0, 0], 0)
    (tmp_path / "go").touch()
    assert ray.get([ref, other], timeout=20) == [1, 1]
    for _ in range(200):   # answered at once, each with an hour's timeout
        assert ray.get(blocked.remote(str(tmp_path / "go")), timeout=3600) == 1
    waiters, live_timers, timers = node.call_sync(state)
    assert live_timers == 0 and timers <= 128


# --------------------------------------------------------------------------
# nested use
# --------------------------------------------------------------------------


def test_nested_remote_get_wait_put(ray_start):
    @ray.remote
    def leaf(x):
        return x * 10

    @ray.remote
    def parent(n):
        refs = [leaf.remote(i) for i in range(n)]
        ready, not_ready = ray.wait(refs, num_returns=n, timeout=20)
        assert not not_ready
        stored = ray.put(sum(ray.get(ready)))
        return ray.get(stored), isinstance(stored, ray.ObjectRef)

    assert ray.get(parent.remote(4)) == (60, True)


def test_ref_created_in_task_can_be_returned_and_got_by_driver(ray_start):
    @ray.remote
    def leaf():
        return "leaf-value"

    @ray.remote
    def parent():
        return [leaf.remote(), ray.put("put-value")]

    inner = ray.get(parent.remote())
    assert ray.get(inner) == ["leaf-value", "put-value"]


@pytest.mark.parametrize("ray_start", [1], indirect=True)
def test_nested_get_on_one_cpu_does_not_deadlock(ray_start):
    @ray.remote(num_cpus=1)
    def leaf(x):
        return x + 1

    @ray.remote(num_cpus=1)
    def middle(x):
        return ray.get(leaf.remote(x)) * 2

    @ray.remote(num_cpus=1)
    def top(x):
        a = ray.get(middle.remote(x))
        ready, _ = ray.wait([middle.remote(x + 1)], timeout=30)
        return a + ray.get(ready[0])

    assert ray.get(top.remote(1), timeout=30) == (2 * 2) + (3 * 2)


@pytest.mark.parametrize("ray_start", [1], indirect=True)
def test_recursive_remote_function(ray_start):
    @ray.remote
    def fact(n):
        if n <= 1:
            return 1
        return n * ray.get(fact.remote(n - 1))

    assert ray.get(fact.remote(4), timeout=30) == 24


@pytest.mark.parametrize("ray_start", [1], indirect=True)
def test_recursive_remote_function_called_without_its_defaults(ray_start):
    """The function travels by value and refers to itself: the copy in the worker is built before
    its defaults are set, and its check at .remote() must still know them."""
    @ray.remote
    def fact(n, step=1, *, acc=1):
        if n <= 1:
            return acc
        return ray.get(fact.remote(n - step, acc=acc * n))

    assert ray.get(fact.remote(4), timeout=30) == 24


@pytest.mark.parametrize("ray_start", [{"num_cpus": 2, "resources": {"tok": 1}}], indirect=True)
def test_blocked_task_releases_cpu_but_keeps_custom_resources(ray_start, tmp_path, wait_until):
    release = str(tmp_path / "release")
    started = tmp_path / "inner-started"

    @ray.remote(num_cpus=1)
    def inner(started, release):
        open(started, "w").close()
        while not os.path.exists(release):
            time.sleep(0.01)
        return 1

    @ray.remote(num_cpus=1, resources={"tok": 1})
    def outer(started, release):
        return ray.get(inner.remote(started, release)) + 1

    ref = outer.remote(str(started), release)
    wait_until(started.exists, timeout=10, message="inner task never started")
    # outer is blocked in get: its CPU is back in the pool (2 - inner's 1 = 1 free;
    # it would be 0 if outer kept it), and outer still holds its custom resource.
    wait_until(
        lambda: ray.available_resources().get("CPU", 0.0) == 1.0
        and ray.available_resources().get("tok", 0.0) == 0.0,
        timeout=10,
        message=f"unexpected resources while blocked: {ray.available_resources()}",
    )
    open(release, "w").close()
    assert ray.get(ref) == 2
    wait_until(
        lambda: ray.available_resources().get("CPU", 0.0) == 2.0
        and ray.available_resources().get("tok", 0.0) == 1.0,
        message=f"resources not returned: {ray.available_resources()}",
    )


# --------------------------------------------------------------------------
# worker reuse and max_calls
# --------------------------------------------------------------------------


def test_cpu_workers_are_reused(ray_start):
    @ray.remote
    def pid():
        return os.getpid()

    pids = [ray.get(pid.remote()) for _ in range(8)]
    assert len(set(pids)) < len(pids), f"no worker reused: {pids}"


def test_max_calls_one_gives_fresh_worker_per_call(ray_start, wait_pids_gone):
    @ray.remote(max_calls=1)
    def pid():
        return os.getpid()

    pids = [ray.get(pid.remote()) for _ in range(4)]
    assert len(set(pids)) == 4, pids
    # A worker that reached max_calls exits.
    wait_pids_gone(pids[:-1], timeout=10, what="workers past max_calls")


def test_max_calls_two_limits_calls_per_worker(ray_start):
    @ray.remote(max_calls=2)
    def pid():
        return os.getpid()

    pids = [ray.get(pid.remote()) for _ in range(6)]
    counts = {p: pids.count(p) for p in set(pids)}
    assert max(counts.values()) <= 2, counts
    assert len(counts) >= 3, counts


# --------------------------------------------------------------------------
# scheduling: never oversubscribe
# --------------------------------------------------------------------------


def _max_overlap(intervals):
    events = []
    for start, end in intervals:
        events.append((start, 1))
        events.append((end, -1))
    events.sort(key=lambda e: (e[0], e[1]))  # ends before starts at equal times
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


def _timed_sleep_task():
    @ray.remote
    def timed(seconds):
        start = time.time()
        time.sleep(seconds)
        return start, time.time()

    return timed


@pytest.mark.local_only("timed overlap: Ray starts workers (~1 s each here) slower than the 0.4 s tasks")
def test_scheduler_never_oversubscribes_cpus(ray_start):
    timed = _timed_sleep_task()
    intervals = ray.get([timed.remote(0.4) for _ in range(6)])
    assert _max_overlap(intervals) == 2, intervals


@pytest.mark.local_only("timed overlap: Ray starts a worker per extra concurrent task, slower than the 0.6 s tasks")
def test_fractional_cpus_allow_more_concurrent_tasks(ray_start):
    timed = _timed_sleep_task()
    intervals = ray.get([timed.options(num_cpus=0.5).remote(0.6) for _ in range(8)])
    assert _max_overlap(intervals) == 4, intervals


@pytest.mark.parametrize("ray_start", [{"num_cpus": 4, "resources": {"foo": 1}}], indirect=True)
def test_custom_resource_limits_concurrency(ray_start):
    timed = _timed_sleep_task()
    intervals = ray.get([timed.options(resources={"foo": 1}).remote(0.2) for _ in range(3)])
    assert _max_overlap(intervals) == 1, intervals


@pytest.mark.parametrize("ray_start", [1], indirect=True)
def test_fixed_point_resources_fill_exactly(ray_start, tmp_path, wait_until):
    # 0.1 + 0.2 + 0.7 == 1.0 only in fixed point (in floats it is 1.0000000000000002),
    # so all three tasks fit on one CPU at the same time only if accounting is exact.
    barrier = str(tmp_path)

    @ray.remote
    def rendezvous(name, expected, timeout):
        open(os.path.join(barrier, name), "w").close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len([n for n in os.listdir(barrier) if n.startswith("arrived-")]) >= expected:
                return True
            time.sleep(0.01)
        return False

    refs = [
        rendezvous.options(num_cpus=cpus).remote(f"arrived-{cpus}", 3, 8)
        for cpus in (0.1, 0.2, 0.7)
    ]
    assert ray.get(refs) == [True, True, True]
    wait_until(
        lambda: ray.available_resources().get("CPU") == 1.0,
        message=f"fractional CPUs left a remainder: {ray.available_resources()}",
    )


# --------------------------------------------------------------------------
# runtime context in tasks
# --------------------------------------------------------------------------


@pytest.mark.parametrize("ray_start", [{"num_cpus": 2, "resources": {"foo": 2}}], indirect=True)
def test_runtime_context_in_task(ray_start):
    @ray.remote
    def ctx():
        c = ray.get_runtime_context()
        return {
            "task_id": c.get_task_id(),
            "actor_id": c.get_actor_id(),
            "job_id": c.get_job_id(),
            "node_id": c.get_node_id(),
            "resources": c.get_assigned_resources(),
            "accelerators": c.get_accelerator_ids(),
        }

    driver = ray.get_runtime_context()
    assert driver.get_actor_id() is None

    first, second = ray.get([ctx.remote(), ctx.remote()])
    assert first["task_id"] is not None and second["task_id"] is not None
    assert first["task_id"] != second["task_id"]
    assert first["actor_id"] is None
    assert first["job_id"] == driver.get_job_id()
    assert first["node_id"] == driver.get_node_id()
    assert first["resources"] == {"CPU": 1.0}
    assert first["accelerators"].get("GPU", []) == []

    frac = ray.get(ctx.options(num_cpus=0.5, resources={"foo": 1}).remote())
    assert frac["resources"] == {"CPU": 0.5, "foo": 1.0}


# --------------------------------------------------------------------------
# worker output reaches the driver with Ray's prefix
# --------------------------------------------------------------------------


def test_task_stdout_and_stderr_prefixed_like_ray(ray_start, read_output):
    tag = uuid.uuid4().hex

    @ray.remote
    def chatty_task(tag):
        print(f"hello {tag}")
        print(f"line-a {tag}\nline-b {tag}")
        print(f"oops {tag}", file=sys.stderr)
        return os.getpid()

    pid = ray.get(chatty_task.remote(tag))
    out, err = read_output(lambda o, e: f"line-b {tag}" in o and f"oops {tag}" in e)
    prefix = f"(chatty_task pid={pid}) "
    for text in (f"hello {tag}", f"line-a {tag}", f"line-b {tag}"):
        assert re.search(r"^.*" + re.escape(prefix + text) + r"\s*$", out, re.M), (text, out)
    assert prefix + f"oops {tag}" in err, err
    assert f"oops {tag}" not in out


def test_output_of_fresh_workers_names_their_pid(ray_start, read_output):
    # a new worker's first lines can be read before its hello (which carries the pid) is
    tag = uuid.uuid4().hex

    @ray.remote(max_calls=1)
    def first_words(tag, i):
        print(f"{tag} {i}", flush=True)
        return os.getpid()

    pids = []
    for _ in range(3):
        pids.append(ray.get(first_words.remote(tag, len(pids))))   # one waiting get: a borrowed worker
    pids += ray.get([first_words.remote(tag, len(pids) + i) for i in range(4)])   # the node thread's
    out, _ = read_output(lambda o, e: all(f"{tag} {i}" in o for i in range(len(pids))))
    for i, pid in enumerate(pids):
        assert f"(first_words pid={pid}) {tag} {i}" in out, out


def test_actor_repr_prefixes_its_output_like_ray(ray_start, read_output):
    tag = uuid.uuid4().hex

    @ray.remote
    class Shard:
        def __init__(self, index):
            self.index = index

        def __repr__(self):
            return f"Shard(index={self.index})"

        def say(self, tag):
            print(f"hi {tag}")
            return os.getpid()

    pid = ray.get(Shard.remote(7).say.remote(tag))
    out, _ = read_output(lambda o, e: f"hi {tag}" in o)
    assert f"(Shard(index=7) pid={pid}) hi {tag}" in out, out


@pytest.mark.local_only("Ray's sockets under _temp_dir=tmp_path exceed AF_UNIX's 107-byte path limit")
def test_log_to_driver_false_sends_worker_output_to_log_files(ray_init, read_output, tmp_path):
    tag = uuid.uuid4().hex
    ray_init(num_cpus=1, log_to_driver=False, _temp_dir=str(tmp_path))

    @ray.remote
    def quiet_task(tag):
        print(f"to-file {tag}")
        print(f"err-file {tag}", file=sys.stderr)
        return os.getpid()

    pid = ray.get(quiet_task.remote(tag))

    def written():
        files = [tmp_path.glob(f"raylite/session_*/logs/worker-{pid}.{ext}") for ext in ("out", "err")]
        found = [next(f, None) for f in files]
        if all(found) and f"err-file {tag}" in found[1].read_text():
            return found

    out_file, err_file = wait_until(written, timeout=5, what="worker log files")
    assert out_file.read_text() == f"to-file {tag}\n" and err_file.read_text() == f"err-file {tag}\n"
    logs = [out_file.parent]
    assert oct(logs[0].stat().st_mode & 0o777) == "0o700"
    out, err = read_output(lambda o, e: False, timeout=0.3)
    assert tag not in out and tag not in err


@pytest.mark.local_only("Ray 2.60 forwards a job with a logging_config without the (task pid=N) prefix")
def test_logging_config_sets_up_the_workers_root_logger(ray_init, read_output):
    import json
    import logging
    tag = uuid.uuid4().hex
    ray_init(num_cpus=1, logging_config=ray.LoggingConfig(encoding="JSON", log_level="WARNING",
                                                          additional_log_standard_attrs=["name"]))

    @ray.remote
    def logs(tag):
        logging.getLogger("my.module").info(f"quiet {tag}")
        logging.getLogger("my.module").warning(f"loud {tag}", extra={"username": "anyscale"})

    root = logging.getLogger()
    try:
        ray.get(logs.remote(tag))
        _, err = read_output(lambda o, e: f"loud {tag}" in e)
    finally:   # init() gave this process's root logger a handler too: leave other tests theirs
        root.handlers = [h for h in root.handlers if type(h.formatter).__module__ != "raylite.core.client.logging_config"]
    assert f"quiet {tag}" not in err
    line = next(line for line in err.splitlines() if f"loud {tag}" in line)
    record = json.loads(line.split(") ", 1)[1])
    assert record["levelname"] == "WARNING" and record["name"] == "my.module" and record["task_name"] == "logs"
    assert record["username"] == "anyscale" and record["task_func_name"] == f"{__name__}.logs"   # as Ray's
    assert record["job_id"] == ray.get_runtime_context().get_job_id()
    with pytest.raises(ValueError, match="encoding=.XML."):
        ray.LoggingConfig(encoding="XML")
    with pytest.raises(ValueError, match="log_level='LOUD'"):
        ray.LoggingConfig(log_level="LOUD")


def test_logging_config_from_rays_environment_variable(tmp_path):
    """RAY_LOGGING_CONFIG_ENCODING=JSON stands for init(logging_config=LoggingConfig(encoding="JSON"))."""
    import json
    script = tmp_path / "job.py"
    script.write_text("import logging, raylite as ray\n"
                      "ray.init(num_cpus=1)\n"
                      "logging.getLogger().info('from the driver')\n"
                      "ray.shutdown()\n")
    env = {**os.environ, "RAY_LOGGING_CONFIG_ENCODING": "JSON"}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    line = next(line for line in done.stderr.splitlines() if "from the driver" in line)
    assert json.loads(line)["message"] == "from the driver"


@pytest.mark.local_only("white-box: reads the local node's output buffers")
def test_progress_bar_output_shows_its_last_drawing(ray_start, read_output):
    """tqdm redraws one line with carriage returns, for as long as the job runs: the driver
    prints what a terminal would show once the line ends, and holds only that meanwhile."""
    from raylite.core.api import runtime as api
    tag = uuid.uuid4().hex

    @ray.remote
    class Progress:
        def draw(self, tag, n):
            for i in range(n):
                sys.stderr.write(f"\r{tag} {i + 1}/{n}")
                sys.stderr.flush()
            return os.getpid()

        def finish(self):
            sys.stderr.write(" done\r\n")   # ends the line, CRLF style

    bar = Progress.remote()
    pid = ray.get(bar.draw.remote(tag, 20000))
    node = api._node
    held = node.call_sync(lambda: [len(v) for w in node.workers.values() for v in w.partial.values()])
    assert held and max(held) < 100, held
    ray.get(bar.finish.remote())
    _, err = read_output(lambda o, e: "done" in e)
    assert f"(Progress pid={pid}) {tag} 20000/20000 done\n" in err, err[-300:]
    assert f"{tag} 19999/" not in err


def test_workers_limit_math_threads_to_their_cpus(ray_init):
    ray_init(num_cpus=2)

    @ray.remote(num_cpus=1)
    def one():
        import os
        return os.environ.get("OMP_NUM_THREADS")

    @ray.remote(num_cpus=2)
    def two():
        import os
        return os.environ.get("OMP_NUM_THREADS")

    @ray.remote
    class Holder:
        def threads(self):
            import os
            return os.environ.get("OMP_NUM_THREADS")

    # as Ray: the variable follows the CPUs held (at least 1), so two workers don't fight over cores
    assert ray.get([one.remote(), two.remote(), one.remote()]) == ["1", "2", "1"]
    assert ray.get(Holder.remote().threads.remote()) == "1"


def test_tqdm_ray_prints_status_lines_from_tasks(ray_start, read_output):
    from raylite.experimental.tqdm_ray import tqdm
    tag = uuid.uuid4().hex

    @ray.remote
    def work(tag):
        for _ in tqdm(range(6), desc=tag, flush_interval_s=0):
            pass
        bar = tqdm(total=4, desc=f"manual-{tag}", unit="batch", flush_interval_s=3600)
        bar.update(3)   # within the interval: nothing printed until close
        bar.close()
        return os.getpid()

    pid = ray.get(work.remote(tag))
    _, err = read_output(lambda o, e: f"manual-{tag}" in e)
    lines = [line for line in err.splitlines() if tag in line]
    assert lines[0].startswith(f"(work pid={pid}) {tag}:  17% 1/6 it") and f"{tag}: 100% 6/6 it" in lines[5]
    assert lines[-1].startswith(f"(work pid={pid}) manual-{tag}:  75% 3/4 batch") and len(lines) == 7


@pytest.mark.local_only("Ray's own signature errors have no 'f.remote(): ' prefix")
def test_arguments_are_checked_against_the_signature_at_remote(ray_start):
    """As in Ray: a call that cannot bind is a TypeError at .remote(), before anything runs."""
    @ray.remote
    def sample(count, *, seed=0):
        return count + seed

    @ray.remote
    class Holder:
        def __init__(self, value):
            self.value = value

        def add(self, amount, /):
            return self.value + amount

    @ray.remote
    class Empty:
        pass

    calls = {"sample.remote(): missing a required argument: 'count'": lambda: sample.remote(),
             "sample.remote(): too many positional arguments": lambda: sample.remote(1, 2),
             "sample.remote(): got an unexpected keyword argument 'counts'": lambda: sample.remote(counts=1),
             "Holder.remote(): missing a required argument: 'value'": lambda: Holder.remote(),
             "Empty.remote(): too many positional arguments": lambda: Empty.remote(1),
             "Holder.add.remote(): 'amount' parameter is positional only, but was passed as a keyword":
             lambda: holder.add.remote(amount=1)}
    holder = Holder.remote(10)
    for message, call in calls.items():
        with pytest.raises(TypeError) as excinfo:
            call()
        assert str(excinfo.value) == message
    assert ray.get([sample.remote(1), sample.remote(count=2, seed=1), holder.add.remote(5),
                    sample.options(name="renamed").remote(3)]) == [1, 3, 15, 3]
