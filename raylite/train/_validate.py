"""A trainer's constructor arguments checked where they are given, so a wrong one is an error naming
it (Ray's ValueError for a trainer attribute of the wrong type) instead of an AttributeError deep
inside ``fit``, after the workers started."""
from __future__ import annotations

from raylite.train.config import BackendConfig, RunConfig, ScalingConfig, _is_search_space


def check_trainer_arguments(train_loop_config, backend_config, scaling_config, run_config,
                            resume_from_checkpoint) -> None:
    check_loop_config(train_loop_config, "train_loop_config")
    for field, value, cls in (("backend_config", backend_config, BackendConfig),
                              ("scaling_config", scaling_config, ScalingConfig),
                              ("run_config", run_config, RunConfig)):
        if value is not None and not isinstance(value, cls):
            raise ValueError(f"{field} must be a raylite.train.{cls.__name__}, got {type(value).__name__} "
                             f"{value!r}{_as_call(cls, value)}")
    # a Train or a Tune checkpoint (both have a directory); a path given as it is is the usual slip
    if resume_from_checkpoint is not None and not hasattr(resume_from_checkpoint, "path"):
        raise ValueError(f"resume_from_checkpoint must be a raylite.train.Checkpoint, got "
                         f"{type(resume_from_checkpoint).__name__} {resume_from_checkpoint!r}; for a directory "
                         f"pass Checkpoint.from_directory({resume_from_checkpoint!r})")


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
