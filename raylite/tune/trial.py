"""One trial's record: config, status, last result, per-metric statistics, checkpoint, error."""
from __future__ import annotations

import math
import os
import sys
from array import array
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from raylite.tune.metrics import flat_result, is_number, lookup

if TYPE_CHECKING:
    from raylite.train.config import CheckpointConfig

PENDING, RUNNING, TERMINATED, ERROR = "PENDING", "RUNNING", "TERMINATED", "ERROR"
PAUSED = "PAUSED"   # stopped by a scheduler (PBT) that starts it again from a checkpoint
SUMMARY_KEYS = ("max", "min", "last", "avg", "last-5-avg", "last-10-avg")   # a metric_analysis entry


class MetricStats:
    """Running statistics of one numeric metric of a running trial: what `get_best_trial(scope=...)`
    compares. The last ten values are kept for "last-5-avg" and "last-10-avg"."""

    __slots__ = ("count", "total", "max", "min", "last", "recent")

    def __init__(self):
        self.count, self.total = 0, 0.0
        self.max, self.min, self.last = -math.inf, math.inf, math.nan
        self.recent: deque = deque(maxlen=10)

    def add(self, v: float) -> None:
        self.count += 1
        self.total += v
        if v > self.max:
            self.max = v
        if v < self.min:
            self.min = v
        self.last = v
        self.recent.append(v)

    def summary(self) -> tuple[float, ...]:
        """The values of SUMMARY_KEYS, in that order."""
        recent = list(self.recent)
        last5 = recent[-5:]
        return (self.max, self.min, self.last, self.total / self.count, sum(last5) / len(last5),
                sum(recent) / len(recent))


class MetricSummaries:
    """The statistics of a trial no result can come to any more: the SUMMARY_KEYS values of every
    metric in one float array. A sweep keeps every trial in the driver, and a window plus an object
    per metric (ten of them with the automatic ones) cost ~9 KB a trial; this costs ~0.6 KB."""

    __slots__ = ("names", "values")
    _last_names: tuple = ()   # trials of a sweep report the same metrics: they share one tuple

    def __init__(self, summaries: dict[str, Sequence[float]]):
        names = tuple(_intern(k) for k in summaries)
        if names != MetricSummaries._last_names:
            MetricSummaries._last_names = names
        self.names = MetricSummaries._last_names
        self.values = array("d", [v for s in summaries.values() for v in s])

    def get(self, metric: str) -> tuple[float, ...] | None:
        try:
            i = self.names.index(metric) * len(SUMMARY_KEYS)
        except ValueError:
            return None
        return tuple(self.values[i:i + len(SUMMARY_KEYS)])


def _number(v) -> bool:
    return is_number(v) and not math.isnan(v)


def _intern(k):
    return sys.intern(k) if type(k) is str else k


def _interned(d: dict) -> dict:
    """A copy of `d` with interned keys: every unpickled result brings its own copy of each key."""
    return {_intern(k): v for k, v in d.items()}


