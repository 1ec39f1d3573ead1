"""Accelerator families: detection, visible-device variables, worker environment.

Each family maps a resource name to the variable its runtime reads to restrict
the devices a process sees. The variable must be in a worker's environment
before user code imports a framework, so the scheduler asks ``worker_env`` for
it when it starts (or picks) a worker.

Detection runs only when called (at ``init``), never at import, and never
hangs: NVIDIA through NVML, Intel and MetaX through their Python bindings only
when installed, the others through device nodes and sysfs; the one external
tool (``neuron-ls``) runs with a timeout. Nothing here imports a framework or
initialises CUDA, so the driver can still fork workers safely.

``RAYLITE_GPU_VENDOR`` (``nvidia`` | ``amd`` | ``intel`` | ``metax``) selects
which GPU family the ``GPU`` resource means when detection cannot tell (tests,
odd machines). Ray's ``RAY_EXPERIMENTAL_NOSET_*`` opt-outs and
``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0`` are honoured by ``worker_env``.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import sys
from dataclasses import dataclass
from collections.abc import Callable, Iterable, Mapping

from raylite.core.resources import (
    ACCELERATOR_RESOURCES,
    ACCELERATOR_TYPE_PREFIX,
    FRACTIONAL_RESOURCES,
    SCALE,
    to_fixed,
)


GPU_VENDOR_ENV = "RAYLITE_GPU_VENDOR"
INTEL_SELECTOR_VAR = "ONEAPI_DEVICE_SELECTOR"  # read for the ids when ZE_AFFINITY_MASK is unset
INTEL_SELECTOR_PREFIX = "level_zero:"
AMD_ROCR_VAR = "ROCR_VISIBLE_DEVICES"  # Ray refuses it alone: HIP ids count within ROCR's
FURIOSA_PREFIX = "npu:"  # FURIOSA_DEVICES lists "npu:0,npu:3", the form furiosa-llm takes
_TOOL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class AcceleratorFamily:
    """How one kind of device is named, restricted and shared."""

    resource: str
    env_var: str
    vendor: str
    allow_fractions: bool
    noset_var: str  # Ray's opt-out: when set, workers inherit env_var untouched


def _family(resource: str, env_var: str, vendor: str, noset: str = "") -> AcceleratorFamily:
    """A family whose opt-out is RAY_EXPERIMENTAL_NOSET_<noset or env_var>, as Ray names it."""
    return AcceleratorFamily(resource, env_var, vendor, resource in FRACTIONAL_RESOURCES,
                             "RAY_EXPERIMENTAL_NOSET_" + (noset or env_var))


GPU_FAMILIES: dict[str, AcceleratorFamily] = {
    "nvidia": _family("GPU", "CUDA_VISIBLE_DEVICES", "nvidia"),
    "amd": _family("GPU", "HIP_VISIBLE_DEVICES", "amd"),
    "intel": _family("GPU", "ZE_AFFINITY_MASK", "intel"),
    "metax": _family("GPU", "CUDA_VISIBLE_DEVICES", "metax"),
}
OTHER_FAMILIES: dict[str, AcceleratorFamily] = {
    "neuron_cores": _family("neuron_cores", "NEURON_RT_VISIBLE_CORES", "aws"),
    "TPU": _family("TPU", "TPU_VISIBLE_CHIPS", "google"),
    "HPU": _family("HPU", "HABANA_VISIBLE_MODULES", "habana"),
    "NPU": _family("NPU", "ASCEND_RT_VISIBLE_DEVICES", "huawei"),
    "RBLN": _family("RBLN", "RBLN_DEVICES", "rebellions", noset="RBLN_RT_VISIBLE_DEVICES"),
    "FURIOSA": _family("FURIOSA", "FURIOSA_DEVICES", "furiosa"),
    "MBLT": _family("MBLT", "QBRUNTIME_VISIBLE_DEVICES", "mobilint", noset="MBLT_RT_VISIBLE_DEVICES"),
    "TTNPU": _family("TTNPU", "TT_VISIBLE_DEVICES", "tenstorrent", noset="TENSTORRENT_VISIBLE_DEVICES"),
}


def _path(root: str, rel: str) -> str:
    return os.path.join(root, rel)


@functools.lru_cache(maxsize=8)
def _probe_gpu_vendor(root: str) -> str | None:
    """Cheap stat-only guess, cached: NVIDIA driver nodes, else AMD's /dev/kfd."""
    if os.path.exists(_path(root, "proc/driver/nvidia")) or glob.glob(
        _path(root, "dev/nvidia[0-9]*")
    ):
        return "nvidia"
    if os.path.exists(_path(root, "dev/kfd")):
        return "amd"
    return None


