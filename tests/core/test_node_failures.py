"""The node manager's failures flow to its callers (issue 26, item 3): a command's error goes back
to its own caller without skipping anyone else's, and a bug in the node's loop breaks the runtime
loudly: every blocked caller wakes with the cause, new work is refused, shutdown still cleans up.
White-box: these reach into the local node to queue a command or inject a handler's bug."""
import glob
import os
import threading

import pytest

import raylite as ray

pytestmark = pytest.mark.local_only("white-box: the local node manager's commands and handlers")


def _raise(error: BaseException):
    raise error


def _in_thread(fn):
    """Run fn in a daemon thread; returns (thread, box) where box gets ("ok", value) or ("error", e)."""
    box = []

    def run():
        try:
            box.append(("ok", fn()))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box.append(("error", e))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def test_a_command_that_raises_goes_back_to_its_caller_and_the_next_still_runs(ray_start, capfd):
    from raylite.core.api import runtime as api
    node = api._node

    with pytest.raises(ValueError, match="the caller's own"):
        node.call_sync(_raise, ValueError("the caller's own"))

    # a command queued while the node was busy, whose caller did not wait: it fails first, and
    # the next caller's own work (run in that caller's thread) must still run and answer
    with node.shared.lock:
        node.shared.commands.append((_raise, (KeyError("queued earlier"),)))
    thread, box = _in_thread(lambda: node.call_sync(lambda: "answered"))
    thread.join(15)
    assert box == [("ok", "answered")], "the next caller's command was skipped"
    err = capfd.readouterr().err
    assert "a node command failed" in err and "queued earlier" in err
    assert "broken" not in err

    @ray.remote
    def one():
        return 1

    assert ray.get(one.remote()) == 1   # a command's error leaves the runtime working


@pytest.mark.parametrize("tasks", [1, 2], ids=["in-the-getting-thread", "in-the-node-thread"])
def test_a_bug_in_the_node_loop_fails_waiters_refuses_work_and_shutdown_cleans_up(ray_start, tmp_path, capfd, tasks,
                                                                                   wait_until, wait_pids_gone):
    """One task: the blocked get serves its worker's socket itself (raylite.core.node.reader), so the bug
    hits in the getting thread; two tasks on two workers: the node thread serves them."""
    from raylite.core.api import runtime as api
    from raylite.core.wire import protocol
    node = api._node
    fifos = [str(tmp_path / f"gate{i}") for i in range(tasks)]
    for fifo in fifos:
        os.mkfifo(fifo)

    @ray.remote
    def gated(path):
        with open(path) as f:   # returns once the test opens the other end
            return f.read()

    def done_with_a_bug(*_args):
        raise RuntimeError("injected bug in the done handler")

    node.shared.handlers[protocol.DONE] = done_with_a_bug   # the handler for a worker's "task done"

    refs = [gated.remote(fifo) for fifo in fifos]
    wait_until(lambda: sum(w.task is not None and w.index not in node.shared.unsent for w in node.workers.values()) == tasks,
               what="the tasks running")
    thread, box = _in_thread(lambda: ray.get(refs))
    wait_until(lambda: all(node.table.objects[ref.id].waiters for ref in refs) and (tasks == 2 or node.shared.readers),
               what="the get blocked")
    assert bool(node.shared.readers) == (tasks == 1)
    pids = [w.pid for w in node.workers.values() if w.pid is not None]
    for fifo in fifos:
        with open(fifo, "w") as f:   # the task returns; its "done" message hits the bug
            f.write("go")
    thread.join(15)
    assert box, "the blocked get was never woken"
    kind, error = box[0]
    assert kind == "error" and isinstance(error, ray.exceptions.RaySystemError), box
    assert isinstance(error.__cause__, RuntimeError) and "injected bug" in str(error.__cause__)
    assert "broken" in str(error)

    with pytest.raises(ray.exceptions.RaySystemError, match="broken") as refused:
        gated.remote(fifos[0])
    assert "injected bug" in str(refused.value.__cause__)
    err = capfd.readouterr().err
    assert err.count("internal error in the node manager") == 1, err

    wait_pids_gone(pids, what="workers of a broken node (their socket ends: they exit)")
    prefix = node.shm_prefix
    ray.shutdown()
    assert not glob.glob(f"/dev/shm/{prefix}*")
    assert not node.shared.thread.is_alive()

    ray.init(num_cpus=1)   # a new runtime after shutdown works

    @ray.remote
    def one():
        return 1

    assert ray.get(one.remote()) == 1