class Trial:
    """`str(trial)` is its name, Ray's `<trainable>_<trial_id>` unless a `trial_name_creator` gave one."""

    def __init__(self, trial_id: str, index: int, config: dict, path: str, resources: dict,
                 trainable_name: str = "trainable", experiment_tag: str = ""):
        self.trial_id, self.index, self.config, self.path = trial_id, index, config, path
        self.resources = resources
        self.trainable_name, self.experiment_tag = trainable_name, experiment_tag
        self.custom_trial_name: str | None = None
        self.status = PENDING
        self.last_result: dict = {}
        self.stats: dict[str, MetricStats] | MetricSummaries = {}   # the latter once compact()ed
        self.num_failures = 0
        self.error_msg: str | None = None
        self.early_stopped = False
        self.stop_reason: str | None = None
        self.checkpoint_path: str | None = None
        self.checkpoints: list[tuple[str, dict]] = []   # (path, the result it came with)
        self.optuna: dict = {}            # params, distributions (JSON), state, value, intermediate
        self.runtime: dict = {}           # pid, accelerator ids of the current attempt
        self.start_time: float | None = None
        self.end_time: float | None = None
        # driver-side, not persisted
        self.ref = None
        self.attempt = 0
        self.launched = False
        self.task_ended_at: float | None = None   # when its task was seen done, before its results drain
        self.stop_requested_at: float | None = None
        self.cancel_stage = 0
        self.optuna_trial = None
        self.launched_at = 0.0
        self.outcome = None
        self.restored = False
        self.withdrawn = False   # submitted ahead, then the experiment stopped before it was promoted
        self.restart: tuple | None = None      # (config, checkpoint path) a scheduler restarts it with
        self.resume_from: str | None = None    # the checkpoint its next launch starts from
        self.req_units: dict | None = None     # its own resources in units, when they differ per config

    # ------------------------------------------------------------------ results
    def add_result(self, result: dict) -> None:
        self.last_result = result
        for k, v in flat_result(result).items():   # nested metrics as a/b, as Ray's metric_analysis
            if _number(v):
                self.stats.setdefault(k, MetricStats()).add(float(v))
        name = result.get("checkpoint_dir_name")
        if name:
            self.checkpoint_path = os.path.join(self.path, name)
            self.checkpoints.append((self.checkpoint_path, result))   # all of it, strings and nested too (Ray's)

    def drop_checkpoints(self, config: CheckpointConfig) -> list[str]:
        """Forget all but the `config.num_to_keep` best checkpoints (by `checkpoint_score_attribute`,
        else the newest) and the latest, which a restart needs.
        Returns the forgotten ones' paths, for deletion: a long trial would otherwise fill the disk."""
        n = config.num_to_keep
        if n is None or len(self.checkpoints) <= n:
            return []
        attr = config.checkpoint_score_attribute
        if attr is None:
            ranked = self.checkpoints[::-1]
        else:
            sign = 1 if config.checkpoint_score_order == "max" else -1
            ranked = sorted(self.checkpoints, reverse=True,
                            key=lambda c: sign * v if _number(v := lookup(c[1], attr)) else -math.inf)
        keep = {p for p, _ in ranked[:n]} | {self.checkpoint_path}
        dropped = [p for p, _ in self.checkpoints if p not in keep]
        self.checkpoints = [c for c in self.checkpoints if c[0] in keep]
        return dropped

    def rewind(self, results: list[dict]) -> None:
        """Start the record over from these results (a trial restarting from a checkpoint); of
        their checkpoints, only those still on disk count (older ones may have been dropped)."""
        self.last_result, self.stats, self.checkpoints, self.checkpoint_path = {}, {}, [], None
        for r in results:
            self.add_result(r)
        self.checkpoints = [c for c in self.checkpoints if os.path.isdir(c[0])]

    def compact(self) -> None:
        """Shrink the record of a trial that has ended for good (or was loaded from disk) to what the
        analysis reads: a long sweep keeps every trial in the driver, so each byte counts 100k-fold.
        Statistics become MetricSummaries, keys are shared, the Optuna trial (the study keeps its
        record) is dropped. A trial that runs again starts over from `rewind`."""
        if not isinstance(self.stats, MetricSummaries):
            self.stats = MetricSummaries({k: m.summary() for k, m in self.stats.items()})
        self.last_result = _interned(self.last_result)
        for key in ("hostname", "node_ip"):   # the same strings in every trial's record
            if type(self.last_result.get(key)) is str:
                self.last_result[key] = sys.intern(self.last_result[key])
        self.checkpoints = [(p, _interned(r)) for p, r in self.checkpoints]
        self.runtime = _interned({k: _interned(v) if isinstance(v, dict) else v for k, v in self.runtime.items()})
        o = self.optuna
        for key in ("params", "system_attrs", "intermediate"):
            if key in o:
                o[key] = _interned(o[key])
        if "distributions" in o:   # the same JSON text in every trial
            o["distributions"] = {_intern(k): _intern(v) for k, v in o["distributions"].items()}
        self.optuna_trial = None

    def metric_summary(self, metric: str) -> tuple[float, ...] | None:
        """The SUMMARY_KEYS values of `metric`, or None if the trial never reported it as a number."""
        if isinstance(self.stats, MetricSummaries):
            return self.stats.get(metric)
        m = self.stats.get(metric)
        return m.summary() if m is not None else None

    @property
    def metric_analysis(self) -> dict[str, dict[str, float]]:
        names = self.stats.names if isinstance(self.stats, MetricSummaries) else self.stats
        return {k: dict(zip(SUMMARY_KEYS, self.metric_summary(k))) for k in names}

    @property
    def local_path(self) -> str:
        return self.path

    logdir = local_path

    @property
    def error_file(self) -> str | None:
        p = os.path.join(self.path, "error.txt")
        return p if os.path.exists(p) else None

    @property
    def checkpoint(self):
        from raylite.tune.session import Checkpoint
        return Checkpoint(self.checkpoint_path) if self.checkpoint_path else None

    @property
    def is_finished(self) -> bool:
        return self.status in (TERMINATED, ERROR)

    @property
    def trial_name(self) -> str:
        return self.custom_trial_name or f"{self.trainable_name}_{self.trial_id}"

    def __repr__(self) -> str:
        return self.trial_name

    def __str__(self) -> str:
        return self.trial_name

    # ------------------------------------------------------------------ persistence
    def to_state(self) -> dict:
        return {"trial_id": self.trial_id, "index": self.index, "status": self.status,
                "trainable_name": self.trainable_name, "experiment_tag": self.experiment_tag,
                "custom_trial_name": self.custom_trial_name,
                "resources": self.resources, "last_result": self.last_result,
                "stats": self.metric_analysis,
                "num_failures": self.num_failures, "error_msg": self.error_msg,
                "early_stopped": self.early_stopped, "stop_reason": self.stop_reason,
                "checkpoint_path": _rel(self.checkpoint_path, self.path),
                "checkpoints": [(_rel(p, self.path), r) for p, r in self.checkpoints],
                "optuna": self.optuna, "runtime": self.runtime,
                "start_time": self.start_time, "end_time": self.end_time}

    @classmethod
    def from_state(cls, state: dict, config: dict, path: str) -> Trial:
        t = cls(state["trial_id"], state["index"], config, path, state.get("resources", {}),
                state.get("trainable_name", "trainable"), state.get("experiment_tag", ""))
        t.custom_trial_name = state.get("custom_trial_name")
        t.status = state["status"]
        t.last_result = state.get("last_result") or {}
        t.stats = MetricSummaries({k: [s[key] for key in SUMMARY_KEYS] for k, s in (state.get("stats") or {}).items()})
        t.num_failures = state.get("num_failures", 0)
        t.error_msg = state.get("error_msg")
        t.early_stopped = state.get("early_stopped", False)
        t.stop_reason = state.get("stop_reason")
        t.checkpoint_path = _abs(state.get("checkpoint_path"), path)
        t.checkpoints = [(_abs(p, path), r) for p, r in state.get("checkpoints", [])]
        t.optuna = state.get("optuna") or {}
        t.runtime = state.get("runtime") or {}
        t.start_time, t.end_time = state.get("start_time"), state.get("end_time")
        t.compact()
        return t


def _rel(p: str | None, base: str) -> str | None:
    return os.path.relpath(p, base) if p else None


def _abs(p: str | None, base: str) -> str | None:
    return os.path.join(base, p) if p else None
