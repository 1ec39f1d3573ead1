"""More of Ray's state API on the local runtime: tasks' parent ids, ``summarize_objects``,
``list_jobs`` and the other ``get_*``, the workers' logs (``list_logs``, ``get_log``), and
``cancel(force=True)`` refused for actor calls. Expected values were checked against Ray 2.60.
"""
from __future__ import annotations

import os
import time

import pytest

import raylite as ray
from backend import ON_RAY
from raylite.util.state import (RayStateApiException, get_job, get_log, get_node, get_objects, get_placement_group,
                                get_task, get_worker, list_actors, list_jobs, list_logs, list_nodes, list_tasks,
                                list_workers, summarize_objects)

DRIVER_TASK_ID = "f" * 20 + "01000000"   # Ray's: all ones, then the job id
STATE_API = ("ray.util.state on Ray asks Ray's dashboard, which the test clusters do not start "
             "(init(backend='ray', include_dashboard=True) does)")


def _one(name: str, detail: bool = False):
    [task] = list_tasks(filters=[("name", "=", name)], detail=detail)
    return task


# --------------------------------------------------------------------------
# parent_task_id
# --------------------------------------------------------------------------


@pytest.mark.local_only(STATE_API)
def test_parent_task_ids_name_the_submitter(ray_start):
    @ray.remote
    def leaf():
        return 1

    @ray.remote
    def outer():
        return ray.get(leaf.options(name="from_task").remote())

    @ray.remote
    class Child:
        def ping(self):
            return 1

    @ray.remote
    class Parent:
        def __init__(self):
            self.early = leaf.options(name="from_constructor").remote()

        def spawn(self):
            child = Child.remote()
            return ray.get([child.ping.remote(), leaf.options(name="from_call").remote(), self.early])

    assert ray.get(outer.remote(), timeout=30) == 1
    parent = Parent.remote()
    assert ray.get(parent.spawn.remote(), timeout=30) == [1, 1, 1]

    assert ray.get_runtime_context().get_task_id() is None   # the driver's own id is not given out, as in Ray
    for name in ("outer", "Parent.__init__", "Parent.spawn"):
        assert _one(name).parent_task_id == _one(name, detail=True).parent_task_id == DRIVER_TASK_ID
    assert _one("from_task").parent_task_id == _one("outer").task_id
    assert _one("from_constructor").parent_task_id == _one("Parent.__init__").task_id
    spawn = _one("Parent.spawn").task_id
    assert {_one(n).parent_task_id for n in ("from_call", "Child.__init__", "Child.ping")} == {spawn}
    assert get_task(spawn).parent_task_id == DRIVER_TASK_ID
    assert {t.name for t in list_tasks(filters=[("parent_task_id", "=", spawn)])} == \
        {"from_call", "Child.__init__", "Child.ping"}


@pytest.mark.local_only(STATE_API)
def test_parent_is_the_call_that_submits_when_an_actor_runs_several(ray_start, tmp_path):
    """Each of a threaded actor's running calls is the parent of what it submits (the worker says
    which call submits), and cancelling that call recursively cancels them."""
    @ray.remote
    def leaf():
        return 1

    @ray.remote(max_concurrency=2)
    class Threaded:
        def hold(self, path):
            while not os.path.exists(path):
                time.sleep(0.01)

        def submit(self, path):
            value = ray.get(leaf.remote())
            open(path, "w").close()
            return value

    actor = Threaded.remote()
    go = str(tmp_path / "go")
    held = actor.hold.remote(go)
    assert ray.get(actor.submit.remote(go), timeout=30) == 1
    ray.get(held, timeout=30)
    assert _one("leaf").parent_task_id == _one("Threaded.submit").task_id


# --------------------------------------------------------------------------
# summarize_objects, list_jobs, get_*
# --------------------------------------------------------------------------


