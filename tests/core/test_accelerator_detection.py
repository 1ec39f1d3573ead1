"""Accelerator families: vendor choice, visible ids, detection, worker env vars.

Hardware is faked at its boundary: a stand-in ``pynvml`` module for NVML and a
temporary directory tree for device nodes and sysfs (``root=``).
"""

import importlib.machinery
import sys
import types

import pytest

from helpers import make_tree
from raylite.core.hardware import accelerators as acc
from raylite.core.wire.resources import SCALE

NVIDIA = {"RAYLITE_GPU_VENDOR": "nvidia"}
GPU_VENDORS = ("nvidia", "amd", "intel", "metax")
FAMILY_VARS = {   # vendor -> (resource, variable, Ray 2.60's opt-out for it)
    "nvidia": ("GPU", "CUDA_VISIBLE_DEVICES", "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"),
    "amd": ("GPU", "HIP_VISIBLE_DEVICES", "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES"),
    "intel": ("GPU", "ZE_AFFINITY_MASK", "RAY_EXPERIMENTAL_NOSET_ZE_AFFINITY_MASK"),
    "metax": ("GPU", "CUDA_VISIBLE_DEVICES", "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"),
    "aws": ("neuron_cores", "NEURON_RT_VISIBLE_CORES", "RAY_EXPERIMENTAL_NOSET_NEURON_RT_VISIBLE_CORES"),
    "google": ("TPU", "TPU_VISIBLE_CHIPS", "RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS"),
    "habana": ("HPU", "HABANA_VISIBLE_MODULES", "RAY_EXPERIMENTAL_NOSET_HABANA_VISIBLE_MODULES"),
    "huawei": ("NPU", "ASCEND_RT_VISIBLE_DEVICES", "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"),
    "rebellions": ("RBLN", "RBLN_DEVICES", "RAY_EXPERIMENTAL_NOSET_RBLN_RT_VISIBLE_DEVICES"),
    "furiosa": ("FURIOSA", "FURIOSA_DEVICES", "RAY_EXPERIMENTAL_NOSET_FURIOSA_DEVICES"),
    "mobilint": ("MBLT", "QBRUNTIME_VISIBLE_DEVICES", "RAY_EXPERIMENTAL_NOSET_MBLT_RT_VISIBLE_DEVICES"),
    "tenstorrent": ("TTNPU", "TT_VISIBLE_DEVICES", "RAY_EXPERIMENTAL_NOSET_TENSTORRENT_VISIBLE_DEVICES"),
}
ALL_RESOURCES = ["GPU", "neuron_cores", "TPU", "HPU", "NPU", "RBLN", "FURIOSA", "MBLT", "TTNPU"]


def vendor_env(vendor: str, **extra: str) -> dict:
    """An environment selecting the GPU vendor when the family is a GPU one."""
    env = {"RAYLITE_GPU_VENDOR": vendor if vendor in GPU_VENDORS else "nvidia"}
    env.update(extra)
    return env


def worker_value(vendor: str, ids: list[str]) -> str:
    """What a worker holding `ids` sees: Furiosa's tools read "npu:<id>", the others plain ids."""
    return ",".join("npu:" + i if vendor == "furiosa" else i for i in ids)


class FakeNVML(types.ModuleType):
    """Just the NVML calls detection makes; records init/shutdown pairing."""

    class NVMLError(Exception):
        pass

    def __init__(self, names, fail_init=False, as_bytes=False):
        super().__init__("pynvml")
        self.names, self.fail_init, self.as_bytes = names, fail_init, as_bytes
        self.inits = self.shutdowns = 0
        self.asked: list[int] = []

    def nvmlInit(self):
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, i):
        self.asked.append(i)
        return ("handle", i)

    def nvmlDeviceGetName(self, handle):
        name = self.names[handle[1]]
        return name.encode() if self.as_bytes else name


@pytest.fixture
def nvml(monkeypatch):
    def install(*names, **kw):
        fake = FakeNVML(list(names), **kw)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake
    return install


@pytest.fixture
def empty_root(tmp_path):
    return str(tmp_path)


# ------------------------------------------------------------------- vendors

