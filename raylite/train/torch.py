"""``raylite.train.torch``: the PyTorch helpers of Ray Train, for use inside ``train_func``.

    model = train.torch.prepare_model(model)          # to the worker's device, wrapped in DDP
    loader = train.torch.prepare_data_loader(loader)  # DistributedSampler + batches on the device
    device = train.torch.get_device()

Outside a run (or with one worker) they still move things to the device but skip DDP/sharding.
"""
from __future__ import annotations

import random

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, IterableDataset, RandomSampler

from raylite.train import session
from raylite.train.config import TorchConfig
from raylite.train.trainer import TorchTrainer

__all__ = ["TorchConfig", "TorchTrainer", "enable_reproducibility", "get_device", "get_devices",
           "prepare_data_loader", "prepare_model", "prepare_optimizer"]


def get_device() -> torch.device:
    """The worker's device: its (only visible) GPU with use_gpu, else the CPU."""
    if session.get_context().uses_gpu() and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def get_devices() -> list[torch.device]:
    return [get_device()]


def prepare_model(model: torch.nn.Module, move_to_device: bool | torch.device = True,
                  parallel_strategy: str | None = "ddp", parallel_strategy_kwargs: dict | None = None):
    """Move ``model`` to the worker's device and, with more than one worker, wrap it in
    DistributedDataParallel (``parallel_strategy="ddp"``; None leaves it unwrapped).

    ``parallel_strategy_kwargs`` go to DDP as given; unless they say otherwise,
    ``gradient_as_bucket_view=True``: gradients live in DDP's allreduce buckets instead of being
    copied back out of them after every allreduce (a copy of all gradients per step, and as much
    memory). Code that calls ``detach_()`` on a gradient needs ``gradient_as_bucket_view=False``."""
    if parallel_strategy not in ("ddp", None):
        raise ValueError(f"parallel_strategy must be 'ddp' or None, got {parallel_strategy!r}")
    device = move_to_device if isinstance(move_to_device, torch.device) else get_device()
    if move_to_device is not False:
        model = model.to(device)
    if parallel_strategy == "ddp" and session.world_size() > 1:
        if not dist.is_initialized():
            raise RuntimeError("prepare_model: torch.distributed is not initialized; call it inside a "
                               "raylite.train worker (Trainer.run / TorchTrainer.fit)")
        kwargs = dict(parallel_strategy_kwargs or {})
        kwargs.setdefault("gradient_as_bucket_view", True)
        if device.type == "cuda":
            kwargs.setdefault("device_ids", [device.index if device.index is not None else 0])
            kwargs.setdefault("output_device", kwargs["device_ids"][0])
        model = torch.nn.parallel.DistributedDataParallel(model, **kwargs)
        if device.type == "cpu":
            _average_through_shared_memory(model, kwargs)
    return model


def _average_through_shared_memory(model, ddp_kwargs: dict) -> None:
    """On CPU with every rank on this machine, average gradients through shared memory instead
    of gloo over loopback (``raylite.util.shm_collectives``; gloo's round trips cost ~10% of a
    step of a compute-bound model on 2 cores). Same means on every rank; off with
    RAYLITE_TRAIN_FASTPATH=0 and wherever the ranks cannot share a segment. A collective: every
    rank calls prepare_model."""
    from raylite.util import shm_collectives
    if not shm_collectives.wanted(shm_collectives.TRAIN_ENV):
        return
    slot = int(ddp_kwargs.get("bucket_cap_mb", 25) * (1 << 20))   # DDP's bucket size
    local = shm_collectives.LocalGroup.connect(slot_bytes=slot)
    if local is not None:
        model.register_comm_hook(local, shm_collectives.allreduce_hook)


def prepare_data_loader(data_loader: DataLoader, add_dist_sampler: bool = True,
                        move_to_device: bool = True, auto_transfer: bool = True):
    """With more than one worker, rebuild ``data_loader`` around a DistributedSampler (shuffling if
    the original shuffled; call ``loader.sampler.set_epoch(epoch)`` each epoch, as in Ray), so each
    rank sees its own shard; then move every batch to the worker's device."""
    if add_dist_sampler and session.world_size() > 1 and not isinstance(data_loader.sampler, DistributedSampler) \
            and not isinstance(data_loader.dataset, IterableDataset):
        if data_loader.batch_sampler is not None and not _default_batch_sampler(data_loader):
            raise ValueError("prepare_data_loader: a DataLoader with a custom batch_sampler cannot be sharded "
                             "automatically; pass add_dist_sampler=False and shard it yourself")
        shuffle = isinstance(data_loader.sampler, RandomSampler)
        sampler = DistributedSampler(data_loader.dataset, num_replicas=session.world_size(),
                                     rank=session.world_rank(), shuffle=shuffle)
        data_loader = DataLoader(
            data_loader.dataset, batch_size=data_loader.batch_size, sampler=sampler,
            num_workers=data_loader.num_workers, collate_fn=data_loader.collate_fn,
            pin_memory=data_loader.pin_memory, drop_last=data_loader.drop_last, timeout=data_loader.timeout,
            worker_init_fn=data_loader.worker_init_fn, generator=data_loader.generator,
            prefetch_factor=data_loader.prefetch_factor if data_loader.num_workers > 0 else None,
            persistent_workers=data_loader.persistent_workers)
    if move_to_device:
        device = get_device()
        return _DeviceDataLoader(data_loader, device, auto_transfer and device.type == "cuda")
    return data_loader


def prepare_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Ray 1.x's `train.torch.prepare_optimizer`: Ray wraps the optimizer only for automatic mixed
    precision (`train.torch.accelerate(amp=True)`), which raylite leaves to `torch.autocast` and
    `torch.amp.GradScaler` in the loop; so this checks it is an optimizer and returns it."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"prepare_optimizer expects a torch.optim.Optimizer, got {type(optimizer).__name__}")
    return optimizer


def _default_batch_sampler(loader: DataLoader) -> bool:
    return type(loader.batch_sampler) is BatchSampler


def _to(batch, device: torch.device, non_blocking: bool):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: _to(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):   # namedtuple
        return type(batch)(*(_to(v, device, non_blocking) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to(v, device, non_blocking) for v in batch)
    return batch


class _DeviceDataLoader:
    """Iterates the wrapped loader, moving each batch to the device; other attributes pass through."""

    def __init__(self, loader: DataLoader, device: torch.device, non_blocking: bool):
        self._loader, self._device, self._non_blocking = loader, device, non_blocking

    def __iter__(self):
        for batch in self._loader:
            yield _to(batch, self._device, self._non_blocking)

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name):
        return getattr(self.__dict__["_loader"], name)


def enable_reproducibility(seed: int = 0) -> None:
    """Seed Python, numpy (if present) and torch, and ask torch for deterministic algorithms."""
    random.seed(seed)
    try:
        import numpy as np
        np.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