def gpu_vendor(environ: Mapping[str, str] = os.environ, *, root: str = "/") -> str:
    """Which family "GPU" means here: RAYLITE_GPU_VENDOR, else a probe, else nvidia."""
    chosen = environ.get(GPU_VENDOR_ENV, "").strip().lower()
    if chosen:
        if chosen not in GPU_FAMILIES:
            raise ValueError(
                f"{GPU_VENDOR_ENV}={chosen!r} is invalid; use one of {sorted(GPU_FAMILIES)}"
            )
        return chosen
    return _probe_gpu_vendor(root) or "nvidia"


def family_for(
    resource: str, environ: Mapping[str, str] = os.environ, *, root: str = "/"
) -> AcceleratorFamily | None:
    """The family behind an accelerator resource name; None for plain resources."""
    if resource == "GPU":
        return GPU_FAMILIES[gpu_vendor(environ, root=root)]
    return OTHER_FAMILIES.get(resource)


def _parse_ids(family: AcceleratorFamily, raw: str) -> list[str]:
    text = raw.strip()
    if text in ("", "NoDevFiles"):
        return []
    ids = [t.strip() for t in text.split(",") if t.strip()]
    if family.vendor == "furiosa":
        # "npu:3" and "3" name device 3; a PE suffix ("npu:0:0-3") is dropped, as Ray does.
        ids = [t.removeprefix(FURIOSA_PREFIX).split(":", 1)[0] for t in ids]
    if family.resource == "GPU" and family.vendor != "intel":
        # CUDA/HIP stop enumerating at the first invalid index, e.g. "-1".
        cut = next((i for i, t in enumerate(ids) if t.startswith("-")), len(ids))
        ids = ids[:cut]
    return ids


def _parse_selector(raw: str) -> list[str] | None:
    """Ids in "level_zero:0,1" (possibly among ';'-separated selectors) or "0,1"; None for "*"."""
    parts = [p.strip() for p in raw.split(";") if p.strip()]
    chosen = next((p for p in parts if p.startswith(INTEL_SELECTOR_PREFIX)), None)
    if chosen is None:
        chosen = next((p for p in parts if ":" not in p), "")
    text = chosen.split(":", 1)[-1].strip()
    if text == "*":
        return None
    return [] if text in ("", "NoDevFiles") else [t.strip() for t in text.split(",") if t.strip()]


def _restricting_var(family: AcceleratorFamily, environ: Mapping[str, str]) -> str | None:
    """The variable that restricted this family's devices before init, if any.

    Intel falls back to ONEAPI_DEVICE_SELECTOR as Ray does; AMD refuses
    ROCR_VISIBLE_DEVICES without HIP_VISIBLE_DEVICES, as Ray does, because the
    HIP ids handed out would silently count within ROCR's subset.
    """
    if family.env_var in environ:
        return family.env_var
    if family.vendor == "intel" and INTEL_SELECTOR_VAR in environ:
        return INTEL_SELECTOR_VAR
    if family.vendor == "amd" and AMD_ROCR_VAR in environ:
        raise RuntimeError(f"Please use {family.env_var} instead of {AMD_ROCR_VAR}")
    return None


def visible_ids(
    resource: str, environ: Mapping[str, str] = os.environ, *, root: str = "/"
) -> list[str] | None:
    """Device ids the family variable allowed before init; None when it is unset."""
    family = family_for(resource, environ, root=root)
    var = _restricting_var(family, environ) if family is not None else None
    if var is None:
        return None
    if var == INTEL_SELECTOR_VAR:
        return _parse_selector(environ[var])
    return _parse_ids(family, environ[var])


def nvidia_type_from_name(name: str | bytes) -> str:
    """NVML device name -> Ray accelerator type ("NVIDIA A100-SXM4-80GB" -> "A100").

    Data-centre parts are a model token (letters+digits) after the brand, which
    becomes the type; consumer/workstation names keep their words joined by '-'
    ("NVIDIA GeForce RTX 4090" -> "GeForce-RTX-4090") rather than a fragment.
    """
    if isinstance(name, bytes):
        name = name.decode("utf-8", "replace")
    words = name.split()
    while words and words[0].lower() in ("nvidia", "tesla"):
        words = words[1:]
    if not words:
        return name.strip() or "unknown"
    model = words[0].split("-")[0]
    if re.fullmatch(r"[A-Z]+[0-9]+[A-Z0-9]*", model):
        return model
    return "-".join(w for w in words if not re.fullmatch(r"\d+GB", w, re.IGNORECASE))


