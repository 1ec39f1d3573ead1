"""Accelerators through the real runtime (issue 3): Ray 2.35's "Accelerator Support" examples.

Resources are logical, so every family runs on a CPU machine: ``init(num_gpus=2)`` or
``init(resources={"TPU": 2})`` advertises devices, and what is checked is what Ray promises: the
ids a task or actor is given, the visible-devices variable set in its process before user code,
per-device packing, fresh or reused worker processes, and devices coming back when the holder
goes. Remote functions and classes are defined inside the tests (shipped by value) and use only
stdlib and ``raylite`` as globals. Nothing here depends on wall-clock thresholds: concurrency is
proved by a rendezvous, waits are polls with generous deadlines.
"""

import math
import os
import time
import warnings

import pytest

import raylite as ray
from raylite.exceptions import InfeasibleTaskError
from helpers import pid_alive as _pid_alive, wait_until as _wait_until

pytestmark = pytest.mark.timeout(60)

FAMILY_VARS = {
    "GPU": "CUDA_VISIBLE_DEVICES",
    "neuron_cores": "NEURON_RT_VISIBLE_CORES",
    "TPU": "TPU_VISIBLE_CHIPS",
    "HPU": "HABANA_VISIBLE_MODULES",
    "NPU": "ASCEND_RT_VISIBLE_DEVICES",
    "RBLN": "RBLN_DEVICES",
    "FURIOSA": "FURIOSA_DEVICES",
    "MBLT": "QBRUNTIME_VISIBLE_DEVICES",
    "TTNPU": "TT_VISIBLE_DEVICES",
}
GPU_VENDOR_VARS = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "HIP_VISIBLE_DEVICES",
                   "intel": "ZE_AFFINITY_MASK"}
# Variables Ray 2.60 reads but never sets: a worker inherits them from the driver as they are.
INHERITED_VARS = {"ROCR_VISIBLE_DEVICES", "ONEAPI_DEVICE_SELECTOR"}
ALL_VARS = set(FAMILY_VARS.values()) | set(GPU_VENDOR_VARS.values()) | INHERITED_VARS






def _gpu_free() -> float:
    return ray.available_resources().get("GPU", 0.0)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """Known environment (no inherited visible-device variables, GPU means NVIDIA); no runtime
    before or after. The variables are set before init because the workers inherit them."""
    for var in ALL_VARS | {"RAYLITE_GPU_VENDOR", "TPU_CHIPS_PER_HOST_BOUNDS", "TPU_HOST_BOUNDS"}:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RAYLITE_GPU_VENDOR", "nvidia")
    if ray.is_initialized():
        ray.shutdown()
    yield monkeypatch
    if ray.is_initialized():
        ray.shutdown()


def _seed_pair(resource: str, var: str, verbose: bool = False, **remote_kw):
    """The page's example: an actor and a task each asking for one device of `resource`;
    both report the ids they were given, the variable, get_gpu_ids(), their pid and every
    visible-devices variable in `ALL_VARS` (and print the first two, as the page does, when
    verbose)."""
    watched = sorted(ALL_VARS)   # a local: the remote code takes it by value

    def report():
        ctx = ray.get_runtime_context()
        ids = ctx.get_accelerator_ids()
        if verbose:
            print(f"{resource} IDs: {ids.get(resource)}")
            print(f"{var}: {os.environ.get(var)}")
        return {"ids": ids, "var": os.environ.get(var), "gpu_ids": ray.get_gpu_ids(),
                "pid": os.getpid(), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "env": {v: os.environ.get(v) for v in watched}}

    @ray.remote(**remote_kw)
    class Actor:
        def info(self):
            return report()

    @ray.remote(**remote_kw)
    def task():
        return report()

    return Actor, task


# --------------------------------------------------------------------- seed examples


