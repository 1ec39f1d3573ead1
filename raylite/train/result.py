"""Result of a run, and the driver-side recorder that writes a run's directory:

    <run dir>/result.json      one JSON object per rank-0 report (JSON lines), written as they arrive
    <run dir>/progress.csv     the same history as CSV, written when the run ends
    <run dir>/checkpoint_NNNNNN/   checkpoints reported by rank 0 (the last N kept, see CheckpointConfig)

The history lives in ``result.json`` only: the recorder keeps the last report, not every one (a
long run reporting every step would otherwise grow the driver by about 0.7 KB per report), and
``Result.metrics_history`` reads the file when first asked.
"""
from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import time

from raylite.train.checkpoint import Checkpoint
from raylite.train.config import CheckpointConfig
from raylite.util.jsonl import read_json_lines

RESULT_FILE = "result.json"
PROGRESS_FILE = "progress.csv"
_CKPT_RE = re.compile(r"^checkpoint_(\d{6})($|\.tmp-\d+$)")


class Result:
    """What a run produced: the last rank-0 metrics, the latest checkpoint, the error if it failed,
    the run directory, and the whole metrics history.

    ``metrics_history`` given as None is read from ``path/result.json`` on first use (then kept):
    the run's history stays on disk until someone asks for it.
    """

    def __init__(self, metrics: dict | None, checkpoint: Checkpoint | None, error: BaseException | None = None,
                 path: str | None = None, metrics_history: list | None = None,
                 best_checkpoints: list | None = None):
        self.metrics = metrics
        self.checkpoint = checkpoint
        self.error = error
        self.path = path
        self._history = metrics_history
        self.best_checkpoints = best_checkpoints if best_checkpoints is not None else []   # [(Checkpoint, metrics)]

    @property
    def metrics_history(self) -> list[dict]:
        """Every rank-0 report, in order, as written to ``result.json``."""
        if self._history is None:
            self._history = read_json_lines(os.path.join(self.path, RESULT_FILE)) if self.path else []
        return self._history

    @property
    def metrics_dataframe(self):
        """The history as a pandas DataFrame (None without pandas)."""
        try:
            import pandas as pd
        except ImportError:
            return None
        return pd.DataFrame(self.metrics_history)

    @property
    def filesystem(self):
        return None

    @classmethod
    def from_path(cls, path: str | os.PathLike) -> Result:
        """Rebuild a Result from a run directory written by a (finished or killed) run."""
        path = os.path.abspath(os.fspath(path))
        history = read_json_lines(os.path.join(path, RESULT_FILE))
        by_name = {r.get("checkpoint_dir_name"): r for r in history if r.get("checkpoint_dir_name")}
        names = sorted(n for n in (os.listdir(path) if os.path.isdir(path) else [])
                       if _CKPT_RE.match(n) and "." not in n)
        ckpts = [(Checkpoint(os.path.join(path, n)), by_name.get(n, {})) for n in names]
        return cls(history[-1] if history else None, ckpts[-1][0] if ckpts else None, None, path, history, ckpts)

    def __repr__(self) -> str:
        return (f"Result(metrics={self.metrics!r}, checkpoint={self.checkpoint!r}, error={self.error!r}, "
                f"path={self.path!r})")


def _json_default(value):
    return str(value)


