"""`TuneReportCallback` (Ray 2.x's `ray.tune.integration.ray_train`): a Train run started inside a Tune
trial reports each round to the trial.

    def train_driver_fn(config):
        TorchTrainer(train_fn_per_worker, train_loop_config=config["train_loop_config"],
                     run_config=train.RunConfig(callbacks=[TuneReportCallback()])).fit()

    tune.Tuner(train_driver_fn, param_space={...}).fit()

As in Ray, the trial gets rank 0's metrics of each round, plus `checkpoint_path` (the Train run's
checkpoint of that round) when there is one; the checkpoint itself is not copied into the trial.
"""
from __future__ import annotations

from raylite.tune import session

CHECKPOINT_PATH_KEY = "checkpoint_path"

__all__ = ["TuneReportCallback"]


class TuneReportCallback:
    """A Train RunConfig callback for a TorchTrainer fitted inside a Tune trial."""

    def __init__(self):
        if not session.in_session():
            raise RuntimeError("TuneReportCallback must be created inside a Tune trial (the function that "
                               "Tuner/tune.run runs)")

    def after_report(self, run_context, metrics: list[dict], checkpoint) -> None:
        result = dict(metrics[0])
        if checkpoint is not None:
            result[CHECKPOINT_PATH_KEY] = checkpoint.path
        session.report(result)
