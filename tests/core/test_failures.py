"""Core failure paths: typed errors instead of hangs.

Covers issue #2: exception round trip (original type + RayTaskError + remote
traceback + task name), GetTimeoutError, WorkerCrashedError after max_retries
(worker exits, SIGKILLs itself, or is killed mid-task from outside), retries
that succeed, killed/crashed actors (RayActorError / ActorDiedError), actor
restarts (max_restarts), cancel of pending and running tasks
(TaskCancelledError, force=False/True), unpicklable functions/arguments
rejected at .remote(), and infeasible requests (warning, not ready, immediate
InfeasibleTaskError).
"""

import os
import signal
import threading
import time
import uuid
import warnings

import pytest

import raylite as ray

exc = ray.exceptions


# --------------------------------------------------------------------------
# exception hierarchy
# --------------------------------------------------------------------------


def test_exception_hierarchy():
    assert issubclass(exc.RayError, Exception)
    for name in ("RayTaskError", "GetTimeoutError", "WorkerCrashedError", "RayActorError",
                 "ActorDiedError", "TaskCancelledError", "InfeasibleTaskError"):
        assert issubclass(getattr(exc, name), exc.RayError), name
    assert issubclass(exc.GetTimeoutError, TimeoutError)
    assert issubclass(exc.ActorDiedError, exc.RayActorError)


# --------------------------------------------------------------------------
# exceptions raised by tasks
# --------------------------------------------------------------------------


@pytest.mark.local_only("Ray's text heads each traceback with ray::task(), not 'Traceback'")
def test_task_exception_reraises_as_original_type_with_remote_traceback(ray_start):
    @ray.remote
    def my_failing_task(x):
        raise ValueError(f"boom-{x}")

    ref = my_failing_task.remote(42)
    with pytest.raises(ValueError) as excinfo:
        ray.get(ref)
    err = excinfo.value
    assert isinstance(err, exc.RayTaskError)
    assert isinstance(err, exc.RayError)
    text = str(err)
    assert "boom-42" in text
    assert "my_failing_task" in text
    assert "Traceback" in text
    assert os.path.basename(__file__) in text  # the remote frame, not only the driver's
    assert "raylite/core/" not in text         # the runtime's frames that called it say nothing

    # A plain `except ValueError` catches it too, and getting again re-raises.
    try:
        ray.get(ref)
    except ValueError as again:
        assert "boom-42" in str(again)
    else:
        pytest.fail("second get did not raise")


@pytest.mark.parametrize(
    "exc_type,args",
    [(KeyError, ("missing",)), (ZeroDivisionError, ("div",)), (RuntimeError, ("rt",)),
     (OSError, (2, "no such file"))],
    ids=["KeyError", "ZeroDivisionError", "RuntimeError", "OSError"],
)
def test_builtin_exception_types_round_trip(ray_start, exc_type, args):
    @ray.remote
    def raiser():
        raise exc_type(*args)

    with pytest.raises(exc_type) as excinfo:
        ray.get(raiser.remote())
    assert isinstance(excinfo.value, exc.RayTaskError)


def test_custom_exception_type_round_trips_with_attributes(ray_start):
    class MyAppError(Exception):
        def __init__(self, code, detail):
            super().__init__(code, detail)
            self.code = code
            self.detail = detail

    @ray.remote
    def failing_with_custom():
        raise MyAppError(7, "custom detail")

    with pytest.raises(MyAppError) as excinfo:
        ray.get(failing_with_custom.remote())
    err = excinfo.value
    assert isinstance(err, exc.RayTaskError)
    assert err.code == 7 and err.detail == "custom detail"
    assert "failing_with_custom" in str(err)


@pytest.mark.local_only("Ray raises its UnserializableException alone, not as a RayTaskError")
def test_an_exception_that_cannot_be_rebuilt_still_reports_itself(ray_start):
    """Its __init__ wants other arguments than the args it keeps, so unpickling it fails: get
    raises RayTaskError with the task's own traceback, not that unpickling error."""
    class Odd(Exception):
        def __init__(self, a, b):
            super().__init__(f"{a} and {b}")

    @ray.remote
    def odd():
        raise Odd(1, 2)

    with pytest.raises(exc.RayTaskError) as excinfo:
        ray.get(odd.remote(), timeout=30)
    text = str(excinfo.value)
    assert text.rstrip().endswith("Odd: 1 and 2") and "raise Odd(1, 2)" in text
    assert "missing 1 required positional argument" not in text
    assert isinstance(excinfo.value, exc.UnserializableException)   # its cause, as in Ray
    assert str(excinfo.value.cause).startswith("Failed to deserialize exception")
    assert "Odd: 1 and 2" in str(excinfo.value.cause)


