"""`ray.util.multiprocessing.pool` (Ray's module of its Pool): the standard library's Pool API
on raylite actors, so code written for `multiprocessing.Pool` runs on the runtime by changing
one import.

Each pool process is an actor: the initializer runs once in it, and its module state lasts
across tasks, as in a process pool. Work goes out in chunks, round-robin over the actors; a
chunk counts as one task for `maxtasksperchild`, as in the standard library. `imap` and
`imap_unordered` return an iterator with the stdlib's `next(timeout)`; as in Ray's Pool, an
item that raised comes back as a `PoolTaskError` in its place.
"""
from __future__ import annotations

import itertools
import multiprocessing
import os
import threading
import time
import traceback
import warnings
import weakref
from collections import deque
from typing import Any, Callable, Iterable, Iterator

import raylite as ray

TimeoutError = multiprocessing.TimeoutError   # what AsyncResult.get raises, as in the stdlib
JoinableQueue = multiprocessing.JoinableQueue   # re-exported, as Ray does


class _PoolProcess:
    """One pool process: runs the initializer once, then chunks of calls."""

    def __init__(self, initializer: Callable | None, initargs: tuple):
        if initializer is not None:
            initializer(*initargs)

    def ready(self) -> bool:
        return True

    def run_chunk(self, fn: Callable, chunk: list, star: bool) -> list:
        return [fn(*args) for args in chunk] if star else [fn(arg) for arg in chunk]

    def run_each(self, fn: Callable, chunk: list, star: bool) -> list:
        """(True, value) or (False, error) per item, so one failed item spares the rest of its chunk."""
        out = []
        for args in chunk:
            try:
                out.append((True, fn(*args) if star else fn(args)))
            except Exception as e:  # noqa: BLE001 - handed back in the item's place
                name = getattr(fn, "__name__", type(fn).__name__)
                out.append((False, ray.exceptions.RayTaskError(name, traceback.format_exc(), e, os.getpid())))
        return out


class PoolTaskError(Exception):
    """A failed item of ``imap``/``imap_unordered``, in the item's place (as Ray's Pool); the
    item's exception is ``underlying``, a RayTaskError that is also of the raised class."""

    def __init__(self, underlying: BaseException):
        super().__init__(underlying)
        self.underlying = underlying