@pytest.mark.local_only(STATE_API)
def test_summarize_objects_counts_sizes_and_states(ray_start, tmp_path, wait_until):
    @ray.remote
    def value():
        return b"v" * 1000

    @ray.remote
    def blocked(path):
        while not os.path.exists(path):
            time.sleep(0.01)

    big = ray.put(b"x" * (1 << 20))
    done = value.remote()
    ray.get(done, timeout=30)
    go = str(tmp_path / "go")
    pending = blocked.remote(go)
    wait_until(lambda: _one("blocked").state == "RUNNING", timeout=20, what="the blocked task running")

    cluster = summarize_objects()["cluster"]
    assert set(cluster) == {"summary", "total_objects", "total_size_mb", "callsite_enabled", "summary_by"}
    assert (cluster["summary_by"], cluster["callsite_enabled"], cluster["total_objects"]) == ("callsite", False, 3)
    entry = cluster["summary"]["disabled"]   # call sites are not recorded, as by Ray's default
    assert entry["total_objects"] == 3
    assert entry["task_state_counts"] == {"FINISHED": 2, "RUNNING": 1}
    assert entry["task_attempt_number_counts"] == {"0": 3}
    assert sum(entry["ref_type_counts"].values()) == 3
    assert (entry["total_num_workers"], entry["total_num_nodes"]) == (1, 1)
    assert 1.0 < entry["total_size_mb"] == cluster["total_size_mb"] < 1.1

    open(go, "w").close()
    ray.get(pending, timeout=30)
    del big, done, pending
    assert summarize_objects()["cluster"]["total_objects"] == 0


@pytest.mark.local_only(STATE_API)
def test_list_jobs_has_the_drivers_job(ray_start):
    [job] = list_jobs()
    assert (job.job_id, job.type, job.status, job.submission_id) == ("01000000", "DRIVER", "RUNNING", None)
    assert job.job_id == ray.get_runtime_context().get_job_id()
    assert job.driver_info == {"id": "01000000", "node_ip_address": "127.0.0.1", "pid": str(os.getpid())}
    assert "pytest" in job.entrypoint and job.start_time is None   # detail columns only with detail

    [full] = list_jobs(detail=True)
    assert full.start_time <= time.time() * 1000 and full.end_time == 0 and full.metadata == {}
    assert list_jobs(filters=[("status", "=", "running"), ("type", "=", "DRIVER")]) == [job]
    assert list_jobs(filters=[("type", "=", "SUBMISSION")]) == []
    assert get_job("01000000") is None   # Ray's get_job finds submitted jobs only, by submission id
    with pytest.raises(ValueError, match="'entrypoint' is not supported"):
        list_jobs(filters=[("entrypoint", "=", "python")])


@pytest.mark.local_only(STATE_API)
def test_get_by_id_for_workers_nodes_groups_and_objects(ray_start):
    @ray.remote
    def pid():
        return os.getpid()

    worker_pid = ray.get(pid.remote(), timeout=30)
    [row] = [w for w in list_workers() if w.pid == worker_pid]
    assert get_worker(row.worker_id).pid == worker_pid
    [node] = list_nodes()
    assert get_node(node.node_id).start_time_ms is not None   # with the detail columns
    group = ray.util.placement_group([{"CPU": 1}], name="got")
    ray.get(group.ready(), timeout=30)
    assert get_placement_group(group.id.hex()).name == "got"
    ref = ray.put(list(range(10)))
    [obj] = get_objects(ref.hex())
    assert obj.object_id == ref.hex() and obj.task_status == "FINISHED"
    for get in (get_worker, get_node, get_placement_group, get_objects):
        assert get("0" * 28) is None
    ray.util.remove_placement_group(group)


# --------------------------------------------------------------------------
# logs
# --------------------------------------------------------------------------


def _wait_log(wait_until, expected: list, **where) -> None:
    """get_log gives `expected` (output reaches the file a moment after the task ends)."""
    wait_until(lambda: list(get_log(**where)) == expected, timeout=10,
               message=f"get_log({where}) never gave {expected}")


@pytest.mark.local_only(STATE_API)
def test_logs_of_tasks_and_actors_with_log_to_driver_false(ray_init, tmp_path, wait_until):
    ray_init(log_to_driver=False, _temp_dir=str(tmp_path))

    @ray.remote
    def chatty(n):
        import sys
        for i in range(n):
            print(f"line {i}")
        print("\x1b[31mred\x1b[0m")
        print("to stderr", file=sys.stderr, flush=True)
        return os.getpid()

    @ray.remote
    class Talker:
        def talk(self):
            print("actor speaking", flush=True)
            return os.getpid()

    ref = chatty.remote(3)
    pid = ray.get(ref, timeout=30)
    task_id = get_task(ref).task_id
    expected = ["line 0\n", "line 1\n", "line 2\n", "\x1b[31mred\x1b[0m\n"]
    _wait_log(wait_until, expected, task_id=task_id)
    assert list(get_log(pid=pid, tail=2, filter_ansi_code=True)) == ["line 2\n", "red\n"]
    assert list(get_log(filename=f"worker-{pid}.out", tail=1, encoding=None)) == [b"\x1b[31mred\x1b[0m\n"]
    _wait_log(wait_until, ["to stderr\n"], task_id=task_id, suffix="err")
    assert list(get_log(pid=pid, tail=0)) == []

    talker = Talker.remote()
    actor_pid = ray.get(talker.talk.remote(), timeout=30)
    [actor] = list_actors()
    _wait_log(wait_until, ["actor speaking\n"], actor_id=actor.actor_id)
    assert list(get_log(actor_id=actor.actor_id, suffix="err")) == []   # it wrote nothing there

    logs = list_logs(node_id=ray.get_runtime_context().get_node_id())
    assert {f"worker-{pid}.out", f"worker-{actor_pid}.out"} <= set(logs["worker_out"])
    # as Ray's, a worker's files exist from its start (the actor's .err is empty)
    assert {f"worker-{pid}.err", f"worker-{actor_pid}.err"} <= set(logs["worker_err"])
    assert list_logs(glob_filter="*.err") == {"worker_err": logs["worker_err"]}
    assert os.path.exists(tmp_path / "raylite")   # under _temp_dir, as Ray's logs


