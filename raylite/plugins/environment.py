"""``RayEnvironment``: a Lightning ``ClusterEnvironment`` for processes raylite already started.

Inside ``raylite.train.Trainer(train_func, num_workers=N)`` every worker runs ``train_func``; a
``pl.Trainer(strategy="ddp", devices=N, plugins=[RayEnvironment()])`` built there joins the others
instead of spawning its own processes: ranks and world size come from the train context
(``raylite.train.get_context()``), else from the ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` /
``LOCAL_WORLD_SIZE`` / ``NODE_RANK`` / ``MASTER_ADDR`` / ``MASTER_PORT`` variables the Trainer sets.
"""
from __future__ import annotations

import os
import socket

from raylite.plugins._compat import ClusterEnvironment, rank_zero_only


def _train_context():
    """raylite.train's context when this process is a Trainer worker, else None."""
    try:
        from raylite import train
        get_context = train.get_context
    except (ImportError, AttributeError):
        return None
    try:
        ctx = get_context()
        if ctx is None:
            return None
        in_session = getattr(ctx, "in_session", None)
        if callable(in_session):
            return ctx if in_session() else None
        # Outside a run raylite.train's context is rank 0 of 1: only a larger group is a session.
        return ctx if ctx.get_world_size() > 1 else None
    except Exception:  # noqa: BLE001 - "not in a train session", whatever its type
        return None


def _env_int(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"environment variable {name}={value!r} is not an integer") from None
    return None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class RayEnvironment(ClusterEnvironment):
    """Cluster environment for a process started by raylite (``raylite.train.Trainer`` workers).

    Use inside a ``train_func``::

        trainer = pl.Trainer(strategy="ddp", accelerator="cpu", devices=train.get_context().get_local_world_size(),
                             plugins=[RayEnvironment()])

    ``creates_processes_externally`` is True, so Lightning never spawns processes itself. The
    ``devices`` (and ``num_nodes``) given to ``pl.Trainer`` must describe the worker group
    (``devices * num_nodes == world size``): Lightning sizes its distributed samplers from them.
    ``validate_settings`` says exactly what to pass when they do not.
    """

    def __init__(self) -> None:
        super().__init__()
        self._main_port: int | None = None
        self._set_rank: int | None = None
        self._set_world: int | None = None

    # -- what Lightning asks --
    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR") or "127.0.0.1"

    @property
    def main_port(self) -> int:
        port = _env_int("MASTER_PORT")
        if port is not None:
            return port
        if self._main_port is None:   # nobody chose one: a single process on its own
            self._main_port = free_port()
        return self._main_port

    @staticmethod
    def detect() -> bool:
        return _train_context() is not None

    def world_size(self) -> int:
        ctx = _train_context()
        if ctx is not None:
            return int(ctx.get_world_size())
        value = _env_int("WORLD_SIZE")
        if value is not None:
            return value
        return self._set_world if self._set_world is not None else 1

    def set_world_size(self, size: int) -> None:
        # Lightning derives this from devices * num_nodes; the real value comes from the train
        # context or the environment (validate_settings reports a mismatch).
        self._set_world = size

    def global_rank(self) -> int:
        ctx = _train_context()
        if ctx is not None:
            return int(ctx.get_world_rank())
        value = _env_int("RANK")
        if value is not None:
            return value
        return self._set_rank if self._set_rank is not None else 0

    def set_global_rank(self, rank: int) -> None:
        self._set_rank = rank
        rank_zero_only.rank = self.global_rank()

    def local_rank(self) -> int:
        ctx = _train_context()
        if ctx is not None:
            return int(ctx.get_local_rank())
        value = _env_int("LOCAL_RANK")
        return 0 if value is None else value

    def local_world_size(self) -> int:
        ctx = _train_context()
        if ctx is not None and hasattr(ctx, "get_local_world_size"):
            return int(ctx.get_local_world_size())
        value = _env_int("LOCAL_WORLD_SIZE")
        return self.world_size() if value is None else value

    def node_rank(self) -> int:
        ctx = _train_context()
        if ctx is not None and hasattr(ctx, "get_node_rank"):
            return int(ctx.get_node_rank())
        value = _env_int("NODE_RANK", "GROUP_RANK")
        return 0 if value is None else value

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        world, local = self.world_size(), self.local_world_size()
        if num_devices * num_nodes != world or num_devices != local:
            nodes = max(1, world // max(1, local))
            raise ValueError(
                f"RayEnvironment: this process is one of {world} raylite workers ({local} on this node), but "
                f"pl.Trainer was given devices={num_devices}, num_nodes={num_nodes}. Pass "
                f"pl.Trainer(devices={local}, num_nodes={nodes}, ...) so that Lightning's distributed "
                f"samplers split the data across all {world} workers.")

    def teardown(self) -> None:
        # Lightning's default environment deletes WORLD_SIZE here; these variables belong to
        # raylite.train and other code in the worker may still need them.
        pass


class _LaunchedEnvironment(RayEnvironment):
    """The environment of RayStrategy's own workers: ranks are assigned by its launcher.

    In the driver (nothing assigned) this is rank 0 of ``num_workers``; it never consults an
    enclosing raylite.train context or the process environment, so a RayStrategy run inside a
    Trainer worker or a Tune trial describes its own group.
    """

    def __init__(self, num_workers: int) -> None:
        super().__init__()
        self._num_workers = num_workers
        self._assigned: dict | None = None

    def assign(self, *, rank: int, world_size: int, local_rank: int, local_world_size: int, node_rank: int,
               address: str, port: int) -> None:
        self._assigned = dict(rank=rank, world_size=world_size, local_rank=local_rank,
                              local_world_size=local_world_size, node_rank=node_rank, address=address, port=port)
        rank_zero_only.rank = rank

    def _get(self, key: str, default):
        return default if self._assigned is None else self._assigned[key]

    @property
    def main_address(self) -> str:
        return self._get("address", "127.0.0.1")

    @property
    def main_port(self) -> int:
        if self._assigned is not None:
            return self._assigned["port"]
        if self._main_port is None:
            self._main_port = free_port()
        return self._main_port

    @staticmethod
    def detect() -> bool:
        return False

    def world_size(self) -> int:
        return self._get("world_size", self._num_workers)

    def global_rank(self) -> int:
        return self._get("rank", 0)

    def set_global_rank(self, rank: int) -> None:
        self._set_rank = rank
        rank_zero_only.rank = self.global_rank()

    def local_rank(self) -> int:
        return self._get("local_rank", 0)

    def local_world_size(self) -> int:
        return self._get("local_world_size", self._num_workers)

    def node_rank(self) -> int:
        return self._get("node_rank", 0)

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        pass

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_assigned"] = None   # a worker's assignment never travels back or to another worker
        return state
