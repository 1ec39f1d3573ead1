"""The live status table and the final summary (printed by the driver; `verbose=0` prints nothing).

verbose=1: the status table at most every `interval` seconds, and the summary at the end.
verbose=2: also one line per finished trial.  verbose=3: also one line per result.
"""
from __future__ import annotations

import math
import numbers
import sys
import time

import raylite as ray

from raylite.tune.metrics import flatten, is_number, lookup
from raylite.tune.trial import ERROR, PAUSED, PENDING, RUNNING, TERMINATED, _number

UNITS = 10_000   # resources in integer units of 1e-4, as raylite counts them
MAX_ROWS = 20
MAX_PARAM_COLUMNS = 6
_ORDER = {RUNNING: 0, PAUSED: 1, PENDING: 2, ERROR: 3, TERMINATED: 4}


def _fmt(v) -> str:
    if is_number(v) and not isinstance(v, numbers.Integral):
        v = float(v)
        if math.isnan(v):
            return "nan"
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"
    s = str(v)
    return s if len(s) <= 24 else s[:21] + "..."


def _elapsed(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h:02d}:{m:02d}:{s:02d}"


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    fmt = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line, fmt(header), line, *(fmt(r) for r in rows), line])


class ProgressReporter:
    def __init__(self, verbose: int, metric: str | None, mode: str | None, param_names: list[str],
                 interval: float = 5.0, out=None):
        self.verbose, self.metric, self.mode = verbose, metric, mode
        self.param_names = param_names[:MAX_PARAM_COLUMNS]
        self.param_headers = list(self.param_names)
        self.metric_columns: list[tuple[str, str]] = []   # (metric, header) shown besides `metric`
        self.max_rows = MAX_ROWS
        self.interval = interval
        self.out = out or sys.stdout
        self.last_print = time.monotonic()   # the first table after `interval`, not at once

    def _print(self, text: str) -> None:
        try:
            print(text, file=self.out, flush=True)
        except (OSError, ValueError):
            pass

    def maybe_status(self, runner, force: bool = False) -> None:
        if self.verbose < 1:
            return
        now = time.monotonic()
        if force or now - self.last_print >= self.interval:
            self.last_print = now
            self._print(self.status(runner))

    def trial_line(self, trial, what: str) -> None:
        if self.verbose >= 2:
            metric = ""
            value = lookup(trial.last_result, self.metric) if self.metric else None
            if value is not None:
                metric = f" {self.metric}={_fmt(value)}"
            self._print(f"Trial {trial} {what} after {trial.last_result.get('training_iteration', 0)} "
                        f"iterations{metric}")

    def result_line(self, trial, result: dict) -> None:
        if self.verbose >= 3:
            shown = {k: v for k, v in result.items() if k not in ("timestamp", "pid", "trial_id")}
            self._print(f"Result for {trial}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in shown.items()))

    # ------------------------------------------------------------------ the table
    def status(self, runner, final: bool = False) -> str:
        trials = runner.trials
        counts: dict[str, int] = {}
        for t in trials:
            counts[t.status] = counts.get(t.status, 0) + 1
        planned = runner.total_trials
        lines = ["== Status ==" if not final else "== Summary ==",
                 f"Running for {_elapsed(time.monotonic() - runner.started_at)}; "
                 f"{runner.searcher.describe()}; {runner.scheduler.describe()}",
                 f"Resources: {resources_line(runner)}",
                 f"Results: {runner.storage.path}",
                 f"Trials: {len(trials)}{'' if planned is None else '/' + str(planned)} ("
                 + ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: _ORDER[kv[0]])) + ")"]
        waiting = waiting_reason(runner)
        if waiting and not final:
            lines.append(f"Waiting: {waiting}")
        best = current_best(runner)
        if best is not None:
            lines.append(f"{'Best trial' if final else 'Best so far'}: {best} {self.metric}={_fmt(lookup(best.last_result, self.metric))} "
                         f"config={_short_config(best.config, self.param_names)}")
        shown = sorted(trials, key=lambda t: (_ORDER[t.status], t.index))
        rows = [self._row(runner, t) for t in shown[:self.max_rows]]
        header = ["Trial name", "status", *self.param_headers, "iter", "total time (s)"]
        if self.metric:
            header.append(self.metric)
        header += [h for _, h in self.metric_columns]
        header.append("note")
        lines.append(table(rows, header))
        if len(shown) > self.max_rows:
            rest: dict[str, int] = {}
            for t in shown[self.max_rows:]:
                rest[t.status] = rest.get(t.status, 0) + 1
            lines.append(f"... {len(shown) - self.max_rows} more trials not shown ("
                         + ", ".join(f"{n} {s}" for s, n in rest.items()) + ")")
        return "\n".join(lines)

    def _row(self, runner, t) -> list[str]:
        flat = flatten(t.config)
        r = t.last_result
        row = [str(t), t.status, *(_fmt(flat.get(p, "")) for p in self.param_names),
               _fmt(r.get("training_iteration", "")), _fmt(r.get("time_total_s", ""))]
        if self.metric:
            value = lookup(r, self.metric)
            row.append("" if value is None else _fmt(value))
        for key, _ in self.metric_columns:
            value = lookup(r, key)
            row.append("" if value is None else _fmt(value))
        row.append(trial_note(runner, t))
        return row

    def summary(self, runner) -> None:
        if self.verbose >= 1:
            self._print(self.status(runner, final=True))


