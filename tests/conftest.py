"""What every folder of tests/ needs: the backend option, markers, the runtime fixtures.

Each folder's conftest.py adds its own family (tests/core: isolation, shared-memory and output
helpers; tests/plugins: a runtime whose workers fork with Lightning imported; tests/train: one with
torch's compiler imported). One name, one meaning, across the tree:

* ``ray_init``: factory, ``ray_init(**kw)`` starts a runtime (num_cpus defaults to 2); shut down after
  the test;
* ``ray_start``: ``init(num_cpus=2)`` (or the indirect parameter) for the test; shut down after;
* ``ray_module``: one 2-CPU runtime shared by a module's tests (warm workers across them);
* ``driver_process``, ``wait_until``, ``pid_alive``, ``wait_pids_gone``: processes and polling.

Conventions: remote functions and classes are defined *inside* the test functions, so cloudpickle
ships them by value and workers never have to import a test module; ``raylite`` is imported lazily
here so that suites can be collected even when the core runtime fails to import.
``RAYLITE_TEST_BACKEND=ray`` (tests/backend.py) starts the init fixtures on a real Ray.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# tests/ is a package (tests/core/test_tasks.py and tests/train/test_failures.py may share a basename);
# its shared modules (helpers, backend) stay importable by their plain names from every folder
TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
for _path in (str(TESTS_DIR), str(REPO_ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import backend  # noqa: E402
from helpers import pid_alive as _pid_alive, wait_until as _wait_until  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "local_only(reason): cannot apply on Ray (white-box, zygote, shared "
                                       "memory, ...): skipped when RAYLITE_TEST_BACKEND=ray")


def pytest_collection_modifyitems(config, items):
    """RAYLITE_TEST_BACKEND=ray: a local_only test is skipped, wherever the init fixtures serve
    (tests/core/conftest.py also skips the core tests that start a runtime of their own)."""
    if not backend.ON_RAY:
        return
    for item in items:
        local_only = item.get_closest_marker("local_only")
        if local_only is not None:
            why = local_only.args[0] if local_only.args else "the local runtime's internals"
            item.add_marker(pytest.mark.skip(reason=f"local runtime only: {why}"))


@pytest.fixture(autouse=True, scope="module")
def _backend_cluster():
    """RAYLITE_TEST_BACKEND=ray: the Ray cluster a module's tests shared ends with the module."""
    yield
    backend.close()


# --------------------------------------------------------------------------
# init / shutdown fixtures
# --------------------------------------------------------------------------


@pytest.fixture
def ray_init():
    """Factory: ``ray_init(**kw)`` calls ``ray.init`` (num_cpus defaults to 2).

    ``ray.shutdown()`` always runs afterwards, even if the test fails.
    """
    import raylite as ray

    def _init(**kwargs):
        kwargs.setdefault("num_cpus", 2)
        return backend.init(**kwargs)

    try:
        yield _init
    finally:
        if ray.is_initialized():
            ray.shutdown()


@pytest.fixture
def ray_start(request, ray_init):
    """``ray.init(num_cpus=2)`` for the test, then ``ray.shutdown()``; yields the ``raylite`` module.

    Parametrize indirectly with a number (num_cpus) or a dict of init kwargs::

        @pytest.mark.parametrize("ray_start", [1], indirect=True)
        @pytest.mark.parametrize("ray_start", [{"num_cpus": 2, "resources": {"foo": 1}}], indirect=True)
    """
    import raylite as ray

    param = getattr(request, "param", None)
    if param is None:
        kwargs = {}
    elif isinstance(param, (int, float)):
        kwargs = {"num_cpus": param}
    else:
        kwargs = dict(param)
    ray_init(**kwargs)
    yield ray


@pytest.fixture(scope="module")
def ray_module():
    """One 2-CPU runtime shared by a module's tests (warm workers across them), shut down after it."""
    import raylite as ray

    if ray.is_initialized():
        ray.shutdown()
    backend.init(num_cpus=2)
    try:
        yield
    finally:
        ray.shutdown()


# --------------------------------------------------------------------------
# small helpers, exposed as fixtures (no `import conftest` in test modules)
# --------------------------------------------------------------------------


