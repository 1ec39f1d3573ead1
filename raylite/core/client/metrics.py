"""Application metrics (``ray.util.metrics``): where recorded points go, and the session's totals.

Ray exports metrics through a per-node agent. Here each worker keeps what it recorded since its
last report and sends it to the driver just before each "done" (and before it exits), so by the
time `get` returns a call's result, the driver's store holds the points that call recorded; what
a worker records between calls (an actor's own threads) is sent every REPORT_S seconds. The
driver's store holds the totals over every process (for the driver's life, across sessions):
counters summed, gauges at their last value, histograms' bucket counts summed.
"""
from __future__ import annotations

import math
import threading
import time
import warnings

from raylite.core.wire.polling import start_sleeper
from raylite.core.wire.protocol import METRICS

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
REPORT_S = 2.0   # a worker's report of what it recorded between calls, at most this late


class MetricStore:
    """Series by (name, tags). In a worker (`forwarding`) they hold what was recorded since the
    last `take`; in the driver, totals."""

    def __init__(self):
        self.lock = threading.Lock()
        self.meta: dict[str, tuple] = {}     # name -> (kind, description, tag_keys, boundaries)
        self.series: dict[tuple, object] = {}   # (name, tags) -> float, or [counts per bucket..., sum, count]
        self.forwarding = False
        self.pending = False   # (forwarding) something to report
        self.report = None     # (forwarding) sends take() to the driver; see _report_between_calls
        self._reporting = False
        self._conflicts: set[str] = set()

    def declare(self, name: str, kind: str, description: str, tag_keys: tuple, boundaries: tuple) -> None:
        """Register a metric; the same name with another kind or tag keys is an error."""
        with self.lock:
            self._declare(name, (kind, description, tag_keys, boundaries), raise_=True)

    def _declare(self, name: str, meta: tuple, raise_: bool) -> bool:
        known = self.meta.setdefault(name, meta)
        if known[0] == meta[0] and known[2] == meta[2] and known[3] == meta[3]:
            return True
        why = (f"metric {name!r} is already a {known[0]} with tag_keys={known[2]}"
               + (f" and boundaries={list(known[3])}" if known[3] else "")
               + f"; it cannot also be a {meta[0]} with tag_keys={meta[2]}"
               + (f" and boundaries={list(meta[3])}" if meta[3] else ""))
        if raise_:
            raise ValueError(why)
        if name not in self._conflicts:   # (from a worker) once per name
            self._conflicts.add(name)
            warnings.warn(f"raylite: dropped points of a conflicting metric: {why}", stacklevel=2)
        return False

    def record(self, name: str, tags: tuple, value: float) -> None:
        with self.lock:
            self._add(name, tags, value, single=True)
            self.pending = self.forwarding
            start = self.forwarding and not self._reporting and self.report is not None
            self._reporting = self._reporting or start
        if start:
            start_sleeper(self._report_between_calls, "raylite-metrics")   # (the worker still polls)

    def _report_between_calls(self) -> None:
        """(Worker, from its first point on) report every REPORT_S what no finished call took along."""
        while True:
            time.sleep(REPORT_S)
            try:
                if self.pending:
                    self.report()
            except OSError:   # the driver is gone: so is this process, soon
                return

    def _add(self, name: str, tags: tuple, value, single: bool) -> None:
        """Fold one point (`single`), or another process's series value, into a series."""
        kind, _, _, boundaries = self.meta[name]
        key = (name, tags)
        if kind == COUNTER:
            self.series[key] = self.series.get(key, 0.0) + value
        elif kind == GAUGE:
            self.series[key] = value
        else:
            counts = self.series.get(key)
            if counts is None:
                counts = self.series[key] = [0] * (len(boundaries) + 1) + [0.0, 0]
            if single:
                import bisect
                counts[bisect.bisect_left(boundaries, value)] += 1
                counts[-2] += value
                counts[-1] += 1
            else:
                for i, n in enumerate(value):
                    counts[i] += n

    def take(self) -> list:
        """(Worker) what was recorded since the last take, for the driver's `merge`."""
        with self.lock:
            out = [(name, self.meta[name], tags, value) for (name, tags), value in self.series.items()]
            self.series = {}
            self.pending = False
        return out

    def merge(self, updates: list) -> None:
        """(Driver) a worker's report."""
        with self.lock:
            for name, meta, tags, value in updates:
                if self._declare(name, tuple(meta), raise_=False):
                    self._add(name, tags, value, single=False)

    def collect(self) -> list[dict]:
        with self.lock:
            items = sorted(self.series.items())
            meta = dict(self.meta)
        out = []
        for (name, tags), value in items:
            kind, description, _, boundaries = meta[name]
            row = {"name": name, "type": kind, "description": description, "tags": dict(tags)}
            if kind == HISTOGRAM:
                cumulative, running = {}, 0
                for bound, n in zip(list(boundaries) + [math.inf], value[:-2]):
                    running += n
                    cumulative[bound] = running
                row.update(buckets=cumulative, sum=value[-2], count=value[-1])
            else:
                row["value"] = value
            out.append(row)
        return out


def prometheus_text(rows: list[dict]) -> str:
    """Prometheus' text exposition format; counters are named with "_total", as Ray exports them."""
    lines, described = [], set()
    for row in rows:
        name, kind = row["name"], row["type"]
        exported = name + "_total" if kind == COUNTER else name
        if name not in described:
            described.add(name)
            if row["description"]:
                lines.append(f"# HELP {exported} {_escape(row['description'], quote=False)}")
            lines.append(f"# TYPE {exported} {kind}")
        if kind == HISTOGRAM:
            for bound, n in row["buckets"].items():
                le = "+Inf" if bound == math.inf else repr(float(bound))
                lines.append(f"{name}_bucket{_labels({**row['tags'], 'le': le})} {n}")
            lines.append(f"{name}_sum{_labels(row['tags'])} {_number(row['sum'])}")
            lines.append(f"{name}_count{_labels(row['tags'])} {row['count']}")
        else:
            lines.append(f"{exported}{_labels(row['tags'])} {_number(row['value'])}")
    return "\n".join(lines) + "\n" if lines else ""


def _labels(tags: dict) -> str:
    if not tags:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in tags.items()) + "}"


def _escape(text: str, quote: bool = True) -> str:
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if quote else text


def _number(x: float) -> str:
    return repr(float(x)) if math.isfinite(x) else ("+Inf" if x > 0 else "-Inf" if x < 0 else "NaN")


store = MetricStore()


def _in_a_worker() -> None:
    """Imported in a task or actor (by its user code, after the worker's start): forward points."""
    from raylite.core.client.link import process
    client = process.client
    if process.index and client is not None and hasattr(client, "chan"):   # a WorkerClient, not the driver's
        store.forwarding = True
        store.report = lambda: client.send((METRICS, store.take()))


_in_a_worker()