def test_an_exception_that_cannot_be_pickled_becomes_a_ray_error_saying_so(ray_start, capfd):
    class Locked(Exception):
        def __init__(self, message):
            super().__init__(message)
            self.lock = threading.Lock()

    @ray.remote
    def locked():
        raise Locked("held")

    with pytest.raises(exc.RayTaskError) as excinfo:
        ray.get(locked.remote(), timeout=30)
    cause = excinfo.value.cause
    assert type(cause) is exc.RayError and type(excinfo.value) is exc.RayTaskError   # as Ray gives it
    assert "Locked isn't serializable: cannot pickle '_thread.lock' object" in str(cause)
    assert 'raise Locked("held")' in str(cause) and "Locked: held" in str(excinfo.value)


def test_exception_in_nested_task_propagates(ray_start):
    @ray.remote
    def inner_fails():
        raise KeyError("deep")

    @ray.remote
    def outer():
        return ray.get(inner_fails.remote())

    with pytest.raises(KeyError) as excinfo:
        ray.get(outer.remote())
    assert isinstance(excinfo.value, exc.RayTaskError)
    assert "inner_fails" in str(excinfo.value)


def test_failed_dependency_fails_downstream_task(ray_start, tmp_path):
    ran = tmp_path / "downstream-ran"

    @ray.remote
    def upstream():
        raise ValueError("upstream broke")

    @ray.remote
    def downstream(x, marker):
        open(marker, "w").close()
        return x

    with pytest.raises(ValueError, match="upstream broke") as excinfo:
        ray.get(downstream.remote(upstream.remote(), str(ran)))
    assert not ran.exists(), "downstream ran although its argument failed"
    assert "downstream() (pid=" in str(excinfo.value)   # Ray's words for why it failed
    assert "At least one of the input arguments for this task could not be computed" in str(excinfo.value)


# --------------------------------------------------------------------------
# get timeout
# --------------------------------------------------------------------------


def test_get_timeout_raises_get_timeout_error(ray_start, tmp_path):
    release = str(tmp_path / "release")

    @ray.remote
    def blocked(path):
        while not os.path.exists(path):
            time.sleep(0.01)
        return "finished"

    ref = blocked.remote(release)
    t0 = time.monotonic()
    with pytest.raises(exc.GetTimeoutError):
        ray.get(ref, timeout=0.3)
    elapsed = time.monotonic() - t0
    assert 0.25 <= elapsed < 3, elapsed

    with pytest.raises(TimeoutError):  # a GetTimeoutError is a TimeoutError
        ray.get([ray.put(1), ref], timeout=0.1)
    with pytest.raises(exc.GetTimeoutError):
        ray.get(ref, timeout=0)

    # The task is unaffected by the timeouts.
    open(release, "w").close()
    assert ray.get(ref, timeout=20) == "finished"


# --------------------------------------------------------------------------
# worker crashes and retries
# --------------------------------------------------------------------------


def test_worker_exit_with_max_retries_0_fails_at_once(ray_start):
    @ray.remote(max_retries=0)
    def dies():
        os._exit(1)

    t0 = time.monotonic()
    with pytest.raises(exc.WorkerCrashedError):
        ray.get(dies.remote(), timeout=30)
    assert time.monotonic() - t0 < 10

    @ray.remote
    def still_works():
        return "ok"

    assert ray.get(still_works.remote()) == "ok"


