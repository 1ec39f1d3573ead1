"""The client interface (raylite.core.client.interface.Client): the driver's client and a
worker's implement every member of it, so the API is written once for both."""
from raylite.core.client.interface import Client
from raylite.core.node.driver import DriverClient
from raylite.core.worker.client import WorkerClient


def _members() -> tuple[set[str], set[str]]:
    methods = {name for name, value in vars(Client).items() if callable(value) and not name.startswith("_")}
    return methods, set(Client.__annotations__)


def test_the_driver_and_the_worker_client_implement_the_client_interface():
    methods, attributes = _members()
    assert {"get", "put", "wait", "submit", "addref", "release"} <= methods and "shm_prefix" in attributes
    for cls in (DriverClient, WorkerClient):
        assigned = set(cls.__init__.__code__.co_names)   # self.<name> = ... in __init__
        missing = sorted(m for m in methods if not callable(getattr(cls, m, None)))
        missing += sorted(a for a in attributes if not hasattr(cls, a) and a not in assigned)
        assert not missing, f"{cls.__name__} lacks {missing} of the Client interface"