def test_seed_gpu_actor_gets_gpu_0_and_task_gpu_1():
    ray.init(num_cpus=2, num_gpus=2)
    GPUActor, use_gpu = _seed_pair("GPU", "CUDA_VISIBLE_DEVICES", num_gpus=1)
    actor = GPUActor.remote()
    a = ray.get(actor.info.remote())      # the actor takes the first GPU ...
    t = ray.get(use_gpu.remote())         # ... so the task gets the second one
    assert a["ids"]["GPU"] == ["0"] and a["var"] == "0" and a["gpu_ids"] == [0]
    assert t["ids"]["GPU"] == ["1"] and t["var"] == "1" and t["gpu_ids"] == [1]
    assert a["pid"] != t["pid"] != os.getpid()
    # The actor still holds GPU 0: the next task gets GPU 1 again.
    assert ray.get(use_gpu.remote())["var"] == "1"


def test_seed_output_is_printed_with_the_workers_prefix(capfd):
    ray.init(num_cpus=2, num_gpus=2)
    GPUActor, use_gpu = _seed_pair("GPU", "CUDA_VISIBLE_DEVICES", verbose=True, num_gpus=1)
    actor = GPUActor.remote()
    ray.get(actor.info.remote())
    ray.get(use_gpu.remote())
    seen = ""

    def printed():
        nonlocal seen
        seen += capfd.readouterr().out
        return "CUDA_VISIBLE_DEVICES: 0" in seen and "CUDA_VISIBLE_DEVICES: 1" in seen

    _wait_until(printed, what="worker output forwarded to the driver")
    lines = seen.splitlines()
    assert any(line.startswith("(Actor pid=") and line.endswith("GPU IDs: ['0']") for line in lines), seen
    assert any(line.startswith("(task pid=") and line.endswith("GPU IDs: ['1']") for line in lines), seen


@pytest.mark.parametrize("resource, seen", [
    ("neuron_cores", ["0", "1"]), ("TPU", ["0", "1"]), ("HPU", ["0", "1"]), ("NPU", ["0", "1"]),
    ("RBLN", ["0", "1"]), ("FURIOSA", ["npu:0", "npu:1"]), ("MBLT", ["0", "1"]), ("TTNPU", ["0", "1"]),
])
def test_seed_other_families_actor_gets_0_and_task_1(resource, seen):
    var = FAMILY_VARS[resource]
    ray.init(num_cpus=2, resources={resource: 2})
    assert ray.cluster_resources()[resource] == 2
    Actor, task = _seed_pair(resource, var, resources={resource: 1})
    actor = Actor.remote()
    a = ray.get(actor.info.remote())
    t = ray.get(task.remote())
    assert (a["ids"][resource], a["var"]) == (["0"], seen[0])
    assert (t["ids"][resource], t["var"]) == (["1"], seen[1])
    # No GPU was asked for: no GPU ids either; and no other family's variable is set.
    assert a["ids"].get("GPU", []) == [] and t["gpu_ids"] == []
    assert {k: v for k, v in t["env"].items() if v is not None} == {var: seen[1]}


@pytest.mark.parametrize("vendor", ["amd", "intel"])
def test_seed_gpu_vendor_setting_selects_the_variable(clean_env, vendor):
    clean_env.setenv("RAYLITE_GPU_VENDOR", vendor)   # in the driver's env before init
    var = GPU_VENDOR_VARS[vendor]
    ray.init(num_cpus=2, num_gpus=2)
    Actor, task = _seed_pair("GPU", var, num_gpus=1)
    actor = Actor.remote()
    a = ray.get(actor.info.remote())
    t = ray.get(task.remote())
    assert (a["ids"]["GPU"], a["var"], a["gpu_ids"]) == (["0"], "0", [0])
    assert (t["ids"]["GPU"], t["var"], t["gpu_ids"]) == (["1"], "1", [1])
    # Ray 2.60 sets only HIP_VISIBLE_DEVICES / ZE_AFFINITY_MASK: not CUDA's, ROCR's or oneAPI's.
    assert {k: v for k, v in a["env"].items() if v is not None} == {var: "0"}
    assert {k: v for k, v in t["env"].items() if v is not None} == {var: "1"}


