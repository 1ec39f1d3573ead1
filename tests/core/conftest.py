"""tests/core: the runtime's own tests, black-box through ``import raylite as ray`` where they can be.

Every test here gets a 60 s timeout unless it sets its own, and starts without a runtime and leaves
none behind (``ray.shutdown()`` before and after it, even on failure) unless it uses a runtime its
module shares (``SHARED_RUNTIME_FIXTURES``). On ``RAYLITE_TEST_BACKEND=ray`` a test runs only
through the root's init fixtures, and ``local_only`` ones are skipped. Fixtures added here:
``raylite_mappings``, ``shm_segments``, ``shm_allocated_bytes`` (shared-memory leak checks) and
``read_output`` (worker output forwarded to the driver).
"""
from __future__ import annotations

import glob
import os
import sys
import time
from pathlib import Path

import pytest

import backend

CORE_TESTS = Path(__file__).resolve().parent
DEFAULT_CORE_TIMEOUT_S = 60
SHM_GLOB = "/dev/shm/raylite-*"
INIT_FIXTURES = {"ray_init", "ray_start", "ray_module"}   # what RAYLITE_TEST_BACKEND selects for
# module-scoped fixtures holding a runtime across a module's tests: no shutdown between those tests
SHARED_RUNTIME_FIXTURES = {"ray_module", "ray_cluster"}


def _is_core_test(node) -> bool:
    return CORE_TESTS in Path(str(node.fspath)).parents


def pytest_collection_modifyitems(config, items):
    # A hang must fail the test rather than block CI.
    for item in items:
        if not _is_core_test(item):
            continue
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_CORE_TIMEOUT_S))
        if (backend.ON_RAY and item.get_closest_marker("local_only") is None   # (the root skips those)
                and not INIT_FIXTURES & set(getattr(item, "fixturenames", ()))):
            item.add_marker(pytest.mark.skip(reason="starts its own runtime, not through the init fixtures "
                                                    "RAYLITE_TEST_BACKEND=ray selects (the local run covers it)"))


def _shutdown_if_initialized():
    mod = sys.modules.get("raylite")
    if mod is not None and getattr(mod, "is_initialized", None) is not None:
        if mod.is_initialized():
            mod.shutdown()


@pytest.fixture(autouse=True)
def _core_isolation(request):
    """Core tests start without a runtime and never leave one behind (but for a module's shared one)."""
    if SHARED_RUNTIME_FIXTURES & set(request.fixturenames):
        yield
        return
    _shutdown_if_initialized()
    try:
        yield
    finally:
        _shutdown_if_initialized()


# --------------------------------------------------------------------------
# shared memory and worker output
# --------------------------------------------------------------------------


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
def shm_segments():
    """Callable returning the current set of /dev/shm/raylite-* paths."""
    return _shm_segments


@pytest.fixture
def shm_allocated_bytes():
    """Callable: ``shm_allocated_bytes(paths)`` -> the pages those files hold, in bytes."""
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
