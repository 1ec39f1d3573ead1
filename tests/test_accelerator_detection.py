"""Accelerator families: vendor choice, visible ids, detection, worker env vars.

Hardware is faked at its boundary: a stand-in ``pynvml`` module for NVML and a
temporary directory tree for device nodes and sysfs (``root=``).
"""

import sys
import types

import pytest

from helpers import make_tree
from raylite.core import accelerators as acc
from raylite.core.resources import SCALE

NVIDIA = {"RAYLITE_GPU_VENDOR": "nvidia"}
FAMILY_VARS = {
    "nvidia": ("GPU", "CUDA_VISIBLE_DEVICES"),
    "amd": ("GPU", "ROCR_VISIBLE_DEVICES"),
    "intel": ("GPU", "ONEAPI_DEVICE_SELECTOR"),
    "aws": ("neuron_cores", "NEURON_RT_VISIBLE_CORES"),
    "google": ("TPU", "TPU_VISIBLE_CHIPS"),
    "habana": ("HPU", "HABANA_VISIBLE_MODULES"),
    "huawei": ("NPU", "ASCEND_RT_VISIBLE_DEVICES"),
}


def vendor_env(vendor: str, **extra: str) -> dict:
    """An environment selecting the GPU vendor when the family is a GPU one."""
    env = {"RAYLITE_GPU_VENDOR": vendor if vendor in ("nvidia", "amd", "intel") else "nvidia"}
    env.update(extra)
    return env


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
    for vendor in ("nvidia", "amd", "intel"):
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
    for vendor, (res, var) in FAMILY_VARS.items():
        fam = acc.family_for(res, vendor_env(vendor))
        assert (fam.resource, fam.env_var) == (res, var)
        assert fam.allow_fractions == (res in ("GPU", "NPU"))
    assert acc.family_for("CPU") is None and acc.family_for("memory") is None


# --------------------------------------------------------------- visible ids

@pytest.mark.parametrize("vendor", sorted(FAMILY_VARS))
def test_visible_ids_per_family(vendor):
    res, var = FAMILY_VARS[vendor]
    assert acc.visible_ids(res, vendor_env(vendor)) is None
    value = "level_zero:1,3" if vendor == "intel" else "1,3"
    assert acc.visible_ids(res, vendor_env(vendor, **{var: value})) == ["1", "3"]
    assert acc.visible_ids(res, vendor_env(vendor, **{var: ""})) == []


def test_visible_ids_forms():
    intel = vendor_env("intel")
    sel = "ONEAPI_DEVICE_SELECTOR"
    assert acc.visible_ids("GPU", {**intel, sel: "0,1"}) == ["0", "1"]
    assert acc.visible_ids("GPU", {**intel, sel: "opencl:*;level_zero:2"}) == ["2"]
    assert acc.visible_ids("GPU", {**intel, sel: "level_zero:*"}) is None
    assert acc.visible_ids("GPU", {**intel, sel: "level_zero:"}) == []
    cuda = {**NVIDIA, "CUDA_VISIBLE_DEVICES": " 0, 2 "}
    assert acc.visible_ids("GPU", cuda) == ["0", "2"]
    assert acc.visible_ids("GPU", {**NVIDIA, "CUDA_VISIBLE_DEVICES": "-1"}) == []
    assert acc.visible_ids("GPU", {**NVIDIA, "CUDA_VISIBLE_DEVICES": "1,-1,2"}) == ["1"]
    assert acc.visible_ids("GPU", {**NVIDIA, "CUDA_VISIBLE_DEVICES": "NoDevFiles"}) == []
    assert acc.visible_ids("CPU", {"CUDA_VISIBLE_DEVICES": "1"}) is None


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
    res, var = FAMILY_VARS[vendor]
    value = "level_zero:2,5" if vendor == "intel" else "2,5"
    env = vendor_env(vendor, **{var: value})
    kwargs = {"num_gpus": 2} if res == "GPU" else {"resources": {res: 2, "custom": 1}}
    totals, ids, _ = acc.node_devices(environ=env, root=empty_root, **kwargs)
    assert totals == {res: 2 * SCALE} and ids == {res: ["2", "5"]}


# --------------------------------------------------- device-node detection

