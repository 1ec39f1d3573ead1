"""Tiny tasks sent ahead to a busy worker, several at a time (raylite.core.node.lines.TaskLines._prefetch),
and the worker's results coming back several per write: what each task sees stays as if they
went one by one (cancel, retries, a worker's death, fail-fast get).

Each test holds the worker busy on a task waiting for a gate file, queues tasks behind it and
checks, on the node, that they went ahead to that worker before it opens the gate."""
import os
import sys
import time

import numpy as np
import pytest

import raylite as ray
from raylite import exceptions
from raylite.core.node.lines import PREFETCH_MAX
from raylite.core.client.link import process

pytestmark = [pytest.mark.local_only("white-box: the node's tasks sent ahead to a worker"),
              pytest.mark.parametrize("ray_start", [1], indirect=True)]


@ray.remote
def step(i, gate="", kill=False, fail_once=""):
    """i, once `gate` exists; `kill` ends the worker there; `fail_once` raises the first time."""
    while gate and not os.path.exists(gate):
        time.sleep(0.005)
    if kill:
        os._exit(1)
    if fail_once and not os.path.exists(fail_once):
        open(fail_once, "w").close()
        raise ValueError("first try")
    return i


def _node():
    return process.client.node


def _short(fn) -> None:
    """Let the node take fn as tiny from now on (its estimate otherwise depends on the machine's speed)."""
    _node().call_sync(_node().shared.fn_time.__setitem__, fn._fn_id, 1e-5)


