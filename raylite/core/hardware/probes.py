"""Hardware probes, one per accelerator kind: how many devices this machine has, and their type.

Split from raylite.core.hardware.accelerators, which owns the families, the visible-device variables and
which probes run (``detect``). A probe reads device nodes and sysfs under ``root``, or a vendor's
Python bindings only when installed; the one external tool (``neuron-ls``) runs with a timeout.
None imports a framework or initialises CUDA, so the driver can still fork workers safely.
"""

from __future__ import annotations

import glob
import os
import re
import sys
from collections.abc import Mapping

_TOOL_TIMEOUT_S = 5.0


def under(root: str, rel: str) -> str:
    """A path below ``root`` (tests pass a fake machine's root)."""
    return os.path.join(root, rel)


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


def nvidia(visible: list[str] | None) -> tuple[int, str | None]:
    """Count and type through NVML; any failure means no NVIDIA GPU. ``visible``:
    CUDA_VISIBLE_DEVICES's ids, whose first names the GPU whose type we report."""
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


def amd(root: str) -> tuple[int, str | None]:
    """GPU nodes of the KFD topology (CPU nodes report simd_count 0)."""
    device_ids = []
    base = under(root, "sys/class/kfd/kfd/topology/nodes")
    nodes = sorted((n for n in _listdir(base) if n.isdigit()), key=int)
    for node in nodes:
        lines = (_read(os.path.join(base, node, "properties")) or "").splitlines()
        fields = dict(line.split(None, 1) for line in lines if len(line.split()) == 2)
        if int(fields.get("simd_count", "0") or 0) > 0:
            device_ids.append(int(fields.get("device_id", "0") or 0))
    if not device_ids:
        return 0, None
    return len(device_ids), AMD_DEVICE_TYPES.get(device_ids[0])


def intel() -> tuple[int, str | None]:
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


def metax() -> tuple[int, str | None]:
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


def neuron_cores(root: str) -> int:
    devices = sorted(glob.glob(under(root, "dev/neuron[0-9]*")))
    if not devices:
        return 0
    cores = 0
    for dev in devices:
        sysfs = f"sys/devices/virtual/neuron_device/{os.path.basename(dev)}/core_count"
        text = _read(under(root, sysfs))
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


def tpu_chips(root: str) -> int:
    accel = glob.glob(under(root, "dev/accel[0-9]*"))
    if accel:
        return len(accel)
    # v5e/v6e expose chips through VFIO; count only Google (0x1ae0) PCI functions
    # bound to vfio-pci, so unrelated passthrough devices are not taken for TPUs.
    vendors = glob.glob(under(root, "sys/bus/pci/drivers/vfio-pci/*/vendor"))
    return sum(1 for v in vendors if (_read(v) or "").strip().lower() == "0x1ae0")


def tpu_type(environ: Mapping[str, str]) -> str | None:
    pod = environ.get("TPU_ACCELERATOR_TYPE", "")
    return "TPU-" + pod.split("-")[0].upper() if re.fullmatch(r"v\d+[a-zA-Z]*-\d+", pod) else None


def count_nodes(root: str, pattern: str) -> int:
    return len(glob.glob(under(root, pattern)))


def mblt(root: str) -> tuple[int, str | None]:
    """Mobilint cards: one /dev/aries<N> or /dev/regulus-npu<N> node each (not /dev/regulus-usb)."""
    aries, regulus = count_nodes(root, "dev/aries[0-9]*"), count_nodes(root, "dev/regulus-npu*")
    return aries + regulus, "MOBILINT_ARIES" if aries else "MOBILINT_REGULUS" if regulus else None


def hpu_modules(root: str) -> int:
    legacy = glob.glob(under(root, "dev/hl[0-9]*"))
    if legacy:
        return len(legacy)
    accel = glob.glob(under(root, "sys/class/accel/accel[0-9]*/device/driver"))
    return sum(1 for d in accel if os.path.basename(os.path.realpath(d)) == "habanalabs")
