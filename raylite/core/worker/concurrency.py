"""Threaded and async actors: calls that run side by side in one actor process, as in Ray.

An actor whose class defines an ``async def`` method runs every call on one asyncio event loop, in
a thread of its own, up to ``max_concurrency`` at once (default 1000, as in Ray); an actor created
with ``max_concurrency=N > 1`` runs its calls in a pool of N threads. Calls start in submission
order and each sends its own "done" message. The worker's main thread keeps reading the driver's
messages meanwhile, so one call may wait (``get``, ``await``) on another call of the same actor.

``concurrency_groups={"io": 2, ...}`` gives each named group its own limit (its own thread pool,
or its own share of the event loop); a method joins one with ``@ray.method(concurrency_group=)``
or per call with ``.options(concurrency_group=)``, and the rest share the default limit.
"""
from __future__ import annotations

import inspect
import threading

from raylite.core.wire.signatures import has_async_methods

ASYNC_DEFAULT_CONCURRENCY = 1000   # calls at once on an async actor unless told otherwise, as in Ray


def runner_for(executor, max_concurrency: int, groups: dict[str, int]):
    """The runner an actor's calls need, or None for one call at a time (the plain loop)."""
    if has_async_methods(type(executor.actor)):
        return AsyncRunner(executor, {None: max_concurrency or ASYNC_DEFAULT_CONCURRENCY, **groups})
    if max_concurrency > 1 or groups:
        return ThreadRunner(executor, {None: max_concurrency or 1, **groups})
    return None


def _group(executor, spec, limits: dict) -> tuple[bool, str | None]:
    """(known, name): the call's concurrency group, from .options() or the method's decorator."""
    name = spec.concurrency_group or getattr(getattr(type(executor.actor), spec.method, None),
                                             "__ray_concurrency_group__", None)
    if name in limits:
        return True, name
    executor.reject(spec, ValueError(f"{spec.name} asks for concurrency group {name!r}, but the actor has "
                                     f"{sorted(n for n in limits if n is not None)}"))
    return False, name


class ThreadRunner:
    def __init__(self, executor, limits: dict):
        from concurrent.futures import ThreadPoolExecutor
        self.executor = executor
        self.limits = limits
        self.pools = {name: ThreadPoolExecutor(n, thread_name_prefix=f"raylite-actor-{name or 'default'}")
                      for name, n in limits.items()}

    def submit(self, spec, deps: dict, assigned: dict, accel: dict) -> None:
        known, group = _group(self.executor, spec, self.limits)
        if known:
            self.pools[group].submit(self.executor.execute, spec, deps, assigned, accel)

    def cancel(self, task_id: int) -> None:
        """A started call on a thread runs to its end (as in Ray); get() then reports the cancel."""

    def drain(self) -> None:
        for pool in self.pools.values():
            pool.shutdown(wait=True)


class AsyncRunner:
    """An async actor's calls on its event loop. As in Ray, a call is handed to the loop only once
    its group has a free slot (a semaphore inside the loop instead lets a newly admitted call run
    ahead of one already woken, which deadlocks Ray's own batching example)."""

    def __init__(self, executor, limits: dict):
        import asyncio
        from collections import deque
        self.asyncio = asyncio
        self.executor = executor
        self.limits = limits
        self.running = dict.fromkeys(limits, 0)                  # per group (loop thread only)
        self.waiting = {name: deque() for name in limits}        # calls without a slot yet (loop thread)
        self.tasks: dict[int, object] = {}   # task id -> its asyncio task (loop thread only)
        self.doomed: set[int] = set()        # cancelled before their first step (loop thread only)
        self.pending = 0
        self.idle = threading.Condition()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="raylite-actor-loop", daemon=True).start()

    def run_until_done(self, coroutine):
        """Run a coroutine on the actor's loop and wait for it (an ``async def __init__``)."""
        return self.asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def submit(self, spec, deps: dict, assigned: dict, accel: dict) -> None:
        known, group = _group(self.executor, spec, self.limits)
        if not known:
            return
        with self.idle:
            self.pending += 1
        self.loop.call_soon_threadsafe(self._admit, (spec, group, deps, assigned, accel))

    def _admit(self, call: tuple) -> None:
        group = call[1]
        if self.running[group] < self.limits[group]:
            self._start(call)
        else:
            self.waiting[group].append(call)

    def _start(self, call: tuple) -> None:
        self.running[call[1]] += 1
        self.loop.create_task(self._run(*call))

    def cancel(self, task_id: int) -> None:
        """ray.cancel of a running (or waiting) call: CancelledError inside its coroutine, as in Ray."""
        self.loop.call_soon_threadsafe(self._cancel, task_id)

    def _cancel(self, task_id: int) -> None:
        task = self.tasks.get(task_id)
        if task is not None:
            return task.cancel()
        self.doomed.add(task_id)   # its coroutine has not taken its first step yet
        for queue in self.waiting.values():
            call = next((c for c in queue if c[0].task_id == task_id), None)
            if call is not None:   # waiting for a slot: report the cancel now
                queue.remove(call)
                return self._start(call)

    async def _run(self, spec, group: str | None, deps: dict, assigned: dict, accel: dict) -> None:
        ex = self.executor
        self.tasks[spec.task_id] = self.asyncio.current_task()
        try:
            try:
                if spec.task_id in self.doomed:
                    raise self.asyncio.CancelledError
                ex.begin(spec, assigned, accel)
                args, kwargs = ex.arguments(spec, deps)
                value = ex.invoke(spec, args, kwargs)
                if inspect.isawaitable(value):
                    value = await value
                if spec.stream:
                    value = (await ex.stream_async(spec, value) if hasattr(value, "__aiter__")
                             else ex.stream(spec, value))
                results = ex.pack(spec, value)
            except self.asyncio.CancelledError:   # raised in user code: a RayTaskError too, as in Ray
                results = ex.failure(spec, ex.cancel_error(spec))
            except BaseException as e:  # noqa: BLE001 - every failure goes back to the caller
                results = ex.failure(spec, e)
                if ex.retryable(spec, e):
                    return ex.finish(spec, results, retry=True)
            ex.finish(spec, results)
        finally:   # only once its "done" is sent may drain() let the worker exit
            self.tasks.pop(spec.task_id, None)
            self.doomed.discard(spec.task_id)
            self.running[group] -= 1
            if self.waiting[group]:   # its first step runs after the coroutines already woken
                self._start(self.waiting[group].popleft())
            with self.idle:
                self.pending -= 1
                self.idle.notify_all()

    def drain(self) -> None:
        with self.idle:
            self.idle.wait_for(lambda: self.pending == 0)
        self.loop.call_soon_threadsafe(self.loop.stop)
