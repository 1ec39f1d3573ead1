"""CPU fallback for GPU work: ask the runtime whether a GPU can be had, then choose options.

Ray has no CPU fallback. A task declared with ``num_gpus=1`` on a node whose GPUs are all busy
waits, silently, until one frees up; on a node with no GPU at all it is infeasible and never
runs. Code that would rather run on the CPU than wait has to ask first and pick its resource
options itself. ``probe_gpu_resources`` does that asking in one call, through the public API only
(so it behaves the same on any backend):

    opts = probe_gpu_resources(timeout=30)      # {"num_cpus": 1, "num_gpus": 1} or {"num_cpus": 1}
    ref = train.options(**opts).remote(data)

and the task looks at ``ray.get_gpu_ids()`` (or ``torch.cuda.is_available()``) to choose its device.
"""
from __future__ import annotations

import math
import numbers

__all__ = ["probe_gpu_resources"]


def _gpu_probe() -> bool:
    """Runs on the GPU it was given, then returns at once: proof that a GPU could be had."""
    return True


def _check_number(name: str, value, *, positive: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be {'> 0' if positive else '>= 0'}, got {value!r}")


def probe_gpu_resources(timeout: float | None = 240.0, num_gpus: float = 1, num_cpus: float = 1) -> dict:
    """Resource options for one unit of work: with a GPU if one can be had, else CPU only.

    Ray has no CPU fallback: a ``num_gpus`` request waits until a GPU is free (or forever, on a
    node without GPUs), so a program that can also run on the CPU must decide for itself. This
    returns the keyword arguments to pass to ``.options(...)`` / ``@remote(...)``:

    - ``{"num_cpus": num_cpus, "num_gpus": num_gpus}`` when a task asking for ``num_gpus`` could
      be scheduled within ``timeout`` seconds;
    - ``{"num_cpus": num_cpus}`` otherwise.

    It answers at once when the node has no GPU, or too few for the request ever to fit
    (``cluster_resources()`` decides). Otherwise it submits a tiny probe task asking for
    ``num_gpus`` (and no CPU: the work needs its CPUs either way, so a busy CPU must not decide
    the answer) and waits for it with ``wait(timeout=...)``. If the probe has not run by then,
    it is cancelled, so it neither keeps a place in the queue nor takes a GPU later; the
    devices it would have held stay free for others.

    The answer is a snapshot: another task may take the GPU between the probe and your task, in
    which case your task simply waits for it as any GPU task does. Calls ``init()`` with the
    machine's defaults when the runtime is not initialised yet, as Ray's first ``.remote()``
    does.

    Args:
        timeout: seconds to wait for a GPU (None: as long as it takes), then the CPU options.
        num_gpus: GPUs the work needs (a fraction shares one).
        num_cpus: CPUs the work needs, in either answer.
    """
    import raylite as ray

    _check_number("num_gpus", num_gpus, positive=True)
    _check_number("num_cpus", num_cpus, positive=False)
    if timeout is not None:
        _check_number("timeout", timeout, positive=False)
    # Validates the shape now (0.00001, 1.5 GPUs, ... raise ValueError naming the value).
    probe = ray.remote(num_cpus=0, num_gpus=num_gpus, max_retries=0)(_gpu_probe)
    cpu_only = {"num_cpus": num_cpus}
    if not ray.is_initialized():
        ray.init()
    total = ray.cluster_resources().get("GPU", 0)
    if total <= 0 or num_gpus > total:
        return cpu_only   # no GPU here, or never enough: waiting would be forever
    ref = probe.remote()
    ready, _ = ray.wait([ref], timeout=timeout)
    if ready:
        try:
            ray.get(ref)
        except Exception:   # the probe could not run on a GPU (e.g. its worker died)
            return cpu_only
        return {"num_cpus": num_cpus, "num_gpus": num_gpus}
    ray.cancel(ref)   # queued: dropped from the queue; just started: interrupted and released
    return cpu_only