@pytest.mark.local_only(STATE_API)
def test_get_log_of_a_task_gives_only_its_lines(ray_init, tmp_path):
    """Tasks that ran one after another on one worker: each one's log is its own lines (Ray's
    task_log_info offsets), the worker's log all of them, raw (a line without its end included)."""
    ray_init(num_cpus=1, log_to_driver=False, _temp_dir=str(tmp_path))

    @ray.remote
    def talk(i):
        import sys
        print(f"task {i} says hello")
        print(f"task {i} says goodbye")
        print(f"task {i} complains", file=sys.stderr)
        sys.stdout.write(f"task {i} trails off")
        return os.getpid()

    refs = [talk.remote(i) for i in range(3)]
    pids = ray.get(refs, timeout=30)
    assert len(set(pids)) == 1   # one reused worker: the tasks share its files
    for i, ref in enumerate(refs):
        task = get_task(ref)
        assert set(task.task_log_info) == {"stdout_file", "stderr_file", "stdout_start", "stdout_end",
                                           "stderr_start", "stderr_end"}
        assert task.task_log_info["stdout_file"] == f"worker-{pids[0]}.out"
        assert list(get_log(task_id=task.task_id)) == [f"task {i} says hello\n", f"task {i} says goodbye\n",
                                                       f"task {i} trails off"]
        assert list(get_log(task_id=task.task_id, suffix="err")) == [f"task {i} complains\n"]
        assert list(get_log(task_id=task.task_id, tail=1)) == [f"task {i} trails off"]
    whole = "".join(get_log(pid=pids[0]))
    assert whole.count("says hello") == 3 and "task 0 trails offtask 1 says hello" in whole


@pytest.mark.local_only(STATE_API)
def test_get_log_errors_name_what_is_wrong(ray_init, tmp_path):
    ray_init(log_to_driver=False, _temp_dir=str(tmp_path))

    @ray.remote
    class Quiet:
        def call(self):
            return 1

    quiet = Quiet.remote()
    call = quiet.call.remote()
    ray.get(call, timeout=30)
    with pytest.raises(RayStateApiException, match="actor log"):
        list(get_log(task_id=get_task(call).task_id))
    with pytest.raises(RayStateApiException, match="worker-1.out"):
        list(get_log(filename="worker-1.out"))
    with pytest.raises(RayStateApiException, match="Actor ID 00 not found"):
        list(get_log(actor_id="00"))
    with pytest.raises(ValueError, match="suffix='log'"):
        list(get_log(pid=1, suffix="log"))
    with pytest.raises(ValueError, match="tail=-2"):
        list(get_log(pid=1, tail=-2))
    with pytest.raises(ValueError, match="filename='../x'"):
        list(get_log(filename="../x"))
    with pytest.raises(ValueError, match="node_id='nope'"):
        list_logs(node_id="nope")
    with pytest.raises(ValueError, match="filename, or an actor_id, task_id or pid"):
        list(get_log())


@pytest.mark.local_only(STATE_API)
def test_no_logs_while_output_goes_to_the_driver(ray_start):
    assert list_logs() == {}
    with pytest.raises(RayStateApiException, match="log_to_driver=False"):
        list(get_log(pid=os.getpid()))


# --------------------------------------------------------------------------
# cancel
# --------------------------------------------------------------------------