@pytest.mark.local_only("Ray's ActorDiedError text does not name the sys.exit() call")
def test_sys_exit_ends_the_worker_not_the_driver(ray_start, tmp_path):
    """sys.exit() in user code ends that worker, as in Ray: a task is retried and then fails with
    WorkerCrashedError; an actor restarts after a non-zero code and ends for good after 0. Before,
    the SystemExit came back through get() and silently ended the driver."""
    import sys

    @ray.remote(max_retries=1)
    def quits(path):
        with open(path, "a") as f:
            f.write("x")
        sys.exit(3)

    attempts = tmp_path / "attempts"
    with pytest.raises(exc.WorkerCrashedError):
        ray.get(quits.remote(str(attempts)), timeout=30)
    assert attempts.read_text() == "xx"

    @ray.remote(max_restarts=1)
    class Service:
        def crash(self, code):
            sys.exit(code)

        def restarted(self):
            return ray.get_runtime_context().was_current_actor_reconstructed

    s = Service.remote()
    assert ray.get(s.restarted.remote()) is False
    with pytest.raises(exc.RayActorError):
        ray.get(s.crash.remote(1))
    assert ray.get(s.restarted.remote()) is True   # a crash: restarted
    with pytest.raises(exc.RayActorError):
        ray.get(s.crash.remote(0))
    with pytest.raises(exc.ActorDiedError, match=r"Service.crash called sys.exit\(\)"):
        ray.get(s.restarted.remote())   # exit code 0: ended for good, restarts left or not


def test_actor_methods_retry_on_exceptions_within_max_task_retries(ray_start):
    class NotYet(Exception):   # defined here, as in a user's script: plain pickle cannot load it
        pass

    @ray.remote(max_task_retries=2)
    class Flaky:
        def __init__(self):
            self.calls = {}

        def _count(self, key):
            self.calls[key] = self.calls.get(key, 0) + 1
            return self.calls[key]

        @ray.method(retry_exceptions=True)
        def declared(self):
            if self._count("declared") < 3:
                raise ValueError("not yet")
            return self.calls["declared"]

        @ray.method(retry_exceptions=[NotYet])
        def listed(self):
            if self._count("listed") < 3:
                raise NotYet()
            return self.calls["listed"]

        def per_call(self, key):
            if self._count(key) < 3:
                raise KeyError(key)
            return self.calls[key]

        async def on_the_loop(self):   # an async method: the actor's calls run on its event loop
            if self._count("async") < 2:
                raise ValueError("not yet")
            return self.calls["async"]

    a = Flaky.remote()
    assert ray.get(a.declared.remote()) == 3                          # two retries allowed
    assert ray.get(a.listed.remote()) == 3
    assert ray.get(a.per_call.options(retry_exceptions=[KeyError]).remote("k")) == 3
    with pytest.raises(KeyError):                                     # not a listed type: no retry
        ray.get(a.per_call.options(retry_exceptions=[ValueError]).remote("other"))
    with pytest.raises(KeyError):                                     # the budget runs out first
        ray.get(a.per_call.options(retry_exceptions=True, max_task_retries=1).remote("short"))
    assert ray.get(a.on_the_loop.options(retry_exceptions=True).remote()) == 2
    with pytest.raises(ValueError, match="Invalid option keyword 'retries'"):
        ray.method(retries=3)


def test_worker_sigkill_retried_then_worker_crashed_error(ray_start, tmp_path):
    attempts = tmp_path / "attempts"

    @ray.remote  # default max_retries = 3, as in Ray
    def kills_itself(path):
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")
        os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(exc.WorkerCrashedError):
        ray.get(kills_itself.remote(str(attempts)), timeout=45)
    pids = attempts.read_text().split()
    assert len(pids) == 4, f"expected 1 try + 3 retries, got {len(pids)}"
    assert len(set(pids)) == 4  # each attempt ran in a fresh worker


@pytest.mark.local_only("patches the local node's OOM detection")
def test_a_worker_the_kernel_killed_for_memory_raises_out_of_memory_error(ray_start, monkeypatch):
    """A worker that dies while the kernel's count of out-of-memory kills rises was its victim:
    the task raises OutOfMemoryError (after its retries) and an actor's calls say why it died."""
    import itertools

    from raylite.core.node import worker_lifecycle
    kills = itertools.count(1000)
    monkeypatch.setattr(worker_lifecycle, "oom_kills", lambda: next(kills))   # it rises at every death

    @ray.remote(max_retries=1)
    def hog():
        os.kill(os.getpid(), signal.SIGKILL)   # as the OOM killer ends a process

    with pytest.raises(exc.OutOfMemoryError, match="out-of-memory killer.*use less memory per task"):
        ray.get(hog.remote(), timeout=45)

    @ray.remote
    class Hog:
        def grow(self):
            os.kill(os.getpid(), signal.SIGKILL)

    hog_actor = Hog.remote()   # (a handle kept: an actor with none left is ended on purpose)
    with pytest.raises(exc.ActorDiedError, match="out-of-memory killer"):
        ray.get(hog_actor.grow.remote(), timeout=45)
    monkeypatch.setattr(worker_lifecycle, "oom_kills", lambda: 7)   # no kill counted: a plain crash
    with pytest.raises(exc.WorkerCrashedError, match="died unexpectedly"):
        ray.get(hog.options(max_retries=0).remote(), timeout=45)


