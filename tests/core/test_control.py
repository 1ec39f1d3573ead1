"""The control endpoint (raylite.core.api.control) and the `raylite` CLI against live drivers:
a driver in a subprocess running tasks and an actor, and drivers in this process."""
from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap

import pytest

from helpers import REPO_ROOT, wait_until

REPO = str(REPO_ROOT)

DRIVER = textwrap.dedent("""
    import os, signal, sys, time
    if sys.argv[1] == "ignore-sigint":
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # as under `cmd &` or nohup
    import raylite as ray
    ray.init(num_cpus=2)

    @ray.remote
    def marker_task(i):
        print(f"marker-line {i}", flush=True)
        return i

    @ray.remote
    class Keeper:
        def say(self):
            print("keeper-says-hi", flush=True)
            return os.getpid()

    @ray.remote
    def long_sleeper(path):
        open(path, "w").close()
        time.sleep(300)

    keeper = Keeper.remote()
    ray.get(keeper.say.remote())
    ray.get([marker_task.remote(i) for i in range(3)])
    started = sys.argv[2]
    ref = long_sleeper.remote(started)
    while not os.path.exists(started):   # it runs
        time.sleep(0.01)
    print("READY", flush=True)
    try:
        ray.get(ref)
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
        raise
""")


@pytest.fixture
def sessions_dir(tmp_path, monkeypatch):
    path = tmp_path / "sessions"
    monkeypatch.setenv("RAYLITE_SESSIONS_DIR", str(path))
    return path


def _start_driver(tmp_path, mode: str = "plain") -> subprocess.Popen:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = dict(os.environ, PYTHONPATH=REPO, RAY_DEDUP_LOGS="0")
    proc = subprocess.Popen([sys.executable, str(script), mode, str(tmp_path / "started")], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT,
                            env=env, text=True, start_new_session=True)
    for line in proc.stdout:
        if line.strip() == "READY":
            return proc
    proc.wait()
    pytest.fail(f"the driver exited ({proc.returncode}) before it was ready")


@pytest.fixture
def driver(tmp_path, sessions_dir):
    proc = _start_driver(tmp_path)
    yield proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def cli(*args: str, expect: int = 0):
    """`python -m raylite ARGS`: (stdout, stderr), checking the exit status."""
    done = subprocess.run([sys.executable, "-m", "raylite", *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=REPO), timeout=60)
    assert done.returncode == expect, (done.returncode, done.stdout, done.stderr)
    return done.stdout, done.stderr


def cli_json(*args: str):
    return json.loads(cli(*args, "--format", "json")[0])


def test_no_session_exits_1_with_one_line(sessions_dir):
    for command in (["status"], ["list", "tasks"], ["logs"], ["stop"]):
        out, err = cli(*command, expect=1)
        assert out == ""
        assert err.count("\n") == 1 and err.startswith("raylite: no raylite session is running"), err