def test_cancel_force_is_refused_for_an_actor_call(ray_start, tmp_path):
    @ray.remote
    class Waiter:
        def wait(self, path):
            while not os.path.exists(path):
                time.sleep(0.01)
            return "done"

        def quick(self):
            return 1

    @ray.remote
    def cancel_from_task(refs):
        try:
            ray.cancel(refs[0], force=True)
        except ValueError as e:
            return str(e)

    actor = Waiter.remote()
    finished = actor.quick.remote()
    ray.get(finished, timeout=30)
    ray.cancel(finished, force=True)   # done already: nothing to refuse, as in Ray

    go = str(tmp_path / "go")
    running = actor.wait.remote(go)
    with pytest.raises(ValueError, match=r"^force=True is not supported for actor tasks\.$"):
        ray.cancel(running, force=True)
    # Ray refuses it only in the call's owner: another process's cancel goes to the owner, which
    # drops it, so there it neither raises nor cancels
    refused = None if ON_RAY else "force=True is not supported for actor tasks."
    assert ray.get(cancel_from_task.remote([running]), timeout=30) == refused
    open(go, "w").close()
    assert ray.get(running, timeout=30) == "done"   # not cancelled
    with pytest.raises(TypeError, match=r"only supported for object refs\. For actors, try ray\.kill\(\)"):
        ray.cancel(actor)


def test_on_the_ray_backend_the_new_calls_are_rays(monkeypatch):
    import types
    from raylite.core.client.link import process
    calls = []

    def recorder(name, result):
        return lambda *args, **kwargs: calls.append((name, args, kwargs)) or result

    rays_state = types.SimpleNamespace(list_jobs=recorder("list_jobs", ["job"]), get_worker=recorder("get_worker", "w"),
                                       summarize_objects=recorder("summarize_objects", {"cluster": {}}),
                                       list_logs=recorder("list_logs", {"worker_out": []}),
                                       get_log=recorder("get_log", iter(["a\n"])))
    monkeypatch.setattr(process, "ray", types.SimpleNamespace(state_api=lambda: rays_state))
    assert list_jobs(limit=3) == ["job"] and get_worker("ab") == "w"
    assert summarize_objects() == {"cluster": {}} and list_logs(node_ip="1.2.3.4") == {"worker_out": []}
    assert list(get_log(pid=5, tail=2)) == ["a\n"]
    assert [name for name, _, _ in calls] == ["list_jobs", "get_worker", "summarize_objects", "list_logs", "get_log"]
    assert calls[0][1] == (None, None, 3, 30, False, True, False) and calls[1][1] == ("ab", None, 30, False)
    assert calls[4][2]["pid"] == 5 and calls[4][2]["tail"] == 2 and calls[3][2]["node_ip"] == "1.2.3.4"