@pytest.mark.parametrize("options", [{}, {"max_retries": 1}], ids=["default-retries", "max_retries=1"])
def test_task_crashing_on_first_attempt_succeeds_on_retry(ray_start, tmp_path, options):
    marker = str(tmp_path / "crashed-once")

    @ray.remote
    def flaky(marker):
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)
        return "recovered"

    assert ray.get(flaky.options(**options).remote(marker), timeout=30) == "recovered"


def test_worker_killed_mid_task_from_outside(ray_start, tmp_path, wait_until):
    pid_file = tmp_path / "pid"

    @ray.remote(max_retries=0)
    def long_task(path):
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(path + ".tmp", path)
        time.sleep(60)

    ref = long_task.remote(str(pid_file))
    wait_until(pid_file.exists, timeout=10)
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(exc.WorkerCrashedError):
        ray.get(ref, timeout=30)
    assert time.monotonic() - t0 < 10


# --------------------------------------------------------------------------
# dead actors
# --------------------------------------------------------------------------


def _pid_actor(**options):
    class Proc:
        def __init__(self, log=None):
            self.calls = 0
            if log:
                with open(log, "a") as f:
                    f.write(f"{os.getpid()}\n")

        def pid(self):
            self.calls += 1
            return os.getpid()

        def calls_so_far(self):
            return self.calls

        def crash(self):
            os._exit(1)

        def wait_for(self, path):
            open(path + ".waiting", "w").close()   # the call is running
            while not os.path.exists(path):
                time.sleep(0.01)
            return "released"

    return ray.remote(**options)(Proc) if options else ray.remote(Proc)


def test_killed_actor_raises_actor_died_error(ray_start, wait_pids_gone):
    Proc = _pid_actor()
    a = Proc.remote()
    pid = ray.get(a.pid.remote())
    ray.kill(a)
    wait_pids_gone([pid], timeout=10, what="killed actor")
    with pytest.raises(exc.ActorDiedError) as excinfo:
        ray.get(a.pid.remote(), timeout=20)
    assert isinstance(excinfo.value, exc.RayActorError)


def test_kill_actor_fails_in_flight_call(ray_start, tmp_path, wait_until):
    Proc = _pid_actor()
    a = Proc.remote()
    ray.get(a.pid.remote())
    ref = a.wait_for.remote(str(tmp_path / "never"))
    wait_until((tmp_path / "never.waiting").exists, timeout=20, what="the call running")
    ray.kill(a)
    with pytest.raises(exc.RayActorError):
        ray.get(ref, timeout=20)


@pytest.mark.parametrize("how", ["method-exits", "external-sigkill"])
def test_crashed_actor_raises_actor_errors(ray_start, how):
    Proc = _pid_actor()
    a = Proc.remote()
    pid = ray.get(a.pid.remote())
    if how == "method-exits":
        ref = a.crash.remote()
    else:
        os.kill(pid, signal.SIGKILL)
        ref = a.pid.remote()  # may be sent before the death is noticed
    with pytest.raises(exc.RayActorError):
        ray.get(ref, timeout=20)
    # Once the death is known, every further call is an ActorDiedError.
    with pytest.raises(exc.ActorDiedError):
        ray.get(a.pid.remote(), timeout=20)

    @ray.remote
    def still_works():
        return "ok"

    assert ray.get(still_works.remote()) == "ok"


@pytest.mark.local_only("Ray fails calls with ActorUnavailableError while the actor restarts")
def test_actor_restarts_after_crash_with_max_restarts(ray_start, tmp_path):
    log = tmp_path / "constructed"
    Proc = _pid_actor(max_restarts=1)
    a = Proc.remote(str(log))
    first_pid = ray.get(a.pid.remote())
    assert ray.get(a.calls_so_far.remote()) == 1

    with pytest.raises(exc.RayActorError):
        ray.get(a.crash.remote(), timeout=20)

    second_pid = ray.get(a.pid.remote(), timeout=30)
    assert second_pid != first_pid
    assert ray.get(a.calls_so_far.remote()) == 1  # constructor re-ran: fresh state
    assert log.read_text().split() == [str(first_pid), str(second_pid)]

    # The single restart is used up: the next crash is final.
    with pytest.raises(exc.RayActorError):
        ray.get(a.crash.remote(), timeout=20)
    with pytest.raises(exc.ActorDiedError):
        ray.get(a.pid.remote(), timeout=20)


