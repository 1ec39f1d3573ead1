"""Threaded and async actors: calls that run side by side in one actor process, as in Ray.

An actor whose class defines an ``async def`` method runs every call on one asyncio event loop, in
a thread of its own, up to ``max_concurrency`` at once (default 1000, as in Ray); an actor created
with ``max_concurrency=N > 1`` runs its calls in a pool of N threads. Calls start in submission
order and each sends its own "done" message. The worker's main thread keeps reading the driver's
messages meanwhile, so one call may wait (``get``, ``await``) on another call of the same actor.
"""
from __future__ import annotations

import inspect
import threading

ASYNC_DEFAULT_CONCURRENCY = 1000


def runner_for(executor, max_concurrency: int):
    """The runner an actor's calls need, or None for one call at a time (the plain loop)."""
    cls = type(executor.actor)
    members = (getattr(cls, name, None) for name in dir(cls))
    if any(inspect.iscoroutinefunction(m) or inspect.isasyncgenfunction(m) for m in members):
        return AsyncRunner(executor, max_concurrency or ASYNC_DEFAULT_CONCURRENCY)
    if max_concurrency > 1:
        return ThreadRunner(executor, max_concurrency)
    return None


class ThreadRunner:
    def __init__(self, executor, threads: int):
        from concurrent.futures import ThreadPoolExecutor
        self.executor = executor
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="raylite-actor")

    def submit(self, spec, deps: dict, assigned: dict, accel: dict) -> None:
        self.pool.submit(self.executor.execute, spec, deps, assigned, accel)

    def cancel(self, task_id: int) -> None:
        """A started call on a thread runs to its end (as in Ray); get() then reports the cancel."""

    def drain(self) -> None:
        self.pool.shutdown(wait=True)


class AsyncRunner:
    def __init__(self, executor, limit: int):
        import asyncio
        self.asyncio = asyncio
        self.executor = executor
        self.limit = limit
        self.slots = None   # the semaphore, made on the loop it belongs to
        self.tasks: dict[int, object] = {}   # task id -> its asyncio task (loop thread only)
        self.doomed: set[int] = set()        # cancelled before their first step (loop thread only)
        self.pending = 0
        self.idle = threading.Condition()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="raylite-actor-loop", daemon=True).start()

    def submit(self, spec, deps: dict, assigned: dict, accel: dict) -> None:
        with self.idle:
            self.pending += 1
        self.asyncio.run_coroutine_threadsafe(self._run(spec, deps, assigned, accel), self.loop)

    def cancel(self, task_id: int) -> None:
        """ray.cancel of a running (or waiting) call: CancelledError inside its coroutine, as in Ray."""
        self.loop.call_soon_threadsafe(self._cancel, task_id)

    def _cancel(self, task_id: int) -> None:
        task = self.tasks.get(task_id)
        if task is not None:
            task.cancel()
        else:   # its coroutine has not taken its first step yet
            self.doomed.add(task_id)

    async def _run(self, spec, deps: dict, assigned: dict, accel: dict) -> None:
        if self.slots is None:
            self.slots = self.asyncio.Semaphore(self.limit)
        ex = self.executor
        self.tasks[spec.task_id] = self.asyncio.current_task()
        try:
            try:
                if spec.task_id in self.doomed:
                    raise self.asyncio.CancelledError
                async with self.slots:
                    ex.begin(spec, assigned, accel)
                    args, kwargs = ex.arguments(spec, deps)
                    value = ex.invoke(spec, args, kwargs)
                    if inspect.isawaitable(value):
                        value = await value
                    if spec.stream:
                        value = (await ex.stream_async(spec, value) if hasattr(value, "__aiter__")
                                 else ex.stream(spec, value))
                    results = ex.pack(spec, value)
            except self.asyncio.CancelledError:
                results = ex.cancelled(spec)
            except BaseException as e:  # noqa: BLE001 - every failure goes back to the caller
                results = ex.failure(spec, e)
            ex.finish(spec, results)
        finally:   # only once its "done" is sent may drain() let the worker exit
            self.tasks.pop(spec.task_id, None)
            self.doomed.discard(spec.task_id)
            with self.idle:
                self.pending -= 1
                self.idle.notify_all()

    def drain(self) -> None:
        with self.idle:
            self.idle.wait_for(lambda: self.pending == 0)
        self.loop.call_soon_threadsafe(self.loop.stop)
