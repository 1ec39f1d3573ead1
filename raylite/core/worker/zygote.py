"""The zygote: a small pre-imported process that forks workers in a few milliseconds.

The driver runs threads and may have touched devices, so it never forks itself. Instead it starts
this process once per session (new session id, so a terminal's Ctrl-C reaches only the driver)
and asks it, over a SOCK_SEQPACKET pair, to fork a worker; the request carries the worker's three
descriptors (control socket, stdout pipe, stderr pipe) and the environment to set before any user
code runs. When the driver goes away, the zygote kills its workers, removes the session's
shared-memory segments and runtime_env copies (raylite.core.envs.working_dir) and exits; workers die
with the zygote (PR_SET_PDEATHSIG). The processes a task starts go with their worker: the zygote
is their subreaper and ends them (see _Children) unless they detached with setsid.

A preload (RAYLITE_PRELOAD, e.g. torch and Lightning for RayStrategy) that the driver has imported
already comes for free: the zygote is then the driver's fork, made only while that is safe (see
fork_refusal; RAYLITE_ZYGOTE_FORK=0 turns it off), instead of a new interpreter importing it again.
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
PRELOAD_ENV = "RAYLITE_PRELOAD"
AUTO_PRELOAD_ENV = "RAYLITE_AUTO_PRELOAD"
# Heavy modules the zygote imports when the driver has: each imports without touching a device
# (torch initialises CUDA lazily) and forks single-threaded (numpy's OpenBLAS starts a thread at
# import and stops it in its own fork handler; torch, Lightning and pandas start none). Workers
# that would each import them seconds long fork with them loaded instead.
AUTO_PRELOAD = ("numpy", "pandas", "torch", "pytorch_lightning", "lightning.pytorch")
# Off unless asked: the zygote's import delays the first forks after init (4 fresh 0.25-GPU workers
# right after init took 1.08-1.17 s against 1.01-1.02 s without), for ~3% on a quiet machine's cold
# RayStrategy job; it pays off where CPUs are contended (81.6 s -> 38.1 s at load 20).
_OFF, _ON = ("", "0", "false", "no", "off"), ("1", "true", "yes", "on")


def preload_names(explicit: str, auto: str, modules) -> str:
    """What the zygote preloads: RAYLITE_PRELOAD's names (`explicit`), then each AUTO_PRELOAD
    module the driver imported (in `modules`, its sys.modules) when RAYLITE_AUTO_PRELOAD (`auto`)
    turns that on."""
    flag = auto.strip().lower()
    if flag not in _OFF + _ON:
        raise ValueError(f"{AUTO_PRELOAD_ENV}={auto!r}: expected 1 or 0 (on or off; unset is off)")
    names = [n.strip() for n in explicit.split(",") if n.strip()]
    if flag in _ON:
        names += [m for m in AUTO_PRELOAD if m in modules and m not in names]
    return ",".join(names)


_ahead: Zygote | None = None   # see start_ahead


def start_ahead(imports: tuple[str, ...]) -> None:
    """Start the next session's zygote now (raylite.init, before the driver imports the runtime,
    so the two run side by side); init takes it (take), else discard_ahead closes it."""
    global _ahead
    if _ahead is None:
        _ahead = Zygote(imports)


def take(imports: tuple[str, ...]) -> Zygote:
    """A new session's zygote: the one started ahead, else one started now (init's, the one place
    a session's zygote starts; a restart keeps the session, see Node)."""
    global _ahead
    zygote, _ahead = _ahead, None
    return zygote if zygote is not None else Zygote(imports)


def discard_ahead() -> None:
    """Close the zygote started ahead if init did not take it (it failed, or found a runtime)."""
    global _ahead
    zygote, _ahead = _ahead, None
    if zygote is not None:
        zygote.close()