def test_kill_does_not_restart_actor(ray_start):
    Proc = _pid_actor(max_restarts=1)
    a = Proc.remote()
    ray.get(a.pid.remote())
    ray.kill(a)
    with pytest.raises(exc.ActorDiedError):
        ray.get(a.pid.remote(), timeout=20)


# --------------------------------------------------------------------------
# cancel
# --------------------------------------------------------------------------


@pytest.mark.parametrize("ray_start", [1], indirect=True)
def test_cancel_pending_task(ray_start, tmp_path, wait_until):
    release = str(tmp_path / "release")
    started = tmp_path / "blocker-started"
    ran = tmp_path / "pending-ran"

    @ray.remote
    def blocker(started, release):
        open(started, "w").close()
        while not os.path.exists(release):
            time.sleep(0.01)
        return "blocker done"

    @ray.remote
    def pending(marker):
        open(marker, "w").close()
        return "should not run"

    b = blocker.remote(str(started), release)
    wait_until(started.exists, timeout=10)
    p = pending.remote(str(ran))  # queued: the only CPU is busy
    ray.cancel(p)
    with pytest.raises(exc.TaskCancelledError):
        ray.get(p, timeout=10)

    open(release, "w").close()
    assert ray.get(b) == "blocker done"

    @ray.remote
    def after():
        return "after"

    assert ray.get(after.remote()) == "after"  # the queue drained past the cancelled task
    assert not ran.exists(), "cancelled pending task ran anyway"


@pytest.mark.local_only("Ray 2.60's bug: once the arguments of a task cancelled while it waited for them are "
                        "ready, a failed check in the driver's reference counter ends the driver process")
def test_cancel_of_a_task_waiting_for_its_arguments_never_runs_it(ray_start, tmp_path, capfd):
    release = tmp_path / "release"
    ran = tmp_path / "dependent-ran"

    @ray.remote
    def producer(release):
        while not os.path.exists(release):
            time.sleep(0.01)
        return 1

    @ray.remote
    def dependent(x, marker):
        open(marker, "w").close()
        return x

    argument = producer.remote(str(release))
    dep = dependent.remote(argument, str(ran))
    ray.cancel(dep)
    with pytest.raises(exc.TaskCancelledError):
        ray.get(dep, timeout=10)
    release.touch()   # its argument is ready now: the cancelled task must stay cancelled
    assert ray.get(argument, timeout=10) == 1

    @ray.remote(num_cpus=2)
    def after():   # the whole machine: it starts only once a dependent sent on meanwhile has ended
        return "after"

    assert ray.get(after.remote(), timeout=20) == "after"
    assert not ran.exists(), "a task cancelled while it waited for its arguments ran anyway"
    assert ray.available_resources()["CPU"] == 2.0
    assert "internal error" not in capfd.readouterr().err


def test_cancel_running_task_interrupts_it(ray_start, tmp_path, wait_until):
    started = tmp_path / "started"

    @ray.remote
    def spin(started):
        open(started, "w").close()
        while True:
            time.sleep(0.01)

    ref = spin.remote(str(started))
    wait_until(started.exists, timeout=10)
    t0 = time.monotonic()
    ray.cancel(ref)  # force=False: interrupt the running task
    with pytest.raises(exc.TaskCancelledError):
        ray.get(ref, timeout=20)
    assert time.monotonic() - t0 < 10

    @ray.remote
    def after():
        return "after"

    assert ray.get(after.remote()) == "after"


@pytest.mark.local_only("Ray can lose a cancel sent while its worker still loads the task (imports the test module): the task runs on")
def test_cancel_right_after_submit_interrupts_a_task_that_has_not_started_yet(ray_start):
    # The worker has the task but has not started it when the SIGINT comes (or the signal lands
    # just before the task blocks in sleep): it must still be interrupted, not run to its end.
    @ray.remote
    def sleeper():
        time.sleep(30)

    @ray.remote
    def warm():
        return 0

    ray.get([warm.remote() for _ in range(2)])   # idle workers: the task is sent at once
    for _ in range(10):
        ref = sleeper.remote()
        ray.cancel(ref)
        with pytest.raises(exc.TaskCancelledError):
            ray.get(ref, timeout=10)


