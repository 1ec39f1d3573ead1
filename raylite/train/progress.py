"""Driver-side progress of a Train run (``TorchTrainer.fit``, ``Trainer.run``): reports received,
iteration, the last metrics and the time elapsed, so a long run is never silent.

On a terminal it is one status line, redrawn every TTY_INTERVAL_S; in a log (stderr not a
terminal) one line every LOG_INTERVAL_S; ``RAYLITE_PROGRESS_INTERVAL_S`` sets both, and
``RunConfig(verbose=0)`` turns it off. A daemon thread draws it, so the line moves on while no
report arrives (a long first epoch). The same view is published to the `raylite` CLI and the
dashboard (raylite.control.register_panel), whatever ``verbose`` says.
"""
from __future__ import annotations

import datetime
import numbers
import os
import sys
import threading
import time

from raylite import control

TTY_INTERVAL_S = 2.0
LOG_INTERVAL_S = 15.0
INTERVAL_ENV = "RAYLITE_PROGRESS_INTERVAL_S"
METRICS_SHOWN = 4
_AUTO = ("training_iteration", "time_total_s", "timestamp", "checkpoint_dir_name")


def _interval(tty: bool) -> float:
    raw = os.environ.get(INTERVAL_ENV)
    if raw is None:
        return TTY_INTERVAL_S if tty else LOG_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{INTERVAL_ENV} must be a number of seconds > 0, got {INTERVAL_ENV}={raw!r}")
    return value


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) <= 24 else text[:21] + "..."


class RunProgress:
    """One run's progress: ``start(recorder)`` shows it, ``close(error)`` prints the last line and
    ends the panel."""

    def __init__(self, trainer, name: str | None, verbose: int, stream=None):
        """Checks RAYLITE_PROGRESS_INTERVAL_S (before the run makes anything); ``start`` shows it."""
        self.trainer, self.recorder, self.name = trainer, None, name
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = _interval(self.tty)
        self.verbose = verbose
        self._done = threading.Event()
        self.error: BaseException | None = None
        self._drawn = 0   # width of the status line on the terminal
        self.panel = self.thread = None

    def start(self, recorder) -> None:
        self.recorder, self.started = recorder, time.monotonic()
        self.name = self.name or os.path.basename(recorder.run_dir)
        self.panel = control.register_panel("train", self.view)
        if self.verbose:
            self.thread = threading.Thread(target=self._draw_every, name="raylite-train-progress", daemon=True)
            self.thread.start()

    def view(self) -> dict:
        """What the CLI and the dashboard show (also what the line says)."""
        rec = self.recorder
        last = dict(rec.last or {})
        infos = list(self.trainer.worker_infos or [])
        return {"name": self.name, "run_dir": rec.run_dir, "elapsed_s": time.monotonic() - self.started,
                "reports": rec.reports, "iteration": last.get("training_iteration"), "attempt": rec.attempt,
                "workers": rec.world_size, "state": "ERRORED" if self.error is not None else None,
                "last_metrics": {k: v for k, v in last.items()
                                 if k not in _AUTO and isinstance(v, (numbers.Number, str, bool))},
                "worker_info": [{"rank": i.get("rank"), "pid": i.get("pid"),
                                 "devices": i.get("device") + (f" (GPU {','.join(map(str, i['gpu_ids']))})"
                                                               if i.get("gpu_ids") else "")} for i in infos]}

    def line(self, final: str | None = None) -> str:
        v = self.view()
        elapsed = datetime.timedelta(seconds=int(v["elapsed_s"]))
        shown = ", ".join(f"{k}={_short(x)}" for k, x in list(v["last_metrics"].items())[:METRICS_SHOWN])
        state = final or ("starting workers" if self.trainer._group is None and not v["reports"] else "running")
        head = f"raylite.train {self.name}: {state}, {v['workers']} workers, {v['reports']} reports"
        if v["iteration"] is not None:
            head += f", iteration {v['iteration']}"
        if v["attempt"]:
            head += f", restart {v['attempt']}"
        return f"{head}, {elapsed} elapsed" + (f" | {shown}" if shown else "")

    def _draw_every(self) -> None:
        while not self._done.wait(self.interval):
            self._draw(self.line())

    def _draw(self, text: str, final: bool = False) -> None:
        try:
            if self.tty:
                pad = max(0, self._drawn - len(text))
                self.stream.write("\r" + text + " " * pad + ("\n" if final else ""))
                self._drawn = 0 if final else len(text)
            else:
                self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):   # the stream was closed under us
            pass

    def close(self, error: BaseException | None) -> None:
        if self.panel is None:   # never started
            return
        self.error = error
        self._done.set()
        if self.thread is not None:
            self.thread.join(5)
            self._draw(self.line("failed" if error is not None else "finished"), final=True)
        control.unregister_panel(self.panel)