def test_cpu_task_on_a_gpu_node_sees_no_gpu():
    ray.init(num_cpus=2, num_gpus=2)

    @ray.remote
    def cpu_only():
        return os.environ.get("CUDA_VISIBLE_DEVICES"), ray.get_gpu_ids()

    assert ray.get(cpu_only.remote()) == ("", [])   # as in Ray: set, but empty


def test_accelerator_ids_lists_every_family():
    ray.init(num_cpus=1, num_gpus=1)

    @ray.remote(num_gpus=1)
    def ids():
        return ray.get_runtime_context().get_accelerator_ids()

    assert ray.get(ids.remote()) == {"GPU": ["0"], "neuron_cores": [], "TPU": [], "HPU": [], "NPU": [],
                                     "RBLN": [], "FURIOSA": [], "MBLT": [], "TTNPU": []}


# --------------------------------------------------------------------- visible ids before init


@pytest.mark.parametrize("resource, vendor, before, expected", [
    ("GPU", "nvidia", {"CUDA_VISIBLE_DEVICES": "1,3"}, ["1", "3"]),
    ("GPU", "amd", {"HIP_VISIBLE_DEVICES": "1,3"}, ["1", "3"]),
    ("GPU", "amd", {"HIP_VISIBLE_DEVICES": "1,3", "ROCR_VISIBLE_DEVICES": "0,2,4,6"}, ["1", "3"]),
    ("GPU", "intel", {"ZE_AFFINITY_MASK": "1,3"}, ["1", "3"]),
    ("GPU", "intel", {"ONEAPI_DEVICE_SELECTOR": "level_zero:1,3"}, ["1", "3"]),   # Ray's fallback
    ("GPU", "intel", {"ONEAPI_DEVICE_SELECTOR": "1,3"}, ["1", "3"]),
    ("neuron_cores", "nvidia", {"NEURON_RT_VISIBLE_CORES": "1,3"}, ["1", "3"]),
    ("TPU", "nvidia", {"TPU_VISIBLE_CHIPS": "1,3"}, ["1", "3"]),
    ("HPU", "nvidia", {"HABANA_VISIBLE_MODULES": "1,3"}, ["1", "3"]),
    ("NPU", "nvidia", {"ASCEND_RT_VISIBLE_DEVICES": "1,3"}, ["1", "3"]),
    ("RBLN", "nvidia", {"RBLN_DEVICES": "1,3"}, ["1", "3"]),
    ("FURIOSA", "nvidia", {"FURIOSA_DEVICES": "npu:1,npu:3"}, ["npu:1", "npu:3"]),
    ("MBLT", "nvidia", {"QBRUNTIME_VISIBLE_DEVICES": "1,3"}, ["1", "3"]),
    ("TTNPU", "nvidia", {"TT_VISIBLE_DEVICES": "1,3"}, ["1", "3"]),
])
def test_visible_devices_before_init_restrict_the_ids(clean_env, resource, vendor, before, expected):
    """The ids come from the variable set before init; workers get the family's variable, and
    the variables Ray only reads (ROCR_VISIBLE_DEVICES, ONEAPI_DEVICE_SELECTOR) pass unchanged."""
    clean_env.setenv("RAYLITE_GPU_VENDOR", vendor)
    var = GPU_VENDOR_VARS[vendor] if resource == "GPU" else FAMILY_VARS[resource]
    for name, value in before.items():
        clean_env.setenv(name, value)
    if resource == "GPU":
        ray.init(num_cpus=2, num_gpus=2)
        Actor, task = _seed_pair(resource, var, num_gpus=1)
    else:
        ray.init(num_cpus=2, resources={resource: 2})
        Actor, task = _seed_pair(resource, var, resources={resource: 1})
    actor = Actor.remote()
    a = ray.get(actor.info.remote())
    t = ray.get(task.remote())
    assert (a["ids"][resource], a["var"]) == (["1"], expected[0])
    assert (t["ids"][resource], t["var"]) == (["3"], expected[1])
    if resource == "GPU":
        assert (a["gpu_ids"], t["gpu_ids"]) == ([1], [3])
    for name in INHERITED_VARS & set(before):
        assert a["env"][name] == t["env"][name] == before[name]


