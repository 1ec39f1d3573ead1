"""Resource quantities, request validation and per-node accounting.

Quantities are fixed-point integers (1 unit = 1e-4) so that adding and removing
0.1 + 0.2 never leaves a ghost remainder that blocks the next task. Accelerator
resources are additionally tracked per device slot, because "0.5 GPU" must land
on one concrete device whose id the worker sees in its visible-devices variable.

This module is pure bookkeeping: no I/O, no imports beyond the standard library,
so it is cheap to import in the driver and trivial to test.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

SCALE = 10_000
"""Units per whole resource (fixed point: 1 unit = 0.0001)."""

ACCELERATOR_RESOURCES: tuple[str, ...] = (
    "GPU", "neuron_cores", "TPU", "HPU", "NPU", "RBLN", "FURIOSA", "MBLT", "TTNPU")
"""Resources accounted per device slot; each device holds exactly SCALE units."""

FRACTIONAL_RESOURCES: frozenset[str] = frozenset({"GPU", "NPU"})
"""Accelerators that may be shared by fractional requests (Ray's rules)."""

TPU_CHIP_COUNTS: frozenset[int] = frozenset({1, 2, 4, 8})
"""TPU requests must match a chip topology the runtime can address."""

ACCELERATOR_TYPE_PREFIX = "accelerator_type:"
ACCELERATOR_TYPE_UNITS = 10  # 0.001: a constraint marker, never a real limit

_RESERVED = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory"}


def to_fixed(value: object, field: str) -> int:
    """Convert a user quantity to integer units, rejecting anything ambiguous.

    Floats are rounded to the nearest unit when they are within float noise of
    it (0.1 + 0.2 -> 3000); anything finer than 0.0001 is an error rather than
    silently rounded, because a request the user did not write is worse than a
    clear message.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):   # a TypeError, as in Ray
        raise TypeError(f"{field} must be a number, got {field}={value!r} ({type(value).__name__})")
    if isinstance(value, numbers.Integral):
        units = int(value) * SCALE
    else:
        as_float = float(value)
        if not math.isfinite(as_float):
            raise ValueError(f"{field} must be finite, got {value!r}")
        scaled = as_float * SCALE
        units = round(scaled)
        if not math.isclose(scaled, units, rel_tol=1e-12, abs_tol=1e-9):
            down = math.floor(scaled) / SCALE
            fix = (f"round it down to a multiple of 0.0001 ({field}={down:.4f}; a share computed by a "
                   f"division: math.floor(x * 10000) / 10000)" if down > 0 else "ask for 0 or at least 0.0001")
            raise ValueError(f"{field}={value!r} is finer than the resource precision of 0.0001: {fix}")
    if units < 0:
        raise ValueError(f"{field} must be non-negative, got {value!r}")
    return units


def from_fixed(units: int) -> float:
    """Units back to a user-facing float (5000 -> 0.5); division is exact-rounded."""
    return units / SCALE


def format_units(units: int) -> str:
    """Exact decimal text for units, without float noise or a trailing '.0'."""
    sign = "-" if units < 0 else ""
    whole, frac = divmod(abs(units), SCALE)
    if not frac:
        return f"{sign}{whole}"
    return f"{sign}{whole}.{frac:04d}".rstrip("0")


BYTE_RESOURCES = ("memory", "object_store_memory")
"""Resources counted in bytes: messages show them in GiB (or MiB), not as raw counts."""


def format_bytes(n: int) -> str:
    """2147483648 -> '2.0 GiB'; below a GiB in MiB."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _check_accelerator(resource: str, units: int, field: str) -> None:
    """Enforce the per-family request shapes that device slots can honour."""
    if not units:
        return
    shown = format_units(units)
    if units > SCALE and units % SCALE:
        raise ValueError(
            f"{field}: {resource}={shown} is invalid; a request above 1 must be a "
            "whole number of devices"
        )
    if resource not in FRACTIONAL_RESOURCES and units % SCALE:
        raise ValueError(
            f"{field}: {resource}={shown} is invalid; {resource} must be requested "
            "in whole devices"
        )
    if resource == "TPU" and units // SCALE not in TPU_CHIP_COUNTS:
        raise ValueError(
            f"{field}: TPU={shown} is invalid; TPU requests must be 1, 2, 4 or 8 chips"
        )


def normalize_request(
    *,
    num_cpus: object = None,
    num_gpus: object = None,
    resources: Mapping[str, object] | None = None,
    memory: object = None,
    accelerator_type: str | None = None,
    default_cpus: float = 1.0,
) -> dict[str, int]:
    """Validate a task/actor resource request and return it in units.

    This is the single place requests are checked, so that a bad value fails
    at decoration or ``.options()`` time (as in Ray) instead of leaving a task
    pending forever. Zero entries are dropped: "not requested" has one spelling.
    """
    request: dict[str, int] = {}
    request["CPU"] = to_fixed(default_cpus if num_cpus is None else num_cpus, "num_cpus")
    if num_gpus is not None:
        request["GPU"] = to_fixed(num_gpus, "num_gpus")
        _check_accelerator("GPU", request["GPU"], "num_gpus")
    if resources is not None:
        if not isinstance(resources, Mapping):
            raise TypeError(f"resources must be a dict, got {resources!r}")
        for name, value in resources.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"resources keys must be non-empty str, got {name!r}")
            if name in _RESERVED:
                raise ValueError(
                    f"resources={{{name!r}: {value!r}}}: use {_RESERVED[name]}= "
                    f"instead of resources[{name!r}]"
                )
            label = f"resources[{name!r}]"
            request[name] = to_fixed(value, label)
            if name in ACCELERATOR_RESOURCES:
                _check_accelerator(name, request[name], label)
    if memory is not None:
        # Bytes are kept at the same fixed-point scale so every resource shares
        # one arithmetic; Python ints make the large numbers free.
        request["memory"] = to_fixed(memory, "memory")
    if accelerator_type is not None:
        if not isinstance(accelerator_type, str) or not accelerator_type:
            raise ValueError(
                f"accelerator_type must be a non-empty str, got {accelerator_type!r}"
            )
        request[ACCELERATOR_TYPE_PREFIX + accelerator_type] = ACCELERATOR_TYPE_UNITS
    return {name: units for name, units in request.items() if units}


