"""Result of a run, and the driver-side recorder that writes a run's directory:

    <run dir>/result.json      one JSON object per rank-0 report (JSON lines), written as they arrive
    <run dir>/progress.csv     the same history as CSV, written when the run ends
    <run dir>/checkpoint_NNNNNN/   checkpoints of report rounds, every reporting rank's files merged (the last N kept)

The history lives in ``result.json`` only: the recorder keeps the last report, not every one (a
long run reporting every step would otherwise grow the driver by about 0.7 KB per report), and
``Result.metrics_history`` reads the file when first asked.
"""
from __future__ import annotations

import csv
import json
import logging
import math
import numbers
import os
import re
import shutil
import time

from raylite.train.checkpoint import Checkpoint
from raylite.train.config import CheckpointConfig
from raylite.util.jsonl import read_json_lines

RESULT_FILE = "result.json"
PROGRESS_FILE = "progress.csv"
logger = logging.getLogger("raylite.train")
_CKPT_RE = re.compile(r"^checkpoint_(\d{6})($|\.tmp-\d+$)")


class Result:
    """What a run produced: the last rank-0 metrics, the latest checkpoint, the error if it failed,
    the run directory, and the whole metrics history.

    ``metrics_history`` given as None is read from ``path/result.json`` on first use (then kept):
    the run's history stays on disk until someone asks for it.
    """

    def __init__(self, metrics: dict | None, checkpoint: Checkpoint | None, error: BaseException | None = None,
                 path: str | None = None, metrics_history: list | None = None,
                 best_checkpoints: list | None = None, return_value=None):
        self.metrics = metrics
        self.return_value = return_value   # rank 0's return value (None if training failed)
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

    def get_best_checkpoint(self, metric: str, mode: str) -> Checkpoint | None:
        """The best of ``best_checkpoints`` by ``metric`` ("a/b" for nested metrics), as in Ray:
        checkpoints without the metric are left out."""
        if not self.best_checkpoints:
            raise RuntimeError("No checkpoint exists in the trial directory!")
        if mode not in ("max", "min"):
            raise ValueError(f'Unsupported mode: {mode}. Please choose from ["min", "max"]!')
        valid = [(c, flatten_metrics(m)[metric]) for c, m in self.best_checkpoints
                 if flatten_metrics(m).get(metric) is not None]
        if not valid:
            raise RuntimeError(f"Invalid metric name {metric}! You may choose from the following metrics: "
                               f"{list((self.metrics or {}).keys())}.")
        return (max if mode == "max" else min)(valid, key=lambda cv: cv[1])[0]

    @classmethod
    def from_path(cls, path: str | os.PathLike) -> Result:
        """Rebuild a Result from a run directory written by a (finished or killed) run. As in Ray, a
        missing directory, or one no run wrote (no result.json), is a RuntimeError."""
        path = os.path.abspath(os.fspath(path))
        if not os.path.isdir(path):
            raise RuntimeError(f"Experiment folder {path} doesn't exist.")
        if not os.path.isfile(os.path.join(path, RESULT_FILE)):
            raise RuntimeError(f"Failed to restore the Result object: {RESULT_FILE} doesn't exist in the experiment "
                               f"folder. Make sure that this is an output directory created by a Ray Train run.")
        history = read_json_lines(os.path.join(path, RESULT_FILE))
        by_name = {r.get("checkpoint_dir_name"): r for r in history if r.get("checkpoint_dir_name")}
        names = sorted(n for n in os.listdir(path) if _CKPT_RE.match(n) and "." not in n)
        ckpts = [(Checkpoint(os.path.join(path, n)), by_name.get(n, {})) for n in names]
        return cls(history[-1] if history else None, ckpts[-1][0] if ckpts else None, None, path, history, ckpts)

    def __repr__(self) -> str:
        return (f"Result(metrics={self.metrics!r}, checkpoint={self.checkpoint!r}, error={self.error!r}, "
                f"path={self.path!r})")