def test_amd_rocr_without_hip_is_an_init_error(clean_env):
    clean_env.setenv("RAYLITE_GPU_VENDOR", "amd")
    clean_env.setenv("ROCR_VISIBLE_DEVICES", "1,3")
    with pytest.raises(RuntimeError, match="HIP_VISIBLE_DEVICES instead of ROCR_VISIBLE_DEVICES"):
        ray.init(num_cpus=1, num_gpus=2)
    assert not ray.is_initialized()


def test_ray_opt_out_leaves_a_new_familys_variable_inherited(clean_env):
    clean_env.setenv("RAY_EXPERIMENTAL_NOSET_RBLN_RT_VISIBLE_DEVICES", "1")   # Ray's name for it
    ray.init(num_cpus=1, resources={"RBLN": 2})

    @ray.remote(resources={"RBLN": 1})
    def held():
        return ray.get_runtime_context().get_accelerator_ids()["RBLN"], os.environ.get("RBLN_DEVICES")

    assert ray.get(held.remote()) == (["0"], None)


def test_more_devices_than_visible_is_an_init_error(clean_env):
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES"):
        ray.init(num_cpus=1, num_gpus=3)
    assert not ray.is_initialized()


# --------------------------------------------------------------------- packing and sharing


def test_fractional_actors_are_packed_best_fit_0_0_1():
    ray.init(num_cpus=3, num_gpus=3)

    @ray.remote(num_gpus=0.5)
    class FractionalGPUActor:
        def ids(self):
            return ray.get_runtime_context().get_accelerator_ids()["GPU"], os.environ["CUDA_VISIBLE_DEVICES"]

    actors = [FractionalGPUActor.remote() for _ in range(3)]
    got = [ray.get(a.ids.remote()) for a in actors]
    assert got == [(["0"], "0"), (["0"], "0"), (["1"], "1")]
    assert math.isclose(_gpu_free(), 1.5)


def test_four_quarter_gpu_tasks_share_one_device_concurrently(tmp_path):
    ray.init(num_cpus=4, num_gpus=1)
    rendezvous = str(tmp_path)

    @ray.remote(num_gpus=0.25)
    def quarter(i):
        start = time.time()
        open(os.path.join(rendezvous, f"arrived-{i}"), "w").close()
        deadline = time.monotonic() + 30
        while len(os.listdir(rendezvous)) < 4 and time.monotonic() < deadline:
            time.sleep(0.005)
        met = len(os.listdir(rendezvous)) == 4   # only if all four were running at once
        return {"met": met, "start": start, "end": time.time(), "pid": os.getpid(),
                "var": os.environ["CUDA_VISIBLE_DEVICES"], "ids": ray.get_gpu_ids()}

    results = ray.get([quarter.remote(i) for i in range(4)])
    assert all(r["met"] for r in results)
    assert max(r["start"] for r in results) < min(r["end"] for r in results)   # windows overlap
    assert {r["var"] for r in results} == {"0"} and all(r["ids"] == [0] for r in results)
    assert len({r["pid"] for r in results}) == 4
    _wait_until(lambda: _gpu_free() == 1.0, what="the four quarters released")


# --------------------------------------------------------------------- invalid requests


INVALID = [
    ({"num_gpus": -1}, ("num_gpus", "-1")),
    ({"num_gpus": float("nan")}, ("num_gpus", "nan")),
    ({"num_gpus": 0.00001}, ("num_gpus", "1e-05")),
    ({"num_gpus": 1.5}, ("GPU", "1.5")),
    ({"resources": {"neuron_cores": 0.5}}, ("neuron_cores", "0.5")),
    ({"resources": {"TPU": 0.5}}, ("TPU", "0.5")),
    ({"resources": {"HPU": 0.5}}, ("HPU", "0.5")),
    ({"resources": {"RBLN": 0.5}}, ("RBLN", "0.5")),
    ({"resources": {"FURIOSA": 0.5}}, ("FURIOSA", "0.5")),
    ({"resources": {"MBLT": 0.5}}, ("MBLT", "0.5")),
    ({"resources": {"TTNPU": 0.5}}, ("TTNPU", "0.5")),
    ({"resources": {"TPU": 3}}, ("TPU", "3")),
    ({"resources": {"NPU": -2}}, ("NPU", "-2")),
    ({"num_cpus": -0.5}, ("num_cpus", "-0.5")),
]


