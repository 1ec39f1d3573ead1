"""Shared fixtures for the raylite core test suite (tests/test_core_*.py).

The core tests are black-box: they only use the public, Ray-compatible API
(``import raylite as ray``) plus what the operating system shows (/proc,
/dev/shm, signals).

Conventions for the test modules
--------------------------------
* Remote functions and classes are defined *inside* the test functions, so
  cloudpickle ships them by value and workers never have to import a test
  module.  Code that runs in a worker only references stdlib modules, numpy,
  torch and ``raylite`` as globals (never helpers defined in a test module).
* ``raylite`` is imported lazily here so that other suites in tests/ can be
  collected even when the core runtime fails to import.
* Every core test gets a 60 s pytest-timeout unless it sets its own marker, and
  ``ray.shutdown()`` runs after every core test, even on failure.
"""

from __future__ import annotations

import glob
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import backend
from helpers import pid_alive as _pid_alive, wait_until as _wait_until

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

CORE_TEST_PREFIX = "test_core_"
DEFAULT_CORE_TIMEOUT_S = 60
SHM_GLOB = "/dev/shm/raylite-*"


def _is_core_test(node) -> bool:
    return Path(str(node.fspath)).name.startswith(CORE_TEST_PREFIX)


INIT_FIXTURES = {"ray_init", "ray_start", "ray2", "runtime"}   # what RAYLITE_TEST_BACKEND selects for


def pytest_configure(config):
    config.addinivalue_line("markers", "local_only(reason): cannot apply on Ray (white-box, zygote, shared "
                                       "memory, ...): skipped when RAYLITE_TEST_BACKEND=ray")


def pytest_collection_modifyitems(config, items):
    # A hang must fail the test rather than block CI.
    for item in items:
        if _is_core_test(item) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_CORE_TIMEOUT_S))
        if backend.ON_RAY:   # (local_only counts wherever the init fixtures serve, util tests too)
            local_only = item.get_closest_marker("local_only")
            if local_only is not None:
                why = local_only.args[0] if local_only.args else "the local runtime's internals"
                item.add_marker(pytest.mark.skip(reason=f"local runtime only: {why}"))
            elif _is_core_test(item) and not INIT_FIXTURES & set(getattr(item, "fixturenames", ())):
                item.add_marker(pytest.mark.skip(reason="starts its own runtime, not through the init fixtures "
                                                        "RAYLITE_TEST_BACKEND=ray selects (the local run covers it)"))


@pytest.fixture(autouse=True, scope="module")
def _backend_cluster():
    """RAYLITE_TEST_BACKEND=ray: the Ray cluster a module's tests shared ends with the module."""
    yield
    backend.close()


# --------------------------------------------------------------------------
# init / shutdown fixtures
# --------------------------------------------------------------------------


def _shutdown_if_initialized():
    mod = sys.modules.get("raylite")
    if mod is not None and getattr(mod, "is_initialized", None) is not None:
        if mod.is_initialized():
            mod.shutdown()


@pytest.fixture(autouse=True)
def _core_isolation(request):
    """Core tests start without a runtime and never leave one behind."""
    if not _is_core_test(request.node):
        yield
        return
    _shutdown_if_initialized()
    try:
        yield
    finally:
        _shutdown_if_initialized()


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
    """``ray.init(num_cpus=2)`` for the test, then ``ray.shutdown()``.

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


def _shm_segments() -> set:
    return set(glob.glob(SHM_GLOB))


def _shm_allocated_bytes(names) -> int:
    total = 0
    for name in names:
        try:
            total += os.stat(name).st_blocks * 512
        except FileNotFoundError:
            pass
    return total


def _raylite_mappings(pid="self") -> set:
    """/dev/shm/raylite-* files that process ``pid`` has mapped right now.

    Used to tell this session's segments from those of concurrent sessions
    (other pytest runs on the same machine), which a before/after diff of
    /dev/shm cannot do.
    """
    found = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6:
                    path = parts[5].strip()
                    if path.endswith(" (deleted)"):
                        path = path[: -len(" (deleted)")]
                    if path.startswith("/dev/shm/raylite-"):
                        found.add(path)
    except OSError:
        pass
    return found


@pytest.fixture
def raylite_mappings():
    """Callable: ``raylite_mappings(pid="self")`` -> set of mapped raylite shm paths."""
    return _raylite_mappings


@pytest.fixture
def wait_until():
    return _wait_until


@pytest.fixture
def pid_alive():
    return _pid_alive


@pytest.fixture
def wait_pids_gone():
    return _wait_pids_gone


@pytest.fixture
def shm_segments():
    """Callable returning the current set of /dev/shm/raylite-* paths."""
    return _shm_segments


@pytest.fixture
def shm_allocated_bytes():
    return _shm_allocated_bytes


@pytest.fixture
def read_output(capfd):
    """Poll capfd until ``predicate(out, err)`` holds; return accumulated (out, err).

    Worker output is forwarded by a background thread of the driver, so it may
    arrive a little after the task result.
    """

    def _read(predicate, timeout=5.0):
        out_parts, err_parts = [], []
        deadline = time.monotonic() + timeout
        while True:
            out, err = capfd.readouterr()
            out_parts.append(out)
            err_parts.append(err)
            joined = ("".join(out_parts), "".join(err_parts))
            if predicate(*joined):
                return joined
            if time.monotonic() >= deadline:
                return joined
            time.sleep(0.05)

    return _read


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


@pytest.fixture
def ray2():
    """A fresh runtime with 2 CPUs (the machine's size), shut down afterwards."""
    import raylite as ray

    if ray.is_initialized():
        ray.shutdown()
    backend.init(num_cpus=2)
    yield ray
    ray.shutdown()


@pytest.fixture(autouse=True, scope="session")
def _results_in_tmp(tmp_path_factory):
    """Train and Tune runs without an explicit path write here, never into the user's home."""
    os.environ["RAYLITE_RESULTS_DIR"] = str(tmp_path_factory.mktemp("raylite_results"))
    yield


@pytest.fixture(scope="module")
def runtime():
    """One 2-CPU runtime shared by a module's tests (warm workers across them)."""
    import raylite as ray

    if ray.is_initialized():
        ray.shutdown()
    backend.init(num_cpus=2)
    try:
        yield
    finally:
        ray.shutdown()
