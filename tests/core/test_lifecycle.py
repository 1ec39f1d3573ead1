"""Core lifecycle: init/shutdown, resources, and no orphaned workers or shm.

Covers issue #2: init() with Ray's keyword arguments, unknown kwarg -> TypeError,
auto-init on first .remote(), cluster_resources()/available_resources(),
shutdown()/interpreter exit/Ctrl-C/SIGKILL of the driver leave no workers (and
no /dev/shm segments) behind, and nothing listens on a non-loopback socket.
"""

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

import raylite as ray
from backend import ON_RAY
from raylite.util import get_node_ip_address


# --------------------------------------------------------------------------
# init / shutdown / is_initialized
# --------------------------------------------------------------------------


def test_init_shutdown_is_initialized(ray_init):
    assert not ray.is_initialized()
    ray_init(num_cpus=1)
    assert ray.is_initialized()
    ray.shutdown()
    assert not ray.is_initialized()


def test_the_context_init_returns(ray_init):
    """As Ray's: dict-like, a context manager, and disconnect() ends the job (Ray's namespaces docs)."""
    context = ray_init(num_cpus=1)
    assert context.dashboard_url == ("" if ON_RAY else None)   # (Ray's RayContext without a dashboard: "")
    assert context["node_id"] == ray.get_runtime_context().get_node_id()
    assert context.python_version == "{}.{}.{}".format(*sys.version_info[:3])
    context.disconnect()
    assert not ray.is_initialized()
    with ray_init(num_cpus=1):
        assert ray.is_initialized()
    assert not ray.is_initialized()


def test_init_twice_raises_runtime_error(ray_init):
    ray_init(num_cpus=1)
    with pytest.raises(RuntimeError):
        ray.init(num_cpus=1)
    # The first runtime is still usable.
    assert ray.is_initialized()

    @ray.remote
    def one():
        return 1

    assert ray.get(one.remote()) == 1


def test_init_twice_with_ignore_reinit_error_keeps_first_runtime(ray_init):
    ray_init(num_cpus=1)
    ray.init(num_cpus=2, ignore_reinit_error=True)  # must not raise
    assert ray.is_initialized()
    assert ray.cluster_resources()["CPU"] == 1.0


def test_init_accepts_common_ray_kwargs(ray_init):
    ray_init(
        num_cpus=1,
        ignore_reinit_error=True,
        include_dashboard=False,
        logging_level=logging.WARNING,
        log_to_driver=True,
        namespace="raylite-core-tests",
        object_store_memory=128 * 1024 * 1024,
    )

    @ray.remote
    def add(a, b):
        return a + b

    assert ray.get(add.remote(2, 3)) == 5


def test_init_unknown_kwarg_is_type_error():
    with pytest.raises(TypeError, match="definitely_not_an_init_option"):
        ray.init(num_cpus=1, definitely_not_an_init_option=True)
    assert not ray.is_initialized()


_FRESH_DRIVER = r"""
import json, os, sys
import raylite as ray
out = {"lazy": sorted(m for m in ("raylite.core.api.runtime", "cloudpickle", "socket") if m in sys.modules)}

def children():
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[1]) == os.getpid():
            found.append(int(entry))
    return found

for bad in ({"num_cpus": 1, "definitely_bogus": 1}, {"num_cpus": "x"}):
    try:
        ray.init(**bad)
    except (TypeError, ValueError) as e:
        out.setdefault("errors", []).append(f"{type(e).__name__}: {e}")
    out.setdefault("children_after_error", []).append(children())
try:
    ray.init(4)
except TypeError as e:
    out["positional_number"] = str(e)
ray.init("local", num_cpus=1)
out["task"] = ray.get(ray.remote(lambda: 6 * 7).remote())
out["children_running"] = len(children())
ray.shutdown()
out["children_after_shutdown"] = children()
print(json.dumps(out))
"""