def _check(err, words):
    text = str(err.value)
    for word in words:
        assert word in text, f"{word!r} not in {text!r}"


@pytest.mark.parametrize("options, words", INVALID)
def test_invalid_request_fails_at_decoration(options, words):
    def f():
        return 1

    class C:
        pass

    with pytest.raises(ValueError) as err:
        ray.remote(**options)(f)
    _check(err, words)
    with pytest.raises(ValueError) as err:
        ray.remote(**options)(C)
    _check(err, words)
    assert not ray.is_initialized()   # rejected before anything started


@pytest.mark.parametrize("options, words", INVALID)
def test_invalid_request_fails_at_options(options, words):
    @ray.remote
    def f():
        return 1

    @ray.remote
    class C:
        pass

    with pytest.raises(ValueError) as err:
        f.options(**options)
    _check(err, words)
    with pytest.raises(ValueError) as err:
        C.options(**options)
    _check(err, words)
    assert not ray.is_initialized()


def test_valid_shapes_are_accepted():
    for options in ({"num_gpus": 0.25}, {"num_gpus": 2}, {"resources": {"NPU": 0.5}},
                    {"resources": {"TPU": 4}}, {"resources": {"neuron_cores": 2}},
                    {"num_gpus": 0.0001}):
        ray.remote(**options)(lambda: 1)


# --------------------------------------------------------------------- worker processes


def test_gpu_task_gets_a_fresh_worker_per_call_by_default():
    assert not ray.is_initialized()
    ray.init(num_cpus=2, num_gpus=1)

    @ray.remote(num_gpus=1)
    def pid():
        return os.getpid()

    pids = [ray.get(pid.remote()) for _ in range(3)]
    assert len(set(pids)) == 3
    for p in pids:   # each worker was recycled: the process is gone, with whatever it held
        _wait_until(lambda: not _pid_alive(p), what=f"worker {p} exit")


def test_max_calls_0_reuses_only_a_worker_with_the_same_devices():
    ray.init(num_cpus=2, num_gpus=2)

    @ray.remote(num_gpus=1, max_calls=0)
    def where():
        return os.getpid(), os.environ["CUDA_VISIBLE_DEVICES"]

    @ray.remote(num_gpus=1)
    class Holder:
        def gpu(self):
            return ray.get_gpu_ids()

    p0, d0 = ray.get(where.remote())
    assert d0 == "0"
    assert ray.get(where.remote()) == (p0, "0")          # same devices: reused
    holder = Holder.remote()
    assert ray.get(holder.gpu.remote()) == [0]           # GPU 0 is now taken
    p1, d1 = ray.get(where.remote())
    assert d1 == "1" and p1 != p0                        # other device: never the GPU-0 worker
    ray.kill(holder)
    _wait_until(lambda: _gpu_free() == 2.0, what="GPU 0 released by the killed actor")
    assert ray.get(where.remote()) == (p0, "0")          # GPU 0 again: its worker again
    assert _pid_alive(p0) and _pid_alive(p1)


def test_max_calls_n_recycles_after_n_calls():
    ray.init(num_cpus=2, num_gpus=1)

    @ray.remote(num_gpus=0.5, max_calls=2)
    def pid():
        return os.getpid()

    pids = [ray.get(pid.remote()) for _ in range(5)]
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]
    for p in (pids[0], pids[2]):
        _wait_until(lambda: not _pid_alive(p), what=f"worker {p} exit after 2 calls")


def test_default_gpu_task_never_reuses_a_used_worker():
    ray.init(num_cpus=2, num_gpus=1)

    @ray.remote(num_gpus=1)
    def pid():
        return os.getpid()

    reused = ray.get(pid.options(max_calls=0).remote())
    assert ray.get(pid.remote()) != reused


