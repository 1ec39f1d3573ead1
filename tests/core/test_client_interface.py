"""The client interfaces (raylite.core.client.interface): the driver's client and a worker's
implement every member of Client, so the local API code is written once for both; the Ray adapter
and the local runtime's front end implement every member of Backend, with its parameters, so the
API hands each call to link.backend() without asking which backend runs."""
import inspect

from raylite.core.api.local import LocalBackend
from raylite.core.client import ray_backend
from raylite.core.client.interface import Backend, Client
from raylite.core.node.driver import DriverClient
from raylite.core.worker.client import WorkerClient


def _methods(protocol: type) -> set[str]:
    return {name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_")}


def test_the_driver_and_the_worker_client_implement_the_client_interface():
    methods, attributes = _methods(Client), set(Client.__annotations__)
    assert {"get", "put", "wait", "submit", "addref", "release"} <= methods and "shm_prefix" in attributes
    for cls in (DriverClient, WorkerClient):
        assigned = set(cls.__init__.__code__.co_names)   # self.<name> = ... in __init__
        missing = sorted(m for m in methods if not callable(getattr(cls, m, None)))
        missing += sorted(a for a in attributes if not hasattr(cls, a) and a not in assigned)
        assert not missing, f"{cls.__name__} lacks {missing} of the Client interface"


def _parameters(fn) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def test_the_ray_adapter_and_the_local_backend_implement_the_backend_interface():
    methods = _methods(Backend)
    assert {"get", "put", "wait", "kill", "cancel", "get_actor", "cluster_resources"} <= methods
    for name, impl in (("ray_backend", ray_backend), ("LocalBackend", LocalBackend)):
        for method in sorted(methods):
            fn = getattr(impl, method, None)
            assert callable(fn), f"{name} lacks {method} of the Backend interface"
            assert _parameters(fn) == _parameters(getattr(Backend, method)), \
                f"{name}.{method}{inspect.signature(fn)} differs from Backend.{method}"
