"""One trial's record: config, status, last result, per-metric statistics, checkpoint, error."""
from __future__ import annotations

import math
import os
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raylite.train.config import CheckpointConfig

PENDING, RUNNING, TERMINATED, ERROR = "PENDING", "RUNNING", "TERMINATED", "ERROR"


class MetricStats:
    """Running statistics of one numeric metric: what `get_best_trial(scope=...)` compares."""

    __slots__ = ("count", "total", "max", "min", "last", "recent")

    def __init__(self):
        self.count, self.total = 0, 0.0
        self.max, self.min, self.last = -math.inf, math.inf, math.nan
        self.recent: deque = deque(maxlen=10)

    def add(self, v: float) -> None:
        self.count += 1
        self.total += v
        self.max, self.min, self.last = max(self.max, v), min(self.min, v), v
        self.recent.append(v)

    def summary(self) -> dict:
        recent = list(self.recent)
        return {"max": self.max, "min": self.min, "last": self.last, "avg": self.total / self.count,
                "last-5-avg": sum(recent[-5:]) / len(recent[-5:]), "last-10-avg": sum(recent) / len(recent),
                "_count": self.count, "_recent": recent}

    @classmethod
    def from_summary(cls, d: dict) -> MetricStats:
        m = cls()
        m.count, m.max, m.min, m.last = d["_count"], d["max"], d["min"], d["last"]
        m.total = d["avg"] * d["_count"]
        m.recent.extend(d.get("_recent", []))
        return m


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


class Trial:
    def __init__(self, trial_id: str, index: int, config: dict, path: str, resources: dict):
        self.trial_id, self.index, self.config, self.path = trial_id, index, config, path
        self.resources = resources
        self.status = PENDING
        self.last_result: dict = {}
        self.stats: dict[str, MetricStats] = {}
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
        self.stop_requested_at: float | None = None
        self.cancel_stage = 0
        self.optuna_trial = None
        self.launched_at = 0.0
        self.outcome = None
        self.restored = False
        self.withdrawn = False   # submitted ahead, then the experiment stopped before it was promoted

    # ------------------------------------------------------------------ results
    def add_result(self, result: dict) -> None:
        self.last_result = result
        for k, v in result.items():
            if _number(v):
                self.stats.setdefault(k, MetricStats()).add(float(v))
        name = result.get("checkpoint_dir_name")
        if name:
            self.checkpoint_path = os.path.join(self.path, name)
            self.checkpoints.append((self.checkpoint_path, {k: v for k, v in result.items() if _number(v)}))

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
                            key=lambda c: sign * c[1][attr] if _number(c[1].get(attr)) else -math.inf)
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

    @property
    def metric_analysis(self) -> dict:
        return {k: m.summary() for k, m in self.stats.items()}

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

    def __repr__(self) -> str:
        return self.trial_id

    def __str__(self) -> str:
        return self.trial_id

    # ------------------------------------------------------------------ persistence
    def to_state(self) -> dict:
        return {"trial_id": self.trial_id, "index": self.index, "status": self.status,
                "resources": self.resources, "last_result": self.last_result,
                "stats": {k: m.summary() for k, m in self.stats.items()},
                "num_failures": self.num_failures, "error_msg": self.error_msg,
                "early_stopped": self.early_stopped, "stop_reason": self.stop_reason,
                "checkpoint_path": _rel(self.checkpoint_path, self.path),
                "checkpoints": [(_rel(p, self.path), r) for p, r in self.checkpoints],
                "optuna": self.optuna, "runtime": self.runtime,
                "start_time": self.start_time, "end_time": self.end_time}

    @classmethod
    def from_state(cls, state: dict, config: dict, path: str) -> Trial:
        t = cls(state["trial_id"], state["index"], config, path, state.get("resources", {}))
        t.status = state["status"]
        t.last_result = state.get("last_result") or {}
        t.stats = {k: MetricStats.from_summary(v) for k, v in (state.get("stats") or {}).items()}
        t.num_failures = state.get("num_failures", 0)
        t.error_msg = state.get("error_msg")
        t.early_stopped = state.get("early_stopped", False)
        t.stop_reason = state.get("stop_reason")
        t.checkpoint_path = _abs(state.get("checkpoint_path"), path)
        t.checkpoints = [(_abs(p, path), r) for p, r in state.get("checkpoints", [])]
        t.optuna = state.get("optuna") or {}
        t.runtime = state.get("runtime") or {}
        t.start_time, t.end_time = state.get("start_time"), state.get("end_time")
        return t


def _rel(p: str | None, base: str) -> str | None:
    return os.path.relpath(p, base) if p else None


def _abs(p: str | None, base: str) -> str | None:
    return os.path.join(base, p) if p else None
