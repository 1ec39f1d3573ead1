"""``ray.train.collective``: small collectives across the training workers, for coordination (not
tensors), through the same meeting point as ``train.report``'s barrier (the run's reporter actor).
Every rank must make the same calls in the same order, as with report."""
from __future__ import annotations

import logging
import cloudpickle
from typing import TypeVar

from raylite.train import session

logger = logging.getLogger("raylite.train")

T = TypeVar("T")
MAX_BROADCAST_BYTES = 1000   # Ray's bound for "small" data: larger is allowed, with a warning


def _session(name: str):
    if session._session is None:
        raise RuntimeError(f"`{name}` cannot be used outside of a Ray Train training function: it is only "
                           f"available in a function launched by `trainer.fit()`")
    return session._session


def barrier() -> None:
    """Wait until every worker has called ``barrier()``."""
    _session("barrier").gather(None)


def broadcast_from_rank_zero(data: T) -> T:
    """Rank 0's ``data`` on every worker (small, picklable data); also a barrier."""
    s = _session("broadcast_from_rank_zero")
    if data is not None and s.info.world_rank == 0:
        size = len(cloudpickle.dumps(data))
        if size > MAX_BROADCAST_BYTES:
            logger.warning("Data size %d bytes exceeds the maximum broadcast size of %d bytes", size,
                           MAX_BROADCAST_BYTES)
    values, _ = s.gather(data if s.info.world_rank == 0 else None)
    return values[0]
