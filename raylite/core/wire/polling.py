"""Polling before sleeping: a thread that waits for a message from another process (a worker for
its next task, a driver thread for a result) polls its socket briefly first, while a CPU is free,
and longer where recent waits predict the answer soon (spin_for), unless another thread of its
process may want the GIL meanwhile (alone). Used by raylite.core.wire.protocol's Channel,
raylite.core.worker.client and raylite.core.node.reader.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable


def _runnable() -> int | None:
    """Threads runnable now, this one included, from /proc/loadavg; None if it cannot be read."""
    if _LOADAVG is None:
        return None
    try:   # "1.00 0.50 0.25 3/120 4567": 3 runnable now
        return int(os.pread(_LOADAVG, 64, 0).split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return None


def spin_on(deadline: float, clock=time.perf_counter, runnable=_runnable) -> bool:
    """Yield the CPU once; whether a poll loop may go on polling: not past its deadline, and no
    runnable thread waits for a CPU (a poller would slow it down, and keep the kernel from moving
    it to the poller's CPU). That is read at most every LOADAVG_EVERY_S, and either answer is kept
    that long (a read is a system call and a parse: most of a poll's cost); while "busy" is kept,
    a refusal costs no system call, not even the yield, as the caller blocks next anyway."""
    global _free_until, _busy_until
    now = clock()
    if now < _busy_until or now >= deadline:
        return False
    os.sched_yield()
    if now < _free_until:
        return True
    running = runnable()
    if running is None or running > _CPUS:
        _busy_until = now + LOADAVG_EVERY_S
        return False
    _free_until = now + LOADAVG_EVERY_S
    return True


LOADAVG_EVERY_S = 50e-6
_free_until = 0.0   # spin_on read a free CPU this recently
_busy_until = 0.0   # or a busy one (or could not read): no polling until then


_sleepers: set[int] = set()   # idents of the running threads start_sleeper started


def start_sleeper(target: Callable[[], None], name: str) -> threading.Thread:
    """Start a daemon thread of the runtime's that sleeps until something comes for it (the
    node's loop, the control endpoint, a worker's sender of held results or of metrics):
    alone() leaves it out, as its process's polling thread would take no GIL time it needs."""
    def run() -> None:
        me = threading.get_ident()
        _sleepers.add(me)
        try:
            target()
        finally:
            _sleepers.discard(me)
    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def alone() -> bool:
    """Whether the calling thread may poll: every other thread of its process is a sleeper. A
    user's thread would compete with the poller for the GIL, so its wait sleeps at once."""
    return threading.active_count() - len(_sleepers) <= 1


def poll_spinning(poller, seconds: float) -> list:
    """poller.poll(0) until something is ready or spin_on says stop: what is ready, maybe nothing."""
    deadline = time.perf_counter() + seconds
    while True:
        ready = poller.poll(0)   # (not a failing recv: its exception costs more pages)
        if ready or not spin_on(deadline):
            return ready


def _open_loadavg() -> int | None:
    try:
        return os.open("/proc/loadavg", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def cpu_quota_set(cgroups: str | None, read=_read) -> bool:
    """Whether a cgroup CPU quota limits this process (`docker --cpus`, a Kubernetes CPU limit),
    from /proc/self/cgroup's text: polling there spends the quota the work needs, and
    /proc/loadavg (the host's) cannot tell that no CPU is free."""
    for line in (cgroups or "").splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":   # cgroup v2: "max 100000" is no quota
            files = [f"/sys/fs/cgroup{path}/cpu.max", "/sys/fs/cgroup/cpu.max"]
            unlimited = "max"
        elif "cpu" in controllers.split(","):   # v1: -1 is no quota
            files = [f"{base}{sub}/cpu.cfs_quota_us" for base in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct")
                     for sub in dict.fromkeys((path.rstrip("/"), ""))]
            unlimited = "-1"
        else:
            continue
        for fields in (text.split() for text in map(read, files) if text):
            if fields and fields[0] != unlimited:
                return True
    return False


def _seconds_from_us(variable: str, default: str) -> float:
    text = os.environ.get(variable) or default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:   # (NaN too)
        raise ValueError(f"{variable}={text!r}: expected a number of microseconds >= 0 (0 turns it off)")
    return value * 1e-6


# Polling before sleeping (raylite.core.worker.client, raylite.core.node.reader): where idle CPUs halt (VMs),
# waking a sleeper costs its waker tens of microseconds, and the answer to a tiny task usually
# comes sooner. Polling goes on only while a CPU is free (see spin_on). A wait that recent ones
# predict to be short (a task that took milliseconds, a worker whose tasks come every few
# milliseconds) polls until its answer is due, up to SPIN_MAX_S: after sleeping that long, the
# process also runs with cold caches (the host ran others on its CPU), which here cost a 6 ms
# task's round trip 0.2 ms more than the wake-ups alone. Adaptive, as in OpenMP's runtimes,
# which poll for up to 200 ms; RAYLITE_SPIN_MAX_US=0 keeps every wait's polling to SPIN_S, as
# does a CPU quota (see cpu_quota_set).
SPIN_S = _seconds_from_us("RAYLITE_SPIN_US", "400")
# the longer, predicted polls: off where a CPU quota applies, unless asked for
SPIN_MAX_S = _seconds_from_us("RAYLITE_SPIN_MAX_US",
                              "0" if not SPIN_S or cpu_quota_set(_read("/proc/self/cgroup")) else "20000")
_LOADAVG = _open_loadavg() if SPIN_S else None
_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def spin_for(predicted: float | None) -> float:
    """How long to poll before sleeping in a wait predicted to last `predicted` seconds (None:
    no idea): SPIN_S, or until a little past the prediction when that is within SPIN_MAX_S."""
    if predicted is None or predicted > SPIN_MAX_S or not SPIN_S:
        return SPIN_S
    return min(SPIN_MAX_S, max(SPIN_S, 1.5 * predicted + SPIN_S))
