"""The dashboard (raylite.core.api.dashboard): its HTTP API (token required, JSON shape), and the page
in a real headless Chromium against a driver running a task, an actor and a Tune sweep; the
sweep's panel through the `raylite` CLI too."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request

import pytest

from helpers import REPO_ROOT, wait_until

REPO = str(REPO_ROOT)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _get(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:
        body = r.read()
        return r.status, r.headers.get("Content-Type"), body


def _status_of(url: str) -> int:
    try:
        return _get(url)[0]
    except urllib.error.HTTPError as e:
        return e.code


@pytest.fixture
def dashboard(tmp_path, monkeypatch):
    import raylite as ray
    monkeypatch.setenv("RAYLITE_SESSIONS_DIR", str(tmp_path / "sessions"))
    ctx = ray.init(num_cpus=2, include_dashboard=True, dashboard_port=0)
    try:
        yield ray, ctx
    finally:
        ray.shutdown()


def test_http_api_needs_the_token_and_answers_json(dashboard, tmp_path):
    ray, ctx = dashboard
    url = ctx.dashboard_url
    assert url.startswith("http://127.0.0.1:") and "?token=" in url and ctx["dashboard_url"] == url
    assert "http://" + ray.get_runtime_context().get_dashboard_url() == url   # Ray's form: no scheme
    base, token = url.split("/?token=")

    @ray.remote
    def api_marker_task(path):
        import os
        import time
        print("api-marker-output", flush=True)
        while not os.path.exists(path):
            time.sleep(0.01)

    gate = tmp_path / "gate"
    ref = api_marker_task.remote(str(gate))
    for path in ("/", "/api/status", "/api/tasks", "/api/snapshot"):
        assert _status_of(base + path) == 403
        assert _status_of(f"{base}{path}?token={'0' * len(token)}") == 403
    assert _status_of(f"{base}/nothing?token={token}") == 404

    code, kind, page = _get(url)
    assert code == 200 and kind.startswith("text/html")
    assert b"<script>" in page and b"/*SCRIPT*/" not in page and b"/*STYLE*/" not in page
    assert b"src=" not in page and b"href=" not in page   # nothing from elsewhere: no CDN

    def tasks():
        rows = json.loads(_get(f"{base}/api/tasks?token={token}")[2])
        return [r for r in rows if r["name"] == "api_marker_task" and r["state"] == "RUNNING"]
    [task] = wait_until(tasks, what="the task RUNNING")
    assert set(task) >= {"task_id", "state", "worker_pid", "start_time_ms", "end_time_ms"}

    status = json.loads(_get(f"{base}/api/status?token={token}")[2])
    assert status["pid"] == os.getpid() and status["dashboard_url"] == url
    assert status["resources"]["total"]["CPU"] == 2 and status["resources"]["used"]["CPU"] == 1
    assert status["tasks"].get("RUNNING") == 1 and isinstance(status["panels"], dict)

    logs = wait_until(lambda: [l for l in json.loads(_get(f"{base}/api/logs?token={token}")[2])["lines"]
                               if l["line"] == "api-marker-output"], what="the task's output")
    assert logs[0]["pid"] == task["worker_pid"]
    snap = json.loads(_get(f"{base}/api/snapshot?token={token}&after=0")[2])
    assert set(snap) == {"status", "tasks", "actors", "logs", "time"}
    gate.write_text("go")
    ray.get(ref)
    ray.shutdown()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=2).close()


def test_a_poll_builds_each_view_once_for_the_status_and_the_tables(dashboard, monkeypatch):
    """The snapshot's status counts and its tables come from one build of each view (the poll
    built the task view twice: once for the counts, once for the table)."""
    ray, ctx = dashboard
    from raylite.core.api import runtime
    from raylite.core.node import snapshot
    built = []
    for what in ("tasks", "actors", "objects"):
        view = snapshot._VIEWS[what]
        monkeypatch.setitem(snapshot._VIEWS, what, lambda node, detail, view=view, what=what: built.append(what)
                            or view(node, detail))

    @ray.remote
    def one():
        return 1

    assert ray.get(one.remote()) == 1
    snap = runtime._endpoint.dashboard.snapshot(0)
    assert sorted(built) == ["actors", "objects", "tasks"]
    assert snap["status"]["tasks"] == {"FINISHED": 1} and [t["name"] for t in snap["tasks"]] == ["one"]


def test_a_port_in_use_or_a_bad_port_fails_before_anything_starts():
    import raylite as ray
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ValueError, match=f"dashboard_port={port}"):
            ray.init(num_cpus=1, include_dashboard=True, dashboard_port=port)
    assert not ray.is_initialized()
    with pytest.raises(ValueError, match="dashboard_port='8265'"):
        ray.init(num_cpus=1, include_dashboard=True, dashboard_port="8265")
    assert not ray.is_initialized()


def test_off_by_default(tmp_path, monkeypatch):
    import raylite as ray
    monkeypatch.setenv("RAYLITE_SESSIONS_DIR", str(tmp_path / "sessions"))
    ctx = ray.init(num_cpus=1)
    try:
        assert ctx.dashboard_url is None
        assert ray.get_runtime_context().get_dashboard_url() == ""
    finally:
        ray.shutdown()


SWEEP_DRIVER = textwrap.dedent("""
    import os, sys, time
    import raylite as ray
    from raylite import tune
    gate = sys.argv[1]
    ctx = ray.init(num_cpus=3, include_dashboard=True, dashboard_port=0)
    print("URL", ctx.dashboard_url, flush=True)

    @ray.remote
    def browser_marker_task(path):
        while not os.path.exists(path):
            time.sleep(0.05)

    @ray.remote
    class PanelKeeper:
        def ping(self):
            return 1

    keeper = PanelKeeper.remote()
    ray.get(keeper.ping.remote())
    marker = browser_marker_task.remote(gate)

    def objective(config):
        for step in range(3):
            print(f"trial x={config['x']} step {step}", flush=True)
            time.sleep(0.3)
            tune.report({"score": config["x"] * (step + 1)})
        while not os.path.exists(gate):
            time.sleep(0.05)

    tune.run(objective, config={"x": tune.grid_search([1.0, 2.0])}, metric="score", mode="max",
             resources_per_trial={"cpu": 1}, verbose=0, storage_path=sys.argv[2])
    ray.get(marker)