class Allocation:
    """What one task or actor holds, so it can be given back exactly (to `pool`, the node or a
    placement group's bundle that it was taken from)."""

    __slots__ = ("resources", "device_ids", "device_units", "pool")

    def __init__(self, resources: dict[str, int], device_ids: dict[str, list[str]] | None = None,
                 device_units: dict[str, dict[str, int]] | None = None, pool: NodeResources | None = None):
        self.resources = resources
        self.device_ids = device_ids if device_ids is not None else {}
        self.device_units = device_units if device_units is not None else {}
        self.pool = pool


class NodeResources:
    """Free/used bookkeeping for one node; owned by the event loop, not thread-safe.

    Plain resources are a single counter each. Accelerator resources also keep
    one slot per device holding 0..SCALE free units, so whole requests take whole
    free devices and fractional ones are packed best-fit onto a single device.
    """

    def __init__(self, totals: Mapping[str, int], device_ids: Mapping[str, list[str]]):
        self.total: dict[str, int] = {k: int(v) for k, v in totals.items()}
        self._free: dict[str, int] = dict(self.total)
        self._ids: dict[str, list[str]] = {}
        self._slots: dict[str, list[int]] = {}
        for res in ACCELERATOR_RESOURCES:
            units = self.total.get(res, 0)
            if units % SCALE:
                raise ValueError(f"node total {res}={format_units(units)} must be whole")
            ids = [str(i) for i in device_ids.get(res, range(units // SCALE))]
            if len(ids) != units // SCALE:
                raise ValueError(
                    f"node has {res}={units // SCALE} but {len(ids)} device ids {ids}"
                )
            if ids:
                self._ids[res] = ids
                self._slots[res] = [SCALE] * len(ids)
        self._cap: dict[str, list[int]] = {res: list(slots) for res, slots in self._slots.items()}

    @classmethod
    def bundle(cls, alloc: Allocation) -> NodeResources:
        """A pool holding exactly what `alloc` took from the node: a placement group's bundle,
        whose devices may be fractions (a bundle of 0.5 GPU is half of one device)."""
        pool = cls({k: v for k, v in alloc.resources.items() if k not in ACCELERATOR_RESOURCES}, {})
        for res, per_device in alloc.device_units.items():
            pool.total[res] = pool._free[res] = sum(per_device.values())
            pool._ids[res] = list(per_device)
            pool._slots[res] = list(per_device.values())
            pool._cap[res] = list(per_device.values())
        return pool

    @property
    def device_ids(self) -> dict[str, list[str]]:
        """Device ids per accelerator resource, as handed out."""
        return {res: list(ids) for res, ids in self._ids.items()}

    def available(self) -> dict[str, int]:
        """Free units per resource right now (may dip below 0 after adjust)."""
        return dict(self._free)

    def device_free(self, resource: str) -> dict[str, int]:
        """Free units per device id of an accelerator resource (for diagnostics)."""
        return dict(zip(self._ids.get(resource, []), self._slots.get(resource, [])))

    def feasible(self, request: Mapping[str, int]) -> bool:
        """Whether the request could ever run here, i.e. fits on an idle node."""
        for name, units in request.items():
            if units <= 0:
                continue
            if name in ACCELERATOR_RESOURCES:
                caps = self._cap.get(name, [])
                if units < SCALE and not any(cap >= units for cap in caps):
                    return False
                whole = sum(cap == SCALE for cap in caps)
                if units >= SCALE and (units % SCALE or units // SCALE > whole):
                    return False
            elif units > self.total.get(name, 0):
                return False
        return True

    def _pick_devices(self, res: str, units: int) -> dict[int, int] | None:
        """Choose slots for one accelerator request: {slot index: units}, or None."""
        slots = self._slots.get(res)
        if not slots:
            return None
        if units >= SCALE:
            if units % SCALE:
                return None
            free = [i for i, room in enumerate(slots) if room == SCALE]
            need = units // SCALE
            return {i: SCALE for i in free[:need]} if len(free) >= need else None
        # Best fit keeps whole devices free for whole requests; ties go to the
        # lowest index so placement is predictable ([0], [0], [1] for 3 x 0.5).
        fits = [(room, i) for i, room in enumerate(slots) if room >= units]
        return {min(fits)[1]: units} if fits else None

    def try_acquire(self, request: Mapping[str, int]) -> Allocation | None:
        """Take the request now if it fits, else None; never oversubscribes."""
        picks: dict[str, dict[int, int]] = {}
        for name, units in request.items():
            if units <= 0:
                continue
            if name in ACCELERATOR_RESOURCES:
                chosen = self._pick_devices(name, units)
                if chosen is None:
                    return None
                picks[name] = chosen
            elif self._free.get(name, 0) < units:
                return None
        taken = {name: units for name, units in request.items() if units > 0}
        for name, units in taken.items():
            self._free[name] -= units
        alloc = Allocation(resources=taken, pool=self)
        for res, chosen in picks.items():
            ids = self._ids[res]
            for i, units in chosen.items():
                self._slots[res][i] -= units
            alloc.device_ids[res] = [ids[i] for i in sorted(chosen)]
            alloc.device_units[res] = {ids[i]: chosen[i] for i in sorted(chosen)}
        return alloc

    def release(self, alloc: Allocation) -> None:
        """Give back exactly what try_acquire took.

        If CPU was lent back with adjust(+) while the holder was blocked, undo
        that with adjust(-) before releasing, or the CPU is counted twice.
        """
        for res, per_device in alloc.device_units.items():
            index = {dev: i for i, dev in enumerate(self._ids[res])}
            for dev, units in per_device.items():
                slot = index[dev]
                if self._slots[res][slot] + units > self._cap[res][slot]:
                    raise ValueError(f"double release of {res} device {dev}")
                self._slots[res][slot] += units
        for name, units in alloc.resources.items():
            self._free[name] = self._free.get(name, 0) + units

    def adjust(self, name: str, delta_units: int) -> None:
        """Lend (+) or reclaim (-) plain resources of a task blocked in get().

        Reclaiming may push availability below zero for a while, as Ray allows,
        because the resuming task must not wait behind the work it unblocked.
        Accelerators are refused: a blocked task keeps its devices.
        """
        if name in ACCELERATOR_RESOURCES:
            raise ValueError(f"cannot adjust accelerator resource {name}")
        if name not in self.total:
            raise ValueError(f"unknown resource {name!r}")
        self._free[name] += int(delta_units)

    def describe(self, request: Mapping[str, int]) -> str:
        """Human text such as '{CPU: 1, GPU: 0.5, memory: 2.0 GiB}' for error and pending messages."""
        return "{" + ", ".join(f"{k}: {format_bytes(v // SCALE) if k in BYTE_RESOURCES else format_units(v)}"
                               for k, v in request.items()) + "}"
