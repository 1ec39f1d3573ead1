"""Whether a worker group can run here, decided before any worker starts: GPUs for ``use_gpu``
(True, False or "auto") and room for every worker at once in the runtime's totals."""
from __future__ import annotations

import logging

import raylite as ray
from raylite.train.config import ACCELERATOR_TYPE_PREFIX, check_placeable

logger = logging.getLogger("raylite.train")

AUTO_GPU_PROBE_TIMEOUT_S = 30.0


def _cuda_usable() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available() and torch.cuda.device_count() > 0)


def _probe_gpus(num_gpus: float, num_cpus: float) -> bool | None:
    """Ask raylite.util.probe_gpu_resources (when present) whether a worker can get a GPU."""
    try:
        from raylite.util import probe_gpu_resources
    except ImportError:
        return None
    try:
        kwargs = probe_gpu_resources(timeout=AUTO_GPU_PROBE_TIMEOUT_S, num_gpus=num_gpus, num_cpus=num_cpus)
    except TypeError:   # another signature than expected: decide without it
        return None
    return bool(kwargs.get("num_gpus"))


def resolve_use_gpu(use_gpu, num_workers: int, gpus_per_worker: float, cpus_per_worker: float,
                    torch: bool = True) -> bool:
    """True/False for the workers; a clear error when use_gpu=True cannot be honoured. ``torch``:
    the workers will run CUDA through torch, so torch must see a GPU too (not only the runtime)."""
    if use_gpu is False:
        return False
    need = num_workers * gpus_per_worker
    have = ray.cluster_resources().get("GPU", 0)
    if use_gpu == "auto":
        if have < need:
            logger.info("raylite.train: use_gpu='auto' -> CPU workers (%s GPUs needed, the runtime has %s)",
                        need, have)
            return False
        if _probe_gpus(gpus_per_worker, cpus_per_worker) is False or (torch and not _cuda_usable()):
            logger.info("raylite.train: use_gpu='auto' -> CPU workers (no usable CUDA GPU)")
            return False
        return True
    if have < need:
        raise RuntimeError(f"use_gpu=True needs {need:g} GPU(s) ({num_workers} worker(s) x {gpus_per_worker:g}) "
                           f"but the runtime has {have:g}. Pass use_gpu='auto' to fall back to CPU workers "
                           f"when no GPU is usable, or fewer workers.")
    if torch and not _cuda_usable():
        raise RuntimeError(f"use_gpu=True but no usable CUDA GPU: the runtime advertises {have:g} GPU(s), "
                           f"yet torch.cuda.is_available() is False here (a logical GPU from "
                           f"init(num_gpus=...) cannot run NCCL). Pass use_gpu='auto' to fall back to CPU "
                           f"workers when no GPU is usable.")
    return True


def check_fits(num_workers: int, request: dict) -> None:
    """Workers that can never all be placed at once would wait forever: fail now."""
    total = ray.cluster_resources()
    asks = {"CPU": request["num_cpus"], "GPU": request["num_gpus"], **request["resources"]}
    for name, each in asks.items():
        if name.startswith(ACCELERATOR_TYPE_PREFIX) and name not in total:
            types = sorted(k[len(ACCELERATOR_TYPE_PREFIX):] for k in total if k.startswith(ACCELERATOR_TYPE_PREFIX))
            raise ValueError(f"ScalingConfig(accelerator_type={name[len(ACCELERATOR_TYPE_PREFIX):]!r}): the runtime "
                             f"has no such accelerator (its accelerator types: {types or 'none'}), so the workers "
                             f"could never be placed; drop accelerator_type or pass one of those")
    check_placeable("ScalingConfig", num_workers, asks, total, "resources_per_worker['CPU']")