def test_cli_against_a_live_driver(driver, tmp_path):
    sessions = cli_json("sessions")
    assert [s["pid"] for s in sessions] == [driver.pid]
    assert stat.S_IMODE(os.stat(sessions[0]["dir"]).st_mode) == 0o700

    out, _ = cli("status")
    assert f"pid {driver.pid}" in out and "1 RUNNING" in out and "1 ALIVE" in out
    assert "1/2 CPU" in out   # the sleeper holds one of the two
    status = cli_json("status")
    assert status["tasks"] == {"FINISHED": 5, "RUNNING": 1} and status["resources"]["used"]["CPU"] == 1.0
    assert status["cmdline"][1].endswith("driver.py")

    out, _ = cli("list", "tasks", "--filter", "name=marker_task")
    assert out.count("marker_task") == 6 and "Total: 3" in out and "long_sleeper" not in out and "TASK_ID" in out
    running = cli_json("list", "tasks", "--filter", "state=RUNNING", "--detail")
    assert [t["name"] for t in running] == ["long_sleeper"] and running[0]["start_time_ms"] > 0
    assert len(cli_json("list", "tasks", "--limit", "2")) == 2
    [actor] = cli_json("list", "actors")
    assert actor["class_name"] == "Keeper" and actor["state"] == "ALIVE"
    assert {w["pid"] for w in cli_json("list", "workers")} >= {driver.pid, actor["pid"]}
    out, err = cli("list", "tasks", "--filter", "colour=red", expect=2)
    assert "colour" in err and err.count("\n") == 1

    summary = cli_json("summary", "tasks")["cluster"]["summary"]
    assert summary["marker_task"]["state_counts"] == {"FINISHED": 3}
    assert "Keeper.say" in cli("summary", "tasks")[0]
    assert cli_json("summary", "actors")["cluster"]["summary"]["Keeper"]["state_counts"] == {"ALIVE": 1}

    trace_file = tmp_path / "trace.json"
    cli("timeline", "-o", str(trace_file))
    trace = json.loads(trace_file.read_text())
    assert {e["name"] for e in trace} >= {"marker_task", "Keeper.say"} and all("ts" in e for e in trace)

    out = wait_until(lambda: (o := cli("logs")[0]).count("marker-line") == 3 and o, what="the tasks' output")
    assert "keeper-says-hi" in out and all(f"marker-line {i}" in out for i in range(3))
    out, _ = cli("logs", "--actor", actor["actor_id"])
    assert out.strip() == f"(Keeper pid={actor['pid']}) keeper-says-hi"
    marker_pids = {t["worker_pid"] for t in cli_json("list", "tasks", "--filter", "name=marker_task")}
    out, _ = cli("logs", "--worker", str(min(marker_pids)))
    assert "marker-line" in out and "keeper" not in out.lower()

    follower = subprocess.Popen([sys.executable, "-m", "raylite", "logs", "--follow"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=REPO))
    assert "keeper-says-hi" in follower.stdout.readline() + follower.stdout.readline()
    out, _ = cli("stop")
    assert f"pid {driver.pid}" in out
    assert follower.wait(30) == 0   # following ends with the driver
    assert driver.wait(30) != 0 and "INTERRUPTED" in driver.stdout.read()   # Ctrl-C's way out
    assert not os.path.exists(sessions[0]["dir"])
    cli("status", expect=1)