def _busy_with_a_line(tmp_path, n, kill: bool = False, **options):
    """A worker running a task that waits for the gate (and then ends the worker, with `kill`),
    and n tasks (or one per tuple of arguments in n) sent ahead to it (up to half the most a
    line holds; the rest may wait in the node's queue); returns (the gate, the
    waiting task's ref, the n refs)."""
    calls = [(i,) for i in range(n)] if isinstance(n, int) else n
    ray.get([step.remote(i) for i in range(3)])   # the worker is up and has run the function
    gate = str(tmp_path / "gate")
    first = step.options(**options).remote(-1, gate, kill)
    _short(step)
    refs = [step.options(**options).remote(*args) for args in calls]
    node = _node()

    def lined_up():
        workers = [w for w in node.workers.values() if w.task is not None]
        # (a line is topped up once half gone: beyond half of the most, the rest may stay queued)
        return len(workers) == 1 and len(workers[0].ahead) >= min(len(calls), PREFETCH_MAX // 2)
    wait = 0
    while not node.call_sync(lined_up):
        assert wait < 1500, "the tasks never went ahead to the busy worker"
        time.sleep(0.01)
        wait += 1
    return gate, first, refs


def test_tiny_tasks_go_ahead_to_a_busy_worker_several_at_once(ray_start, tmp_path):
    gate, first, refs = _busy_with_a_line(tmp_path, 10)
    open(gate, "w").close()
    assert ray.get(first) == -1
    assert ray.get(refs) == list(range(10))


def test_a_task_cancelled_in_a_workers_line_ends_cancelled(ray_start, tmp_path):
    gate, first, refs = _busy_with_a_line(tmp_path, 6)
    ray.cancel(refs[3])
    open(gate, "w").close()
    with pytest.raises(exceptions.TaskCancelledError):
        ray.get(refs[3])
    assert [ray.get(r) for r in refs[:3] + refs[4:]] == [0, 1, 2, 4, 5]


def test_tasks_in_the_line_of_a_worker_that_died_run_again_and_never_count_it_as_a_try(ray_start, tmp_path):
    """They never began: max_retries=0 does not fail them; the task that ended the worker fails."""
    gate, first, refs = _busy_with_a_line(tmp_path, 6, max_retries=0, kill=True)
    open(gate, "w").close()
    with pytest.raises(exceptions.WorkerCrashedError):
        ray.get(first)
    assert ray.get(refs) == list(range(6))


def test_results_a_dead_worker_held_back_are_retried(ray_start, tmp_path):
    """Tasks done before a task of the line ended the worker may have their results still held
    there: those tasks run again (they may: max_retries), and each gets its value once."""
    ray.get([step.remote(i) for i in range(3)])
    gate = str(tmp_path / "gate")
    _short(step)
    refs = [step.options(max_retries=1).remote(i) for i in range(5)]
    killer = step.options(max_retries=0).remote(-1, gate, True)
    tail = [step.options(max_retries=0).remote(i) for i in range(5, 8)]
    open(gate, "w").close()
    with pytest.raises(exceptions.WorkerCrashedError):
        ray.get(killer)
    assert ray.get(refs + tail) == list(range(8))


def test_a_task_retried_on_its_exception_inside_a_line_gets_its_value(ray_start, tmp_path):
    marker = str(tmp_path / "failed")
    gate, first, line = _busy_with_a_line(tmp_path, [(i, "", False, marker if i == 2 else "") for i in range(5)],
                                          retry_exceptions=True)
    open(gate, "w").close()
    assert ray.get(line) == list(range(5))
    assert os.path.exists(marker)


def test_get_fails_fast_on_an_error_in_a_line_while_a_later_task_still_runs(ray_start, tmp_path):
    last_gate, marker = str(tmp_path / "last"), str(tmp_path / "failed")
    gate, first, line = _busy_with_a_line(tmp_path, [(0,), (1, "", False, marker), (2, last_gate)])
    open(gate, "w").close()
    with pytest.raises(exceptions.RayTaskError, match="first try"):
        ray.get(line, timeout=30)
    assert ray.wait([line[2]], timeout=0)[0] == []   # the get did not wait for the last task
    open(last_gate, "w").close()
    assert ray.get(line[2]) == 2


@ray.remote
def probe(gate=""):
    """What this task sees: its env var RL_PROBE and its own task id, once `gate` exists."""
    while gate and not os.path.exists(gate):
        time.sleep(0.005)
    return os.environ.get("RL_PROBE"), ray.get_runtime_context().get_task_id()


def test_a_task_with_another_runtime_env_never_goes_ahead_in_a_line(ray_start, tmp_path):
    """A call with its own runtime_env queued right behind plain calls runs in a worker set up for it."""
    ray.get([probe.remote() for _ in range(3)])
    node = _node()
    node.call_sync(node.shared.fn_time.__setitem__, probe._fn_id, 1.0)   # nothing goes ahead while they queue
    gate = str(tmp_path / "gate")
    first = probe.remote(gate)
    plain = probe.remote()
    own = probe.options(runtime_env={"env_vars": {"RL_PROBE": "own"}}).remote()
    _short(probe)
    last = probe.remote()   # the node looks at the queue again: now the calls are tiny
    open(gate, "w").close()
    assert ray.get(own)[0] == "own"
    assert ray.get(plain)[0] is None and ray.get(last)[0] is None and ray.get(first)[0] is None


def test_a_result_held_back_comes_while_the_next_task_of_the_line_runs_long(ray_start, tmp_path):
    """A worker holds a tiny task's result back for the next one's only for ~2 ms: a call of the
    same function that runs long (here: waits for a gate) must not keep the results before it."""
    last_gate = str(tmp_path / "last")
    gate, first, line = _busy_with_a_line(tmp_path, [(0,), (1,), (2, last_gate)])
    open(gate, "w").close()
    try:
        assert ray.get(line[:2], timeout=1.5) == [0, 1]
        assert ray.wait([line[2]], timeout=0)[0] == []
    finally:
        open(last_gate, "w").close()
    assert ray.get(line[2]) == 2


def test_the_state_api_shows_tasks_in_a_line_as_submitted_to_the_worker(ray_start, tmp_path):
    """As Ray's SUBMITTED_TO_WORKER: on a worker, not running yet (only the task before runs)."""
    from raylite.util import state
    gate, first, refs = _busy_with_a_line(tmp_path, 4)
    try:
        rows = {r["task_id"]: r["state"] for r in state.list_tasks(filters=[("name", "=", "step")])}
        lined = _node().call_sync(lambda: [f"{s.task_id:028x}" for w in _node().workers.values() for s in w.ahead])
        assert lined and {rows[t] for t in lined} == {"SUBMITTED_TO_WORKER"}
        assert list(rows.values()).count("RUNNING") == 1
    finally:
        open(gate, "w").close()
    assert ray.get(refs) == list(range(4))


@ray.remote
def kinds(i, mode="", gate=""):
    """A tiny task of one kind or another (a large array, an exception, a nested get, an exit),
    once `gate` exists."""
    while gate and not os.path.exists(gate):
        time.sleep(0.005)
    if mode == "big":
        return np.full(300_000, i, dtype=np.int64)   # in shared memory
    if mode == "raise":
        raise KeyError(i)
    if mode == "nested":
        return ray.get(kinds.remote(i + 100))   # gives the line back: its call may be queued behind
    if mode == "exit":
        sys.exit(3)
    return i


def test_a_line_of_tasks_of_every_kind_gives_each_its_own_outcome(ray_start, tmp_path):
    ray.get([kinds.remote(i) for i in range(3)])
    node = _node()
    node.call_sync(node.shared.fn_time.__setitem__, kinds._fn_id, 1.0)   # they all queue first
    gate = str(tmp_path / "gate")
    first = kinds.remote(-1, "", gate)
    modes = ["", "big", "raise", "nested", "", "exit", ""]
    refs = [kinds.remote(i, mode) for i, mode in enumerate(modes[:-1])]
    _short(kinds)
    refs.append(kinds.remote(6))   # the node looks at the queue again: they go ahead
    lined = node.call_sync(lambda: max(len(w.ahead) for w in node.workers.values()))
    open(gate, "w").close()
    assert lined == len(modes)
    assert ray.get(first) == -1
    assert ray.get(refs[0]) == 0 and (ray.get(refs[1]) == 1).all()
    with pytest.raises(KeyError):
        ray.get(refs[2])
    assert ray.get(refs[3]) == 103 and ray.get(refs[4]) == 4
    with pytest.raises(exceptions.RayError):
        ray.get(refs[5], timeout=30)
    assert ray.get(refs[6], timeout=30) == 6


def test_calls_of_a_line_that_differ_only_in_plain_arguments_go_in_one_message(ray_start, tmp_path, monkeypatch):
    """A line's calls with the same options and no ref or large arguments go as one RUN_LINE (its
    shared fields pickled once); a ref argument, a large array or other options go in RUNs of
    their own between them, and each call still gets its own arguments, in order."""
    from raylite.core.wire import protocol
    node = _node()
    kinds_sent = []
    send = node.loop.send

    def recording(w, msg):
        kinds_sent.append((msg[0], len(msg[-1]) if msg[0] == protocol.RUN_LINE else 1))
        send(w, msg)
    monkeypatch.setattr(node.loop, "send", recording)
    ray.get([step.remote(i) for i in range(3)])
    node.call_sync(node.shared.fn_time.__setitem__, step._fn_id, 1.0)   # they all queue first
    gate = str(tmp_path / "gate")
    first = step.remote(-1, gate)
    big = np.arange(300_000)
    args = [(0,), (1,), (ray.put(2),), (3,), (4,), (big,), (6,)]
    refs = [step.remote(*a) for a in args[:-1]] + [step.options(name="other").remote(*args[-1])]
    kinds_sent.clear()
    _short(step)
    refs.append(step.remote(7))   # the node looks at the queue again: they go ahead
    lined = node.call_sync(lambda: max(len(w.ahead) for w in node.workers.values()))
    open(gate, "w").close()
    assert lined == 8 and ray.get(first) == -1
    values = ray.get(refs)
    assert values[:5] == [0, 1, 2, 3, 4] and (values[5] == big).all() and values[6:] == [6, 7]
    assert kinds_sent[:5] == [(protocol.RUN_LINE, 2), (protocol.RUN, 1), (protocol.RUN_LINE, 2), (protocol.RUN, 1),
                              (protocol.RUN, 1)], kinds_sent


def test_a_task_queued_behind_others_that_cannot_start_costs_no_scheduling_pass(ray_start, tmp_path, monkeypatch):
    """A burst of submits while the CPU is taken: the first one queues and looks for a worker;
    each one after only joins that queue behind it, so no scheduling pass runs for it (it would
    find nothing to do). Once the CPU is free they all run, in order."""
    node = _node()
    ray.get([step.remote(i) for i in range(3)])
    node.call_sync(node.shared.fn_time.__setitem__, step._fn_id, 1.0)   # not tiny: nothing goes ahead
    gate = str(tmp_path / "gate")
    first = step.remote(-1, gate)
    passes = []
    schedule = node.scheduler.schedule
    monkeypatch.setattr(node.scheduler, "schedule", lambda: (passes.append(1), schedule())[1])
    node.call_sync(lambda: None)   # (a pass of its own, while the first task runs)
    passes.clear()
    refs = [step.remote(i) for i in range(100)]
    queued = node.call_sync(lambda: sum(len(q) for q in node.shared.queues.values()))
    # the first submit's pass and the call_sync's; a few more where the node thread happened to
    # serve something else meanwhile (a worker's message, a timer): a pass per submit would be 100
    assert queued == 100 and len(passes) <= 6, passes
    open(gate, "w").close()
    assert ray.get(first) == -1 and ray.get(refs) == list(range(100))
