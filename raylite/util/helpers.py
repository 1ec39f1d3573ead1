"""`ray.util.as_completed` and `ray.util.map_unordered`: results in the order they finish, with
at most a bounded number of tasks in flight (Ray's "limit pending tasks" pattern)."""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

import raylite as ray


def _check(chunk_size: int, wait_kwargs: dict) -> None:
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size!r}")
    if "num_returns" in wait_kwargs:   # it is chunk_size here, as Ray says
        raise ValueError("Use the `chunk_size` argument instead of `num_returns`.")


def _ready_batch(refs: list, chunk_size: int, yield_obj_refs: bool, wait_kwargs: dict) -> tuple[list, list]:
    ready, rest = ray.wait(refs, num_returns=min(chunk_size, len(refs)), **wait_kwargs)
    return (ready if yield_obj_refs else ray.get(ready)), rest


def as_completed(refs: Sequence, *, chunk_size: int = 10, yield_obj_refs: bool = False,
                 **wait_kwargs) -> Iterator[Any]:
    """Yield each ref's value (or the ref) as batches of `chunk_size` become ready.

    Args:
        refs: the ObjectRefs to wait on.
        chunk_size: how many ready refs each `wait` asks for.
        yield_obj_refs: yield the refs themselves instead of their values.
        **wait_kwargs: more arguments of `wait` (`timeout`, `fetch_local`).
    """
    _check(chunk_size, wait_kwargs)
    pending = list(refs)
    while pending:
        done, pending = _ready_batch(pending, chunk_size, yield_obj_refs, wait_kwargs)
        yield from done


def map_unordered(fn, items: Iterable, *, backpressure_size: int | None = 100, chunk_size: int = 10,
                  yield_obj_refs: bool = False, **wait_kwargs) -> Iterator[Any]:
    """`fn.remote(item)` for every item, yielding results as they finish, with at most
    `backpressure_size` tasks submitted and not yet yielded (None: no limit).

    Args:
        fn: a remote function.
        items: the arguments, one task each.
        backpressure_size: the most tasks submitted and not yet yielded (None: no limit).
        chunk_size: how many ready refs each `wait` asks for.
        yield_obj_refs: yield the refs themselves instead of their values.
        **wait_kwargs: more arguments of `wait` (`timeout`, `fetch_local`).
    """
    if backpressure_size is not None and backpressure_size < 1:
        raise ValueError(f"backpressure_size must be >= 1 or None, got {backpressure_size!r}")
    _check(chunk_size, wait_kwargs)
    pending: list = []
    for item in items:
        if backpressure_size is not None and len(pending) >= backpressure_size:
            done, pending = _ready_batch(pending, chunk_size, yield_obj_refs, wait_kwargs)
            yield from done
        pending.append(fn.remote(item))
    yield from as_completed(pending, chunk_size=chunk_size, yield_obj_refs=yield_obj_refs, **wait_kwargs)
