"""`Counter`, `Gauge` and `Histogram`: application metrics, as ``ray.util.metrics``.

Record them anywhere (the driver, tasks, actors); a worker reports its points to the driver with
each result it sends, and the driver keeps the session's totals. Two additions to Ray's API read
them back, since there is no metrics agent to scrape: `collect()` (a dict per series) and
`prometheus_text()` (Prometheus' text format, for a file a node exporter picks up, or a test).
On the Ray backend the metrics are Ray's own, exported by Ray.
"""
from __future__ import annotations

import re
import warnings

from raylite.core.client import link
from raylite.core.client.metrics import COUNTER, GAUGE, HISTOGRAM, store
from raylite.core.client.metrics import prometheus_text as _prometheus_text

__all__ = ["Counter", "Gauge", "Histogram", "collect", "prometheus_text"]

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")


class Metric:
    """What the three kinds share: a name, tag keys that every point must have a value for, and
    default tags. A metric whose name Prometheus would reject is discarded, with a warning (as in
    Ray)."""

    _kind = ""

    def __init__(self, name: str, description: str = "", tag_keys: tuple[str, ...] | None = None):
        if not isinstance(name, str) or not name:
            raise ValueError(f"a metric needs a name (letters, digits, _ and :), got name={name!r}")
        self._name, self._description = name, description
        self._tag_keys = () if tag_keys is None else tag_keys
        if not isinstance(self._tag_keys, tuple):
            raise TypeError(f"tag_keys must be a tuple of str, got {type(self._tag_keys).__name__}: {tag_keys!r}")
        for key in self._tag_keys:
            if not isinstance(key, str):
                raise TypeError(f"tag keys must be str, got {type(key).__name__}: {key!r} in tag_keys={tag_keys!r}")
        self._default_tags: dict[str, str] = {}
        self._discarded = not _NAME.match(name)
        if self._discarded:
            warnings.warn(f"invalid metric name {name!r}: its points are discarded. Metric names may only contain "
                          f"letters, digits, _ and :, and cannot start with a digit.", UserWarning, stacklevel=3)
        self._ray = None

    def _register(self, boundaries: tuple = ()) -> None:
        if self._discarded:
            return
        if link.on_ray():
            from ray.util import metrics as ray_metrics
            extra = {"boundaries": list(boundaries)} if self._kind == HISTOGRAM else {}
            self._ray = getattr(ray_metrics, type(self).__name__)(self._name, self._description,
                                                                  tag_keys=self._tag_keys, **extra)
            return
        store.declare(self._name, self._kind, self._description, self._tag_keys, boundaries)

    def set_default_tags(self, default_tags: dict[str, str]) -> "Metric":
        """Tags used for every point that does not give its own; returns the metric itself."""
        for key, value in default_tags.items():
            if key not in self._tag_keys:
                raise ValueError(f"unrecognized tag key {key!r} in default_tags: the metric's tag_keys are "
                                 f"{self._tag_keys}")
            if not isinstance(value, str):
                raise TypeError(f"tag values must be str, got {type(value).__name__} for tag {key!r}")
        self._default_tags = dict(default_tags)
        if self._ray is not None:
            self._ray.set_default_tags(default_tags)
        return self

    @property
    def info(self) -> dict:
        return {"name": self._name, "description": self._description, "tag_keys": self._tag_keys,
                "default_tags": self._default_tags}

    def _point(self, value, tags: dict | None, method: str) -> None:
        if not isinstance(value, (int, float)):
            raise TypeError(f"{type(self).__name__} {self._name!r}: value must be int or float, "
                            f"got {type(value).__name__}: {value!r}")
        final = self._default_tags
        if tags:
            for key, v in tags.items():
                if not isinstance(v, str):
                    raise TypeError(f"tag values must be str, got {type(v).__name__} for tag {key!r}")
            final = {**self._default_tags, **tags}
        missing = [k for k in self._tag_keys if k not in final]
        if missing:
            raise ValueError(f"{type(self).__name__} {self._name!r}: missing value for tag key(s): "
                             f"{','.join(missing)}")
        if self._discarded:
            return
        if self._ray is not None:
            return getattr(self._ray, method)(value, tags=tags)
        store.record(self._name, tuple((k, final[k]) for k in self._tag_keys), float(value))

    def __reduce__(self):
        return _rebuild, (type(self), self._args(), self._default_tags)

    def _args(self) -> tuple:
        return self._name, self._description, self._tag_keys


def _rebuild(cls, args: tuple, default_tags: dict) -> Metric:
    return cls(*args).set_default_tags(default_tags)


class Counter(Metric):
    """A count that only goes up (Prometheus' counter, exported as `<name>_total`)."""

    _kind = COUNTER

    def __init__(self, name: str, description: str = "", tag_keys: tuple[str, ...] | None = None):
        super().__init__(name, description, tag_keys)
        self._register()

    def inc(self, value: int | float = 1.0, tags: dict[str, str] | None = None) -> None:
        if isinstance(value, (int, float)) and not value > 0:
            raise ValueError(f"Counter {self._name!r}: value must be > 0, got {value!r}")
        self._point(value, tags, "inc")


class Gauge(Metric):
    """The last value set (Prometheus' gauge)."""

    _kind = GAUGE

    def __init__(self, name: str, description: str = "", tag_keys: tuple[str, ...] | None = None):
        super().__init__(name, description, tag_keys)
        self._register()

    def set(self, value: int | float | None, tags: dict[str, str] | None = None) -> None:
        """Set the gauge; None does nothing (as in Ray)."""
        if value is not None:
            self._point(value, tags, "set")


class Histogram(Metric):
    """Observed values counted into buckets with upper bounds `boundaries` (Prometheus' histogram)."""

    _kind = HISTOGRAM

    def __init__(self, name: str, description: str = "", boundaries: list[float] | None = None,
                 tag_keys: tuple[str, ...] | None = None):
        super().__init__(name, description, tag_keys)
        if not boundaries:
            raise ValueError(f"Histogram {name!r} needs boundaries, the buckets' upper bounds, e.g. "
                             f"Histogram({name!r}, boundaries=[0.1, 1.0, 10.0]); got boundaries={boundaries!r}")
        for i, bound in enumerate(boundaries):
            if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0:
                raise ValueError(f"Histogram {name!r}: boundaries must be positive numbers, got {bound!r} at "
                                 f"index {i} of boundaries={boundaries!r}")
            if i and not bound > boundaries[i - 1]:
                raise ValueError(f"Histogram {name!r}: boundaries must increase, got {bound!r} after "
                                 f"{boundaries[i - 1]!r} in boundaries={boundaries!r}")
        self.boundaries = list(boundaries)
        self._register(tuple(float(b) for b in boundaries))

    def observe(self, value: int | float, tags: dict[str, str] | None = None) -> None:
        self._point(value, tags, "observe")

    @property
    def info(self) -> dict:
        return {**super().info, "boundaries": self.boundaries}

    def _args(self) -> tuple:
        return self._name, self._description, self.boundaries, self._tag_keys


def collect() -> list[dict]:
    """(raylite) Every series recorded so far, in the driver: what the driver recorded and what its
    tasks and actors reported with their results. One dict per (name, tags): "name", "type",
    "description", "tags", and "value", or for a histogram "buckets" ({upper bound: cumulative
    count}, the last math.inf), "sum" and "count". In a task or actor: what that process
    recorded since it last reported."""
    return store.collect()


def prometheus_text() -> str:
    """(raylite) `collect()` in Prometheus' text exposition format."""
    return _prometheus_text(store.collect())