""")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A driver running a task, an actor and a two-trial Tune sweep that waits on a gate file."""
    tmp = tmp_path_factory.mktemp("sweep")
    script, gate = tmp / "sweep.py", tmp / "gate"
    script.write_text(SWEEP_DRIVER)
    env = dict(os.environ, PYTHONPATH=REPO, RAYLITE_SESSIONS_DIR=str(tmp / "sessions"))
    proc = subprocess.Popen([sys.executable, str(script), str(gate), str(tmp / "results")], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env, start_new_session=True)
    try:
        url = next((line.split()[1] for line in proc.stdout if line.startswith("URL ")), None)
        assert url, f"the sweep driver exited ({proc.wait()}) before it served its dashboard"
        base, token = url.split("/?token=")

        def both_reported():
            panels = json.loads(_get(f"{base}/api/panels?token={token}")[2]).get("tune", [])
            trials = panels[0]["trials"] if panels else []
            logs = json.loads(_get(f"{base}/api/logs?token={token}")[2])["lines"]
            return (len(trials) == 2 and all(t["iteration"] == 3 for t in trials)
                    and any(l["line"] == "trial x=2.0 step 2" for l in logs) and panels[0])
        panel = wait_until(both_reported, timeout=60, what="both trials' three results")
        yield {"url": url, "env": env, "panel": panel, "pid": proc.pid}
    finally:
        gate.write_text("go")
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_tune_panel_and_cli_on_a_running_sweep(sweep):
    panel = sweep["panel"]
    assert panel["metric"] == "score" and panel["mode"] == "max" and panel["trial_states"] == {"RUNNING": 2}
    assert panel["best"]["value"] == 6.0 and panel["best_history"][-1][1] == 6.0
    assert sorted(t["config"]["x"] for t in panel["trials"]) == [1.0, 2.0]
    done = subprocess.run([sys.executable, "-m", "raylite", "status"], capture_output=True, text=True,
                          env=sweep["env"], timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"pid {sweep['pid']}" in done.stdout and "trials 2 RUNNING" in done.stdout
    assert "best score (max): 6" in done.stdout and "Dashboard: http://127.0.0.1:" in done.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (CI installs it: apt-get install chromium)")
def test_the_page_renders_in_a_headless_browser(sweep, tmp_path):
    shot = tmp_path / "dashboard.png"
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              "--window-size=1400,1100", "--virtual-time-budget=4000"]
    dom = subprocess.run([*common, "--dump-dom", sweep["url"]], capture_output=True, text=True, timeout=120).stdout
    tasks = dom.split('id="tasks-table"', 1)[1].split("</table>", 1)[0]
    assert "browser_marker_task" in tasks and "RUNNING" in tasks
    actors = dom.split('id="actors-table"', 1)[1].split("</table>", 1)[0]
    assert "PanelKeeper" in actors and "ALIVE" in actors
    tune = dom.split('id="tune-panel"', 1)[1].split("</section>", 1)[0]
    assert "score" in tune and "<path" in tune and "<svg" in tune   # the best-so-far plot
    assert 'id="conn" class="conn">live<' in dom
    assert "trial x=2.0 step 2" in dom.split('id="logs"', 1)[1]   # the workers' output
    subprocess.run([*common, f"--screenshot={shot}", sweep["url"]], capture_output=True, timeout=120)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("RAYLITE_DASHBOARD_SCREENSHOT"):   # to refresh docs/img/dashboard.png
        shutil.copy(shot, os.environ["RAYLITE_DASHBOARD_SCREENSHOT"])
