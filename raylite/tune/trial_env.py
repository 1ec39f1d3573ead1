"""The process state a trial runs in: its working directory and where its output goes.

As in Ray, a trial runs in its trial directory (unless `RAY_CHDIR_TO_TRIAL_DIR=0`), so files it
writes to relative paths (`torch.save(model, "./model.pth")`) land there and trials never
overwrite each other's. Ray gives each trial its own actor process; raylite runs trials as tasks
on reused worker processes, so everything changed here is put back when the trial ends and the
next task on that worker starts as it would have.
"""
from __future__ import annotations

import contextlib
import os
import sys

CHDIR_ENV = "RAY_CHDIR_TO_TRIAL_DIR"   # "0": trials keep the worker's working directory (Ray's switch)
ORIG_DIR_ENV = "TUNE_ORIG_WORKING_DIR"   # the directory the trial left, for paths relative to it (Ray's)


def chdir_enabled() -> bool:
    """Ray's default (1) unless the variable says 0; read in the driver and in the trial's process
    (either may carry it: the driver's environment, or a runtime_env's env_vars)."""
    return os.environ.get(CHDIR_ENV, "1").strip() not in ("0", "false", "False", "")


def log_files(log_to_file: bool | str | tuple | list | None) -> tuple[str, str] | None:
    """Ray's `log_to_file`: True -> ("stdout", "stderr"), a name -> both streams into that file,
    (out, err) -> one file each, all relative to the trial directory; False/None -> None."""
    if not log_to_file:
        return None
    if log_to_file is True:
        return "stdout", "stderr"
    if isinstance(log_to_file, str):
        return log_to_file, log_to_file
    if isinstance(log_to_file, (tuple, list)) and len(log_to_file) == 2 and all(isinstance(n, str) for n in log_to_file):
        return log_to_file[0], log_to_file[1]
    raise ValueError(f"log_to_file must be a bool, a file name or a (stdout, stderr) pair of file names, "
                     f"got {log_to_file!r}")


class _Tee:
    """Writes to the original stream (the worker's output still reaches the driver) and a file."""

    def __init__(self, stream, file):
        self.stream, self.file = stream, file

    def write(self, text: str) -> int:
        self.file.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.file.flush()
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


@contextlib.contextmanager
def trial_process(trial_dir: str, chdir: bool, logs: tuple[str, str] | None):
    """Run the trial in `trial_dir` (when `chdir` and the process allows it) with its output also
    written to `logs`; the working directory, sys.path, environment and streams are restored after."""
    old_cwd = os.getcwd()
    old_path = list(sys.path)
    old_orig = os.environ.get(ORIG_DIR_ENV)
    with contextlib.ExitStack() as stack:
        if logs is not None:
            os.makedirs(trial_dir, exist_ok=True)
            out = stack.enter_context(open(os.path.join(trial_dir, logs[0]), "a"))
            err = out if logs[1] == logs[0] else stack.enter_context(open(os.path.join(trial_dir, logs[1]), "a"))
            stack.enter_context(contextlib.redirect_stdout(_Tee(sys.stdout, out)))
            stack.enter_context(contextlib.redirect_stderr(_Tee(sys.stderr, err)))
        try:
            if chdir and chdir_enabled():
                os.makedirs(trial_dir, exist_ok=True)
                os.environ[ORIG_DIR_ENV] = old_cwd
                # "" on sys.path means the working directory: keep imports relative to the old one working
                sys.path[:] = [p or old_cwd for p in sys.path]
                os.chdir(trial_dir)
            yield
        finally:
            with contextlib.suppress(OSError):
                os.chdir(old_cwd)
            sys.path[:] = old_path
            if old_orig is None:
                os.environ.pop(ORIG_DIR_ENV, None)
            else:
                os.environ[ORIG_DIR_ENV] = old_orig
