"""What this process may use of the machine, as Ray counts it: inside a container the host's
CPU count and free memory are the wrong answer (Docker's --cpus and --memory, Kubernetes limits
are cgroup settings), and `init()` without num_cpus would start a task per host CPU."""
from __future__ import annotations

import os

CGROUP_ROOT = "/sys/fs/cgroup"


def cpu_count(root: str = CGROUP_ROOT) -> int:
    """The CPUs this process may run on (its affinity: taskset, Docker's --cpuset-cpus), capped
    by a cgroup CPU quota (Docker's --cpus; v1 cfs_quota_us / cfs_period_us, v2 cpu.max), in
    whole CPUs and at least one; RAY_USE_MULTIPROCESSING_CPU_COUNT=1 counts the host's, as Ray."""
    host = os.cpu_count() or 1
    if os.environ.get("RAY_USE_MULTIPROCESSING_CPU_COUNT"):
        return host
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        cpus = host
    quota = _cpu_quota(root)
    if quota is not None:
        cpus = min(cpus, max(1, int(quota)))
    return cpus


def _cpu_quota(root: str) -> float | None:
    v1 = _read(os.path.join(root, "cpu", "cpu.cfs_quota_us")), _read(os.path.join(root, "cpu", "cpu.cfs_period_us"))
    v2 = _read(os.path.join(root, "cpu.max"))
    try:
        if v1[0] is not None and v1[1] is not None:
            quota, period = int(v1[0]), int(v1[1])
        elif v2 is not None and v2.split()[0] != "max":
            quota, period = (int(x) for x in v2.split()[:2])
        else:
            return None
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def memory_available(root: str = CGROUP_ROOT) -> int:
    """Free memory: the kernel's MemAvailable, capped by what a cgroup memory limit leaves
    (limit minus usage, page cache not counted, as Ray counts it)."""
    free = _mem_available()
    left = _cgroup_memory_left(root)
    return free if left is None else min(free, left)


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def _cgroup_memory_left(root: str) -> int | None:
    for limit_file, usage_file, stat_file, prefix in (
            ("memory.max", "memory.current", "memory.stat", ""),   # v2
            ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes", "memory/memory.stat", "total_")):
        limit = _read(os.path.join(root, limit_file))
        if limit is None:
            continue
        usage = _read(os.path.join(root, usage_file))
        if not limit.isdigit() or usage is None or not usage.isdigit():   # "max": no limit
            return None
        limit_bytes = int(limit)
        if limit_bytes >= 1 << 60:   # v1's "no limit" is a huge number
            return None
        cache = 0
        for line in (_read(os.path.join(root, stat_file)) or "").splitlines():
            key, _, value = line.partition(" ")
            if key in (f"{prefix}inactive_file", f"{prefix}active_file") and value.isdigit():
                cache += int(value)
        return max(0, limit_bytes - max(0, int(usage) - cache))
    return None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def raise_open_files_limit() -> int:
    """Raise the soft limit on open files towards the hard one (to 65,536 at most), as Ray's init
    does: the driver holds three descriptors per worker, so the usual 1,024 ends near 300 workers,
    and a worker's torch DataLoader passes tensors as descriptors. Returns the soft limit now."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        return soft
    except (ImportError, ValueError, OSError):
        return -1