def test_stop_when_the_driver_ignores_sigint(tmp_path, sessions_dir):
    proc = _start_driver(tmp_path, "ignore-sigint")
    try:
        [session] = cli_json("sessions")
        cli("stop", "--session", str(proc.pid))
        assert proc.wait(30) != 0   # the runtime shut down, then SIGTERM (or its get's error, if first)
        assert not os.path.exists(session["dir"])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_init_imports_no_file_or_http_modules_for_the_endpoint():
    """json, shutil and tempfile wait for the endpoint's thread, http.server for the dashboard's
    first visit: init's own thread imports none of them (RAYLITE_CONTROL=0: no thread at all)."""
    script = ("import sys, raylite\n"
              "raylite.init(num_cpus=1)\n"
              "late = {'json', 'shutil', 'tempfile', 'http.server', 'raylite.core.api.dashboard'}\n"
              "print(sorted(late & set(sys.modules)))\n"
              "raylite.shutdown()\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO,
                         env=dict(os.environ, RAYLITE_CONTROL="0"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_stale_sessions_are_ignored_and_removed(sessions_dir):
    from raylite.control import list_sessions
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = sessions_dir / f"{dead.pid}-0badc0de"
    stale.mkdir(parents=True)
    (stale / "session.json").write_text(json.dumps({"session": stale.name, "pid": dead.pid, "started": 1.0}))
    half_made = sessions_dir / f"{dead.pid}-00000000"   # died before writing its session.json
    half_made.mkdir()
    assert list_sessions() == []
    assert not stale.exists() and not half_made.exists()
    cli("status", expect=1)
    stale.mkdir()
    (stale / "session.json").write_text(json.dumps({"session": stale.name, "pid": dead.pid, "started": 1.0}))
    import raylite as ray
    ray.init(num_cpus=1)   # a new driver cleans up after dead ones too
    try:
        wait_until(lambda: not stale.exists(), what="the stale directory removed")
    finally:
        ray.shutdown()


def test_in_process_session_and_peer_check(sessions_dir, monkeypatch):
    import raylite as ray
    from raylite.control import SessionError, find_session
    ray.init(num_cpus=1)
    try:
        session = wait_until(lambda: _session_or_none(find_session))
        assert session.pid == os.getpid() and session.request("info")["pid"] == os.getpid()
        with pytest.raises(SessionError, match="unknown request op='nope'"):
            session.request("nope")
        real_uid = os.getuid()
        with monkeypatch.context() as m:
            m.setattr(os, "getuid", lambda: real_uid + 1)   # the endpoint now sees another user
            with pytest.raises(SessionError, match="another user") as refused:
                session.request("status")
        assert refused.value.kind == "PermissionError"
        assert session.request("status")["pid"] == os.getpid()
    finally:
        ray.shutdown()
    assert list(sessions_dir.iterdir()) == []


def _session_or_none(find):
    from raylite.control import SessionError
    try:
        return find()
    except SessionError:
        return None


def test_endpoint_off_and_a_bad_knob(sessions_dir, monkeypatch):
    import raylite as ray
    monkeypatch.setenv("RAYLITE_CONTROL", "0")
    ray.init(num_cpus=1)
    try:
        assert not sessions_dir.exists()
    finally:
        ray.shutdown()
    monkeypatch.setenv("RAYLITE_CONTROL", "maybe")
    with pytest.raises(ValueError, match="RAYLITE_CONTROL.*'maybe'"):
        ray.init(num_cpus=1)
    assert not ray.is_initialized()


def test_a_socket_in_the_session_dir_answers_only_json_lines(sessions_dir):
    import raylite as ray
    from raylite.control import find_session
    ray.init(num_cpus=1)
    try:
        session = wait_until(lambda: _session_or_none(find_session))
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(os.path.join(session.dir, "control.sock"))
            s.sendall(b"[1, 2]\n")
            reply = json.loads(s.makefile().readline())
        assert reply["type"] == "ValueError" and "JSON object" in reply["error"]
    finally:
        ray.shutdown()


def test_the_console_script_is_the_cli():
    import importlib
    import tomllib
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        target = tomllib.load(f)["project"]["scripts"]["raylite"]
    module, _, name = target.partition(":")
    from raylite.cli import main
    assert getattr(importlib.import_module(module), name) is main


def test_status_shows_use_per_device(sessions_dir, tmp_path):
    import raylite as ray
    from raylite.cli import tables
    from raylite.control import find_session
    ray.init(num_cpus=2, num_gpus=2)   # two device slots, no hardware needed
    try:
        @ray.remote(num_gpus=0.5)
        def half(path):
            import os
            import time
            while not os.path.exists(path):
                time.sleep(0.01)

        gate = tmp_path / "gate"
        ref = half.remote(str(gate))
        session = wait_until(lambda: _session_or_none(find_session))
        st = wait_until(lambda: (s := session.request("status"))["tasks"].get("RUNNING") and s)
        assert st["devices"]["GPU"] == [{"id": "0", "used": 0.5}, {"id": "1", "used": 0.0}]
        assert st["resources"]["used"]["GPU"] == 0.5
        text = tables.status(st)
        assert " 0.5/2 GPU\n   GPU 0: 0.5/1 used\n   GPU 1: 0/1 used" in text
        gate.write_text("go")
        ray.get(ref)
    finally:
        ray.shutdown()


def test_uses_local_runtime_follows_inits_rule(monkeypatch):
    from raylite.control import uses_local_runtime
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert uses_local_runtime() and uses_local_runtime("local")
    assert not uses_local_runtime("auto") and not uses_local_runtime("ray://10.0.0.1:10001")
    monkeypatch.setenv("RAY_ADDRESS", "ray://10.0.0.1:10001")
    assert not uses_local_runtime()   # RAY_ADDRESS names a cluster
    assert uses_local_runtime("local") and uses_local_runtime(backend="local")
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert uses_local_runtime() and not uses_local_runtime(backend="ray")
    with pytest.raises(ValueError, match="backend='local'.*address='auto'"):
        uses_local_runtime("auto", backend="local")