def _short_config(config: dict, names: list[str]) -> str:
    flat = flatten(config)
    keys = [n for n in names if n in flat] or list(flat)[:MAX_PARAM_COLUMNS]
    return "{" + ", ".join(f"{k}: {_fmt(flat[k])}" for k in keys) + "}"


# ---------------------------------------------------------------------------- what the runner is doing
def units(x: float) -> int:
    return int(round(x * UNITS))


def resources_str(resources: dict) -> str:
    """{'cpu': 1, 'gpu': 0.5}: a trial's request as the user wrote it."""
    return "{" + ", ".join(f"'{k.lower() if k in ('CPU', 'GPU') else k}': {v:g}"
                           for k, v in resources.items() if v or k == "CPU") + "}"


def resources_line(runner) -> str:
    used = ", ".join(f"{k} {runner.held.get(k, 0) / UNITS:g}/{runner.total_units.get(k, 0) / UNITS:g}"
                     for k in runner.req_units) or "none requested"
    return f"{used} in use by {len(runner.running)} trials; each trial asks for {resources_str(runner.resources)}"

def waiting_reason(runner) -> str | None:
    if runner.stopping or not (runner.pending or runner._can_create()):
        return None
    if runner.max_concurrent is not None and len(runner.running) >= runner.max_concurrent:
        return f"max_concurrent_trials={runner.max_concurrent} reached ({len(runner.running)} running)"
    short = []
    for k, v in runner.req_units.items():
        held, total = runner.held.get(k, 0), runner.total_units.get(k, 0)
        if held + v > total:
            short.append(f"{k} (needs {v / UNITS:g}, {(total - held) / UNITS:g} of {total / UNITS:g} free, "
                         f"{held / UNITS:g} held by {len(runner.running)} running trials)")
    if short:
        return "next trial waits for " + "; ".join(short)
    return None

def trial_note(runner, t) -> str:
    if t.status == PENDING:
        if t.launched:
            if time.monotonic() - t.launched_at < 1.0:
                return "starting"
            avail = ray.available_resources()
            return "submitted, waiting for " + ", ".join(
                f"{k} ({avail.get(k, 0):g} free in raylite)" for k in runner.req_units) + \
                ": nested work holds the rest"
        retry = f"retry {t.num_failures}/{runner.max_failures}; " if t.num_failures else ""
        why = waiting_reason(runner) or "next in line"
        return retry + why.replace("next trial waits for ", "waiting for ")
    if t.status == RUNNING and t.stop_reason:
        return f"stopping ({t.stop_reason})"
    if t.status == TERMINATED:
        if t.early_stopped:
            return "stopped early (pruned)"
        if t.stop_reason == "max_t":
            return "reached max_t"
        return f"stopped: {t.stop_reason}" if t.stop_reason else ""
    if t.status == ERROR:
        return (t.error_msg or "")[:60]
    return ""

def current_best(runner):
    if not runner.metric:
        return None
    scored = [t for t in runner.trials if _number(lookup(t.last_result, runner.metric))]
    if not scored:
        return None
    pick = max if runner.mode == "max" else min
    return pick(scored, key=lambda t: lookup(t.last_result, runner.metric))