class Zygote:
    """Driver-side handle: start the zygote and ask it for workers."""

    def __init__(self, imports: tuple[str, ...], session: str | None = None):
        """``imports``: the modules it imports before saying ready, for every worker (the API that
        tasks call through, named by the layer above: this one never imports it)."""
        # names the shm segments and log directory; a restarted zygote keeps its session's (see Node)
        self.session = session or f"{os.getpid()}-{os.urandom(4).hex()}"
        self.imports = tuple(imports)
        self.ready = False
        env = dict(os.environ)
        preload = preload_names(env.get(PRELOAD_ENV, ""), env.get(AUTO_PRELOAD_ENV, ""), sys.modules)
        from raylite.core.worker.zygote_fork import FORK_ENV, fork_refusal
        refusal = fork_refusal(preload, env.get(FORK_ENV, ""), sys.modules)
        if preload:
            env[PRELOAD_ENV] = preload
        self.sock, child = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        root = os.path.abspath(__file__)
        for _ in range(__name__.count(".") + 1):   # up from raylite/core/worker/zygote.py to raylite's parent
            root = os.path.dirname(root)
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in sys.path if p])
        env.pop("PYTHONDONTWRITEBYTECODE", None)   # the zygote's start is on the first task's path
        self.forked = refusal is None and self._fork(child, env)
        if self.forked:
            return
        os.set_inheritable(child.fileno(), True)
        # -P (3.11+): -c would put the working directory first on sys.path, where another raylite (or a
        # module named like one of the stdlib's) would shadow the one the driver imported
        safe_path = ["-P"] if sys.version_info >= (3, 11) else []
        try:   # posix_spawn: no fork of this (threaded) process, and cheaper than subprocess
            self.pid = os.posix_spawn(
                sys.executable, [sys.executable, *safe_path, "-c", _MAIN, str(child.fileno()), self.session,
                                 ",".join(self.imports)],
                env, setsid=True, file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)])
        finally:
            child.close()

    def _fork(self, child, env: dict) -> bool:
        """Fork this process as the zygote (see fork_refusal): it starts with everything the
        driver imported, torch and Lightning included. The fork also stops the threads that numpy's
        OpenBLAS keeps (its fork handler does); any thread left then (torch's OpenMP pool, which a
        forked child would wait for forever) means the child is killed unused and False returned."""
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:   # a child's copy of unwritten output must not be written twice
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        go_r, go_w = os.pipe()
        import warnings
        with warnings.catch_warnings():   # 3.12+ warns of native threads: OpenBLAS's stop at fork, see above
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            self.sock.close()
            os.close(go_w)
            _become_zygote(child.detach(), self.session, self.imports, env, go_r)
        os.close(go_r)
        from raylite.core.worker.zygote_fork import threads
        if threads() != 1:
            os.close(go_w)   # the child sees EOF and exits
            os.waitpid(pid, 0)
            return False
        os.write(go_w, b"1")
        os.close(go_w)
        child.close()
        self.pid = pid
        return True

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

    def exited(self) -> bool:
        """Whether the zygote process has ended (without reaping it: close() does)."""
        try:
            return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

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


def _become_zygote(fd: int, session: str, imports: tuple[str, ...], env: dict, go_r: int) -> None:
    """In the driver's forked child: once the driver says go, become what ``python -c _MAIN``
    starts (raylite.core.worker.zygote_fork.become_child), then serve; never return to the driver's code."""
    code = 1
    try:
        go = os.read(go_r, 1)
        os.close(go_r)
        if go != b"1":
            return
        from raylite.core.worker.zygote_fork import become_child
        become_child(fd, env)
        import socket
        with socket.socket(fileno=fd) as driver:
            _serve(driver, session, imports)
        code = 0
    except BaseException:   # noqa: BLE001 - said, then the process ends; never the driver's code
        import traceback
        traceback.print_exc()
    finally:
        os._exit(code)


def _set_parent_death_signal(libc) -> None:
    try:
        libc.prctl(1, _signal.SIGKILL)  # PR_SET_PDEATHSIG
    except AttributeError:
        pass


def _serve(sock, session: str, imports: tuple[str, ...]) -> None:
    import importlib
    import pickle
    import socket

    # preload what every worker needs, and what the driver named (the API that tasks calling ray.* use)
    for name in imports:
        importlib.import_module(name)
    from raylite.core.envs import runtime_env
    from raylite.core.hardware import machine
    from raylite.core.wire import segments, serialization
    from raylite.core.worker import loop as worker
    serialization._pickler()
    machine.raise_open_files_limit()   # for the workers too
    libc = segments.libc()
    _settle(libc)
    try:
        sock.send(b"ready")   # init() returns now; a preload below goes on while the driver runs
    except OSError:   # init() failed meanwhile and closed the socket
        return
    preload = os.environ.get(PRELOAD_ENV, "")
    if preload:
        _preload(preload)
        _settle(libc, collect=True)
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    me = os.getpid()
    children = _Children(libc)
    while True:
        if children.wait(sock):   # one ended: reap it, and end what a dead worker left running
            children.reap()
            children.end_orphans()
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MAX_REQUEST, 4)
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
            children.forget()
            # the C functions (as everywhere here): signal.signal's enum conversions copy ~35 pages per worker
            _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
            _signal.signal(_signal.SIGINT, _signal.default_int_handler)
            _set_parent_death_signal(libc)
            if os.getppid() != me:
                os._exit(1)
            os.setpgid(0, 0)   # a group of its own, which what it starts joins: see end_group
            code = 1
            try:
                runtime_env.expand_env_vars(config["env"])   # Ray's ${VAR}: against the worker's own
                worker.run(config, *fds)
                code = 0
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        children.workers.add(pid)
    children.end_all()
    segments.remove_session_segments(session)
    from raylite.core.client import sessions
    from raylite.core.envs import working_dir
    working_dir.remove_session(session)   # the copies of working_dir and py_modules
    sessions.remove(sessions.session_dir(session))   # and what upper layers kept there (session_private_dir)


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
    """Import what RAYLITE_PRELOAD names (e.g. "torch,numpy") once, so fresh workers start with it
    (the driver adds the AUTO_PRELOAD modules it imported, see preload_names).

    Only imports: a module that initialises a device or leaves a thread running at fork must not
    be listed (see AUTO_PRELOAD)."""
    import importlib
    for name in filter(None, (n.strip() for n in names.split(","))):
        try:
            importlib.import_module(name)
        except Exception as e:   # a bad name must not stop the runtime
            sys.stderr.write(f"raylite: RAYLITE_PRELOAD could not import {name!r}: {e}\n")


