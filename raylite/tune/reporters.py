"""Ray's progress reporters (`tune.CLIReporter`, `JupyterNotebookReporter`, `ProgressReporter`),
as settings of raylite's own status table (progress.py) rather than a second printer.

A CLIReporter's `metric_columns`, `parameter_columns` (lists, or dicts of column headers),
`max_report_frequency` and `max_progress_rows` shape the table; its other arguments are accepted
and ignored, with one warning naming them. A `ProgressReporter` subclass of the user's own gets
Ray's calls instead of the table: `setup(...)` once, then `should_report(trials, done)` /
`report(trials, done)` about once a second and at the end (`done=True`)."""
from __future__ import annotations

import time
import warnings

from raylite.tune import progress

_IGNORED = {"total_samples": None, "max_error_rows": 20, "max_column_length": 20, "infer_limit": 3,
            "print_intermediate_tables": None, "metric": None, "mode": None, "sort_by_metric": False,
            "overwrite": True}   # Ray's defaults: only a value set otherwise is worth a warning


class ProgressReporter:
    """Ray's base class: subclass it and override `should_report` and `report` (and `setup`)."""

    def setup(self, start_time: float | None = None, total_samples: int | None = None, metric: str | None = None,
              mode: str | None = None, **kwargs) -> None:
        """Called once, before the first report."""

    def should_report(self, trials: list, done: bool = False) -> bool:
        raise NotImplementedError

    def report(self, trials: list, done: bool, *sys_info: str) -> None:
        raise NotImplementedError


def _columns(columns) -> list[tuple[str, str]]:
    if columns is None:
        return []
    if isinstance(columns, dict):
        return [(str(k), str(v)) for k, v in columns.items()]
    if isinstance(columns, (list, tuple)):
        return [(str(c), str(c)) for c in columns]
    raise TypeError(f"columns must be a list of names or a dict of name -> header, got {type(columns).__name__}")


class CLIReporter(ProgressReporter):
    """Ray's `CLIReporter`: which metrics and parameters raylite's status table shows, and how often."""

    def __init__(self, *, metric_columns: list | dict | None = None, parameter_columns: list | dict | None = None,
                 max_progress_rows: int = 20, max_report_frequency: float = 5, **ignored):
        unknown = set(ignored) - set(_IGNORED)
        if unknown:
            raise TypeError(f"{type(self).__name__} got unexpected arguments {sorted(unknown)}")
        self.metric_columns, self.parameter_columns = _columns(metric_columns), _columns(parameter_columns)
        self.max_progress_rows, self.max_report_frequency = max_progress_rows, max_report_frequency
        ignored = sorted(k for k, v in ignored.items() if v != _IGNORED[k])
        if ignored:
            warnings.warn(f"{type(self).__name__}: {', '.join(ignored)} ignored by raylite.tune (its status table "
                          f"honours metric_columns, parameter_columns, max_progress_rows and "
                          f"max_report_frequency)", stacklevel=2)

    def add_metric_column(self, metric: str, representation: str | None = None) -> None:
        if metric in dict(self.metric_columns):
            raise ValueError(f"Column {metric} already exists.")
        self.metric_columns.append((metric, representation or metric))

    def add_parameter_column(self, parameter: str, representation: str | None = None) -> None:
        if parameter in dict(self.parameter_columns):
            raise ValueError(f"Column {parameter} already exists.")
        self.parameter_columns.append((parameter, representation or parameter))


class JupyterNotebookReporter(CLIReporter):
    """Ray's notebook reporter; here the same text table as CLIReporter (`overwrite` is ignored)."""


def configure(table: progress.ProgressReporter, reporter) -> progress.ProgressReporter:
    """The runner's table with `reporter`'s settings (tune.run's / RunConfig's `progress_reporter`)."""
    if reporter is None:
        return table
    check(reporter)
    if not isinstance(reporter, CLIReporter):
        return _UserReporter(table, reporter)
    if reporter.parameter_columns:
        table.param_names = [k for k, _ in reporter.parameter_columns]
        table.param_headers = [h for _, h in reporter.parameter_columns]
    table.metric_columns = [(k, h) for k, h in reporter.metric_columns if k != table.metric]
    table.max_rows, table.interval = reporter.max_progress_rows, reporter.max_report_frequency
    return table


def check(reporter) -> None:
    """A TypeError, before the experiment starts, for anything but a reporter (or None)."""
    if reporter is not None and not isinstance(reporter, ProgressReporter):
        raise TypeError(f"progress_reporter must be a tune.CLIReporter or a tune.ProgressReporter subclass, "
                        f"got {type(reporter).__name__}")


class _UserReporter(progress.ProgressReporter):
    """The table's place taken by the user's reporter, asked about once a second, as Ray's loop does."""

    def __init__(self, table: progress.ProgressReporter, user: ProgressReporter):
        super().__init__(table.verbose, table.metric, table.mode, table.param_names, interval=1.0, out=table.out)
        self.user, self.set_up = user, False

    def _call(self, runner, done: bool) -> None:
        if not self.set_up:
            self.set_up = True
            self.user.setup(start_time=time.time(), total_samples=runner.total_trials, metric=self.metric,
                            mode=self.mode)
        if self.user.should_report(runner.trials, done):
            self.user.report(runner.trials, done)

    def maybe_status(self, runner, force: bool = False) -> None:
        now = time.monotonic()
        if self.verbose >= 1 and (force or now - self.last_print >= self.interval):
            self.last_print = now
            self._call(runner, False)

    def summary(self, runner) -> None:
        if self.verbose >= 1:
            self._call(runner, True)


__all__ = ["CLIReporter", "JupyterNotebookReporter", "ProgressReporter"]
