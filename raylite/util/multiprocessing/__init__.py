"""`ray.util.multiprocessing`: the standard library's Pool API on raylite actors (the
implementation is ``raylite.util.multiprocessing.pool``, at Ray's path)."""
from raylite.util.multiprocessing.pool import (AsyncResult, IMapIterator, JoinableQueue, Pool, PoolTaskError,
                                               TimeoutError)

__all__ = ["AsyncResult", "IMapIterator", "JoinableQueue", "Pool", "PoolTaskError", "TimeoutError"]