def _wait_pids_gone(pids, timeout=10.0, what="worker processes"):
    pids = set(pids)
    deadline = time.monotonic() + timeout
    while True:
        alive = {p for p in pids if _pid_alive(p)}
        if not alive:
            return
        if time.monotonic() >= deadline:
            cmdlines = {}
            for p in alive:
                try:
                    with open(f"/proc/{p}/cmdline", "rb") as f:
                        cmdlines[p] = f.read().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    cmdlines[p] = "?"
            pytest.fail(f"{what} still alive after {timeout} s: {cmdlines}")
        time.sleep(0.05)


@pytest.fixture
def wait_until():
    """helpers.wait_until: ``wait_until(predicate, timeout, what=...)`` polls, failing the test at the deadline."""
    return _wait_until


@pytest.fixture
def pid_alive():
    """helpers.pid_alive: ``pid_alive(pid)``, False for a zombie."""
    return _pid_alive


@pytest.fixture
def wait_pids_gone():
    """``wait_pids_gone(pids, timeout, what=...)``: fails the test, naming their command lines, if any outlives it."""
    return _wait_pids_gone


# --------------------------------------------------------------------------
# driver scripts in a subprocess (SIGKILL / Ctrl-C / interpreter exit)
# --------------------------------------------------------------------------


class DriverProcess:
    """A Python driver script run in its own session, read line by line."""

    def __init__(self, code: str, workdir: Path):
        script = workdir / "driver_script.py"
        script.write_text(code)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-u", str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=str(workdir),
            env=env,
            start_new_session=True,  # own process group: SIGINT to the group = Ctrl-C
        )
        self.pid = self.proc.pid
        self.output = ""  # everything read so far
        self._buf = b""
        self._lines = []
        self.recorded_pids: set = set()

    def _read_some(self, timeout):
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            if not sel.select(timeout):
                return False
        finally:
            sel.close()
        chunk = os.read(self.proc.stdout.fileno(), 65536)
        if not chunk:
            return None  # EOF
        self._buf += chunk
        self.output += chunk.decode(errors="replace")
        *complete, self._buf = self._buf.split(b"\n")
        self._lines.extend(c.decode(errors="replace") for c in complete)
        return True

    def wait_for_line(self, prefix: str, timeout: float = 30.0) -> str:
        """Return the rest of the first unread line starting with ``prefix``."""
        deadline = time.monotonic() + timeout
        while True:
            for i, line in enumerate(self._lines):
                if line.startswith(prefix):
                    del self._lines[: i + 1]
                    return line[len(prefix):].strip()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"driver did not print {prefix!r} within {timeout} s; output:\n{self.output}")
            got = self._read_some(min(remaining, 0.5))
            if got is None:
                if self.proc.poll() is not None:
                    pytest.fail(
                        f"driver exited (rc={self.proc.returncode}) before printing {prefix!r}; "
                        f"output:\n{self.output}"
                    )
                time.sleep(0.05)

    def wait_for_json(self, prefix: str, timeout: float = 30.0):
        return json.loads(self.wait_for_line(prefix, timeout))

    def wait_exit(self, timeout: float) -> int:
        """Wait for the driver to exit (draining its output); fail if it does not."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"driver still running after {timeout} s; output:\n{self.output}")
            if self._read_some(min(remaining, 0.2)) is None:
                time.sleep(0.05)
        # drain
        while self._read_some(0.05):
            pass
        return self.proc.returncode

    def cleanup(self):
        """Best effort: never leak processes from a failed test."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for pid in self.recorded_pids:
            if _pid_alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        try:
            self.proc.stdout.close()
        except Exception:
            pass


@pytest.fixture
def driver_process(tmp_path):
    """Factory: ``driver_process(code)`` starts ``code`` as a driver script.

    Pids added to ``handle.recorded_pids`` are SIGKILLed at teardown if still
    alive, so a failing test leaves nothing behind.
    """
    started = []

    def _start(code: str) -> DriverProcess:
        workdir = tmp_path / f"driver{len(started)}"
        workdir.mkdir()
        handle = DriverProcess(code, workdir)
        started.append(handle)
        return handle

    try:
        yield _start
    finally:
        for handle in started:
            handle.cleanup()


@pytest.fixture(autouse=True, scope="session")
def _results_in_tmp(tmp_path_factory):
    """Train and Tune runs without an explicit path write here, never into the user's home."""
    os.environ["RAYLITE_RESULTS_DIR"] = str(tmp_path_factory.mktemp("raylite_results"))
    yield