class IMapIterator:
    """What ``imap`` and ``imap_unordered`` return, as the standard library's: iterate it, or call
    ``next(timeout)``, which raises multiprocessing.TimeoutError if no result came in time.

    The input is read lazily: each pool process has one chunk at a time and gets the next when
    it finishes (as the stdlib's free process takes the next task), so a slow item holds back
    only its own process. ``Pool.close`` sends the rest at once, so the iteration still
    completes, as in the stdlib."""

    def __init__(self, pool: Pool, func: Callable, items: Iterator, chunksize: int, ordered: bool):
        self._pool, self._func, self._items = pool, func, items
        self._chunksize, self._ordered = chunksize, ordered
        self._running: dict = {}    # chunk's ref -> (chunk index, actor index, chunk length)
        self._finished: dict = {}   # ordered: chunk index -> its results, until its turn
        self._ready: deque = deque()
        self._submitted = 0         # chunks sent
        self._next_chunk = 0        # ordered: the chunk whose results come next
        self._lock = threading.Lock()
        for index in range(len(pool._actors)):
            self._submit(index)

    def _submit(self, index: int | None) -> None:
        """Send the next chunk of the input (to actor ``index``), if any is left."""
        with self._lock:
            chunk = list(itertools.islice(self._items, self._chunksize))
            if not chunk:
                return
            ref = self._pool._submit(self._func, chunk, False, index, each=True)
            self._running[ref] = (self._submitted, index, len(chunk))
            self._submitted += 1

    def _submit_all(self) -> None:
        while True:
            before = self._submitted
            self._submit(None)
            if self._submitted == before:
                return

    def __iter__(self) -> IMapIterator:
        return self

    def __next__(self) -> Any:
        return self.next()

    def next(self, timeout: float | None = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ready:
            if self._ordered and self._next_chunk in self._finished:
                self._ready.extend(self._finished.pop(self._next_chunk))
                self._next_chunk += 1
                continue
            if not self._running:
                raise StopIteration
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, _ = ray.wait(list(self._running), num_returns=1, timeout=left)
            if not done:
                raise TimeoutError(f"no result within {timeout} s")
            chunk_index, index, length = self._running.pop(done[0])
            results = self._results(done[0], length)
            if not self._pool._closed:
                self._submit(index)
            if self._ordered:
                self._finished[chunk_index] = results
            else:
                self._ready.extend(results)
        return self._ready.popleft()

    @staticmethod
    def _results(ref, length: int) -> list:
        try:
            pairs = ray.get(ref)
        except ray.exceptions.RayError as e:   # the whole chunk failed (its process died, ...)
            return [PoolTaskError(e)] * length
        return [value if ok else PoolTaskError(value.as_instanceof_cause()) for ok, value in pairs]


def _positive(value, field: str) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{field} must be a positive integer (or None), got {field}={value!r}")


class AsyncResult:
    """The result of `apply_async` / `map_async`: `get(timeout)`, `wait`, `ready`, `successful`."""

    def __init__(self, refs: list, single: bool, callback: Callable | None = None,
                 error_callback: Callable | None = None):
        self._refs, self._single = refs, single
        if callback is not None or error_callback is not None:   # the stdlib calls them from a thread
            threading.Thread(target=self._notify, args=(callback, error_callback), daemon=True).start()

    def _notify(self, callback, error_callback) -> None:
        try:
            value = self.get()
        except Exception as e:  # noqa: BLE001 - handed to the user's error_callback
            if error_callback is not None:
                error_callback(e)
            return
        if callback is not None:
            callback(value)

    def get(self, timeout: float | None = None):
        """The value (apply) or list of values (map); re-raises the first task's exception."""
        try:
            chunks = ray.get(self._refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"the result was not ready within {timeout} s") from None
        values = [v for chunk in chunks for v in chunk]
        return values[0] if self._single else values

    def wait(self, timeout: float | None = None) -> None:
        ray.wait(self._refs, num_returns=len(self._refs), timeout=timeout)

    def ready(self) -> bool:
        ready, _ = ray.wait(self._refs, num_returns=len(self._refs), timeout=0)
        return len(ready) == len(self._refs)

    def successful(self) -> bool:
        """Whether every call succeeded; ValueError while the result is not ready (as the stdlib)."""
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        try:
            ray.get(self._refs)
        except Exception:  # noqa: BLE001 - any failure means "not successful"
            return False
        return True


def _start_runtime(processes: int | None, ray_address: str | None) -> None:
    """``init`` as Ray's Pool calls it: ``ray_address``, else RAY_ADDRESS, else a local runtime;
    a local one gets ``num_cpus=processes`` (a cluster's CPUs are its own)."""
    from raylite.control import uses_local_runtime
    local = uses_local_runtime(ray_address)
    ray.init(address=ray_address, **({"num_cpus": processes} if local and processes else {}))


class Pool:
    """A pool of `processes` actors with `multiprocessing.Pool`'s methods.

    Args:
        processes: how many actors (default: the node's CPUs, starting the runtime if needed).
        initializer: called as `initializer(*initargs)` once in each actor.
        initargs: the arguments of `initializer`.
        maxtasksperchild: an actor is replaced after this many tasks (None: never).
        context: accepted for compatibility and ignored: the runtime starts the processes.
        ray_address: passed to `init` when the pool starts the runtime (then, or with RAY_ADDRESS
            set, a Ray cluster's CPUs are its own; a local runtime gets `num_cpus=processes`).
        ray_remote_args: the actors' options (e.g. `{"num_gpus": 0.25}`).
    """

    def __init__(self, processes: int | None = None, initializer: Callable | None = None,
                 initargs: Iterable | None = None, maxtasksperchild: int | None = None, context: Any = None,
                 ray_address: str | None = None, ray_remote_args: dict | None = None):
        _positive(processes, "processes")
        _positive(maxtasksperchild, "maxtasksperchild")
        if initializer is not None and not callable(initializer):
            raise TypeError(f"initializer must be callable, got {initializer!r}")
        if context is not None:
            warnings.warn("Pool(context=...) is ignored: raylite starts the pool's processes", stacklevel=2)
        if not ray.is_initialized():
            _start_runtime(processes, ray_address)
        cpus = int(ray.cluster_resources().get("CPU", 0))
        processes = processes or max(1, cpus)
        if processes > cpus:
            raise ValueError(f"Pool(processes={processes}) asks for more processes than the {cpus} CPUs "
                             "the runtime has")
        self._actor_class = ray.remote(_PoolProcess).options(**(ray_remote_args or {}))
        self._init = (initializer, tuple(initargs or ()))
        self._max_tasks = maxtasksperchild
        self._actors = [self._actor_class.remote(*self._init) for _ in range(processes)]
        self._done = [0] * processes   # chunks given to each actor (for maxtasksperchild)
        self._next = itertools.cycle(range(processes))
        self._closing: list = []
        self._closed = False
        self._iterators: weakref.WeakSet = weakref.WeakSet()   # imap iterators still submitting
        self._lock = threading.Lock()
        ray.get([a.ready.remote() for a in self._actors])   # an initializer's error raises here

    # -- submission --
    def _check_running(self) -> None:
        if self._closed:
            raise ValueError("Pool not running")

    def _submit(self, fn: Callable, chunk: list, star: bool, index: int | None = None, each: bool = False):
        """Run one chunk on the next actor round-robin (or on actor ``index``); ``each``: as
        run_each, one result or error per item."""
        with self._lock:
            self._check_running()
            i = next(self._next) if index is None else index
            ref = (self._actors[i].run_each if each else self._actors[i].run_chunk).remote(fn, chunk, star)
            self._done[i] += 1
            if self._max_tasks is not None and self._done[i] >= self._max_tasks:   # retire after its calls
                self._closing.append(self._actors[i].__ray_terminate__.remote())
                self._actors[i], self._done[i] = self._actor_class.remote(*self._init), 0
            return ref

    def _chunks(self, iterable: Iterable, chunksize: int | None) -> Iterator[list]:
        items = iterable if chunksize is not None else list(iterable)
        if chunksize is None:   # the stdlib's default
            chunksize = self._default_chunksize(len(items))
        _positive(chunksize, "chunksize")
        it = iter(items)
        while chunk := list(itertools.islice(it, chunksize)):
            yield chunk

    def _default_chunksize(self, n: int) -> int:
        """About four chunks per process, as the standard library's map."""
        return max(1, -(-n // (4 * len(self._actors))))

    def apply(self, func: Callable, args: tuple = (), kwds: dict | None = None):
        return self.apply_async(func, args, kwds).get()

    def apply_async(self, func: Callable, args: tuple = (), kwds: dict | None = None,
                    callback: Callable | None = None, error_callback: Callable | None = None) -> AsyncResult:
        kwds = kwds or {}
        call = (lambda *a: func(*a, **kwds)) if kwds else func
        return AsyncResult([self._submit(call, [tuple(args)], True)], True, callback, error_callback)

    def map(self, func: Callable, iterable: Iterable, chunksize: int | None = None) -> list:
        return self.map_async(func, iterable, chunksize).get()

    def map_async(self, func: Callable, iterable: Iterable, chunksize: int | None = None,
                  callback: Callable | None = None, error_callback: Callable | None = None) -> AsyncResult:
        refs = [self._submit(func, chunk, False) for chunk in self._chunks(iterable, chunksize)]
        return AsyncResult(refs, False, callback, error_callback)

    def starmap(self, func: Callable, iterable: Iterable, chunksize: int | None = None) -> list:
        return self.starmap_async(func, iterable, chunksize).get()

    def starmap_async(self, func: Callable, iterable: Iterable, chunksize: int | None = None,
                      callback: Callable | None = None, error_callback: Callable | None = None) -> AsyncResult:
        refs = [self._submit(func, [tuple(a) for a in chunk], True) for chunk in self._chunks(iterable, chunksize)]
        return AsyncResult(refs, False, callback, error_callback)

    def imap(self, func: Callable, iterable: Iterable, chunksize: int | None = 1) -> IMapIterator:
        """Results in input order, as an iterator with ``next(timeout)``; a failed item comes back
        as a PoolTaskError in its place (Ray's Pool does so; the standard library raises it)."""
        return self._iterate(func, iterable, chunksize, ordered=True)

    def imap_unordered(self, func: Callable, iterable: Iterable, chunksize: int | None = 1) -> IMapIterator:
        """As ``imap``, in the order the chunks finish."""
        return self._iterate(func, iterable, chunksize, ordered=False)

    def _iterate(self, func: Callable, iterable: Iterable, chunksize: int | None, ordered: bool) -> IMapIterator:
        self._check_running()
        _positive(chunksize, "chunksize")
        if chunksize is None:   # as Ray's: the map default for a sized input, else 1
            chunksize = self._default_chunksize(len(iterable)) if hasattr(iterable, "__len__") else 1
        iterator = IMapIterator(self, func, iter(iterable), chunksize, ordered)   # iter(): a TypeError here
        self._iterators.add(iterator)
        return iterator

    # -- lifecycle, as the stdlib's: close lets queued work finish, terminate stops it --
    def close(self) -> None:
        for iterator in list(self._iterators):   # as the stdlib: work imap was given still runs
            iterator._submit_all()
        self._stop()

    def terminate(self) -> None:
        """Stop at once: running work fails, and imap iterators end after what already ran."""
        self._stop()
        for actor in self._actors:
            ray.kill(actor)

    def _stop(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._closing += [a.__ray_terminate__.remote() for a in self._actors]

    def join(self) -> None:
        """Wait until the closed pool's processes have finished their work and exited."""
        if not self._closed:
            raise ValueError("Pool is still running")
        ray.wait(self._closing, num_returns=len(self._closing))

    def __enter__(self) -> Pool:
        self._check_running()
        return self

    def __exit__(self, *exc) -> None:
        self.terminate()