def _detect_nvidia(environ: Mapping[str, str]) -> tuple[int, str | None]:
    """Count and type through NVML; any failure means no NVIDIA GPU."""
    if "pynvml" not in sys.modules and not any(
            os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia")):
        return 0, None   # no driver: skip importing NVML (tens of ms at init)
    try:
        import pynvml  # from the nvidia-ml-py distribution
    except Exception:
        return 0, None
    try:
        pynvml.nvmlInit()
    except Exception:
        return 0, None
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        if count <= 0:
            return 0, None
        first = 0
        raw = environ.get("CUDA_VISIBLE_DEVICES")
        visible = _parse_ids(GPU_FAMILIES["nvidia"], raw) if raw is not None else None
        if visible and visible[0].isdigit() and int(visible[0]) < count:
            first = int(visible[0])  # type of a GPU we will actually hand out
        try:
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(first))
            accel_type: str | None = nvidia_type_from_name(name)
        except Exception:
            accel_type = None
        return count, accel_type
    except Exception:
        return 0, None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


AMD_DEVICE_TYPES = {  # PCI device id -> the type name Ray 2.60 gives it
    0x66A1: "AMD-Instinct-MI50",
    0x738C: "AMD-Instinct-MI100",
    0x7408: "AMD-Instinct-MI250X",
    0x740C: "AMD-Instinct-MI250X-MI250",
    0x740F: "AMD-Instinct-MI210",
    0x74A0: "AMD-Instinct-MI300A",
    0x74A1: "AMD-Instinct-MI300X-OAM",
    0x74A2: "AMD-Instinct-MI308X-OAM",
    0x74A5: "AMD-Instinct-MI325X-OAM",
    0x74A9: "AMD-Instinct-MI300X-HF",
    0x75A0: "AMD-Instinct-MI350X-OAM",
    0x75A3: "AMD-Instinct-MI355X-OAM",
    0x6798: "AMD-Radeon-R9-200-HD-7900",
    0x6799: "AMD-Radeon-HD-7900",
    0x679A: "AMD-Radeon-HD-7900",
    0x679B: "AMD-Radeon-HD-7900",
}


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _detect_amd(root: str) -> tuple[int, str | None]:
    """GPU nodes of the KFD topology (CPU nodes report simd_count 0)."""
    device_ids = []
    base = _path(root, "sys/class/kfd/kfd/topology/nodes")
    nodes = sorted((n for n in _listdir(base) if n.isdigit()), key=int)
    for node in nodes:
        lines = (_read(os.path.join(base, node, "properties")) or "").splitlines()
        fields = dict(line.split(None, 1) for line in lines if len(line.split()) == 2)
        if int(fields.get("simd_count", "0") or 0) > 0:
            device_ids.append(int(fields.get("device_id", "0") or 0))
    if not device_ids:
        return 0, None
    return len(device_ids), AMD_DEVICE_TYPES.get(device_ids[0])


def _detect_intel() -> tuple[int, str | None]:
    """Intel GPUs through dpctl when installed (as Ray does); else none."""
    try:
        import importlib.util
        if importlib.util.find_spec("dpctl") is None:
            return 0, None
        import dpctl  # type: ignore[import-not-found]

        count = int(dpctl.SyclContext("level_zero:gpu").device_count)
        name = dpctl.SyclDevice("level_zero:gpu:0").name if count else ""
        return count, ("Intel-GPU-" + "-".join(name.split()[-2:])) if name else None
    except Exception:
        return 0, None


def _detect_metax() -> tuple[int, str | None]:
    """MetaX GPUs through pymxsml when installed (as Ray does); the type is the device name."""
    try:
        import importlib.util
        if importlib.util.find_spec("pymxsml") is None:
            return 0, None
        import pymxsml.mxsml_extension as mxsml  # type: ignore[import-not-found]

        mxsml.mxSmlExInit()
        try:
            count = int(mxsml.mxSmlExDeviceGetCount())
            name = mxsml.mxSmlExDeviceGetName(mxsml.mxSmlExDeviceGetHandleByIndex(0)) if count else None
        finally:
            mxsml.mxSmlExShutdown()
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        return count, name or None
    except Exception:
        return 0, None