@pytest.mark.local_only("Ray's get raises TaskCancelledError at once, not after the task's own cleanup")
def test_a_task_that_catches_the_interrupt_to_clean_up_is_interrupted_once(ray_start, tmp_path, wait_until):
    log, started = tmp_path / "log", tmp_path / "started"

    @ray.remote
    def careful(path, started):
        try:
            open(started, "w").close()
            time.sleep(30)
        except KeyboardInterrupt:
            time.sleep(1.5)   # cleanup, past every repeat of the signal
            with open(path, "w") as f:
                f.write("cleaned up")
            raise

    ref = careful.remote(str(log), str(started))
    wait_until(started.exists, timeout=20, what="the task inside its try")
    ray.cancel(ref)
    with pytest.raises(exc.TaskCancelledError):
        ray.get(ref, timeout=20)
    assert log.read_text() == "cleaned up"


def test_cancel_running_task_force_kills_worker(ray_start, tmp_path, wait_until, wait_pids_gone):
    pid_file = tmp_path / "pid"

    @ray.remote
    def stuck(path):
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(path + ".tmp", path)
        time.sleep(300)  # blocked in C: only a kill stops it

    ref = stuck.remote(str(pid_file))
    wait_until(pid_file.exists, timeout=10)
    pid = int(pid_file.read_text())
    ray.cancel(ref, force=True)
    with pytest.raises(exc.TaskCancelledError):
        ray.get(ref, timeout=20)
    wait_pids_gone([pid], timeout=10, what="force-cancelled worker")

    @ray.remote
    def after():
        return "after"

    assert ray.get(after.remote()) == "after"


# --------------------------------------------------------------------------
# unpicklable functions and arguments fail at .remote()
# --------------------------------------------------------------------------

_SERIALIZATION_ERRORS = (TypeError, ValueError, exc.RayError)


def _assert_serialization_message(err):
    text = str(err).lower()
    assert "pickl" in text or "serializ" in text, str(err)


def test_unpicklable_argument_fails_at_remote(ray_start):
    @ray.remote
    def use(x):
        return "ran"

    lock = threading.Lock()
    with pytest.raises(_SERIALIZATION_ERRORS) as excinfo:
        use.remote(lock)
    _assert_serialization_message(excinfo.value)
    # The runtime is still fine afterwards.
    assert ray.get(use.remote(1)) == "ran"


def test_unpicklable_function_fails_at_remote(ray_start):
    lock = threading.Lock()

    def uses_lock():
        with lock:
            return 1

    remote_fn = ray.remote(uses_lock)  # decorating never pickles (as in Ray)
    with pytest.raises(_SERIALIZATION_ERRORS) as excinfo:
        remote_fn.remote()
    _assert_serialization_message(excinfo.value)


@pytest.mark.local_only("Ray logs this warning, not a UserWarning")
def test_function_capturing_a_large_object_warns_at_remote(ray_start):
    blob = b"x" * (11 << 20)

    @ray.remote
    def captures():
        return len(blob)

    with pytest.warns(UserWarning, match=r"function captures is very large when pickled \(11\.\d MiB\)"):
        ref = captures.remote()
    assert ray.get(ref) == 11 << 20

    @ray.remote
    def small():
        return 1

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ray.get(small.remote()) == 1


def test_unpicklable_actor_arguments_fail_at_remote(ray_start):
    Proc = _pid_actor()
    with pytest.raises(_SERIALIZATION_ERRORS) as excinfo:
        Proc.remote(threading.Lock())
    _assert_serialization_message(excinfo.value)

    a = Proc.remote()
    ray.get(a.pid.remote())
    with pytest.raises(_SERIALIZATION_ERRORS) as excinfo:
        a.wait_for.remote(threading.Lock())
    _assert_serialization_message(excinfo.value)


# --------------------------------------------------------------------------
# infeasible requests
# --------------------------------------------------------------------------


def _warning_text(records):
    return "\n".join(str(r.message) for r in records)