def test_vendor_setting_wins_and_is_validated(empty_root):
    for vendor in GPU_VENDORS:
        assert acc.gpu_vendor({"RAYLITE_GPU_VENDOR": vendor.upper()}, root=empty_root) == vendor
        assert acc.family_for("GPU", {"RAYLITE_GPU_VENDOR": vendor}).vendor == vendor
    with pytest.raises(ValueError, match="RAYLITE_GPU_VENDOR"):
        acc.gpu_vendor({"RAYLITE_GPU_VENDOR": "voodoo"})


def test_vendor_probe_defaults_to_nvidia(tmp_path):
    assert acc.gpu_vendor({}, root=str(tmp_path)) == "nvidia"
    amd = tmp_path / "amd"
    (amd / "dev").mkdir(parents=True)
    (amd / "dev" / "kfd").touch()
    assert acc.gpu_vendor({}, root=str(amd)) == "amd"


def test_families_table():
    for vendor, (res, var, noset) in FAMILY_VARS.items():
        fam = acc.family_for(res, vendor_env(vendor))
        assert (fam.resource, fam.env_var, fam.noset_var) == (res, var, noset)
        assert fam.allow_fractions == (res in ("GPU", "NPU"))
    assert acc.family_for("CPU") is None and acc.family_for("memory") is None
    assert sorted(acc.OTHER_FAMILIES) == sorted(r for r in ALL_RESOURCES if r != "GPU")


def test_families_match_ray():
    """Resource names, variables and opt-outs are Ray's own (checked against it when installed)."""
    managers = pytest.importorskip("ray._private.accelerators")
    from ray._private.accelerators import amd_gpu, furiosa, intel_gpu, mblt, rbln, ttnpu
    ray_noset = {"amd": amd_gpu.NOSET_HIP_VISIBLE_DEVICES_ENV_VAR,
                 "intel": intel_gpu.NOSET_ZE_AFFINITY_MASK_ENV_VAR,
                 "rebellions": rbln.NOSET_RBLN_RT_VISIBLE_DEVICES_ENV_VAR,
                 "furiosa": furiosa.NOSET_FURIOSA_VISIBLE_DEVICES_ENV_VAR,
                 "mobilint": mblt.NOSET_MBLT_RT_VISIBLE_DEVICES_ENV_VAR,
                 "tenstorrent": ttnpu.NOSET_TENSTORRENT_VISIBLE_DEVICES_ENV_VAR}
    assert {v: FAMILY_VARS[v][2] for v in ray_noset} == ray_noset
    theirs = {m.get_resource_name(): m for m in managers.get_all_accelerator_managers()}
    assert set(ALL_RESOURCES) <= set(theirs)
    for res in ALL_RESOURCES:
        if res != "GPU":   # Ray's GPU manager depends on the machine; GPU vendors are checked above
            assert acc.family_for(res).env_var == theirs[res].get_visible_accelerator_ids_env_var()


# --------------------------------------------------------------- visible ids

@pytest.mark.parametrize("vendor", sorted(FAMILY_VARS))
def test_visible_ids_per_family(vendor):
    res, var, _ = FAMILY_VARS[vendor]
    assert acc.visible_ids(res, vendor_env(vendor)) is None
    assert acc.visible_ids(res, vendor_env(vendor, **{var: "1,3"})) == ["1", "3"]
    assert acc.visible_ids(res, vendor_env(vendor, **{var: ""})) == []


