"""Lightning callbacks that report metrics to raylite.tune (or raylite.train).

``TuneReportCallback`` lets ``tune.run`` sweep a LightningModule: at the chosen hook it sends the
trainer's ``callback_metrics`` to ``raylite.tune.report``; inside a ``raylite.train.Trainer``
worker it calls ``raylite.train.report`` instead. Where it runs:

* a plain ``pl.Trainer`` in the trial's process: reports directly (rank 0 only under Lightning's
  own multi-process strategies);
* ``pl.Trainer(strategy=RayStrategy(...))``: rank 0's worker hands the report to the launching
  process (the trial), which reports while the workers keep training;
* a ``raylite.train.Trainer`` worker: every rank reports, as ``train.report`` expects.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import warnings

from raylite.plugins._compat import Callback

# `on=` names -> Lightning 2.x Callback hooks (ray_lightning's short names are aliases).
HOOKS = {
    "fit_start": "on_fit_start", "fit_end": "on_fit_end",
    "sanity_check_start": "on_sanity_check_start", "sanity_check_end": "on_sanity_check_end",
    "train_start": "on_train_start", "train_end": "on_train_end",
    "validation_start": "on_validation_start", "validation_end": "on_validation_end",
    "test_start": "on_test_start", "test_end": "on_test_end",
    "train_epoch_start": "on_train_epoch_start", "train_epoch_end": "on_train_epoch_end",
    "validation_epoch_start": "on_validation_epoch_start", "validation_epoch_end": "on_validation_epoch_end",
    "test_epoch_start": "on_test_epoch_start", "test_epoch_end": "on_test_epoch_end",
    "train_batch_start": "on_train_batch_start", "train_batch_end": "on_train_batch_end",
    "validation_batch_start": "on_validation_batch_start", "validation_batch_end": "on_validation_batch_end",
    "test_batch_start": "on_test_batch_start", "test_batch_end": "on_test_batch_end",
    # aliases
    "epoch_start": "on_train_epoch_start", "epoch_end": "on_train_epoch_end",
    "batch_start": "on_train_batch_start", "batch_end": "on_train_batch_end",
}


def _train_context():
    from raylite.plugins.environment import _train_context as ctx
    return ctx()


def _plain(value):
    """A metric as a plain Python number (or list), so it pickles anywhere and prints nicely."""
    if hasattr(value, "detach"):
        value = value.detach().cpu()
        return value.item() if value.numel() == 1 else value.tolist()
    if hasattr(value, "item") and getattr(value, "size", 2) == 1:   # numpy scalar
        return value.item()
    return value


def _report(metrics: dict, checkpoint_dir: str | None, cleanup: bool = False) -> None:
    """Report from this process: to raylite.train inside a Trainer worker, else to raylite.tune.

    Both copy a reported checkpoint directory into their own storage before returning, so a
    directory we made only for the report (``cleanup``) is removed afterwards.
    """
    try:
        if _train_context() is not None:
            from raylite import train
            checkpoint = None if checkpoint_dir is None else train.Checkpoint.from_directory(checkpoint_dir)
            train.report(metrics, checkpoint=checkpoint)
            return
        try:
            from raylite import tune
            report = tune.report
        except (ImportError, AttributeError) as e:
            raise RuntimeError("TuneReportCallback: raylite.tune.report is not available; run the trainer "
                               "inside tune.run (or a raylite.train.Trainer worker)") from e
        checkpoint = None
        if checkpoint_dir is not None:
            cls = getattr(tune, "Checkpoint", None)
            checkpoint = cls.from_directory(checkpoint_dir) if cls is not None else checkpoint_dir
        report(metrics, checkpoint=checkpoint)
    finally:
        if cleanup and checkpoint_dir is not None:
            shutil.rmtree(checkpoint_dir, ignore_errors=True)


def _deliver_report(item) -> None:
    """In the process that launched RayStrategy's workers: a report rank 0 sent."""
    _, metrics, checkpoint_dir, cleanup = item
    _report(metrics, checkpoint_dir, cleanup)