_PR_SET_CHILD_SUBREAPER = 36


def _ignore(signum, frame) -> None:
    """SIGCHLD's handler: the signal only wakes the zygote's loop (signal.set_wakeup_fd)."""


class _Children:
    """The zygote's children: its workers and, as their subreaper (PR_SET_CHILD_SUBREAPER), what a
    dead worker left running (a task's subprocess, a DataLoader's workers, a shell), which the
    kernel hands to the zygote instead of init. Those are ended, and all of them when the driver
    goes, except a process that detached into a session of its own (setsid, Popen's
    start_new_session=True): that one is left alone, as a daemon should be."""

    def __init__(self, libc):
        import select
        self.select = select.select
        self.workers: set[int] = set()
        self.session = os.getsid(0)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        _signal.set_wakeup_fd(self.wake_w)
        _signal.signal(_signal.SIGCHLD, _ignore)
        if libc is not None:
            libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)
        self.me = os.getpid()

    def forget(self) -> None:
        """In a new worker: none of this is its business."""
        _signal.set_wakeup_fd(-1)
        os.close(self.wake_r)
        os.close(self.wake_w)

    def wait(self, sock) -> bool:
        """Until the driver sends something (False) or a child ends (True)."""
        ready = self.select([sock, self.wake_r], [], [])[0]
        if self.wake_r not in ready:
            return False
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass
        return True

    def reap(self) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.workers.discard(pid)

    def end_orphans(self) -> int:
        """SIGKILL the children that are no worker and did not detach; how many there were."""
        orphans = [pid for pid in self._pids() if pid not in self.workers and self._attached(pid)]
        for pid in orphans:
            _kill(pid)
        return len(orphans)

    def end_all(self, timeout: float = 5.0) -> None:
        """The driver went: end every worker, then what they leave (each death hands the zygote
        the dead one's children), until only detached processes remain."""
        for pid in self.workers:
            _kill(pid)
        self.workers.clear()
        deadline = time.monotonic() + timeout
        while True:
            self.reap()
            if not self.end_orphans() or time.monotonic() > deadline:
                return
            self.select([self.wake_r], [], [], 0.05)

    def _pids(self) -> list[int]:
        try:
            with open(f"/proc/self/task/{self.me}/children", "rb") as f:
                return [int(p) for p in f.read().split()]
        except OSError:   # a kernel without that file: look through /proc
            return [pid for pid in _all_pids() if _parent(pid) == self.me]

    def _attached(self, pid: int) -> bool:
        try:
            return os.getsid(pid) == self.session
        except OSError:
            return False


def end_group(pid: int) -> None:
    """SIGKILL the process group of a dead worker (its pid): what it started, for when the zygote,
    their subreaper, died too. The kernel keeps the pid from reuse while a member of the group
    lives; with none left this finds nothing (short of a new process taking the pid and leading a
    group of its own in the moment since)."""
    try:
        os.killpg(pid, _signal.SIGKILL)
    except OSError:
        pass


def _kill(pid: int) -> None:
    try:
        os.kill(pid, _signal.SIGKILL)
    except OSError:
        pass


def _all_pids() -> list[int]:
    try:
        return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return []


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def main() -> None:
    """`python -c _MAIN <socket fd> <session> <imports, comma-separated>`: -c, not -m, whose runpy
    and importlib.util cost the zygote's start (on the first task's path) 5 ms more here."""
    import socket
    with socket.socket(fileno=int(sys.argv[1])) as driver:
        _serve(driver, sys.argv[2], tuple(n for n in sys.argv[3].split(",") if n))


_MAIN = "from raylite.core.worker.zygote import main; main()"

if __name__ == "__main__":
    main()
