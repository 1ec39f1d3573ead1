"""What init() counts of the machine inside a container: cgroup CPU quotas and memory limits
(fake cgroup trees here, v1 and v2, as Docker and Kubernetes write them)."""
import os

import pytest

from helpers import make_tree
from raylite.core.hardware import machine


@pytest.fixture
def affinity(monkeypatch):
    """This process may run on 8 CPUs (the host has 64)."""
    monkeypatch.delenv("RAY_USE_MULTIPROCESSING_CPU_COUNT", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(os, "cpu_count", lambda: 64)


@pytest.mark.parametrize("files, expected", [
    ({}, 8),                                                                       # no cgroup files: affinity
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, 8),    # v1, no quota
    ({"cpu/cpu.cfs_quota_us": "250000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2),   # v1 --cpus=2.5
    ({"cpu.max": "max 100000\n"}, 8),                                              # v2, no quota
    ({"cpu.max": "400000 100000\n"}, 4),                                           # v2 --cpus=4
    ({"cpu.max": "50000 100000\n"}, 1),                                            # --cpus=0.5: still one
    ({"cpu.max": "1600000 100000\n"}, 8),                                          # a quota above the affinity
    ({"cpu.max": "garbage\n"}, 8),
])
def test_cpu_count_follows_quota_and_affinity(tmp_path, affinity, files, expected):
    assert machine.cpu_count(make_tree(tmp_path, files)) == expected


def test_cpu_count_can_be_the_hosts_as_in_ray(tmp_path, affinity, monkeypatch):
    monkeypatch.setenv("RAY_USE_MULTIPROCESSING_CPU_COUNT", "1")
    assert machine.cpu_count(make_tree(tmp_path, {"cpu.max": "200000 100000\n"})) == 64


@pytest.fixture
def plenty_free(monkeypatch):
    monkeypatch.setattr(machine, "_mem_available", lambda: 64 << 30)


def test_memory_is_capped_by_a_v2_limit_without_page_cache(tmp_path, plenty_free):
    root = make_tree(tmp_path, {"memory.max": f"{4 << 30}\n", "memory.current": f"{3 << 30}\n",
                            "memory.stat": f"anon 1\ninactive_file {1 << 30}\nactive_file {1 << 30}\n"})
    assert machine.memory_available(root) == 3 << 30   # 4 GiB limit - (3 GiB used - 2 GiB of cache)


def test_memory_is_capped_by_a_v1_limit(tmp_path, plenty_free):
    root = make_tree(tmp_path, {"memory/memory.limit_in_bytes": f"{2 << 30}\n",
                            "memory/memory.usage_in_bytes": f"{1 << 30}\n",
                            "memory/memory.stat": f"total_inactive_file {256 << 20}\ntotal_active_file 0\n"})
    assert machine.memory_available(root) == (2 << 30) - (768 << 20)


@pytest.mark.parametrize("files", [
    {},
    {"memory.max": "max\n", "memory.current": "123\n"},
    {"memory/memory.limit_in_bytes": "9223372036854771712\n", "memory/memory.usage_in_bytes": "5\n"},
])
def test_memory_without_a_limit_is_the_kernels_free_memory(tmp_path, plenty_free, files):
    assert machine.memory_available(make_tree(tmp_path, files)) == 64 << 30


def test_a_small_free_figure_wins_over_a_large_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "_mem_available", lambda: 1 << 30)
    root = make_tree(tmp_path, {"memory.max": f"{8 << 30}\n", "memory.current": "0\n"})
    assert machine.memory_available(root) == 1 << 30


@pytest.mark.local_only("raylite's own reading of the container's CPUs and memory: a Ray node sizes itself")
def test_init_without_counts_uses_what_the_container_allows(ray_init, monkeypatch):
    monkeypatch.setattr(machine, "cpu_count", lambda: 3)
    monkeypatch.setattr(machine, "memory_available", lambda: 10 << 30)
    ray_init(num_cpus=None)
    import raylite as ray
    total = ray.cluster_resources()
    assert total["CPU"] == 3
    assert total["memory"] == pytest.approx(0.7 * (10 << 30), rel=1e-3)
    assert total["object_store_memory"] == pytest.approx(0.3 * (10 << 30), rel=1e-3)


def _limited(soft: int, hard: int):
    import resource
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_init_raises_a_low_open_files_limit_as_ray_does():
    import subprocess
    import sys
    code = ("import resource, raylite as ray; ray.init(num_cpus=1)\n"
            "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
            "print(ray.get(ray.remote(lambda: resource.getrlimit(resource.RLIMIT_NOFILE)[0]).remote()))\n"
            "ray.shutdown()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         preexec_fn=_limited(256, 4096))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["4096", "4096"]   # the driver's, and a worker's


_OUT_OF_DESCRIPTORS = r"""
import raylite as ray
ray.init(num_cpus=2)

@ray.remote(num_cpus=0)
class A:
    def ping(self):
        return 1

actors = [A.remote() for _ in range(40)]   # 3 descriptors each: more than 64 in all
results = []
for a in actors:
    try:
        results.append(ray.get(a.ping.remote(), timeout=30))
    except ray.exceptions.ActorDiedError as e:
        results.append(str(e))
print(sum(r == 1 for r in results))
print([r for r in results if r != 1][-1])
try:
    ray.get(ray.remote(max_calls=1)(lambda: 1).remote(), timeout=30)
except ray.exceptions.RaySystemError as e:
    print(e)
ray.shutdown()
"""


def test_out_of_descriptors_fails_the_actor_or_task_that_needed_a_worker():
    """Not a hang: with the limit at 64 (hard), actors beyond it die naming the limit, and so
    does a task that needs a new worker."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _OUT_OF_DESCRIPTORS], capture_output=True, text=True,
                         timeout=120, preexec_fn=_limited(64, 64))
    assert out.returncode == 0, out.stderr[-2000:]
    started, actor_error, task_error = out.stdout.strip().splitlines()
    assert 1 <= int(started) < 40
    assert "may open 64 files" in actor_error and "ulimit -n" in actor_error
    assert "could not run: a worker process could not start" in task_error and "ulimit -n" in task_error
