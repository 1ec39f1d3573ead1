"""`ActorPool`: spread work over a fixed set of actors, as ``ray.util.ActorPool`` does.

Each submitted ``fn(actor, value)`` runs on an idle actor, or waits in the pool until one frees
up; results come back in submission order (``get_next``, ``map``) or as they finish
(``get_next_unordered``, ``map_unordered``). ``fn`` may return a list of refs (a method with
``num_returns=N``): its result is then the list of values. An actor that died is dropped from
the pool once its call's result is read, as in Ray. Only the public API is used, so the pool
works on both backends.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Callable, Iterable, Iterator

import raylite as ray


class ActorPool:
    """Ray's ``ActorPool``: calls spread over a fixed set of actors, one call per actor at a time.

    Args:
        actors: the actor handles to use; ``push`` adds more, ``pop_idle`` takes one out.
    """

    def __init__(self, actors: Iterable):
        self._idle = list(actors)
        self._pending: deque = deque()   # (fn, value) waiting for an idle actor
        self._by_ref: dict = {}          # running call's key (its ref, or tuple of refs) -> (index, actor)
        self._by_index: dict = {}        # submission index -> key, for in-order results
        self._next_submit = 0
        self._next_return = 0

    def submit(self, fn: Callable[[Any, Any], Any], value: Any) -> None:
        """Run ``fn(actor, value)`` (which must return an ObjectRef, or a list of them) on the next
        idle actor."""
        if self._idle:
            actor = self._idle.pop()
            ref = fn(actor, value)
            refs = ref if isinstance(ref, list) else [ref]
            if not refs or not all(isinstance(r, ray.ObjectRef) for r in refs):
                self._idle.append(actor)
                raise TypeError(f"ActorPool.submit: fn must return an ObjectRef or a list of them (e.g. "
                                f"`lambda a, v: a.method.remote(v)`), got {_describe(ref)}")
            key = tuple(refs) if isinstance(ref, list) else ref
            self._by_ref[key] = (self._next_submit, actor)
            self._by_index[self._next_submit] = key
            self._next_submit += 1
        else:
            self._pending.append((fn, value))

    def has_next(self) -> bool:
        """Whether any submitted call's result is still to be returned."""
        return bool(self._by_ref)

    def get_next(self, timeout: float | None = None, ignore_if_timedout: bool = False) -> Any:
        """The next result in submission order; TimeoutError if it is not ready within
        ``timeout`` (then skipped for good if ``ignore_if_timedout``)."""
        if not self.has_next():
            raise StopIteration("No more results to get")
        key = self._by_index[self._next_return]
        if timeout is not None:
            ready, _ = ray.wait([_first(key)], timeout=timeout)
            if not ready:
                if ignore_if_timedout:
                    self._forget(key)
                raise TimeoutError(f"Timed out waiting for result after {timeout} s")
        return self._result(key)

    def get_next_unordered(self, timeout: float | None = None, ignore_if_timedout: bool = False) -> Any:
        """Whichever running call finishes first; TimeoutError if none does within ``timeout``."""
        if not self.has_next():
            raise StopIteration("No more results to get")
        keys = {_first(key): key for key in self._by_ref}   # a call's refs are ready together
        ready, _ = ray.wait(list(keys), num_returns=1, timeout=timeout)
        if not ready:
            if ignore_if_timedout:   # nothing in particular timed out: drop the oldest call
                self._forget(self._by_index[min(self._by_index)])
            raise TimeoutError(f"Timed out waiting for result after {timeout} s")
        return self._result(keys[ready[0]])

    def _result(self, key) -> Any:
        """The call's value(s); its actor goes back to the pool unless the call found it dead."""
        alive = True
        try:
            return ray.get(list(key) if isinstance(key, tuple) else key)
        except ray.exceptions.ActorDiedError:
            alive = False
            raise
        finally:
            self._forget(key, alive)

    def map(self, fn: Callable[[Any, Any], Any], values: Iterable) -> Iterator:
        """Results of ``fn(actor, v)`` for each value, in order (earlier unread results are
        dropped). The calls are submitted here, before the first result is asked for, as in Ray."""
        return self._map(fn, values, self.get_next)

    def map_unordered(self, fn: Callable[[Any, Any], Any], values: Iterable) -> Iterator:
        """Results of ``fn(actor, v)`` for each value, as they finish (submitted here, as ``map``)."""
        return self._map(fn, values, self.get_next_unordered)

    def _map(self, fn, values: Iterable, next_result: Callable[[], Any]) -> Iterator:
        self._drop_unread()
        for v in values:
            self.submit(fn, v)
        return self._results(next_result)

    def _results(self, next_result: Callable[[], Any]) -> Iterator:
        while self.has_next():
            yield next_result()

    def has_free(self) -> bool:
        """Whether an actor is idle (and no submitted call is waiting for one)."""
        return bool(self._idle) and not self._pending

    def pop_idle(self):
        """Take an idle actor out of the pool (None if none is idle)."""
        return self._idle.pop() if self.has_free() else None

    def push(self, actor) -> None:
        """Add an actor to the pool; it takes waiting work at once."""
        busy = [a for _, a in self._by_ref.values()]
        if any(actor is a for a in self._idle + busy):
            raise ValueError("Actor already belongs to current ActorPool")
        self._idle.append(actor)
        self._dispatch_pending()

    def _forget(self, key, alive: bool = True) -> None:
        """A call is done (or abandoned): free its actor for waiting work (a dead one leaves the pool)."""
        index, actor = self._by_ref.pop(key)
        del self._by_index[index]
        if index == self._next_return:
            self._next_return = min(self._by_index, default=self._next_submit)
        if alive:
            self._idle.append(actor)
        self._dispatch_pending()

    def _dispatch_pending(self) -> None:
        while self._idle and self._pending:
            self.submit(*self._pending.popleft())

    def _drop_unread(self) -> None:
        """What `map` does first, as in Ray: results not read yet, and work not started, are dropped."""
        self._pending.clear()
        for ref in list(self._by_ref):
            self._forget(ref)


def _first(key):
    """The ref to wait on for a call: its only one, or the first of a num_returns=N call's."""
    return key[0] if isinstance(key, tuple) else key


def _describe(value) -> str:
    if isinstance(value, list):
        return f"a list of {', '.join(sorted({type(v).__name__ for v in value})) or 'nothing'}"
    return type(value).__name__
