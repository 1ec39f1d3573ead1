"""A trainer's constructor arguments checked where they are given, so a wrong one is an error naming
it (Ray's ValueError for a trainer attribute of the wrong type) instead of an AttributeError deep
inside ``fit``, after the workers started."""
from __future__ import annotations

from raylite.train.checkpoint import Checkpoint
from raylite.train.config import BackendConfig, RunConfig, ScalingConfig, _is_search_space


def check_trainer_arguments(train_loop_config, backend_config, scaling_config, run_config,
                            resume_from_checkpoint, backend_field: str = "backend_config") -> None:
    check_loop_config(train_loop_config, "train_loop_config")
    for field, value, cls in ((backend_field, backend_config, BackendConfig),
                              ("scaling_config", scaling_config, ScalingConfig),
                              ("run_config", run_config, RunConfig),
                              ("resume_from_checkpoint", resume_from_checkpoint, Checkpoint)):
        if value is not None and not isinstance(value, cls):
            raise ValueError(f"{field} must be a raylite.train.{cls.__name__}, got {type(value).__name__} "
                             f"{value!r}{_as_call(cls, value)}")


def check_loop_config(config, field: str) -> None:
    """The training function's config is a dict (or None), as in Ray; a Tune search space resolves to one."""
    if config is not None and not isinstance(config, dict) and not _is_search_space(config):
        raise ValueError(f"{field} must be a dict (it becomes the training function's config argument), "
                         f"got {type(config).__name__} {config!r}")


def _as_call(cls: type, value) -> str:
    """For a dict of the right fields: the config call to pass instead."""
    if not isinstance(value, dict) or not all(isinstance(k, str) and k.isidentifier() for k in value):
        return ""
    args = ", ".join(f"{k}={v!r}" for k, v in value.items())
    return f"; pass {cls.__name__}({args})"
