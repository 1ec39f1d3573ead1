"""What init() decides before anything starts: the backend, the node's resource totals, the
namespace and log directory, and the context it returns. Pure functions of init's arguments and
the machine, so api.init reads as the order of its steps."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable

from raylite.core.hardware import machine
from raylite.core.wire.ids import NODE_IP
from raylite.core.wire.resources import ACCELERATOR_RESOURCES, SCALE, format_bytes, to_fixed


class RayContext(dict):
    """What `init` returns; Ray's context is dict-like too, with a few attributes. ``shutdown``:
    the runtime's (raylite.core.api.runtime builds this context, and imports this module)."""

    def __init__(self, shutdown: Callable[[], None], **info):
        super().__init__(**info)
        self._shutdown = shutdown

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.disconnect()

    def disconnect(self) -> None:
        """Ray's way out of a job (its namespaces docs use it): here, shutdown()."""
        self._shutdown()

    @property
    def address_info(self) -> dict:
        return dict(self)

    @property
    def dashboard_url(self) -> str | None:
        return self.get("dashboard_url")   # None: no dashboard runs

    @property
    def python_version(self) -> str:
        return "{}.{}.{}".format(*sys.version_info[:3])


def session_log_dir(temp_dir: str | None, session: str) -> str:
    """Where worker output goes with log_to_driver=False: <temp dir>/raylite/session_<id>/logs
    (Ray's layout under /tmp/ray); kept after shutdown, as Ray keeps its logs."""
    import tempfile
    return os.path.join(temp_dir or tempfile.gettempdir(), "raylite", f"session_{session}", "logs")


def anonymous_namespace() -> str:
    """As Ray: a job started without a namespace gets a fresh one, shaped like a uuid."""
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def use_ray(address: str | None, backend: str | None) -> bool:
    """Which backend: an explicit ``backend``, else Ray when an address is given or in RAY_ADDRESS."""
    if backend not in (None, "local", "ray"):
        raise ValueError(f"backend must be 'local' or 'ray', got backend={backend!r}")
    if backend == "local":
        if address not in (None, "local"):
            raise ValueError(f"backend='local' runs on this machine only; it cannot use address={address!r}")
        return False
    if backend == "ray":
        return True
    if address is None:
        address = os.environ.get("RAY_ADDRESS") or None
    return address not in (None, "local")


def accelerator_part(resources: dict | None) -> dict | None:
    """The accelerator entries of init's resources (node_totals has checked their type)."""
    if resources is None:
        return None
    return {k: v for k, v in resources.items() if k in ACCELERATOR_RESOURCES} or None


def node_totals(num_cpus, resources, object_store_memory) -> dict[str, int]:
    """init's CPU, memory, object store and custom totals; accelerators.node_devices adds the devices."""
    if resources is not None and not isinstance(resources, dict):
        raise TypeError(f"init(): resources must be a dict of resource names to amounts, got "
                        f"resources={resources!r} ({type(resources).__name__})")
    cpus = num_cpus if num_cpus is not None else machine.cpu_count()   # a container's, not the host's
    memory = machine.memory_available()
    store = object_store_memory if object_store_memory is not None else int(memory * 0.3)
    if to_fixed(store, "object_store_memory") > to_fixed(memory, "memory"):   # as Ray refuses it
        raise ValueError(f"init(): object_store_memory={object_store_memory!r} ({format_bytes(store)}) is more "
                         f"than this machine has available ({format_bytes(memory)} of memory)")
    totals = {"CPU": to_fixed(cpus, "num_cpus"),
              "memory": to_fixed(int(memory * 0.7), "memory"),
              "object_store_memory": to_fixed(store, "object_store_memory"),
              f"node:{NODE_IP}": SCALE, "node:__internal_head__": SCALE}
    for name, value in (resources or {}).items():
        if name in ("CPU", "GPU"):
            raise ValueError(f"Use the 'num_cpus' and 'num_gpus' keyword instead of resources={{{name!r}: ...}}")
        if name not in ACCELERATOR_RESOURCES:
            totals[name] = to_fixed(value, f"resources[{name!r}]")
    return totals