def test_detect_other_families_from_device_nodes(tmp_path, nvml):
    nvml()
    root = make_tree(tmp_path, {
        "dev/neuron0": "", "dev/neuron1": "",
        "sys/devices/virtual/neuron_device/neuron0/core_count": "2\n",
        "sys/devices/virtual/neuron_device/neuron1/core_count": "2\n",
        "dev/accel0": "", "dev/accel1": "", "dev/accel2": "", "dev/accel3": "",
        "dev/hl0": "", "dev/hl1": "", "dev/hl_controlD0": "",
        "dev/davinci0": "", "dev/davinci1": "", "dev/davinci_manager": "",
    })
    env = {**NVIDIA, "TPU_ACCELERATOR_TYPE": "v4-8", "HABANA_VISIBLE_MODULES": "1"}
    assert acc.detect(env, root=root) == {
        "neuron_cores": (4, "aws-neuron-core"),
        "TPU": (4, "TPU-V4"),
        "HPU": (1, "Intel-GAUDI"),
        "NPU": (2, None),
    }


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
    env = {"ROCR_VISIBLE_DEVICES": "1"}
    totals, ids, accel_type = acc.node_devices(environ=env, root=root)
    assert ids == {"GPU": ["1"]} and accel_type == "AMD-Instinct-MI300X-OAM"
    assert totals == {"GPU": SCALE, "accelerator_type:AMD-Instinct-MI300X-OAM": SCALE}


def test_detect_intel_without_dpctl_finds_nothing(empty_root):
    assert acc.detect({"RAYLITE_GPU_VENDOR": "intel"}, root=empty_root) == {}


def test_detect_survives_broken_probe(monkeypatch, nvml, empty_root):
    nvml()
    monkeypatch.setattr(acc, "_tpu_chips", lambda root: 1 / 0)
    assert acc.detect(NVIDIA, root=empty_root) == {}


# ---------------------------------------------------------------- worker_env

@pytest.mark.parametrize("vendor", sorted(FAMILY_VARS))
def test_worker_env_per_family(vendor):
    res, var = FAMILY_VARS[vendor]
    env = vendor_env(vendor)
    ids = ["0", "1", "2", "3"] if res == "TPU" else ["0", "2"]
    got = acc.worker_env({res: ids}, env)
    joined = ",".join(ids)
    gpu_var = acc.family_for("GPU", env).env_var
    expected = {v: "" for r, v in FAMILY_VARS.values() if r != "GPU"}
    expected[gpu_var] = "level_zero:" if gpu_var == "ONEAPI_DEVICE_SELECTOR" else ""
    expected[var] = "level_zero:" + joined if vendor == "intel" else joined
    assert got == expected   # every other family hidden, as Ray does for num_*=0


def test_worker_env_cpu_task_hides_gpus():
    assert acc.worker_env({}, NVIDIA, resources=["GPU"]) == {"CUDA_VISIBLE_DEVICES": ""}
    assert acc.worker_env({}, {"RAYLITE_GPU_VENDOR": "intel"}, resources=["GPU"]) == {
        "ONEAPI_DEVICE_SELECTOR": "level_zero:"}
    got = acc.worker_env({"GPU": ["3"]}, NVIDIA, resources=["GPU"])
    assert got == {"CUDA_VISIBLE_DEVICES": "3"}


def test_worker_env_opt_outs():
    env = {**NVIDIA, "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}
    assert "CUDA_VISIBLE_DEVICES" not in acc.worker_env({"GPU": ["0"]}, env)
    env = {**NVIDIA, "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}
    assert acc.worker_env({"GPU": ["1"]}, env) == {"CUDA_VISIBLE_DEVICES": "1"}


def test_worker_env_tpu_subhost_bounds():
    got = acc.worker_env({"TPU": ["1"]}, NVIDIA, resources=["TPU"])
    assert got == {"TPU_VISIBLE_CHIPS": "1", "TPU_CHIPS_PER_HOST_BOUNDS": "1,1,1",
                   "TPU_HOST_BOUNDS": "1,1,1"}
    got = acc.worker_env({"TPU": ["0", "1"]}, NVIDIA, resources=["TPU"])
    assert got["TPU_CHIPS_PER_HOST_BOUNDS"] == "1,2,1"


def test_accelerator_ids_view():
    assert acc.accelerator_ids({"GPU": ["0"]}) == {
        "GPU": ["0"], "neuron_cores": [], "TPU": [], "HPU": [], "NPU": []}


def test_detect_survives_broken_gpu_probe(monkeypatch, empty_root):
    monkeypatch.setattr(acc, "_detect_amd", lambda root: int("garbage"))
    assert acc.detect({"RAYLITE_GPU_VENDOR": "amd"}, root=empty_root) == {}