class _ReportCallback(Callback):
    def __init__(self, metrics=None, on="validation_end"):
        if metrics is not None and not isinstance(metrics, (str, list, tuple, dict)):
            raise TypeError(f"metrics must be None, a name, a list of names or a dict, got {type(metrics).__name__}")
        if isinstance(metrics, str):
            metrics = [metrics]
        self._metrics = metrics
        names = [on] if isinstance(on, str) else list(on)
        unknown = [n for n in names if n not in HOOKS]
        if unknown:
            raise ValueError(f"on={unknown!r}: not a hook name; choose from {sorted(HOOKS)}")
        self._on = {HOOKS[n] for n in names}
        self._warned: set = set()

    def _selected(self, trainer) -> dict:
        available = trainer.callback_metrics
        if self._metrics is None:
            return {k: _plain(v) for k, v in available.items()}
        pairs = self._metrics.items() if isinstance(self._metrics, dict) else ((m, m) for m in self._metrics)
        out = {}
        for report_name, metric_name in pairs:
            if metric_name in available:
                out[report_name] = _plain(available[metric_name])
            elif metric_name not in self._warned:
                self._warned.add(metric_name)
                warnings.warn(f"{type(self).__name__}: metric {metric_name!r} was not logged (have: "
                              f"{sorted(available)}); it is left out of the report", RuntimeWarning, stacklevel=2)
        return out

    def _hook(self, name: str, trainer) -> None:
        if name not in self._on or trainer.sanity_checking:
            return
        self._send(trainer, self._selected(trainer))

    def _checkpoint(self, trainer) -> tuple[str | None, bool]:
        """(directory holding a checkpoint to report, whether it is ours to remove afterwards)."""
        return None, False

    def _send(self, trainer, metrics: dict) -> None:
        from raylite.plugins._worker import worker_session
        directory, cleanup = self._checkpoint(trainer)   # every rank: saving may be collective
        rank = trainer.global_rank
        session = worker_session()
        if session is not None:   # a RayStrategy worker: rank 0 hands it to the launching process
            if session.send(("report", metrics, directory, cleanup)) or rank != 0:
                return
        elif _train_context() is None and rank != 0:
            return                # Lightning's own processes: only rank 0 may report to a trial
        _report(metrics, directory if rank == 0 else None, cleanup and rank == 0)

    # Lightning calls these; each reports when chosen by `on`.
    def on_fit_start(self, trainer, pl_module):
        self._hook("on_fit_start", trainer)

    def on_fit_end(self, trainer, pl_module):
        self._hook("on_fit_end", trainer)

    def on_sanity_check_start(self, trainer, pl_module):
        pass   # never reports: metrics of a sanity check are not results

    def on_sanity_check_end(self, trainer, pl_module):
        if "on_sanity_check_end" in self._on:
            self._send(trainer, self._selected(trainer))

    def on_train_start(self, trainer, pl_module):
        self._hook("on_train_start", trainer)

    def on_train_end(self, trainer, pl_module):
        self._hook("on_train_end", trainer)

    def on_validation_start(self, trainer, pl_module):
        self._hook("on_validation_start", trainer)

    def on_validation_end(self, trainer, pl_module):
        self._hook("on_validation_end", trainer)

    def on_test_start(self, trainer, pl_module):
        self._hook("on_test_start", trainer)

    def on_test_end(self, trainer, pl_module):
        self._hook("on_test_end", trainer)

    def on_train_epoch_start(self, trainer, pl_module):
        self._hook("on_train_epoch_start", trainer)

    def on_train_epoch_end(self, trainer, pl_module):
        self._hook("on_train_epoch_end", trainer)

    def on_validation_epoch_start(self, trainer, pl_module):
        self._hook("on_validation_epoch_start", trainer)

    def on_validation_epoch_end(self, trainer, pl_module):
        self._hook("on_validation_epoch_end", trainer)

    def on_test_epoch_start(self, trainer, pl_module):
        self._hook("on_test_epoch_start", trainer)

    def on_test_epoch_end(self, trainer, pl_module):
        self._hook("on_test_epoch_end", trainer)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._hook("on_train_batch_start", trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._hook("on_train_batch_end", trainer)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._hook("on_validation_batch_start", trainer)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._hook("on_validation_batch_end", trainer)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._hook("on_test_batch_start", trainer)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._hook("on_test_batch_end", trainer)


class TuneReportCallback(_ReportCallback):
    """Report Lightning metrics to ``raylite.tune.report`` (``raylite.train.report`` in a Trainer
    worker) at a Lightning hook.

    Args:
        metrics: which ``trainer.callback_metrics`` to report: None for all of them, a name, a
            list of names, or a dict ``{name in the report: name logged in Lightning}``.
        on: the hook (or list of hooks) to report at: ``"validation_end"`` (default),
            ``"train_epoch_end"``, ``"train_end"``, ``"fit_end"``, ``"test_end"``,
            ``"train_batch_end"``, ... (``sorted(raylite.plugins.callbacks.HOOKS)``). Nothing is
            reported during Lightning's sanity check.
    """


class TuneReportCheckpointCallback(_ReportCallback):
    """``TuneReportCallback`` that also saves a Lightning checkpoint and reports it with the
    metrics (``report(metrics, checkpoint=...)``), so a trial can be resumed or its best model
    loaded. ``filename`` is the checkpoint file's name inside the reported directory.

    ``trainer.save_checkpoint`` runs on every rank (it is collective for sharded models); rank 0
    writes the file into a new directory per report, which ``tune.report`` / ``train.report``
    copy into the trial's (run's) own storage. The directory is made under ``dirpath`` and kept
    there when ``dirpath`` is given; by default it is a temporary one, removed after the report.

    Args:
        metrics: which ``trainer.callback_metrics`` to report, as ``TuneReportCallback``'s.
        filename: the checkpoint file's name inside the reported directory.
        on: the hook (or hooks) to report at, as ``TuneReportCallback``'s.
        dirpath: where the checkpoint directories are made and kept (default: temporary ones).
    """

    def __init__(self, metrics=None, filename: str = "checkpoint", on="validation_end", dirpath: str | None = None):
        super().__init__(metrics, on)
        self._filename = filename
        self._dirpath = dirpath

    def _checkpoint(self, trainer) -> tuple[str | None, bool]:
        directory = None
        if trainer.global_rank == 0:
            if self._dirpath:
                os.makedirs(self._dirpath, exist_ok=True)
            directory = tempfile.mkdtemp(prefix=f"checkpoint-step{trainer.global_step}-", dir=self._dirpath)
        directory = trainer.strategy.broadcast(directory)
        trainer.save_checkpoint(os.path.join(directory, self._filename))
        return directory, self._dirpath is None