def test_visible_ids_forms():
    intel = vendor_env("intel")
    sel = "ONEAPI_DEVICE_SELECTOR"
    # Ray reads the selector only when ZE_AFFINITY_MASK is unset.
    assert acc.visible_ids("GPU", {**intel, sel: "0,1"}) == ["0", "1"]
    assert acc.visible_ids("GPU", {**intel, sel: "level_zero:1,3"}) == ["1", "3"]
    assert acc.visible_ids("GPU", {**intel, sel: "opencl:*;level_zero:2"}) == ["2"]
    assert acc.visible_ids("GPU", {**intel, sel: "level_zero:*"}) is None
    assert acc.visible_ids("GPU", {**intel, sel: "level_zero:"}) == []
    assert acc.visible_ids("GPU", {**intel, sel: "level_zero:1,3", "ZE_AFFINITY_MASK": "2"}) == ["2"]
    furiosa = {"FURIOSA_DEVICES": "npu:1, npu:3,5, npu:7:0-3"}   # a PE suffix names its device
    assert acc.visible_ids("FURIOSA", furiosa) == ["1", "3", "5", "7"]
    assert acc.visible_ids("TTNPU", {"TT_VISIBLE_DEVICES": "NoDevFiles"}) == []
    cuda = {**NVIDIA, "CUDA_VISIBLE_DEVICES": " 0, 2 "}
    assert acc.visible_ids("GPU", cuda) == ["0", "2"]
    assert acc.visible_ids("GPU", {**NVIDIA, "CUDA_VISIBLE_DEVICES": "-1"}) == []
    assert acc.visible_ids("GPU", {**NVIDIA, "CUDA_VISIBLE_DEVICES": "1,-1,2"}) == ["1"]
    assert acc.visible_ids("GPU", {**NVIDIA, "CUDA_VISIBLE_DEVICES": "NoDevFiles"}) == []
    assert acc.visible_ids("CPU", {"CUDA_VISIBLE_DEVICES": "1"}) is None


