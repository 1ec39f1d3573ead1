"""Checkpoint: a directory of files, as in Ray Train 2.x.

On raylite's local backend every worker shares the driver's filesystem, so a checkpoint is simply a
path: each rank copies the directory it reports into the round's checkpoint directory under the run
directory, and ``get_checkpoint`` hands the persisted path to the workers of the next attempt.
"""
from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import tempfile
import weakref

_DICT_FILE = "dict_checkpoint.pkl"
METADATA_FILE = ".metadata.json"   # Ray's name: user metadata lives in the directory, so it is persisted with it


class Checkpoint:
    """A checkpoint directory. ``Checkpoint.from_directory(path)`` does not copy: the directory must
    stay in place until ``train.report`` returns (which copies it under the run directory)."""

    def __init__(self, path: str | os.PathLike, filesystem=None):
        self.path = os.path.abspath(os.fspath(path))
        self.filesystem = filesystem

    @classmethod
    def from_directory(cls, path: str | os.PathLike) -> Checkpoint:
        if not os.path.isdir(path):
            raise FileNotFoundError(f"checkpoint directory not found: {path}")
        return cls(path)

    @classmethod
    def from_dict(cls, data: dict) -> Checkpoint:
        """A checkpoint holding a pickled dict (Ray 1.x style), in a temporary directory that is
        removed when this object is garbage-collected."""
        tmp = tempfile.mkdtemp(prefix="raylite-ckpt-")
        with open(os.path.join(tmp, _DICT_FILE), "wb") as f:
            pickle.dump(dict(data), f, protocol=pickle.HIGHEST_PROTOCOL)
        ckpt = cls(tmp)
        weakref.finalize(ckpt, shutil.rmtree, tmp, True)
        return ckpt

    def to_dict(self) -> dict:
        """The dict of a ``from_dict`` checkpoint."""
        file = os.path.join(self.path, _DICT_FILE)
        if not os.path.isfile(file):
            raise ValueError(f"{self.path} is not a dict checkpoint (no {_DICT_FILE}); "
                             f"use as_directory() to read its files")
        with open(file, "rb") as f:
            return pickle.load(f)

    @contextlib.contextmanager
    def as_directory(self):
        """The checkpoint as a local directory (here: the directory itself; do not modify it)."""
        yield self.path

    def to_directory(self, path: str | os.PathLike | None = None) -> str:
        """Copy the checkpoint's files into ``path`` (a new temporary directory by default)."""
        dest = os.fspath(path) if path is not None else tempfile.mkdtemp(prefix="raylite-ckpt-")
        shutil.copytree(self.path, dest, dirs_exist_ok=True)
        return dest

    def get_metadata(self) -> dict:
        """The metadata stored with this checkpoint (``{}`` when none was set)."""
        file = os.path.join(self.path, METADATA_FILE)
        if not os.path.isfile(file):
            return {}
        with open(file) as f:
            return json.load(f)

    def set_metadata(self, metadata: dict) -> None:
        """Store ``metadata`` (JSON-serializable) with the checkpoint, replacing any set before; set
        before ``train.report``, it is persisted with the checkpoint's files."""
        with open(os.path.join(self.path, METADATA_FILE), "w") as f:
            json.dump(metadata, f)

    def update_metadata(self, metadata: dict) -> None:
        """Merge ``metadata`` into the checkpoint's stored metadata."""
        self.set_metadata({**self.get_metadata(), **metadata})

    def __eq__(self, other) -> bool:
        return isinstance(other, Checkpoint) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        return f"Checkpoint(path={self.path!r})"

    def __reduce__(self):   # a path travels; the temporary-dir finalizer stays with its owner
        return (Checkpoint, (self.path,))


def persist(checkpoint: Checkpoint, run_dir: str, name: str, owner: bool = True) -> str:
    """Copy ``checkpoint``'s files into ``run_dir/name``, where every rank that reported a checkpoint
    in this round puts its own (merged, as Ray uploads each rank's files into one checkpoint
    directory). Each file lands whole (copied aside, then renamed); where two ranks write the same
    file name the ``owner``'s (rank 0's) is the one kept, whichever copies first. Returns the path."""
    if not isinstance(checkpoint, Checkpoint):
        raise TypeError(f"checkpoint must be a raylite.train.Checkpoint, got {type(checkpoint).__name__}")
    dest = os.path.join(run_dir, name)
    if os.path.abspath(checkpoint.path) == os.path.abspath(dest):
        return dest
    for root, _, files in os.walk(checkpoint.path):
        out = os.path.normpath(os.path.join(dest, os.path.relpath(root, checkpoint.path)))
        os.makedirs(out, exist_ok=True)
        for file in files:
            target = os.path.join(out, file)
            tmp = os.path.join(out, f".{file}.tmp-{os.getpid()}")
            shutil.copy2(os.path.join(root, file), tmp)
            if owner:
                os.replace(tmp, target)
                continue
            try:
                os.link(tmp, target)   # never replaces: rank 0's file stays
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
    return dest
