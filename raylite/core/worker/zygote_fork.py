"""The zygote as the driver's fork (raylite.core.worker.zygote): when that is safe, and what the child
changes to start as a spawned zygote would. Built-in modules only, as zygote.py."""
from __future__ import annotations

import _signal
import os
import sys

FORK_ENV = "RAYLITE_ZYGOTE_FORK"
_OFF, _ON = ("0", "false", "no", "off"), ("", "1", "true", "yes", "on")   # unset is on
FORK_MAX_RSS = 2 << 30   # a zygote forked from the driver keeps the driver's memory of that moment alive
# Modules that may hold device state a fork cannot carry (torch's CUDA is checked itself).
_DEVICE_MODULES = ("jax", "tensorflow", "cupy", "numba.cuda", "pycuda")


def fork_refusal(preload: str, switch: str, modules) -> str | None:
    """Why the zygote cannot be forked from the driver (None: it can). Forking gives the zygote
    what RAYLITE_PRELOAD names at no cost when the driver has imported all of it already; it is
    refused in a driver with other Python threads, device state (CUDA initialised, a device
    library), a raylite runtime up, or over FORK_MAX_RSS of memory (which the zygote would keep
    alive); the threads no Python call shows (OpenMP's pool) are checked right after the fork."""
    flag = switch.strip().lower()
    if flag not in _OFF + _ON:
        raise ValueError(f"{FORK_ENV}={switch!r}: expected 0 (never fork the zygote from the driver) or 1 "
                         f"(when it is safe; unset is 1)")
    if flag in _OFF:
        return f"{FORK_ENV}={switch}"
    names = [n.strip() for n in preload.split(",") if n.strip()]
    if not names:
        return "nothing to preload"
    if any(n not in modules for n in names):
        return "the driver has not imported all of RAYLITE_PRELOAD"
    api = modules.get("raylite.core.api.runtime")
    if api is not None and (api._node is not None or api.process.client is not None):
        return "a raylite runtime is up in this process"
    threading = modules.get("threading")
    if threading is not None and threading.active_count() > 1:
        return "the driver runs other threads"
    torch = modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        return "the driver initialised CUDA"
    device = next((m for m in _DEVICE_MODULES if m in modules), None)
    if device is not None:
        return f"the driver imported {device}"
    if _rss() > FORK_MAX_RSS:
        return f"the driver uses over {FORK_MAX_RSS >> 30} GiB of memory"
    return None


def _rss() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return FORK_MAX_RSS + 1   # unknown: do not fork


def threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0   # unknown: not 1, so no fork


def become_child(fd: int, env: dict) -> None:
    """In the driver's forked child, before it serves: a session of its own, stdin from
    /dev/null, none of the driver's descriptors but ``fd`` (the driver's socket), the zygote's
    environment, default signal handlers, the interpreter's own standard streams and no logging
    handler of the driver's."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    _drop_descriptors(null, keep=(fd,))
    os.close(null)
    os.environ.clear()
    os.environ.update(env)
    for signum in _signal.valid_signals():
        try:
            if callable(_signal.getsignal(signum)):
                _signal.signal(signum, _signal.default_int_handler if signum == _signal.SIGINT else _signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    # the interpreter's own streams (flushed before the fork), not what the driver put there
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.root.handlers.clear()
    api = sys.modules.get("raylite.core.api.runtime")
    if api is not None:   # held by the driver's init() that forked this process
        import threading
        api._lock = threading.RLock()


def _drop_descriptors(null: int, keep: tuple) -> None:
    """What an exec would close (the driver's close-on-exec descriptors: its files, sockets and
    pipe ends, every one Python opened) is pointed at /dev/null instead, so the zygote and its
    workers hold no listening port or pipe end of the driver's open, as a spawned zygote holds
    none. Not closed: a Python object of the driver's that closes its descriptor later must not
    close a number reused since."""
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for n in fds:
        if n <= 2 or n == null or n in keep:
            continue
        try:
            if not os.get_inheritable(n):
                os.dup2(null, n, inheritable=False)
        except OSError:   # the listing's own descriptor, gone by now
            pass