def test_cpu_tasks_reuse_workers():
    ray.init(num_cpus=1)

    @ray.remote
    def pid():
        return os.getpid()

    assert len({ray.get(pid.remote()) for _ in range(3)}) == 1


# --------------------------------------------------------------------- actors hold devices


def test_devices_are_freed_when_an_actor_is_killed():
    ray.init(num_cpus=2, num_gpus=1)

    @ray.remote(num_gpus=1)
    class Holder:
        def info(self):
            return os.getpid(), os.environ["CUDA_VISIBLE_DEVICES"]

    @ray.remote(num_gpus=1)
    def task():
        return os.environ["CUDA_VISIBLE_DEVICES"]

    holder = Holder.remote()
    pid, dev = ray.get(holder.info.remote())
    assert dev == "0" and _gpu_free() == 0.0
    waiting = task.remote()
    ready, _ = ray.wait([waiting], timeout=0.3)
    assert ready == []                                   # the actor holds the only GPU
    ray.kill(holder)
    assert ray.get(waiting, timeout=30) == "0"           # the queued task gets the freed device
    _wait_until(lambda: not _pid_alive(pid), what="killed actor exit")
    _wait_until(lambda: _gpu_free() == 1.0, what="GPU back after kill")
    again = Holder.remote()                              # and so does a new actor
    assert ray.get(again.info.remote())[1] == "0"


def test_fractional_actor_frees_its_share_on_kill():
    ray.init(num_cpus=2, num_gpus=1)

    @ray.remote(num_gpus=0.5)
    class Half:
        def ping(self):
            return ray.get_gpu_ids()

    a, b = Half.remote(), Half.remote()
    assert ray.get([a.ping.remote(), b.ping.remote()]) == [[0], [0]]
    assert _gpu_free() == 0.0
    ray.kill(a)
    _wait_until(lambda: _gpu_free() == 0.5, what="half a GPU back")
    c = Half.remote()
    assert ray.get(c.ping.remote()) == [0]


# --------------------------------------------------------------------- accelerator_type


def test_accelerator_type_match_runs():
    ray.init(num_cpus=2, num_gpus=1, resources={"accelerator_type:H200": 1})
    from raylite.util.accelerators import NVIDIA_H200

    @ray.remote(num_gpus=1, accelerator_type=NVIDIA_H200)
    def on_h200():
        return ray.get_gpu_ids(), ray.get_runtime_context().get_assigned_resources()

    ids, assigned = ray.get(on_h200.remote())
    assert ids == [0]
    assert math.isclose(assigned["accelerator_type:H200"], 0.001)
    assert ray.get_runtime_context().get_node_labels()["ray.io/accelerator-type"] == "H200"   # as Ray labels it

    @ray.remote(accelerator_type="H200")
    class OnH200:
        def ok(self):
            return "ok"

    assert ray.get(OnH200.remote().ok.remote()) == "ok"


def test_every_accelerator_type_constant_of_ray_has_rays_value():
    pytest.importorskip("ray.util.accelerators")
    from ray.util.accelerators import accelerators as theirs   # every constant, not only those re-exported
    from raylite.util import accelerators as ours
    constants = {n: v for n, v in vars(theirs).items() if n.isupper() and isinstance(v, str)}
    assert len(constants) > 50 and "FURIOSA_RNGD" in constants
    assert {n: getattr(ours, n, None) for n in constants} == constants


def test_accelerator_type_mismatch_is_infeasible():
    ray.init(num_cpus=2, num_gpus=1, resources={"accelerator_type:H200": 1})
    other = "A100" if "accelerator_type:A100" not in ray.cluster_resources() else "K80"

    @ray.remote(num_gpus=1, accelerator_type=other)
    def elsewhere():
        return "ran"

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ref = elsewhere.remote()
    assert any(f"accelerator_type:{other}" in str(w.message) for w in caught), [str(w.message) for w in caught]
    with pytest.raises(InfeasibleTaskError, match=f"accelerator_type:{other}"):
        ray.get(ref, timeout=30)
    assert _gpu_free() == 1.0   # nothing was taken for it