def test_amd_refuses_rocr_without_hip():
    amd = vendor_env("amd")
    with pytest.raises(RuntimeError, match="HIP_VISIBLE_DEVICES instead of ROCR_VISIBLE_DEVICES"):
        acc.visible_ids("GPU", {**amd, "ROCR_VISIBLE_DEVICES": "1"})
    # With HIP set, HIP gives the ids (counted within ROCR's devices) and ROCR is not read.
    assert acc.visible_ids("GPU", {**amd, "ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "1"}) == ["1"]
    assert acc.visible_ids("GPU", {**NVIDIA, "ROCR_VISIBLE_DEVICES": "1"}) is None   # only AMD cares


# ------------------------------------------------------------------- NVML

@pytest.mark.parametrize(
    "name, expected",
    [("NVIDIA H200", "H200"), ("Tesla T4", "T4"), ("NVIDIA A100-SXM4-80GB", "A100"),
     ("Tesla V100-SXM2-16GB", "V100"), ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA A10G", "A10G"),
     ("NVIDIA L40S", "L40S"), ("NVIDIA GeForce RTX 4090", "GeForce-RTX-4090"),
     ("NVIDIA RTX A6000", "RTX-A6000"), (b"NVIDIA L4", "L4")],
)
def test_nvidia_type_names(name, expected):
    assert acc.nvidia_type_from_name(name) == expected


@pytest.mark.parametrize("as_bytes", [False, True])
def test_nvml_detection(nvml, empty_root, as_bytes):
    fake = nvml("NVIDIA H200", "NVIDIA H200", as_bytes=as_bytes)
    assert acc.detect(NVIDIA, root=empty_root) == {"GPU": (2, "H200")}
    assert fake.inits == fake.shutdowns == 1


def test_nvml_failure_means_no_gpu(nvml, empty_root):
    nvml("NVIDIA H200", fail_init=True)
    assert acc.detect(NVIDIA, root=empty_root) == {}


def test_nvml_missing_means_no_gpu(monkeypatch, empty_root):
    monkeypatch.setitem(sys.modules, "pynvml", None)   # import raises ImportError
    assert acc.detect(NVIDIA, root=empty_root) == {}


def test_nvml_zero_devices(nvml, empty_root):
    fake = nvml()
    assert acc.detect(NVIDIA, root=empty_root) == {}
    assert fake.shutdowns == 1


def test_nvml_visible_devices_cap_count_and_pick_type(nvml, empty_root):
    fake = nvml("Tesla T4", "NVIDIA A100-SXM4-80GB", "Tesla T4", "NVIDIA A100-SXM4-80GB")
    env = {**NVIDIA, "CUDA_VISIBLE_DEVICES": "1,3"}
    assert acc.detect(env, root=empty_root) == {"GPU": (2, "A100")}
    assert fake.asked == [1]


def test_node_devices_from_nvml(nvml, empty_root):
    nvml("NVIDIA H200", "NVIDIA H200", "NVIDIA H200")
    totals, ids, accel_type = acc.node_devices(environ=NVIDIA, root=empty_root)
    assert totals == {"GPU": 3 * SCALE, "accelerator_type:H200": SCALE}
    assert ids == {"GPU": ["0", "1", "2"]} and accel_type == "H200"
    # Explicit count overrides detection but keeps the detected type (as Ray).
    totals, ids, _ = acc.node_devices(num_gpus=1, environ=NVIDIA, root=empty_root)
    assert totals == {"GPU": SCALE, "accelerator_type:H200": SCALE} and ids == {"GPU": ["0"]}
    assert acc.node_devices(num_gpus=0, environ=NVIDIA, root=empty_root) == ({}, {}, None)


# ------------------------------------------------------------ node_devices

def test_node_devices_logical_on_cpu_box(nvml, empty_root):
    nvml()
    env = {**NVIDIA, "CUDA_VISIBLE_DEVICES": "1,3"}
    totals, ids, accel_type = acc.node_devices(num_gpus=2, environ=env, root=empty_root)
    assert totals == {"GPU": 2 * SCALE} and ids == {"GPU": ["1", "3"]} and accel_type is None
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES"):
        acc.node_devices(num_gpus=3, environ=env, root=empty_root)
    with pytest.raises(ValueError, match="num_gpus"):
        acc.node_devices(num_gpus=1.5, environ=NVIDIA, root=empty_root)


@pytest.mark.parametrize("vendor", sorted(FAMILY_VARS))
def test_node_devices_explicit_with_visible_ids(vendor, nvml, empty_root):
    nvml()
    res, var, _ = FAMILY_VARS[vendor]
    env = vendor_env(vendor, **{var: "2,5"})
    kwargs = {"num_gpus": 2} if res == "GPU" else {"resources": {res: 2, "custom": 1}}
    totals, ids, _ = acc.node_devices(environ=env, root=empty_root, **kwargs)
    assert totals == {res: 2 * SCALE} and ids == {res: ["2", "5"]}


# --------------------------------------------------- device-node detection

def test_detect_other_families_from_device_nodes(tmp_path, nvml, monkeypatch):
    nvml()
    for sdk in ("rebel", "furiosa_smi_py", "qbruntime"):   # no vendor library is needed (or imported)
        monkeypatch.setitem(sys.modules, sdk, None)
    mgmt = "sys/class/rngd_mgmt/rngd!npu{}mgmt/platform_type"
    root = make_tree(tmp_path, {
        "dev/neuron0": "", "dev/neuron1": "",
        "sys/devices/virtual/neuron_device/neuron0/core_count": "2\n",
        "sys/devices/virtual/neuron_device/neuron1/core_count": "2\n",
        "dev/accel0": "", "dev/accel1": "", "dev/accel2": "", "dev/accel3": "",
        "dev/hl0": "", "dev/hl1": "", "dev/hl_controlD0": "",
        "dev/davinci0": "", "dev/davinci1": "", "dev/davinci_manager": "",
        "dev/rbln0": "", "dev/rbln1": "", "dev/rbln2": "", "dev/rsd0": "", "dev/rblnfs0": "",
        mgmt.format(0): "FuriosaAI\n", mgmt.format(1): "FuriosaAI\n",
        "sys/class/rngd_mgmt/rngd!npu0pe0/alloc_status": "",
        "dev/regulus-npu0": "", "dev/regulus-usb": "", "dev/regulus": "",
        "dev/tenstorrent/0": "", "dev/tenstorrent/1": "",
    })
    env = {**NVIDIA, "TPU_ACCELERATOR_TYPE": "v4-8", "HABANA_VISIBLE_MODULES": "1",
           "TT_VISIBLE_DEVICES": "1"}
    assert acc.detect(env, root=root) == {
        "neuron_cores": (4, "aws-neuron-core"),
        "TPU": (4, "TPU-V4"),
        "HPU": (1, "Intel-GAUDI"),
        "NPU": (2, None),
        "RBLN": (3, None),
        "FURIOSA": (2, None),
        "MBLT": (1, "MOBILINT_REGULUS"),
        "TTNPU": (1, None),
    }


def test_detect_mobilint_aries(tmp_path, nvml):
    nvml()
    root = make_tree(tmp_path, {"dev/aries0": "", "dev/aries1": ""})
    totals, ids, accel_type = acc.node_devices(environ=NVIDIA, root=root)
    assert totals == {"MBLT": 2 * SCALE, "accelerator_type:MOBILINT_ARIES": SCALE}
    assert ids == {"MBLT": ["0", "1"]} and accel_type == "MOBILINT_ARIES"


def test_detect_neuron_without_sysfs_guesses_two_cores(tmp_path, nvml):
    nvml()
    root = make_tree(tmp_path, {"dev/neuron0": ""})
    assert acc.detect(NVIDIA, root=root) == {"neuron_cores": (2, "aws-neuron-core")}


def test_detect_tpu_through_vfio(tmp_path, nvml):
    nvml()
    root = make_tree(tmp_path, {
        "sys/bus/pci/drivers/vfio-pci/0000:00:04.0/vendor": "0x1ae0\n",
        "sys/bus/pci/drivers/vfio-pci/0000:00:05.0/vendor": "0x1ae0\n",
        "sys/bus/pci/drivers/vfio-pci/0000:00:06.0/vendor": "0x10de\n",
    })
    env = {**NVIDIA, "TPU_ACCELERATOR_TYPE": "v5litepod-8"}
    assert acc.detect(env, root=root) == {"TPU": (2, "TPU-V5LITEPOD")}


def test_detect_amd_from_kfd_topology(tmp_path):
    topo = "sys/class/kfd/kfd/topology/nodes"
    files = {"dev/kfd": "", f"{topo}/0/properties": "simd_count 0\ndevice_id 0\n"}
    for node in (1, 2):
        files[f"{topo}/{node}/properties"] = (
            f"cpu_cores_count 0\nsimd_count 304\ndevice_id {0x74A1}\n")
    root = make_tree(tmp_path, files)
    assert acc.detect({}, root=root) == {"GPU": (2, "AMD-Instinct-MI300X-OAM")}
    env = {"HIP_VISIBLE_DEVICES": "1"}
    totals, ids, accel_type = acc.node_devices(environ=env, root=root)
    assert ids == {"GPU": ["1"]} and accel_type == "AMD-Instinct-MI300X-OAM"
    assert totals == {"GPU": SCALE, "accelerator_type:AMD-Instinct-MI300X-OAM": SCALE}
    with pytest.raises(RuntimeError, match="HIP_VISIBLE_DEVICES"):
        acc.node_devices(environ={"ROCR_VISIBLE_DEVICES": "1"}, root=root)
    assert acc.node_devices(num_gpus=0, environ={"ROCR_VISIBLE_DEVICES": "1"}, root=root)[0] == {}


def test_detect_intel_without_dpctl_finds_nothing(empty_root):
    assert acc.detect({"RAYLITE_GPU_VENDOR": "intel"}, root=empty_root) == {}


def test_detection_imports_nothing_without_vendor_tooling(empty_root):
    before = set(sys.modules)
    for vendor in ("amd", "intel", "metax"):
        assert acc.detect({"RAYLITE_GPU_VENDOR": vendor}, root=empty_root) == {}
    assert set(sys.modules) - before == set()


def _fake_mxsml(monkeypatch, names):
    """pymxsml.mxsml_extension with the calls detection makes; records init/shutdown."""
    ext = types.ModuleType("pymxsml.mxsml_extension")
    ext.calls = []
    ext.mxSmlExInit = lambda: ext.calls.append("init")
    ext.mxSmlExShutdown = lambda: ext.calls.append("shutdown")
    ext.mxSmlExDeviceGetCount = lambda: len(names)
    ext.mxSmlExDeviceGetHandleByIndex = lambda i: i
    ext.mxSmlExDeviceGetName = lambda handle: names[handle]
    pkg = types.ModuleType("pymxsml")
    pkg.__spec__ = importlib.machinery.ModuleSpec("pymxsml", None)
    pkg.mxsml_extension = ext
    monkeypatch.setitem(sys.modules, "pymxsml", pkg)
    monkeypatch.setitem(sys.modules, "pymxsml.mxsml_extension", ext)
    return ext


def test_detect_metax_through_pymxsml(monkeypatch, empty_root):
    metax = {"RAYLITE_GPU_VENDOR": "metax"}
    assert acc.detect(metax, root=empty_root) == {}   # pymxsml not installed: no MetaX GPU
    ext = _fake_mxsml(monkeypatch, [b"MXC500", b"MXC500"])
    assert acc.detect(metax, root=empty_root) == {"GPU": (2, "MXC500")}
    assert ext.calls == ["init", "shutdown"]
    assert acc.worker_env({"GPU": ["1"]}, metax, resources=["GPU"]) == {"CUDA_VISIBLE_DEVICES": "1"}


def test_detect_survives_broken_probe(monkeypatch, nvml, empty_root):
    nvml()
    monkeypatch.setattr(acc.device_probes, "tpu_chips", lambda root: 1 / 0)
    assert acc.detect(NVIDIA, root=empty_root) == {}


# ---------------------------------------------------------------- worker_env

@pytest.mark.parametrize("vendor", sorted(FAMILY_VARS))
def test_worker_env_per_family(vendor):
    res, var, _ = FAMILY_VARS[vendor]
    env = vendor_env(vendor)
    ids = ["0", "1", "2", "3"] if res == "TPU" else ["0", "2"]
    got = acc.worker_env({res: ids}, env)
    gpu_var = acc.family_for("GPU", env).env_var
    expected = {v: "" for r, v, _ in FAMILY_VARS.values() if r != "GPU"}
    expected[gpu_var] = ""
    expected[var] = worker_value(vendor, ids)
    assert got == expected   # every other family hidden, as Ray does for num_*=0


def test_worker_env_cpu_task_hides_gpus():
    assert acc.worker_env({}, NVIDIA, resources=["GPU"]) == {"CUDA_VISIBLE_DEVICES": ""}
    assert acc.worker_env({}, vendor_env("intel"), resources=["GPU"]) == {"ZE_AFFINITY_MASK": ""}
    assert acc.worker_env({}, vendor_env("amd"), resources=["GPU"]) == {"HIP_VISIBLE_DEVICES": ""}
    got = acc.worker_env({"GPU": ["3"]}, NVIDIA, resources=["GPU"])
    assert got == {"CUDA_VISIBLE_DEVICES": "3"}


@pytest.mark.parametrize("vendor", sorted(FAMILY_VARS))
def test_worker_env_opt_outs(vendor):
    res, var, noset = FAMILY_VARS[vendor]
    family_vars = {v for _, v, _ in FAMILY_VARS.values()}
    env = vendor_env(vendor, **{noset: "1"})
    assert var not in acc.worker_env({res: ["0"]}, env, resources=[res])
    assert acc.worker_env({res: ["0"]}, vendor_env(vendor), resources=[res])[var] == worker_value(vendor, ["0"])
    env = vendor_env(vendor, RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0")   # families with no ids: untouched
    got = acc.worker_env({res: ["1"]}, env)
    assert {k: v for k, v in got.items() if k in family_vars} == {var: worker_value(vendor, ["1"])}


def test_worker_env_tpu_subhost_bounds():
    got = acc.worker_env({"TPU": ["1"]}, NVIDIA, resources=["TPU"])
    assert got == {"TPU_VISIBLE_CHIPS": "1", "TPU_CHIPS_PER_HOST_BOUNDS": "1,1,1",
                   "TPU_HOST_BOUNDS": "1,1,1"}
    got = acc.worker_env({"TPU": ["0", "1"]}, NVIDIA, resources=["TPU"])
    assert got["TPU_CHIPS_PER_HOST_BOUNDS"] == "1,2,1"


def test_accelerator_ids_view():
    assert acc.accelerator_ids({"GPU": ["0"]}) == {r: ["0"] if r == "GPU" else [] for r in ALL_RESOURCES}


def test_detect_survives_broken_gpu_probe(monkeypatch, empty_root):
    monkeypatch.setattr(acc.device_probes, "amd", lambda root: int("garbage"))
    assert acc.detect({"RAYLITE_GPU_VENDOR": "amd"}, root=empty_root) == {}