def test_init_in_a_fresh_driver_starts_the_zygote_early_and_cleans_up_after_errors(tmp_path):
    """In a fresh process `import raylite` imports no runtime, and init() starts the zygote before
    importing it. An init() that fails (an unknown keyword, a bad value) leaves no zygote behind
    and prints nothing from it; init()'s one positional argument is Ray's address."""
    out = subprocess.run([sys.executable, "-c", _FRESH_DRIVER], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr == ""   # no traceback from a zygote whose init() failed
    result = json.loads(out.stdout)
    assert result["lazy"] == []
    assert "definitely_bogus" in result["errors"][0] and result["errors"][0].startswith("TypeError")
    assert result["errors"][1] == "TypeError: num_cpus must be a number, got num_cpus='x' (str)"
    assert result["children_after_error"] == [[], []]
    assert "address=4" in result["positional_number"] and "num_cpus=" in result["positional_number"]
    assert result["task"] == 42
    assert result["children_running"] >= 1   # the zygote
    assert result["children_after_shutdown"] == []


def test_first_remote_call_auto_initializes():
    assert not ray.is_initialized()

    @ray.remote
    def square(x):
        return x * x

    ref = square.remote(7)
    assert ray.is_initialized()
    assert ray.get(ref) == 49
    # Defaults come from the machine.
    assert ray.cluster_resources()["CPU"] >= 1.0
    # (the autouse fixture shuts this runtime down)


def test_shutdown_when_not_initialized_is_a_noop():
    assert not ray.is_initialized()
    ray.shutdown()
    ray.shutdown()
    assert not ray.is_initialized()


def test_init_again_after_shutdown(ray_init):
    ray_init(num_cpus=1)

    @ray.remote
    def pid():
        return os.getpid()

    first_pid = ray.get(pid.remote())
    ray.shutdown()

    ray_init(num_cpus=2)
    assert ray.cluster_resources()["CPU"] == 2.0
    second_pid = ray.get(pid.remote())
    assert second_pid != os.getpid()
    assert second_pid != first_pid


# --------------------------------------------------------------------------
# cluster_resources / available_resources
# --------------------------------------------------------------------------


@pytest.mark.local_only("Ray's node resources must be whole numbers (custom_b=0.5 is refused), and its node:<ip> "
                        "key names the node's address")
def test_cluster_resources_keys_and_values(ray_init):
    ray_init(num_cpus=2, num_gpus=0, resources={"custom_a": 3, "custom_b": 0.5})
    res = ray.cluster_resources()
    assert isinstance(res, dict)
    assert res["CPU"] == 2.0
    assert res["custom_a"] == 3.0
    assert res["custom_b"] == 0.5
    assert res["node:127.0.0.1"] == 1.0
    assert res["memory"] > 0
    assert res["object_store_memory"] > 0
    assert "GPU" not in res
    for key, value in res.items():
        assert isinstance(value, float), (key, value)


def test_cluster_resources_include_gpu_when_requested(ray_init):
    ray_init(num_cpus=1, num_gpus=1)
    res = ray.cluster_resources()
    assert res["GPU"] == 1.0
    assert res["CPU"] == 1.0


def test_available_resources_idle_match_cluster(ray_init):
    ray_init(num_cpus=2, resources={"custom_a": 2})
    avail = ray.available_resources()
    total = ray.cluster_resources()
    for key in ("CPU", "custom_a", f"node:{get_node_ip_address()}"):
        assert avail[key] == total[key], key
    for key in ("memory", "object_store_memory"):
        assert avail[key] > 0
        assert isinstance(avail[key], float)


@pytest.mark.parametrize("ray_start", [{"num_cpus": 2, "resources": {"foo": 2}}], indirect=True)
def test_available_resources_track_running_task(ray_start, tmp_path, wait_until):
    release = str(tmp_path / "release")

    @ray.remote(num_cpus=1, resources={"foo": 1})
    def hold(path):
        while not os.path.exists(path):
            time.sleep(0.01)
        return "done"

    ref = hold.remote(release)
    wait_until(
        lambda: ray.available_resources().get("CPU", 0.0) == 1.0
        and ray.available_resources().get("foo", 0.0) == 1.0,
        message=f"resources not taken by the running task: {ray.available_resources()}",
    )
    open(release, "w").close()
    assert ray.get(ref) == "done"
    wait_until(
        lambda: ray.available_resources().get("CPU", 0.0) == 2.0
        and ray.available_resources().get("foo", 0.0) == 2.0,
        message=f"resources not returned after the task: {ray.available_resources()}",
    )


# --------------------------------------------------------------------------
# shutdown leaves no workers
# --------------------------------------------------------------------------


def test_shutdown_leaves_no_worker_processes(ray_start, tmp_path, wait_until, pid_alive, wait_pids_gone):
    pid_file = tmp_path / "running.pid"

    @ray.remote
    def pid():
        return os.getpid()

    @ray.remote
    def long_running(path):
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(path + ".tmp", path)
        time.sleep(300)

    @ray.remote
    class Actor:
        def pid(self):
            return os.getpid()

    actors = [Actor.remote() for _ in range(2)]
    pids = set(ray.get([pid.remote() for _ in range(6)]))
    pids |= set(ray.get([a.pid.remote() for a in actors]))
    long_running.remote(str(pid_file))
    wait_until(pid_file.exists, timeout=10)
    pids.add(int(pid_file.read_text()))

    assert os.getpid() not in pids
    assert all(pid_alive(p) for p in pids)

    t0 = time.monotonic()
    ray.shutdown()
    assert time.monotonic() - t0 < 10, "shutdown() took too long with a running task"
    assert not ray.is_initialized()
    wait_pids_gone(pids, timeout=10)


def test_shutdown_does_not_retry_the_tasks_it_kills(ray_start, tmp_path, wait_until, capfd):
    """The killed task's worker is gone and so is the zygote: nothing may try to start another."""
    started = tmp_path / "started"

    @ray.remote
    def long_running(path):
        open(path, "w").close()
        time.sleep(300)

    long_running.remote(str(started))
    wait_until(started.exists, timeout=10)
    ray.shutdown()
    err = capfd.readouterr().err
    assert "internal error" not in err, err


# --------------------------------------------------------------------------
# driver in a subprocess: SIGKILL, interpreter exit, Ctrl-C
# --------------------------------------------------------------------------

# Prints "PIDS [...]" (task workers, an actor and a worker running a long task)
# and "SHM [...]" (raylite shm segments of this driver's session, found through
# the mappings of its processes so concurrent sessions do not interfere).
DRIVER_PRELUDE = r'''
import glob, json, os, sys, time
import numpy as np
import raylite as ray

ray.init(num_cpus=2)

@ray.remote
def task_pid():
    return os.getpid()

@ray.remote
def hold(arr, pid_file):
    with open(pid_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(pid_file + ".tmp", pid_file)
    time.sleep(300)
    return float(arr.sum())

@ray.remote
class Actor:
    def pid(self):
        return os.getpid()

actor = Actor.remote()
pids = set(ray.get([task_pid.remote() for _ in range(4)]))
pids.add(ray.get(actor.pid.remote()))
big = ray.put(np.ones(10 * 1024 * 1024 // 8))  # 10 MB -> shared memory
pid_file = os.path.abspath("running_task.pid")
running = hold.remote(big, pid_file)
while not os.path.exists(pid_file):
    time.sleep(0.01)
hold_pid = int(open(pid_file).read())
pids.add(hold_pid)

def raylite_mappings(pid):
    found = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].strip().startswith("/dev/shm/raylite-"):
                found.add(parts[5].strip().replace(" (deleted)", ""))
    return found

# This session's segments: mapped by the worker holding the array (or by us).
shm = (raylite_mappings(hold_pid) | raylite_mappings("self")) & set(glob.glob("/dev/shm/raylite-*"))
print("PIDS " + json.dumps(sorted(pids)), flush=True)
print("SHM " + json.dumps(sorted(shm)), flush=True)
'''


def _start_driver(driver_process, tail):
    driver = driver_process(DRIVER_PRELUDE + tail)
    pids = driver.wait_for_json("PIDS ")
    driver.recorded_pids.update(pids)
    shm = driver.wait_for_json("SHM ")
    return driver, pids, shm


# In the driver: a thread prints BLOCKED once the main thread sits in raylite's get, its innermost
# frame unchanged over a few looks (waiting, not on its way in).
SAYS_WHEN_BLOCKED_IN_GET = r'''
import threading

def _say_when_blocked(main=threading.main_thread().ident):
    last, still = None, 0
    while still < 5:
        time.sleep(0.01)
        frame = sys._current_frames().get(main)
        stack, f = [], frame
        while f is not None:
            stack.append((f.f_code.co_name, f.f_code.co_filename))
            f = f.f_back
        in_get = any(name == "get" and "raylite" in path for name, path in stack)
        here = (frame.f_code, frame.f_lineno) if in_get else None
        still = still + 1 if here is not None and here == last else 0
        last = here
    print("BLOCKED", flush=True)

threading.Thread(target=_say_when_blocked, daemon=True).start()
'''


def _sigkill_driver(driver_process, pid_alive):
    driver, pids, shm = _start_driver(
        driver_process, 'print("READY", flush=True)\ntime.sleep(300)\n'
    )
    driver.wait_for_line("READY")
    assert pids, "driver reported no worker pids"
    assert driver.pid not in pids
    assert all(pid_alive(p) for p in pids), "workers should be alive before the kill"
    os.kill(driver.pid, signal.SIGKILL)
    driver.proc.wait(timeout=10)
    return pids, shm


@pytest.mark.timeout(90)
def test_driver_sigkill_leaves_no_workers(driver_process, pid_alive, wait_pids_gone):
    pids, _ = _sigkill_driver(driver_process, pid_alive)
    wait_pids_gone(pids, timeout=10, what="workers of a SIGKILLed driver")


@pytest.mark.timeout(90)
def test_driver_sigkill_leaves_no_shm_segments(driver_process, pid_alive, wait_pids_gone,
                                               wait_until, shm_segments):
    pids, shm = _sigkill_driver(driver_process, pid_alive)
    assert shm, "a 10 MB put should live in a /dev/shm/raylite-* segment"
    wait_pids_gone(pids, timeout=10, what="workers of a SIGKILLed driver")
    wait_until(
        lambda: not (set(shm) & shm_segments()),
        timeout=10,
        message=f"shm segments left after the driver was SIGKILLed: {set(shm) & shm_segments()}",
    )


@pytest.mark.timeout(90)
def test_interpreter_exit_without_shutdown_leaves_no_workers_or_shm(
    driver_process, wait_pids_gone, wait_until, shm_segments
):
    # The script ends while a task is still running and without ray.shutdown().
    driver, pids, shm = _start_driver(driver_process, 'print("EXITING", flush=True)\n')
    rc = driver.wait_exit(timeout=30)
    assert rc == 0, driver.output
    wait_pids_gone(pids, timeout=10, what="workers after interpreter exit")
    wait_until(
        lambda: not (set(shm) & shm_segments()),
        timeout=10,
        message=f"shm segments left after interpreter exit: {set(shm) & shm_segments()}",
    )


@pytest.mark.timeout(90)
@pytest.mark.parametrize("target", ["driver", "process_group"])
def test_ctrl_c_while_blocked_in_get_exits_and_cleans_up(driver_process, wait_pids_gone, target):
    # "process_group" is what a terminal's Ctrl-C does; "driver" is `kill -INT`.
    driver, pids, _ = _start_driver(
        driver_process,
        SAYS_WHEN_BLOCKED_IN_GET + 'ray.get(running)\nprint("GET RETURNED", flush=True)\n',
    )
    driver.wait_for_line("BLOCKED")
    if target == "driver":
        os.kill(driver.pid, signal.SIGINT)
    else:
        os.killpg(driver.pid, signal.SIGINT)
    rc = driver.wait_exit(timeout=20)
    assert rc != 0, driver.output
    assert "GET RETURNED" not in driver.output
    wait_pids_gone(pids, timeout=10, what="workers after Ctrl-C")


# --------------------------------------------------------------------------
# security: nothing listens on a non-loopback address
# --------------------------------------------------------------------------


def _socket_inodes(pid):
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def _is_loopback(hex_addr):
    if len(hex_addr) == 8:  # IPv4, little-endian
        return bytes.fromhex(hex_addr)[::-1][0] == 127
    # IPv6: four little-endian 32-bit words
    raw = b"".join(bytes.fromhex(hex_addr[i:i + 8])[::-1] for i in range(0, 32, 8))
    if raw == b"\0" * 15 + b"\1":
        return True  # ::1
    return raw[:12] == b"\0" * 10 + b"\xff\xff" and raw[12] == 127  # ::ffff:127.x


def _tcp_listeners():
    """inode -> local address for every TCP socket in LISTEN state."""
    listeners = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A":
                listeners[inode] = local
    return listeners


@pytest.mark.local_only("Ray's processes listen on the node's addresses: a cluster's nodes reach each other over "
                        "the network")
def test_no_socket_listens_on_non_loopback_address(ray_start):
    @ray.remote
    def pid():
        return os.getpid()

    @ray.remote
    class Actor:
        def pid(self):
            return os.getpid()

    actor = Actor.remote()
    pids = set(ray.get([pid.remote() for _ in range(4)]))
    pids.add(ray.get(actor.pid.remote()))
    pids.add(os.getpid())

    listeners = _tcp_listeners()
    exposed = []
    for p in pids:
        for inode in _socket_inodes(p) & set(listeners):
            addr_hex = listeners[inode].split(":")[0]
            if not _is_loopback(addr_hex):
                exposed.append((p, listeners[inode]))
    assert not exposed, f"sockets listening beyond loopback: {exposed}"


def test_preload_modules_are_imported_before_workers_fork(monkeypatch):
    monkeypatch.setenv("RAYLITE_PRELOAD", "colorsys, no_such_module_raylite")
    ray.init(num_cpus=1)
    try:
        @ray.remote
        def preloaded():
            import sys
            return "colorsys" in sys.modules

        assert ray.get(preloaded.remote()) is True   # imported by the zygote, inherited by the fork
    finally:
        ray.shutdown()


@pytest.mark.local_only("the local runtime's zygote")
def test_init_fails_clearly_when_workers_cannot_start(monkeypatch, ray_init):
    """init() waits for the zygote to be ready, so a Python that cannot run it fails init() with a
    clear error (not the first task), and leaves nothing behind: a later init() works."""
    real = os.sys.executable
    monkeypatch.setattr(os.sys, "executable", "/bin/false")
    with pytest.raises(RuntimeError, match=r"zygote .* exited while starting"):
        ray.init(num_cpus=1)
    assert not ray.is_initialized()
    monkeypatch.setattr(os.sys, "executable", real)
    ray_init(num_cpus=1)
    assert ray.get(ray.remote(lambda: 7).remote()) == 7


def test_preloaded_random_generators_differ_between_workers(monkeypatch):
    """Forked workers must not share the zygote's numpy (and torch) random state."""
    monkeypatch.setenv("RAYLITE_PRELOAD", "numpy.random")   # numpy 2 makes its generator on first use
    ray.init(num_cpus=2)
    try:
        @ray.remote(max_calls=1)
        def draw():
            import random
            import sys

            import numpy
            return "numpy.random" in sys.modules, float(numpy.random.rand()), random.random()

        draws = ray.get([draw.remote() for _ in range(4)])
        assert all(preloaded for preloaded, _, _ in draws)
        assert len({n for _, n, _ in draws}) == 4 and len({r for _, _, r in draws}) == 4
    finally:
        ray.shutdown()


# --------------------------------------------------------------------------
# Ctrl-C while the main thread runs node code (submit, get, ... run in the caller's thread)
# --------------------------------------------------------------------------


@pytest.mark.local_only("white-box: the local node's event loop")
def test_ctrl_c_during_node_work_is_held_until_that_work_is_done(ray_init):
    import threading

    from raylite.core.api import runtime as api
    ray_init(num_cpus=1)
    node = api._node
    finished = []

    def command():
        if threading.current_thread() is not threading.main_thread():
            return   # queued to the node thread this time (it was busy): try again
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)   # the handler runs during this sleep: without the hold it raises here
        finished.append(True)

    for _ in range(50):
        try:
            node.call(command)
        except KeyboardInterrupt:
            break
    else:
        pytest.fail("the command never ran in the calling thread")
    assert finished == [True]   # the command ran to its end, then Ctrl-C took effect
    assert ray.get(ray.remote(lambda: 41).remote()) == 41


