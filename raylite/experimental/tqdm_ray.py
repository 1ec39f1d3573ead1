"""`ray.experimental.tqdm_ray`: progress bars for code running in tasks and actors.

As in Ray, the bars are drawn in the driver: a bar in a worker sends its state (count, total,
description) at most every `flush_interval_s` seconds (default 1) and when it closes, and the
driver (raylite.core.node.bars) keeps one live line per bar at the bottom of its terminal, worker
output scrolling above them. Without a terminal (a log, a pipe) each state is a status line with
the worker's prefix, `(name pid=N) desc:  40% 4/10 it [2.1 it/s]`. A bar in the driver itself
draws on the same board. The constructor takes the subset of tqdm's arguments that Ray's takes.
"""
from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Iterable, Iterator

from raylite.core.client.link import process
from raylite.core.node import bars

DEFAULT_FLUSH_INTERVAL_SECONDS = 1.0


def safe_print(*args, **kwargs) -> None:
    """print() with the driver's live bars cleared around it, as Ray's safe_print."""
    live = bars.live()
    if live is None:
        print(*args, **kwargs)
    else:
        live.around(lambda: print(*args, **kwargs, flush=True))


class tqdm:
    """Counts iterations (`for x in tqdm(...)` or `update(n)`); the driver shows the count now and then."""

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
        self._uuid = uuid.uuid4().hex

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
        state = {"uuid": self._uuid, "desc": self._desc, "x": self._x, "total": self._total, "unit": self._unit,
                 "pos": self._pos, "elapsed": time.monotonic() - self._start, "closed": self._closed}
        if process.index:   # a worker: the driver draws it
            sys.stderr.write(bars.MAGIC + json.dumps(state) + "\n")
            sys.stderr.flush()
        elif not bars.board().update(("driver", self._uuid), state):
            sys.stderr.write(bars.status_text(state) + "\n")
            sys.stderr.flush()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            # a worker's bar tells the driver it closed; the driver's, when a line would say something new
            if process.index or self._shown != self._x or bars.board().tty():
                self.refresh()