def flatten_metrics(metrics: dict, prefix: str = "") -> dict:
    """Nested metrics as one level, keys joined with "/" (``{"a": {"b": 1}}`` -> ``{"a/b": 1}``), as Ray
    flattens results for ``checkpoint_score_attribute`` and ``get_best_checkpoint``."""
    flat = {}
    for key, value in metrics.items():
        if isinstance(value, dict) and value:
            flat.update(flatten_metrics(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _json_default(value):
    return str(value)


class RunRecorder:
    """Driver side of one run: history file, checkpoint registry and retention, callbacks."""

    def __init__(self, run_dir: str, world_size: int, checkpoint_config: CheckpointConfig | None = None,
                 callbacks: list | None = None, config=None, resume: bool = False):
        self.run_dir = os.path.abspath(run_dir)
        os.makedirs(self.run_dir, exist_ok=True)
        self.world_size = world_size
        self.ckpt_config = checkpoint_config or CheckpointConfig()
        self.callbacks = list(callbacks or [])
        self.reports = 0                       # rank-0 reports recorded (the history is in result.json)
        self.last: dict | None = None
        self.columns: dict[str, None] = {}     # every metric name so far, in order: progress.csv's header
        self.checkpoints: list[tuple[int, Checkpoint, dict]] = []   # (index, checkpoint, metrics): kept, worst first
        self.latest: tuple[int, Checkpoint, dict] | None = None
        self.next_index = 0
        self.attempt = 0
        self.start = time.time()
        self.rounds: dict[int, dict[int, tuple]] = {}   # seq -> rank -> (metrics, checkpoint name, time)
        self.error: BaseException | None = None
        history_file = os.path.join(self.run_dir, RESULT_FILE)
        previous = read_json_lines(history_file) if resume and os.path.isfile(history_file) else []
        self._json = open(history_file, "a" if previous else "w")
        if previous:
            self._restore(previous)
        for cb in self.callbacks:
            if hasattr(cb, "start_training"):
                cb.start_training(logdir=self.run_dir, config=config or {})

    def _restore(self, history: list[dict]) -> None:
        """Pick up a previous run of this directory (a rerun with the same RunConfig name, Ray V2's
        job-level fault tolerance): its history goes on, and its kept checkpoints count, so
        ``get_checkpoint()`` returns its latest. Directories no report names are removed."""
        logger.info("raylite.train: a previous run was found in %s; resuming from its latest checkpoint. Use "
                    "a new RunConfig(name) (or delete that directory) to start from scratch.", self.run_dir)
        self.reports, self.last = len(history), history[-1]
        for metrics in history:
            self.columns.update(dict.fromkeys(metrics))
            name = metrics.get("checkpoint_dir_name")
            if name and os.path.isdir(os.path.join(self.run_dir, name)):
                self._register(name, metrics)
        self.remove_orphans()

    # -- during the run --
    def begin_attempt(self, attempt: int) -> None:
        """Rounds a failed attempt left incomplete are dropped (Ray: none of them is valid)."""
        self.rounds = {}
        self.attempt = attempt

    def add(self, items: list) -> None:
        """Record one drained batch of reports (written to result.json together, one flush per batch).
        A round is committed once every rank's report is in, as Ray's report handler does: rank 0's
        metrics, and the checkpoint any rank copied (all copy into the same directory)."""
        for attempt, rank, seq, metrics, ckpt_name, ts in items:
            if attempt != self.attempt:
                continue
            if metrics is None:   # Ray 1.x save_checkpoint: rank 0's checkpoint, no round
                self._register(ckpt_name, {})
                continue
            round_ = self.rounds.setdefault(seq, {})
            round_[rank] = (metrics, ckpt_name, ts)
            if len(round_) == self.world_size:
                self._commit(self.rounds.pop(seq))
        self._json.flush()

    def _commit(self, round_: dict[int, tuple]) -> None:
        metrics, _, ts = round_[0]
        name = next((n for _, (_, n, _) in sorted(round_.items()) if n is not None), None)
        recorded = self._record(dict(metrics), name, ts)
        ckpt = None
        if name is not None:
            self._register(name, recorded)
            ckpt = self.latest[1]
        results = [m for _, (m, _, _) in sorted(round_.items())]
        for cb in self.callbacks:
            if hasattr(cb, "on_rank0_report"):   # raylite.tune's hook: a Train run inside a trial reports to Tune
                cb.on_rank0_report(recorded, ckpt)
            if hasattr(cb, "handle_result"):
                cb.handle_result(results)
            if hasattr(cb, "after_report"):   # Ray Train 2.x's UserCallback (run_context is None here)
                cb.after_report(None, results, ckpt)

    def after_exception(self, worker_exceptions: dict[int, BaseException]) -> None:
        """UserCallback.after_exception: an attempt's failed workers, by rank."""
        for cb in self.callbacks:
            if hasattr(cb, "after_exception"):
                cb.after_exception(None, worker_exceptions)

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
        """Ray's retention: the list stays ordered worst to best (by score, ties by report order;
        without a score attribute, by report order), and all but the last ``num_to_keep`` are
        deleted, except the latest checkpoint (kept for resuming)."""
        index = int(name.split("_")[1])
        self.next_index = max(self.next_index, index + 1)
        entry = (index, Checkpoint(os.path.join(self.run_dir, name)), metrics)
        self.latest = entry
        self.checkpoints.append(entry)
        if self.ckpt_config.checkpoint_score_attribute is not None:
            self.checkpoints.sort(key=lambda c: (self._score(c[2]), c[0]))
        n = self.ckpt_config.num_to_keep
        if n is None:
            return
        drop = [c for c in self.checkpoints[:-n] if c is not entry]
        self.checkpoints = [c for c in self.checkpoints if c not in drop]
        for c in drop:
            shutil.rmtree(c[1].path, ignore_errors=True)

    def _score(self, metrics: dict) -> tuple[bool, float]:
        """(not NaN, signed score) of a checkpoint's metrics: NaN < -inf < numbers, as in Ray. The
        attribute is looked up in the flattened metrics ("nested/acc"); a result without it scores
        -inf (logged, as Ray does)."""
        attr = self.ckpt_config.checkpoint_score_attribute
        flat = flatten_metrics(metrics)
        if attr not in flat:
            logger.error("Result dict has no key: %s. checkpoint_score_attr must be set to a key in the result "
                         "dict. Valid keys are: %s", attr, list(flat))
            value = -math.inf
        else:
            value = flat[attr]
        if isinstance(value, bool) or not isinstance(value, numbers.Number):
            raise ValueError(f"Unable to persist checkpoint for checkpoint_score_attribute: {attr} with value "
                             f"{value!r}. This attribute must be numerical.")
        value = value * (1.0 if self.ckpt_config.checkpoint_score_order == "max" else -1.0)
        return (False, -math.inf) if math.isnan(value) else (True, value)

    def _best(self) -> list:
        """Ray's ``best_checkpoints``: the last ``num_to_keep`` of the kept list, worst to best."""
        n = self.ckpt_config.num_to_keep
        return list(self.checkpoints if n is None else self.checkpoints[-n:])

    @property
    def latest_checkpoint(self) -> Checkpoint | None:
        return self.latest[1] if self.latest else None

    def remove_orphans(self) -> None:
        """Checkpoint directories a dead attempt wrote but never reported."""
        kept = {os.path.basename(c[1].path) for c in self.checkpoints}
        for name in os.listdir(self.run_dir):
            if _CKPT_RE.match(name) and name not in kept:
                shutil.rmtree(os.path.join(self.run_dir, name), ignore_errors=True)

    # -- at the end --
    def finish(self, error: BaseException | None = None) -> Result:
        self._json.close()
        self.error = error
        self._write_csv()
        for cb in self.callbacks:
            if hasattr(cb, "finish_training"):
                cb.finish_training(error=error is not None)
        # best_checkpoints, as in Ray: the best num_to_keep, worst to best (the latest may be left out)
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
