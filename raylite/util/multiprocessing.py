"""`ray.util.multiprocessing.Pool`: the standard library's Pool API on raylite actors, so code
written for `multiprocessing.Pool` runs on the runtime by changing one import.

Each pool process is an actor: the initializer runs once in it, and its module state lasts
across tasks, as in a process pool. Work goes out in chunks, round-robin over the actors; a
chunk counts as one task for `maxtasksperchild`, as in the standard library.
"""
from __future__ import annotations

import itertools
import multiprocessing
import threading
import warnings
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


class Pool:
    """A pool of `processes` actors with `multiprocessing.Pool`'s methods.

    `processes` defaults to the node's CPUs (starting the runtime if needed, with `ray_address`
    passed to `init`); `ray_remote_args` are the actors' options (e.g. `{"num_gpus": 0.25}`).
    `context` is accepted for compatibility and ignored: the runtime starts the processes.
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
            ray.init(address=ray_address, **({"num_cpus": processes} if ray_address is None and processes else {}))
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
        self._lock = threading.Lock()
        ray.get([a.ready.remote() for a in self._actors])   # an initializer's error raises here

    # -- submission --
    def _check_running(self) -> None:
        if self._closed:
            raise ValueError("Pool not running")

    def _submit(self, fn: Callable, chunk: list, star: bool):
        with self._lock:
            self._check_running()
            i = next(self._next)
            ref = self._actors[i].run_chunk.remote(fn, chunk, star)
            self._done[i] += 1
            if self._max_tasks is not None and self._done[i] >= self._max_tasks:   # retire after its calls
                self._closing.append(self._actors[i].__ray_terminate__.remote())
                self._actors[i], self._done[i] = self._actor_class.remote(*self._init), 0
            return ref

    def _chunks(self, iterable: Iterable, chunksize: int | None) -> Iterator[list]:
        items = iterable if chunksize is not None else list(iterable)
        if chunksize is None:   # the stdlib's default: about four chunks per process
            chunksize = max(1, -(-len(items) // (4 * len(self._actors))))
        _positive(chunksize, "chunksize")
        it = iter(items)
        while chunk := list(itertools.islice(it, chunksize)):
            yield chunk

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

    def imap(self, func: Callable, iterable: Iterable, chunksize: int = 1) -> Iterator:
        """Results in input order, lazily: at most two chunks per process in flight."""
        pending: list = []
        for chunk in self._chunks(iterable, chunksize):
            pending.append(self._submit(func, chunk, False))
            if len(pending) >= 2 * len(self._actors):
                yield from ray.get(pending.pop(0))
        for ref in pending:
            yield from ray.get(ref)

    def imap_unordered(self, func: Callable, iterable: Iterable, chunksize: int = 1) -> Iterator:
        """Results as they finish, lazily: at most two chunks per process in flight."""
        pending: list = []
        chunks = self._chunks(iterable, chunksize)
        for chunk in chunks:
            pending.append(self._submit(func, chunk, False))
            if len(pending) >= 2 * len(self._actors):
                break
        while pending:
            [done], pending = ray.wait(pending, num_returns=1)
            chunk = next(chunks, None)
            if chunk is not None:
                pending.append(self._submit(func, chunk, False))
            yield from ray.get(done)

    # -- lifecycle, as the stdlib's: close lets queued work finish, terminate stops it --
    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._closing += [a.__ray_terminate__.remote() for a in self._actors]

    def terminate(self) -> None:
        self.close()
        for actor in self._actors:
            ray.kill(actor)

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