def _neuron_cores(root: str) -> int:
    devices = sorted(glob.glob(_path(root, "dev/neuron[0-9]*")))
    if not devices:
        return 0
    cores = 0
    for dev in devices:
        sysfs = f"sys/devices/virtual/neuron_device/{os.path.basename(dev)}/core_count"
        text = _read(_path(root, sysfs))
        if text is None or not text.strip().isdigit():
            break
        cores += int(text.strip())
    else:
        return cores
    import json
    import shutil
    import subprocess

    tool = shutil.which("neuron-ls") or "/opt/aws/neuron/bin/neuron-ls"
    if root == "/" and os.path.exists(tool):
        try:
            out = subprocess.run(
                [tool, "--json-output"], capture_output=True, timeout=_TOOL_TIMEOUT_S, check=False
            )
            if out.returncode == 0:
                return sum(int(d.get("nc_count", 0)) for d in json.loads(out.stdout))
        except Exception:
            pass   # fall through to the per-device guess below
    import warnings
    warnings.warn("raylite: assuming 2 neuron cores per device (inf2/trn1); pass resources= to init() "
                  "to override", RuntimeWarning, stacklevel=2)
    return 2 * len(devices)


def _tpu_chips(root: str) -> int:
    accel = glob.glob(_path(root, "dev/accel[0-9]*"))
    if accel:
        return len(accel)
    # v5e/v6e expose chips through VFIO; count only Google (0x1ae0) PCI functions
    # bound to vfio-pci, so unrelated passthrough devices are not taken for TPUs.
    vendors = glob.glob(_path(root, "sys/bus/pci/drivers/vfio-pci/*/vendor"))
    return sum(1 for v in vendors if (_read(v) or "").strip().lower() == "0x1ae0")


def _tpu_type(environ: Mapping[str, str]) -> str | None:
    pod = environ.get("TPU_ACCELERATOR_TYPE", "")
    return "TPU-" + pod.split("-")[0].upper() if re.fullmatch(r"v\d+[a-zA-Z]*-\d+", pod) else None


def _count(root: str, pattern: str) -> int:
    return len(glob.glob(_path(root, pattern)))


def _mblt(root: str) -> tuple[int, str | None]:
    """Mobilint cards: one /dev/aries<N> or /dev/regulus-npu<N> node each (not /dev/regulus-usb)."""
    aries, regulus = _count(root, "dev/aries[0-9]*"), _count(root, "dev/regulus-npu*")
    return aries + regulus, "MOBILINT_ARIES" if aries else "MOBILINT_REGULUS" if regulus else None


def _hpu_modules(root: str) -> int:
    legacy = glob.glob(_path(root, "dev/hl[0-9]*"))
    if legacy:
        return len(legacy)
    accel = glob.glob(_path(root, "sys/class/accel/accel[0-9]*/device/driver"))
    return sum(1 for d in accel if os.path.basename(os.path.realpath(d)) == "habanalabs")


def detect(
    environ: Mapping[str, str] = os.environ,
    *,
    root: str = "/",
    resources: Iterable[str] = ACCELERATOR_RESOURCES,
) -> dict[str, tuple[int, str | None]]:
    """What accelerators this machine has: {resource: (count, type or None)}.

    Only ``resources`` are probed (init leaves out those it was given 0 of, as
    Ray does), and only those with a count > 0 appear. A visible-devices
    variable set before init caps the count: devices hidden from us are not ours.
    """
    wanted = tuple(resources)
    gpu_probes: dict[str, Callable[[], tuple[int, str | None]]] = {
        "nvidia": lambda: _detect_nvidia(environ),
        "amd": lambda: _detect_amd(root),
        "intel": _detect_intel,
        "metax": _detect_metax,
    }
    probes: dict[str, Callable[[], tuple[int, str | None]]] = {
        "neuron_cores": lambda: (_neuron_cores(root), "aws-neuron-core"),
        "TPU": lambda: (_tpu_chips(root), _tpu_type(environ)),
        "HPU": lambda: (_hpu_modules(root), "Intel-GAUDI"),
        "NPU": lambda: (_count(root, "dev/davinci[0-9]*"), None),
        "RBLN": lambda: (_count(root, "dev/rbln[0-9]*"), None),
        "FURIOSA": lambda: (_count(root, "sys/class/rngd_mgmt/rngd!npu[0-9]*mgmt"), None),
        "MBLT": lambda: _mblt(root),
        "TTNPU": lambda: (_count(root, "dev/tenstorrent/*"), None),
    }
    if "GPU" in wanted:   # an invalid RAYLITE_GPU_VENDOR is an error, not "no GPU"
        probes["GPU"] = gpu_probes[gpu_vendor(environ, root=root)]
    found: dict[str, tuple[int, str | None]] = {}
    for res in wanted:
        probe = probes[res]
        try:
            found[res] = probe()
        except Exception:  # best effort: a broken probe means "not present"
            pass
    result = {}
    for res, (count, accel_type) in found.items():
        visible = visible_ids(res, environ, root=root) if count > 0 else None
        if visible is not None:
            count = min(count, len(visible))
        if count > 0:
            result[res] = (count, accel_type)
    return result


