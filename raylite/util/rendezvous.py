"""Where a worker group's ranks meet to form their torch.distributed process group (raylite.train's
Trainer and raylite.plugins' RayStrategy).

torch's TCP store (``init_method="env://"``) listens on every interface of rank 0's node, accepts
anyone, and has no option to bind elsewhere. So when every rank runs on the driver's machine the
group meets in torch's file store instead: a file in a private directory (mode 0700, new for each
group start, removed when the group ends; inside the session's private directory, which the runtime
removes when the driver dies), and nothing listens. Ranks on several machines (a Ray
cluster) still meet over TCP at rank 0's ``MASTER_ADDR``/``MASTER_PORT``, which workers get
either way (Lightning's cluster environments read them).
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

_live: dict[str, int] = {}   # directory -> pid of the process that made it; removed at exit at the latest


class Rendezvous:
    """Driver side, one per group start. ``directory`` exists before the workers are asked where
    they are, so each can say whether it sees it (``os.path.isdir``); ``init_method`` then decides, and
    ``close`` (when the group ends) removes the directory."""

    def __init__(self) -> None:
        self.directory: str | None = _make_directory()
        _live[self.directory] = os.getpid()

    def init_method(self, places: list[tuple[str, bool]]) -> str:
        """``places``: each worker's (node id, whether it sees ``directory``). A file store when
        they are all on one node that sees it (the driver's machine); else TCP, ``env://``."""
        if self.directory is not None and len({node for node, _ in places}) == 1 and all(s for _, s in places):
            return "file://" + os.path.join(self.directory, "store")   # the store file must not pre-exist
        self.close()
        return "env://"

    def close(self) -> None:
        directory, self.directory = self.directory, None
        if directory is not None:
            _live.pop(directory, None)
            shutil.rmtree(directory, ignore_errors=True)


def _make_directory() -> str:
    """A new 0700 directory in the session's private one, which the runtime removes when the session
    ends even if the driver is SIGKILLed mid-fit; on the Ray backend, in the temporary directory."""
    from raylite.control import session_private_dir
    try:
        directory = session_private_dir()
    except RuntimeError:   # the Ray backend
        return tempfile.mkdtemp(prefix="raylite-rdzv-")
    return tempfile.mkdtemp(prefix="rdzv-", dir=directory)


def use_loopback(init_method: str) -> None:
    """In a worker of a group that meets in a file store (all ranks on this machine): gloo's and
    NCCL's own sockets on loopback too. gloo binds to the address the host name resolves to and
    NCCL to the first non-loopback interface, so on most hosts they would listen on the network.
    A user's own GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME is kept."""
    if init_method.startswith("file://"):
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            os.environ.setdefault(var, "lo")


@atexit.register
def _remove_live() -> None:
    """Groups still up at exit (a warm RayStrategy group, a Trainer never shut down) leave nothing
    in the temporary directory. Only in the process that made them (not in a forked child)."""
    for directory, pid in list(_live.items()):
        if pid == os.getpid():
            shutil.rmtree(directory, ignore_errors=True)