@pytest.mark.local_only(STATE_API)
def test_list_workers_keeps_the_ones_that_ended_with_why(ray_start):
    @ray.remote(max_calls=1)
    def once():
        return os.getpid()

    @ray.remote
    class Actor:
        def pid(self):
            return os.getpid()

        def leave(self):
            ray.actor.exit_actor()

    @ray.remote(max_retries=0)
    def crash():
        os._exit(1)

    retired = ray.get(once.remote())
    killed_actor = Actor.remote()
    killed = ray.get(killed_actor.pid.remote())
    ray.kill(killed_actor)
    leaving_actor = Actor.remote()
    left = ray.get(leaving_actor.pid.remote())
    leaving_actor.leave.remote()
    with pytest.raises(ray.exceptions.WorkerCrashedError):
        ray.get(crash.remote())

    def ended():
        rows = {w.pid: w for w in list_workers(detail=True) if not w.is_alive}
        return rows if {retired, killed, left} <= rows.keys() and len(rows) >= 4 else None

    deadline = time.monotonic() + 10
    while not (rows := ended()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rows, list_workers(detail=True)
    assert rows[retired].exit_type == "INTENDED_SYSTEM_EXIT"
    assert (rows[killed].exit_type, rows[killed].exit_detail) == ("INTENDED_USER_EXIT", "killed by ray.kill()")
    assert rows[left].exit_type == "INTENDED_USER_EXIT" and "exit_actor" in rows[left].exit_detail
    crashed = [w for pid, w in rows.items() if pid not in (retired, killed, left)]
    assert [w.exit_type for w in crashed] == ["SYSTEM_ERROR"]
    assert all(w.end_time_ms >= w.start_time_ms > 0 for w in rows.values())
    alive = list_workers()
    assert all(w.is_alive for w in alive if w.exit_type is None) and any(not w.is_alive for w in alive)


# --------------------------------------------------------------------------
# list_runtime_envs, list_cluster_events
# --------------------------------------------------------------------------


@pytest.mark.local_only(STATE_API)
def test_runtime_envs_in_use_and_the_ones_that_failed(ray_start, tmp_path, monkeypatch):
    from raylite.util.state import list_runtime_envs
    monkeypatch.setenv("RAYLITE_RUNTIME_ENV_DIR", str(tmp_path))
    monkeypatch.setenv("PIP_NO_INDEX", "1")

    @ray.remote
    def read(name):
        return os.environ.get(name)

    assert list_runtime_envs() == []
    assert ray.get(read.options(runtime_env={"env_vars": {"RAYLITE_T": "1"}}).remote("RAYLITE_T")) == "1"
    with pytest.raises(ray.exceptions.RuntimeEnvSetupError):
        ray.get(read.options(runtime_env={"pip": ["raylite-missing-package==1"]}).remote("X"), timeout=120)
    good, bad = sorted(list_runtime_envs(detail=True), key=lambda r: r.success, reverse=True)
    assert good.runtime_env == {"env_vars": {"RAYLITE_T": "1"}} and good.success and good.ref_cnt == 1
    assert good.node_id == ray.get_runtime_context().get_node_id() and good.creation_time_ms > 0
    assert bad.runtime_env == {"pip": ["raylite-missing-package==1"]} and not bad.success
    assert "No matching distribution" in bad.error and bad.ref_cnt == 0
    assert [r.runtime_env for r in list_runtime_envs(filters=[("success", "=", "false")])] == [bad.runtime_env]
    assert list_runtime_envs()[0].error is None   # a detail column


@pytest.mark.local_only(STATE_API)
def test_cluster_events_tell_of_crashes_and_unschedulable_work(ray_start):
    import signal
    import warnings
    from raylite.util.state import list_cluster_events

    @ray.remote(max_retries=0)
    def crash():
        os.kill(os.getpid(), signal.SIGKILL)

    @ray.remote
    def big():
        return 1

    with pytest.raises(ray.exceptions.WorkerCrashedError):
        ray.get(crash.remote())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        big.options(num_cpus=64).remote()
    crashed, unschedulable = list_cluster_events()
    assert list(crashed) == ["severity", "time", "source_type", "message", "event_id"]   # Ray's dict keys
    assert (crashed["severity"], crashed["source_type"]) == ("WARNING", "RAYLET")
    assert "died running crash: the worker process died unexpectedly" in crashed["message"]
    assert unschedulable["source_type"] == "AUTOSCALER" and "asks for {CPU: 64}" in unschedulable["message"]
    assert crashed["event_id"] < unschedulable["event_id"] and len(crashed["time"]) == len("2026-01-01 00:00:00")
    [detailed] = list_cluster_events(filters=[("source_type", "=", "autoscaler")], detail=True)
    assert detailed["custom_fields"] == {"name": "big"}


@pytest.mark.local_only(STATE_API)
def test_cancelling_an_actor_call_cancels_what_it_submitted(ray_start, tmp_path, wait_until):
    started, ran = tmp_path / "started", tmp_path / "child-finished"

    @ray.remote
    def child(started, ran):
        open(started, "w").close()
        time.sleep(30)
        open(ran, "w").close()

    @ray.remote(max_concurrency=2)
    class Threaded:
        def spawn(self, started, ran):
            ref = child.remote(started, ran)
            while not ray.get_runtime_context().is_canceled():
                time.sleep(0.01)
            return ref

    actor = Threaded.remote()
    call = actor.spawn.remote(str(started), str(ran))
    wait_until(started.exists, timeout=20)
    ray.cancel(call)   # recursive=True, as Ray's default
    with pytest.raises(ray.exceptions.TaskCancelledError):
        ray.get(call, timeout=20)
    assert wait_until(lambda: _one("child").state == "FAILED", timeout=20)
    assert not ran.exists()


def test_a_task_sent_to_a_worker_whose_hello_is_not_read_is_not_running_yet():
    """A task goes to a freshly forked worker before its hello is read; until then the node does not
    know that worker's pid, so the state API says SUBMITTED_TO_WORKER, never RUNNING without a pid."""
    from types import SimpleNamespace

    from raylite.core.node import events, snapshot
    spec = SimpleNamespace(kind="task", actor_id=None)
    worker = SimpleNamespace(index=1, pid=None, task=spec, ahead=())
    rec = events.TaskEvent(spec, 0.0)
    rec.proc = worker
    node = SimpleNamespace(actors={}, workers={1: worker})
    assert snapshot.task_state(node, rec, set()) == events.SUBMITTED_TO_WORKER
    worker.pid = 4242   # the hello is read
    assert snapshot.task_state(node, rec, set()) == events.RUNNING
