"""breakpoint() inside a task (Ray's debugger docs): the worker waits in pdb for a debugger, which
attaches from a terminal with `python -m raylite.util.rpdb` and lets the task go on."""
import os
import subprocess
import sys

import pytest

import raylite as ray
from raylite.util import rpdb

@pytest.fixture(autouse=True)
def _python_decides_no_hook(monkeypatch):
    """The tests are about raylite's own session: a PYTHONBREAKPOINT in the driver's environment
    (workers inherit it; Ray's init sets it and never takes it back) would hand breakpoint() to
    Python's hook instead."""
    monkeypatch.delenv("PYTHONBREAKPOINT", raising=False)


def _waiting_in(task_name: str) -> list[tuple[int, str]]:
    """(pid, socket) of the breakpoint the running task waits in: this session's, not another
    test run's on the same machine (the sockets' directory is the user's)."""
    from raylite.util.state import list_tasks
    pids = {t.worker_pid for t in list_tasks(filters=[("name", "=", task_name)], detail=True)}
    return [(pid, path) for pid, path in rpdb.waiting().items() if pid in pids]


ON_RAYS_WORKERS = ("breakpoint() and RAY_DEBUG_POST_MORTEM in a Ray worker open Ray's own debugger (`ray debug`); "
                   "raylite.util.rpdb serves the local runtime's workers")


@pytest.mark.local_only(ON_RAYS_WORKERS)
def test_breakpoint_in_a_task_waits_for_the_debugger_cli(ray_start, wait_until):
    @ray.remote
    def answer():
        x = 41
        breakpoint()
        return x + 1

    ref = answer.remote()
    [(pid, path)] = wait_until(lambda: _waiting_in("answer"), timeout=20)
    assert oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == "0o700"   # only this user gets in
    assert ray.wait([ref], timeout=0.2)[0] == []   # it waits for the debugger
    cli = subprocess.run([sys.executable, "-m", "raylite.util.rpdb", str(pid)], input="p x\nx = 100\nc\n",
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert "-> return x + 1" in cli.stdout and "41" in cli.stdout
    assert ray.get(ref, timeout=20) == 101   # the session changed x, then the task went on
    assert pid not in rpdb.waiting()


def test_the_cli_says_when_nothing_waits():
    cli = subprocess.run([sys.executable, "-m", "raylite.util.rpdb", "999999"], capture_output=True, text=True,
                         timeout=60)
    assert cli.returncode == 1 and "no breakpoint waits in pid 999999" in cli.stderr


@pytest.mark.local_only(ON_RAYS_WORKERS)
def test_post_mortem_lets_a_debugger_look_at_a_failed_task_first(ray_start, wait_until):
    @ray.remote(runtime_env={"env_vars": {"RAY_DEBUG_POST_MORTEM": "1"}})
    def broken():
        secret = 7
        raise ValueError(f"broken with {secret}")

    ref = broken.remote()
    [(pid, _)] = wait_until(lambda: _waiting_in("broken"), timeout=20)
    cli = subprocess.run([sys.executable, "-m", "raylite.util.rpdb", str(pid)], input="p secret\nc\n",
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert "7" in cli.stdout and "ValueError" in cli.stdout
    try:
        ray.get(ref, timeout=20)
    except ValueError as e:   # then the error reaches the caller as usual
        assert "broken with 7" in str(e)
    else:
        raise AssertionError("the task's error was lost")