@pytest.mark.local_only("the local runtime wraps SIGINT for its node's work; on Ray the driver's handler is left "
                        "as it is")
def test_ctrl_c_handler_in_place_is_wrapped_and_restored(ray_init, wait_until):
    seen = []

    def mine(signum, frame):
        seen.append(signum)

    before = signal.signal(signal.SIGINT, mine)
    try:
        ray_init(num_cpus=1)
        assert signal.getsignal(signal.SIGINT) is not mine   # wrapped while raylite runs
        os.kill(os.getpid(), signal.SIGINT)
        wait_until(lambda: seen, timeout=5, what="the handler in place running")   # (between two bytecodes)
        assert seen == [signal.SIGINT]   # outside node work, the handler in place runs as before
        ray.shutdown()
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="python -P is 3.11+")
def test_workers_import_the_drivers_raylite_not_one_in_the_working_directory(tmp_path):
    """`python -m` would put the working directory first on the zygote's sys.path: a `raylite`
    folder there (another checkout, another version) would run in the workers."""
    import raylite
    decoy = tmp_path / "raylite"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise ImportError('the decoy raylite was imported')\n")
    script = tmp_path / "drive.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {os.path.dirname(os.path.dirname(raylite.__file__))!r})\n"
        "import raylite as ray\n"
        "ray.init(num_cpus=1)\n"
        "print(ray.get(ray.remote(lambda: __import__('raylite').__file__).remote()))\n"
        "ray.shutdown()\n")
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == raylite.__file__


def test_local_mode_warns_that_tasks_still_run_in_workers(ray_init):
    with pytest.warns(UserWarning, match=r"local_mode=True\) is not supported"):
        ray_init(num_cpus=1, local_mode=True)

    @ray.remote
    def where():
        return os.getpid()

    assert ray.get(where.remote()) != os.getpid()