def _whole(value: object, field: str) -> int:
    units = to_fixed(value, field)
    if units % SCALE:
        raise ValueError(f"{field}={value!r} must be a whole number of devices")
    return units // SCALE


def node_devices(
    num_gpus: object = None,
    resources: Mapping[str, object] | None = None,
    environ: Mapping[str, str] = os.environ,
    *,
    root: str = "/",
) -> tuple[dict[str, int], dict[str, list[str]], str | None]:
    """The accelerators init() advertises: (totals in units, device ids, type).

    Explicit counts (``num_gpus=``, ``resources={"TPU": 4}``) win over detection
    and are logical, so ``init(num_gpus=2)`` works on a CPU machine. Ids come
    from the visible-devices variable when set (``CUDA_VISIBLE_DEVICES=1,3`` ->
    ["1", "3"]) and are "0".."n-1" otherwise. Totals also carry
    ``accelerator_type:<T>`` = 1 for every type detected on present devices;
    the caller merges the user's other custom resources itself.
    """
    explicit: dict[str, int] = {}
    if num_gpus is not None:
        explicit["GPU"] = _whole(num_gpus, "num_gpus")
    for res, value in (resources or {}).items():
        if res in ACCELERATOR_RESOURCES:
            explicit[res] = _whole(value, f"resources[{res!r}]")
    wanted = [res for res in ACCELERATOR_RESOURCES if explicit.get(res) != 0]
    detected = detect(environ, root=root, resources=wanted) if wanted else {}
    totals: dict[str, int] = {}
    ids: dict[str, list[str]] = {}
    first_type: str | None = None
    for res in ACCELERATOR_RESOURCES:
        count, accel_type = detected.get(res, (0, None))
        count = explicit.get(res, count)
        if count <= 0:
            continue
        visible = visible_ids(res, environ, root=root)
        if visible is not None and len(visible) < count:
            family = family_for(res, environ, root=root)
            var = _restricting_var(family, environ) if family else None
            raise ValueError(f"{res}={count} requested but {var or res} makes only {visible} visible")
        totals[res] = count * SCALE
        ids[res] = visible[:count] if visible is not None else [str(i) for i in range(count)]
        if accel_type and res in detected:
            totals[ACCELERATOR_TYPE_PREFIX + accel_type] = SCALE
            first_type = first_type or accel_type
    return totals, ids, first_type


def worker_env(
    device_ids: Mapping[str, list[str]],
    environ: Mapping[str, str] = os.environ,
    *,
    resources: Iterable[str] = ACCELERATOR_RESOURCES,
    root: str = "/",
) -> dict[str, str]:
    """Visible-device variables for a worker assigned ``device_ids``.

    Like Ray, every accelerator resource gets its variable, set to "" when the
    task holds none of it, so a CPU task cannot grab a GPU by accident; pass
    ``resources`` to limit this to what the node has. A variable is left alone
    (inherited) when the family's RAY_EXPERIMENTAL_NOSET_* is set, or when the
    task has no ids and RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO is false.
    Furiosa ids take the "npu:" form its tools read. TPU slices of 1 or 2
    chips also get the bounds variables that JAX/libtpu need to address a
    sub-host.
    """
    override_on_zero = environ.get("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "1").lower() not in (
        "0", "false", "no", "off",
    )
    env: dict[str, str] = {}
    for res in resources:
        family = family_for(res, environ, root=root)
        if family is None or environ.get(family.noset_var):
            continue
        ids = [str(i) for i in device_ids.get(res, [])]
        if not ids and not override_on_zero:
            continue
        if family.vendor == "furiosa":
            ids = [FURIOSA_PREFIX + i for i in ids]
        env[family.env_var] = ",".join(ids)
        if res == "TPU" and len(ids) in (1, 2):
            env["TPU_CHIPS_PER_HOST_BOUNDS"] = "1,1,1" if len(ids) == 1 else "1,2,1"
            env["TPU_HOST_BOUNDS"] = "1,1,1"
    return env


def accelerator_ids(
    device_ids: Mapping[str, list[str]], resources: Iterable[str] = ACCELERATOR_RESOURCES
) -> dict[str, list[str]]:
    """get_runtime_context().get_accelerator_ids() view: every resource, [] if none."""
    return {res: [str(i) for i in device_ids.get(res, [])] for res in resources}