class RunRecorder:
    """Driver side of one run: history file, checkpoint registry and retention, callbacks."""

    def __init__(self, run_dir: str, world_size: int, checkpoint_config: CheckpointConfig | None = None,
                 callbacks: list | None = None, config=None):
        self.run_dir = os.path.abspath(run_dir)
        os.makedirs(self.run_dir, exist_ok=True)
        self.world_size = world_size
        self.ckpt_config = checkpoint_config or CheckpointConfig()
        self.callbacks = list(callbacks or [])
        self.reports = 0                       # rank-0 reports recorded (the history is in result.json)
        self.last: dict | None = None
        self.columns: dict[str, None] = {}     # every metric name so far, in order: progress.csv's header
        self.checkpoints: list[tuple[int, Checkpoint, dict]] = []   # (index, checkpoint, metrics), kept ones
        self.next_index = 0
        self.attempt = 0
        self.start = time.time()
        self.rounds: dict[int, dict[int, dict]] = {}
        self.round_checkpoints: dict[int, Checkpoint] = {}   # seq -> rank 0's checkpoint, for after_report
        self.error: BaseException | None = None
        self._json = open(os.path.join(self.run_dir, RESULT_FILE), "w")
        for cb in self.callbacks:
            if hasattr(cb, "start_training"):
                cb.start_training(logdir=self.run_dir, config=config or {})

    # -- during the run --
    def begin_attempt(self, attempt: int) -> None:
        self._flush_rounds()
        self.attempt = attempt

    def add(self, items: list) -> None:
        """Record one drained batch of reports (written to result.json together, one flush per batch)."""
        for attempt, rank, seq, metrics, ckpt_name, ts in items:
            if attempt != self.attempt:
                continue
            if rank == 0:
                recorded = self._record(dict(metrics), ckpt_name, ts) if metrics is not None else {}
                ckpt = Checkpoint(os.path.join(self.run_dir, ckpt_name)) if ckpt_name is not None else None
                if ckpt is not None:
                    self._register(ckpt_name, recorded)
                    if metrics is not None and self.callbacks:
                        self.round_checkpoints[seq] = ckpt
                for cb in self.callbacks:   # raylite.tune's hook: a Train run inside a trial reports to Tune
                    if metrics is not None and hasattr(cb, "on_rank0_report"):
                        cb.on_rank0_report(recorded, ckpt)
            if metrics is not None and self.callbacks:
                self.rounds.setdefault(seq, {})[rank] = metrics
                if len(self.rounds[seq]) == self.world_size:
                    self._flush_rounds(upto=seq)
        self._json.flush()

    def _record(self, metrics: dict, ckpt_name: str | None, ts: float) -> dict:
        auto = {"training_iteration": self.reports + 1, "time_total_s": round(ts - self.start, 6),
                "timestamp": int(ts), "checkpoint_dir_name": ckpt_name}
        for key, value in auto.items():
            metrics.setdefault(key, value)
        self.reports += 1
        self.last = metrics
        self.columns.update(dict.fromkeys(metrics))
        self._json.write(json.dumps(metrics, default=_json_default) + "\n")
        return metrics

    def _register(self, name: str, metrics: dict) -> None:
        index = int(name.split("_")[1])
        self.next_index = max(self.next_index, index + 1)
        self.checkpoints.append((index, Checkpoint(os.path.join(self.run_dir, name)), metrics))
        n = self.ckpt_config.num_to_keep
        if n is None or len(self.checkpoints) <= n:
            return
        keep = {c[0] for c in self._best()} | {self.checkpoints[-1][0]}   # the latest is kept for resuming
        for c in self.checkpoints:
            if c[0] not in keep:
                shutil.rmtree(c[1].path, ignore_errors=True)
        self.checkpoints = [c for c in self.checkpoints if c[0] in keep]

    def _best(self) -> list:
        """The best `num_to_keep` kept checkpoints (by score, else the newest), in the order reported."""
        n = self.ckpt_config.num_to_keep
        if n is None or len(self.checkpoints) <= n:
            return list(self.checkpoints)
        attr = self.ckpt_config.checkpoint_score_attribute
        if attr is None:
            ranked = sorted(self.checkpoints, key=lambda c: c[0], reverse=True)
        else:
            sign = 1 if self.ckpt_config.checkpoint_score_order == "max" else -1

            def score(c):
                v = c[2].get(attr)
                return sign * v if isinstance(v, (int, float)) and not math.isnan(v) else -math.inf
            ranked = sorted(self.checkpoints, key=score, reverse=True)
        top = {c[0] for c in ranked[:n]}
        return [c for c in self.checkpoints if c[0] in top]

    def _flush_rounds(self, upto: int | None = None) -> None:
        for seq in sorted(self.rounds):
            if upto is not None and seq > upto:
                break
            results = [m for _, m in sorted(self.rounds.pop(seq).items())]
            checkpoint = self.round_checkpoints.pop(seq, None)
            for cb in self.callbacks:
                if hasattr(cb, "handle_result"):
                    cb.handle_result(results)
                if hasattr(cb, "after_report"):   # Ray Train 2.x's UserCallback (run_context is None here)
                    cb.after_report(None, results, checkpoint)

    @property
    def latest_checkpoint(self) -> Checkpoint | None:
        return self.checkpoints[-1][1] if self.checkpoints else None

    def remove_orphans(self) -> None:
        """Checkpoint directories a dead attempt wrote but never reported."""
        kept = {os.path.basename(c[1].path) for c in self.checkpoints}
        for name in os.listdir(self.run_dir):
            if _CKPT_RE.match(name) and name not in kept:
                shutil.rmtree(os.path.join(self.run_dir, name), ignore_errors=True)

    # -- at the end --
    def finish(self, error: BaseException | None = None) -> Result:
        self._flush_rounds()
        self._json.close()
        self.error = error
        self._write_csv()
        for cb in self.callbacks:
            if hasattr(cb, "finish_training"):
                cb.finish_training(error=error is not None)
        # best_checkpoints, as in Ray: the best num_to_keep (not the latest, kept on disk for resuming)
        return Result(self.last, self.latest_checkpoint, error, self.run_dir,
                      best_checkpoints=[(c[1], c[2]) for c in self._best()])

    def _write_csv(self) -> None:
        """progress.csv from result.json, a row at a time."""
        with open(os.path.join(self.run_dir, RESULT_FILE)) as src, \
                open(os.path.join(self.run_dir, PROGRESS_FILE), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(self.columns))
            writer.writeheader()
            for line in src:
                row = json.loads(line)
                writer.writerow({k: (json.dumps(v) if isinstance(v, (dict, list)) else v)
                                 for k, v in row.items()})
