"""The zygote: a small pre-imported process that forks workers in a few milliseconds.

The driver runs threads and may have touched devices, so it never forks itself. Instead it starts
this process once per session (new session id, so a terminal's Ctrl-C reaches only the driver)
and asks it, over a SOCK_SEQPACKET pair, to fork a worker; the request carries the worker's three
descriptors (control socket, stdout pipe, stderr pipe) and the environment to set before any user
code runs. When the driver goes away, the zygote kills its workers, removes the session's
shared-memory segments and runtime_env copies (raylite.core.working_dir) and exits; workers die
with the zygote (PR_SET_PDEATHSIG).
"""
from __future__ import annotations

# only built-in modules here: the driver imports this module before the zygote starts, and
# `socket`, `signal` and `pickle` cost ~20 ms each to import on a slow machine
import _signal
import _socket
import gc
import os
import sys
import time

_MAX_REQUEST = 1 << 20


class Zygote:
    """Driver-side handle: start the zygote and ask it for workers."""

    def __init__(self):
        self.session = f"{os.getpid()}-{os.urandom(4).hex()}"   # names the shm segments and log directory
        self.ready = False
        self.sock, child = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in sys.path if p])
        env.pop("PYTHONDONTWRITEBYTECODE", None)   # the zygote's start is on the first task's path
        os.set_inheritable(child.fileno(), True)
        # -P (3.11+): -c would put the working directory first on sys.path, where another raylite (or a
        # module named like one of the stdlib's) would shadow the one the driver imported
        safe_path = ["-P"] if sys.version_info >= (3, 11) else []
        try:   # posix_spawn: no fork of this (threaded) process, and cheaper than subprocess
            self.pid = os.posix_spawn(
                sys.executable, [sys.executable, *safe_path, "-c", _MAIN, str(child.fileno()), self.session],
                env, setsid=True, file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)])
        finally:
            child.close()

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Block until the zygote has imported the core (not RAYLITE_PRELOAD, which goes on in the
        background), so tasks submitted right after init() start at once, and an environment where
        workers cannot start fails init() instead of the first task."""
        self.sock.settimeout(timeout)
        try:
            msg = self.sock.recv(16)
        except TimeoutError:
            raise RuntimeError(f"raylite: the worker zygote (pid {self.pid}) did not start within {timeout:g} s "
                               "(is the machine overloaded?)") from None
        finally:
            self.sock.settimeout(None)
        if msg != b"ready":
            raise RuntimeError(f"raylite: the worker zygote ({sys.executable} -c {_MAIN!r}) exited "
                               "while starting, so no worker can run; its error is printed above")
        self.ready = True

    def fork(self, config: dict, fds: list[int]) -> None:
        import pickle
        from socket import send_fds
        send_fds(self.sock, [pickle.dumps(config)], fds)

    def close(self, timeout: float = 5.0) -> None:
        """Closing its socket tells the zygote to kill the workers and exit; wait for that. One that
        was never ready (init() failed) has no workers and no segments yet: it is killed at once.
        A second call does nothing."""
        pid, self.pid = self.pid, None
        if pid is None:
            return
        self.sock.close()
        deadline = time.monotonic() + (timeout if self.ready else 0)
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, _signal.SIGKILL)
                os.waitpid(pid, 0)
                return
            time.sleep(0.002)


def _set_parent_death_signal(libc) -> None:
    try:
        libc.prctl(1, _signal.SIGKILL)  # PR_SET_PDEATHSIG
    except AttributeError:
        pass


def _serve(sock, session: str) -> None:
    import pickle
    import socket
    # preload what every worker needs, and the API that tasks calling ray.* use
    from raylite.core import api, machine, runtime_env, segments, serialization, worker  # noqa: F401
    serialization._pickler()
    machine.raise_open_files_limit()   # for the workers too
    libc = segments.libc()
    _settle(libc)
    try:
        sock.send(b"ready")   # init() returns now; a preload below goes on while the driver runs
    except OSError:   # init() failed meanwhile and closed the socket
        return
    preload = os.environ.get("RAYLITE_PRELOAD", "")
    if preload:
        _preload(preload)
        _settle(libc, collect=True)
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    _signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)   # children are reaped automatically
    me = os.getpid()
    children: list[int] = []
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MAX_REQUEST, 3)
        except OSError:
            data, fds = b"", []
        if not data:
            break
        config = pickle.loads(data)
        segments.SHM_DIR = config["shm_dir"]   # the driver's choice, for the worker and the cleanup below
        segments.SPILL_DIR = config["spill_dir"]
        pid = os.fork()
        if pid == 0:
            sock.close()
            # the C functions (as everywhere here): signal.signal's enum conversions copy ~35 pages per worker
            _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
            _signal.signal(_signal.SIGINT, _signal.default_int_handler)
            _set_parent_death_signal(libc)
            if os.getppid() != me:
                os._exit(1)
            code = 1
            try:
                runtime_env.expand_env_vars(config["env"])   # Ray's ${VAR}: against the worker's own
                worker.run(config, *fds)
                code = 0
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        children = [c for c in children if _alive(c)] + [pid]
    for pid in children:
        try:
            os.kill(pid, _signal.SIGKILL)
        except OSError:
            pass
    try:
        while True:
            os.waitpid(-1, 0)
    except ChildProcessError:
        pass
    segments.remove_session_segments(session)
    from raylite.core import working_dir
    working_dir.remove_session(session)   # the copies of working_dir and py_modules


def _settle(libc, collect: bool = False) -> None:
    """Make what is imported so far cheap to fork: freeze it, so the workers' GC never writes to
    (and copies) these pages, and hand freed heap back to the OS. The core's imports leave no
    cyclic garbage, so only a preload (which may) is collected first."""
    if collect:
        gc.collect()
    gc.freeze()
    if libc is not None:
        libc.malloc_trim(0)


def _preload(names: str) -> None:
    """Import what RAYLITE_PRELOAD names (e.g. "torch,numpy") once, so fresh workers start with it.

    Only imports: a module that initialises a device or starts threads at import must not be
    listed (torch and numpy do neither until first used)."""
    import importlib
    for name in filter(None, (n.strip() for n in names.split(","))):
        try:
            importlib.import_module(name)
        except Exception as e:   # a bad name must not stop the runtime
            sys.stderr.write(f"raylite: RAYLITE_PRELOAD could not import {name!r}: {e}\n")


def _alive(pid: int) -> bool:
    """Whether pid is still this zygote's child: children are reaped at once (SIGCHLD ignored), so
    a dead worker's pid may already belong to some other process, which must not be killed."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1]) == os.getpid()
    except FileNotFoundError:   # gone, or no /proc at all (not Linux): then ask the kernel
        return not os.path.isdir("/proc/self") and _exists(pid)
    except (OSError, ValueError, IndexError):
        return False


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def main() -> None:
    """`python -c _MAIN <socket fd> <session>`: -c, not -m, whose runpy and importlib.util cost
    the zygote's start (on the first task's path) 5 ms more here."""
    import socket
    with socket.socket(fileno=int(sys.argv[1])) as driver:
        _serve(driver, sys.argv[2])


_MAIN = "from raylite.core.zygote import main; main()"

if __name__ == "__main__":
    main()
