"""`ray.experimental.tqdm_ray`: progress bars for code running in tasks and actors.

Ray draws these bars centrally in the driver. raylite forwards each worker's output line by line
with its `(name pid=N)` prefix instead, so a bar here prints a plain status line, `desc: 40%
4/10 it [2.1 it/s]`, at most every `flush_interval_s` seconds (default 1) and when it closes:
readable in the driver's terminal and in log files, without bars from several workers fighting
over one terminal line. The constructor takes the subset of tqdm's arguments that Ray's takes.
"""
from __future__ import annotations

import sys
import time
from typing import Iterable, Iterator

DEFAULT_FLUSH_INTERVAL_SECONDS = 1.0


def safe_print(*args, **kwargs) -> None:
    """print(); Ray's clears its bars around it, which plain status lines never need."""
    print(*args, **kwargs)


class tqdm:
    """Counts iterations (`for x in tqdm(...)` or `update(n)`) and prints a status line now and then."""

    def __init__(self, iterable: Iterable | None = None, desc: str | None = None, total: int | None = None,
                 unit: str | None = None, position: int | None = None, flush_interval_s: float | None = None):
        if total is None and iterable is not None:
            try:
                total = len(iterable)
            except (TypeError, AttributeError):
                total = None
        self._iterable, self._desc, self._total, self._unit = iterable, desc or "", total, unit or "it"
        self._pos = position or 0
        self._interval = DEFAULT_FLUSH_INTERVAL_SECONDS if flush_interval_s is None else flush_interval_s
        self._x, self._shown = 0, -1
        self._start = self._last_flush = time.monotonic()
        self._closed = False

    def __iter__(self) -> Iterator:
        if self._iterable is None:
            raise ValueError("tqdm was created without an iterable to iterate over")
        try:
            for item in self._iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> tqdm:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def set_description(self, desc: str) -> None:
        self._desc = desc

    def update(self, n: int = 1) -> None:
        self._x += n
        if time.monotonic() - self._last_flush >= self._interval:
            self.refresh()

    def refresh(self) -> None:
        self._last_flush, self._shown = time.monotonic(), self._x
        sys.stderr.write(self._status() + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._shown != self._x:   # the final count, unless the last line showed it
                self.refresh()

    def _status(self) -> str:
        elapsed = max(time.monotonic() - self._start, 1e-9)
        done = f"{self._x}/{self._total}" if self._total else str(self._x)
        percent = f"{100 * self._x / self._total:3.0f}% " if self._total else ""
        head = f"{self._desc}: " if self._desc else ""
        return f"{head}{percent}{done} {self._unit} [{self._x / elapsed:.1f} {self._unit}/s]"
