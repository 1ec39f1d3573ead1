"""Ray's state API (``ray.util.state``) and ``ray.timeline()`` on the local runtime.

Tasks, actor creations and actor calls are listed with Ray's states, types and error types;
filters, limits and detail behave as Ray's; actors show their death cause; the calls work from
inside tasks and actors; the timeline is Chrome trace events; the task record stays bounded.
"""
from __future__ import annotations

import gc
import json
import os
import time
import types

import pytest

import raylite as ray
from raylite import exceptions
from raylite.core.node import events
from raylite.util.state import (RayStateApiException, get_actor, get_task, list_actors, list_nodes, list_objects,
                                list_placement_groups, list_tasks, list_workers, summarize_actors, summarize_tasks)

STATE_API = ("ray.util.state on Ray asks Ray's dashboard, which the test clusters do not start "
             "(init(backend='ray', include_dashboard=True) does)")


def _named(name: str, **kw) -> list:
    return list_tasks(filters=[("name", "=", name)], **kw)


def _wait_for(what, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < deadline, "state not reached in time"
        time.sleep(0.02)
    return found


# --------------------------------------------------------------------------
# tasks
# --------------------------------------------------------------------------


@pytest.mark.local_only(STATE_API)
def test_tasks_are_listed_with_state_name_worker_and_error_type(ray_start):
    @ray.remote
    def fine(x):
        return os.getpid()

    @ray.remote(max_retries=0)
    def broken():
        raise ValueError("boom")

    @ray.remote
    def stuck():
        time.sleep(60)

    pid = ray.get(fine.remote(1))
    with pytest.raises(ValueError):
        ray.get(broken.remote())
    ref = stuck.remote()

    [done] = _named("fine")
    assert (done.state, done.type, done.func_or_class_name) == ("FINISHED", "NORMAL_TASK", "fine")
    assert done.worker_pid == pid and done.error_type is None and done.attempt_number == 0
    assert done["state"] == done.get("state") == "FINISHED"   # dict-style access, as Ray's records

    [failed] = _named("broken", detail=True)
    assert (failed.state, failed.error_type) == ("FAILED", "TASK_EXECUTION_EXCEPTION")
    assert "ValueError: boom" in failed.error_message
    assert failed.start_time_ms <= failed.end_time_ms

    running = _wait_for(lambda: [t for t in _named("stuck") if t.state == "RUNNING"])
    assert isinstance(running[0].worker_pid, int) and running[0].worker_pid > 0
    ray.cancel(ref, force=True)
    with pytest.raises(exceptions.TaskCancelledError):
        ray.get(ref, timeout=30)
    [cancelled] = _named("stuck")
    assert (cancelled.state, cancelled.error_type) == ("FAILED", "TASK_CANCELLED")


@pytest.mark.local_only(STATE_API)
def test_pending_and_crashed_tasks(ray_start, tmp_path):
    @ray.remote(num_cpus=2)
    def hog(path):
        while not os.path.exists(path):
            time.sleep(0.01)

    @ray.remote(num_cpus=2, max_retries=1)
    def dies_once(path):
        if not os.path.exists(path):
            open(path, "w").close()
            os._exit(1)
        return "second try"

    @ray.remote(num_cpus=1, max_retries=0)
    def dies():
        os._exit(1)

    go = str(tmp_path / "go")
    hogging = hog.remote(go)
    waiting = dies.remote()
    _wait_for(lambda: [t for t in _named("hog") if t.state == "RUNNING"])
    assert [t.state for t in _named("dies")] == ["PENDING_NODE_ASSIGNMENT"]
    open(go, "w").close()
    ray.get(hogging)
    with pytest.raises(exceptions.WorkerCrashedError):
        ray.get(waiting, timeout=30)
    assert [(t.state, t.error_type) for t in _named("dies")] == [("FAILED", "WORKER_DIED")]

    assert ray.get(dies_once.remote(str(tmp_path / "once")), timeout=30) == "second try"
    [retried] = _named("dies_once")
    assert (retried.state, retried.attempt_number) == ("FINISHED", 1)


@pytest.mark.local_only(STATE_API)
def test_filters_limit_and_detail(ray_start):
    @ray.remote
    def square(x):
        return x * x

    @ray.remote
    def cube(x):
        return x ** 3

    ray.get([square.remote(i) for i in range(5)] + [cube.remote(i) for i in range(3)])
    assert len(_named("square")) == 5
    assert len(list_tasks(filters=[("name", "=", "square")], limit=2)) == 2
    assert len(list_tasks(filters=[("name", "!=", "square"), ("type", "=", "normal_task")])) == 3
    assert len(list_tasks(filters=[("state", "=", "finished"), ("func_or_class_name", "=", "CUBE")])) == 3
    assert list_tasks(filters=[("name", "=", "cube"), ("name", "!=", "cube")]) == []
    assert all(t.worker_pid == int(str(t.worker_pid)) for t in list_tasks(filters=[("worker_pid", "!=", "0")]))

    brief, full = _named("cube")[0], _named("cube", detail=True)[0]
    assert brief.required_resources is None and brief.creation_time_ms is None
    assert full.required_resources == {"CPU": 1.0}
    assert [e["state"] for e in full.events] == ["PENDING_ARGS_AVAIL", "RUNNING", "FINISHED"]
    assert full.task_id == brief.task_id and full.asdict()["name"] == "cube"


@pytest.mark.local_only(STATE_API)
def test_bad_filters_are_clear_errors(ray_start):
    with pytest.raises(ValueError, match="'colour' is not supported.*Supported filter columns: .*state"):
        list_tasks(filters=[("colour", "=", "red")])
    with pytest.raises(ValueError, match="predicate '>'.*=, !="):
        list_actors(filters=[("state", ">", "ALIVE")])
    with pytest.raises(ValueError, match="\\(key, predicate, value\\)"):
        list_tasks(filters=[("state", "FINISHED")])
    with pytest.raises(ValueError, match="'error_message' is not supported"):   # a column, but not filterable
        list_tasks(filters=[("error_message", "=", "x")])


@pytest.mark.local_only(STATE_API)
def test_get_task_by_id_and_by_ref(ray_start):
    @ray.remote
    def whoami():
        return ray.get_runtime_context().get_task_id()

    ref = whoami.remote()
    task_id = ray.get(ref)
    by_id, by_ref = get_task(task_id), get_task(ref)
    assert by_id == by_ref and by_id.task_id == task_id and by_id.state == "FINISHED"
    assert by_id.start_time_ms is not None   # get_task gives the detail columns, as Ray's
    assert get_task("f" * 28) is None


@pytest.mark.local_only(STATE_API)
def test_summarize_tasks_counts_per_name_and_state(ray_start):
    @ray.remote(max_retries=0)
    def flaky(fail):
        if fail:
            raise RuntimeError("no")

    refs = [flaky.remote(i % 2 == 0) for i in range(4)]
    ray.wait(refs, num_returns=4, timeout=30)
    summary = summarize_tasks()["cluster"]
    assert summary["summary"]["flaky"] == {"func_or_class_name": "flaky", "type": "NORMAL_TASK",
                                           "state_counts": {"FAILED": 2, "FINISHED": 2}}
    assert summary["total_tasks"] == 4 and summary["summary_by"] == "func_name"


# --------------------------------------------------------------------------
# actors
# --------------------------------------------------------------------------


@ray.remote
class Sleeper:
    def nap(self, seconds):
        time.sleep(seconds)
        return ray.get_runtime_context().get_actor_id()


@pytest.mark.local_only(STATE_API)
def test_actors_alive_and_dead_with_death_cause(ray_start):
    named = Sleeper.options(name="napper").remote()
    doomed = Sleeper.remote()
    named_id = ray.get(named.nap.remote(0))
    doomed_id = ray.get(doomed.nap.remote(0))
    ray.kill(doomed)
    _wait_for(lambda: get_actor(doomed_id).state == "DEAD")

    alive = get_actor(named_id)
    assert (alive.state, alive.class_name, alive.name) == ("ALIVE", "Sleeper", "napper")
    assert alive.pid > 0 and alive.death_cause is None
    dead = get_actor(doomed_id)
    context = dead.death_cause["actor_died_error_context"]
    assert context["reason"] == "RAY_KILL" and context["class_name"] == "Sleeper"
    assert [a.actor_id for a in list_actors(filters=[("state", "=", "DEAD")])] == [doomed_id]

    del doomed   # the record outlives the last handle
    assert [a.state for a in list_actors(filters=[("actor_id", "=", doomed_id)])] == ["DEAD"]
    assert summarize_actors()["cluster"]["summary"]["Sleeper"]["state_counts"] == {"ALIVE": 1, "DEAD": 1}
    creations = list_tasks(filters=[("type", "=", "ACTOR_CREATION_TASK")])
    assert {t.name for t in creations} == {"Sleeper.__init__"} and len(creations) == 2


@pytest.mark.local_only(STATE_API)
def test_failed_constructor_is_the_death_cause(ray_start):
    @ray.remote
    class Broken:
        def __init__(self):
            raise KeyError("no config")

        def ping(self):
            return 1

    broken = Broken.remote()
    with pytest.raises(exceptions.ActorDiedError):
        ray.get(broken.ping.remote(), timeout=30)
    [actor] = _wait_for(lambda: list_actors(filters=[("class_name", "=", "Broken"), ("state", "=", "DEAD")],
                                            detail=True))
    assert "no config" in actor.death_cause["creation_task_failure_context"]["formatted_exception_string"]
    [creation] = _named("Broken.__init__")
    assert (creation.state, creation.error_type) == ("FAILED", "TASK_EXECUTION_EXCEPTION")


@pytest.mark.local_only(STATE_API)
def test_calls_on_a_one_at_a_time_actor_run_in_turn(ray_start, tmp_path):
    @ray.remote
    class Gate:
        def wait(self, path):
            while not os.path.exists(path):
                time.sleep(0.01)

    gate, go = Gate.remote(), str(tmp_path / "go")
    refs = [gate.wait.remote(go) for _ in range(3)]
    states = _wait_for(lambda: [t.state for t in _named("Gate.wait")
                                if any(t.state == "RUNNING" for t in _named("Gate.wait"))])
    assert sorted(states) == ["RUNNING", "SUBMITTED_TO_WORKER", "SUBMITTED_TO_WORKER"]
    seen_running = time.time()   # the first call was running then, and runs until the gate opens
    open(go, "w").close()
    ray.get(refs, timeout=30)
    calls = sorted((e for e in ray.timeline() if e["name"] == "Gate.wait"), key=lambda e: e["ts"])
    assert len(calls) == 3 and calls[0]["ts"] <= seen_running * 1e6 <= calls[0]["ts"] + calls[0]["dur"]
    for before, after in zip(calls, calls[1:]):   # in turn, not overlapping
        assert before["ts"] + before["dur"] <= after["ts"] + 1


# --------------------------------------------------------------------------
# other tables, nested use, timeline
# --------------------------------------------------------------------------


@pytest.mark.local_only(STATE_API)
def test_objects_workers_nodes_and_placement_groups(ray_start):
    np = pytest.importorskip("numpy")
    ref = ray.put(np.zeros(2_000_000 // 8))
    [obj] = list_objects(filters=[("object_id", "=", ref.hex())])
    assert obj.object_size >= 2_000_000 and obj.reference_count == 1 and obj.task_status == "FINISHED"

    @ray.remote
    def pid():
        return os.getpid()

    worker_pid = ray.get(pid.remote())
    workers = list_workers()
    assert {(w.worker_type, w.pid) for w in workers} >= {("DRIVER", os.getpid()), ("WORKER", worker_pid)}
    [node] = list_nodes()
    assert node.state == "ALIVE" and node.node_id == ray.get_runtime_context().get_node_id()
    assert node.resources_total["CPU"] == 2.0

    group = ray.util.placement_group([{"CPU": 1}], name="pg_state")
    ray.get(group.ready(), timeout=30)
    [row] = list_placement_groups(filters=[("name", "=", "pg_state")], detail=True)
    assert row.state == "CREATED" and row.bundles[0]["unit_resources"] == {"CPU": 1.0}
    ray.util.remove_placement_group(group)


@pytest.mark.local_only(STATE_API)
def test_state_api_from_inside_a_task_and_an_actor(ray_start):
    @ray.remote
    def inner():
        return 1

    @ray.remote
    def outer():
        ray.get([inner.remote() for _ in range(3)])
        mine = ray.get_runtime_context().get_task_id()
        states = {t.task_id: t.state for t in list_tasks(filters=[("name", "!=", "no such task")])}
        return states[mine], len(ray.util.state.list_tasks(filters=[("name", "=", "inner")]))

    @ray.remote
    class Inspector:
        def actors(self):
            return [(a.class_name, a.state) for a in list_actors()]

    assert ray.get(outer.remote(), timeout=30) == ("RUNNING", 3)
    assert ray.get(Inspector.remote().actors.remote(), timeout=30) == [("Inspector", "ALIVE")]


def test_timeline_returns_and_writes_trace_events(ray_start, tmp_path):
    @ray.remote
    def work(seconds):
        time.sleep(seconds)

    before = time.time()
    ray.get([work.remote(0.05) for _ in range(4)])

    def traced():   # (Ray reports its task events every second or so: they come, not at once)
        trace = ray.timeline()
        return trace if len([e for e in trace if e["cat"] == "task::work"]) == 4 else None
    trace = _wait_for(traced)
    ran = [e for e in trace if e["cat"] == "task::work"]
    for event in ran:   # (Ray's name is the function's qualified name: module.<locals>.work)
        assert event["ph"] == "X" and event["name"].rpartition(".")[2] == "work" and event["args"]["task_id"]
        assert event["dur"] >= 0.04e6 and event["ts"] >= before * 1e6
        assert event["tid"].startswith("worker:")
    path = tmp_path / "trace.json"
    assert ray.timeline(filename=str(path)) is None
    assert json.loads(path.read_text()) == json.loads(json.dumps(trace))


def test_timeline_needs_a_runtime():
    with pytest.raises(RuntimeError, match="initialized"):
        ray.timeline()


# --------------------------------------------------------------------------
# the bound
# --------------------------------------------------------------------------


@pytest.mark.local_only(STATE_API)
def test_the_task_record_is_bounded(ray_init, monkeypatch):
    monkeypatch.setenv(events.LIMIT_ENV, "5")
    ray_init()

    @ray.remote
    def tick(i):
        return i

    ray.get([tick.remote(i) for i in range(20)])
    with pytest.raises(RayStateApiException, match="20 tasks.*15 finished ones were dropped"):
        list_tasks()
    with pytest.raises(RayStateApiException):
        summarize_tasks()
    kept = list_tasks(raise_on_missing_output=False)
    assert len(kept) == 5 and all(t.state == "FINISHED" for t in kept)
    assert sorted(int(t.task_id, 16) for t in kept) == [int(t.task_id, 16) for t in kept]   # newest kept
    assert len(ray.timeline()) == 5


def test_records_drop_oldest_finished_and_keep_unfinished():
    record = events.TaskEvents(limit=100)
    specs = [types.SimpleNamespace(task_id=i, kind="task", name="t", actor_id=0, actor_name=None, return_ids=(i,),
                                   request={"CPU": 10000}, placement=None, deps=()) for i in range(1000)]
    worker = types.SimpleNamespace(index=1, pid=1234, ahead=())
    done = types.SimpleNamespace(is_error=False)
    for spec in specs:
        record.submitted(spec)
        record.sent(spec, worker)
    for spec in specs[:-3]:
        record.logged(spec, 1234, (0, spec.task_id, 0, 0))
        record.finished(spec, [done])
    record.settle()   # (the node does at the end of its locked sections, and before any reading)
    assert len(record.done) == 100 and record.dropped == 897 and len(record.live) == 3
    kept = record.records()
    assert [r.facts().task_id for r in kept] == list(range(897, 1000))
    finished = kept[-4]
    assert finished.worker_pid() == (1, 1234) and finished.state == "FINISHED"
    assert finished.facts().request == {"CPU": 10000} and finished.log["stdout_end"] == 996
    assert not hasattr(finished.facts(), "args")   # a finished task's arguments are not kept
    assert all(r.proc is worker and r.state is None for r in record.live.values())
    gc.collect()
    gc.collect()   # (a tuple is untracked on a pass that finds its items untracked)
    assert not any(gc.is_tracked(r) for r in record.done)   # plain values: collections skip them


# --------------------------------------------------------------------------
# the Ray backend
# --------------------------------------------------------------------------


def test_on_the_ray_backend_the_calls_are_rays(monkeypatch):
    from raylite.core.client.link import process
    calls = []
    rays_state = types.SimpleNamespace(
        list_tasks=lambda *args: calls.append(("list_tasks", args)) or ["ray's"],
        get_actor=lambda *args: calls.append(("get_actor", args)) or "ray's actor")
    fake_ray = types.SimpleNamespace(state_api=lambda: rays_state, is_initialized=lambda: True,
                                     timeline=lambda filename: calls.append(("timeline", filename)) or [])
    monkeypatch.setattr(process, "ray", fake_ray)
    assert list_tasks(filters=[("state", "=", "RUNNING")], limit=7) == ["ray's"]
    assert get_actor("ab") == "ray's actor"
    assert ray.timeline("t.json") == []
    assert calls == [("list_tasks", (None, [("state", "=", "RUNNING")], 7, 30, False, True, False)),
                     ("get_actor", ("ab", None, 30, False)), ("timeline", "t.json")]


@pytest.mark.local_only(STATE_API)
def test_an_async_actors_overlapping_calls_run_together(ray_start):
    @ray.remote
    class Napper:
        async def nap(self, seconds):
            import asyncio
            await asyncio.sleep(seconds)
            return seconds

    napper = Napper.remote()
    refs = [napper.nap.remote(0.5) for _ in range(3)]
    _wait_for(lambda: [t.state for t in _named("Napper.nap")] == ["RUNNING"] * 3)
    ray.get(refs)
    naps = [e for e in ray.timeline() if e["name"] == "Napper.nap"]
    first_end = min(e["ts"] + e["dur"] for e in naps)
    assert len(naps) == 3 and all(e["ts"] < first_end for e in naps)   # drawn side by side


def test_rays_submodule_imports_give_the_same_names():
    """Code written for Ray imports from the submodules too (`ray.util.state.exception`, ...)."""
    import raylite.util.state as state
    from raylite.util.state.api import list_tasks, summarize_tasks
    from raylite.util.state.common import TaskState, WorkerState
    from raylite.util.state.exception import RayStateApiException as Raised
    assert (list_tasks, summarize_tasks, TaskState, WorkerState, Raised) == (
        state.list_tasks, state.summarize_tasks, state.TaskState, state.WorkerState, RayStateApiException)