@pytest.mark.parametrize(
    "options,names",
    [
        ({"num_cpus": 64}, ["64", "CPU", "2"]),
        ({"num_gpus": 1}, ["GPU"]),
        ({"resources": {"foo": 1}}, ["foo"]),
    ],
    ids=["num_cpus=64", "num_gpus=1", "custom-resource"],
)
@pytest.mark.local_only("Ray logs the warning and leaves the task pending (an autoscaler may add a node)")
def test_infeasible_task_warns_and_fails_fast(ray_init, options, names):
    ray_init(num_cpus=2, num_gpus=0)

    @ray.remote
    def never_fits():
        return "ran"

    with pytest.warns(UserWarning) as records:
        ref = never_fits.options(**options).remote()
    assert isinstance(ref, ray.ObjectRef)
    text = _warning_text(records)
    for name in names:
        assert name in text, f"{name!r} missing from warning: {text}"

    ready, not_ready = ray.wait([ref], timeout=0.5)
    assert ready == [] and not_ready == [ref]

    t0 = time.monotonic()
    with pytest.raises(exc.InfeasibleTaskError):
        ray.get(ref)
    assert time.monotonic() - t0 < 5, "get on an infeasible task must fail at once"

    @ray.remote
    def fits():
        return "ran"

    assert ray.get(fits.remote()) == "ran"


@pytest.mark.local_only("Ray logs the warning and leaves the actor pending (an autoscaler may add a node)")
def test_infeasible_actor_warns_and_does_not_hang(ray_init):
    ray_init(num_cpus=2)

    @ray.remote(num_cpus=64)
    class Huge:
        def ping(self):
            return "pong"

    with pytest.warns(UserWarning) as records:
        h = Huge.remote()
    text = _warning_text(records)
    assert "64" in text and "CPU" in text, text

    t0 = time.monotonic()
    with pytest.raises(exc.RayError):
        ray.get(h.ping.remote())
    assert time.monotonic() - t0 < 5


@pytest.mark.local_only("on Ray the cancelled parent's child keeps its CPU until it ends")
def test_cancel_is_recursive_by_default(ray_init, tmp_path, wait_until):
    ray_init(num_cpus=1)
    started = tmp_path / "child-started"

    @ray.remote(num_cpus=1)
    def child(started):
        open(started, "w").close()
        time.sleep(30)
        return 1

    @ray.remote(num_cpus=1)
    def parent(started):
        return ray.get(child.remote(started))   # blocked in get: its CPU goes to the child

    ref = parent.remote(str(started))
    wait_until(started.exists, timeout=20, what="the child running")
    ray.cancel(ref)
    with pytest.raises(ray.exceptions.TaskCancelledError):
        ray.get(ref, timeout=20)

    @ray.remote
    def quick():
        return 2

    # the child was cancelled too, so the single CPU is free again well before its 30 s sleep ends
    assert ray.get(quick.remote(), timeout=15) == 2


def test_retry_exceptions_retries_the_task_on_its_exceptions(ray_start, tmp_path):
    class Transient(KeyError):
        pass

    @ray.remote
    def attempt(d, fail_times, exc):
        n = len(os.listdir(d))
        open(os.path.join(d, str(n)), "w").close()
        if n < fail_times:
            raise exc("attempt %d" % n)
        return n

    def run(options, fail_times, exc):
        d = tmp_path / uuid.uuid4().hex
        d.mkdir()
        try:
            return ray.get(attempt.options(**options).remote(str(d), fail_times, exc))
        finally:
            attempts.append(len(os.listdir(d)))

    attempts = []
    assert run({"retry_exceptions": True, "max_retries": 2}, 2, ValueError) == 2
    assert run({"retry_exceptions": [KeyError], "max_retries": 3}, 1, Transient) == 1   # a subclass
    assert run({"retry_exceptions": [Transient], "max_retries": 3}, 1, Transient) == 1  # a local class
    with pytest.raises(ValueError, match="attempt 0"):   # not in the list: no retry
        run({"retry_exceptions": [KeyError], "max_retries": 3}, 5, ValueError)
    with pytest.raises(ValueError, match="attempt 1"):   # the budget is max_retries
        run({"retry_exceptions": True, "max_retries": 1}, 5, ValueError)
    with pytest.raises(ValueError, match="attempt 0"):   # off by default, as in Ray
        run({}, 5, ValueError)
    assert attempts == [3, 2, 2, 1, 2, 1]
    with pytest.raises(TypeError, match="retry_exceptions"):
        attempt.options(retry_exceptions="yes")
