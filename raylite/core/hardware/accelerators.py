"""Accelerator families: detection, visible-device variables, worker environment.

Each family maps a resource name to the variable its runtime reads to restrict
the devices a process sees. The variable must be in a worker's environment
before user code imports a framework, so the scheduler asks ``worker_env`` for
it when it starts (or picks) a worker.

Detection runs only when called (at ``init``), never at import, and never
hangs: ``detect`` picks the probes (raylite.core.hardware.probes: NVIDIA through
NVML, Intel and MetaX through their Python bindings only when installed, the
others through device nodes and sysfs) and caps their counts by the visible ids.

``RAYLITE_GPU_VENDOR`` (``nvidia`` | ``amd`` | ``intel`` | ``metax``) selects
which GPU family the ``GPU`` resource means when detection cannot tell (tests,
odd machines). Ray's ``RAY_EXPERIMENTAL_NOSET_*`` opt-outs and
``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0`` are honoured by ``worker_env``.
"""

from __future__ import annotations

import functools
import glob
import os
from dataclasses import dataclass
from collections.abc import Callable, Iterable, Mapping

from raylite.core.hardware import probes as device_probes
from raylite.core.hardware.probes import nvidia_type_from_name as nvidia_type_from_name   # (its old home)
from raylite.core.wire.resources import (
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


@functools.lru_cache(maxsize=8)
def _probe_gpu_vendor(root: str) -> str | None:
    """Cheap stat-only guess, cached: NVIDIA driver nodes, else AMD's /dev/kfd."""
    if os.path.exists(device_probes.under(root, "proc/driver/nvidia")) or glob.glob(
        device_probes.under(root, "dev/nvidia[0-9]*")
    ):
        return "nvidia"
    if os.path.exists(device_probes.under(root, "dev/kfd")):
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
    cuda = environ.get("CUDA_VISIBLE_DEVICES")
    gpu_probes: dict[str, Callable[[], tuple[int, str | None]]] = {
        "nvidia": lambda: device_probes.nvidia(
            None if cuda is None else _parse_ids(GPU_FAMILIES["nvidia"], cuda)),   # whose type we report
        "amd": lambda: device_probes.amd(root),
        "intel": device_probes.intel,
        "metax": device_probes.metax,
    }
    probes: dict[str, Callable[[], tuple[int, str | None]]] = {
        "neuron_cores": lambda: (device_probes.neuron_cores(root), "aws-neuron-core"),
        "TPU": lambda: (device_probes.tpu_chips(root), device_probes.tpu_type(environ)),
        "HPU": lambda: (device_probes.hpu_modules(root), "Intel-GAUDI"),
        "NPU": lambda: (device_probes.count_nodes(root, "dev/davinci[0-9]*"), None),
        "RBLN": lambda: (device_probes.count_nodes(root, "dev/rbln[0-9]*"), None),
        "FURIOSA": lambda: (device_probes.count_nodes(root, "sys/class/rngd_mgmt/rngd!npu[0-9]*mgmt"), None),
        "MBLT": lambda: device_probes.mblt(root),
        "TTNPU": lambda: (device_probes.count_nodes(root, "dev/tenstorrent/*"), None),
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
