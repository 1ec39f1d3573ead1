"""``ray.client(address)``: Ray Client's builder (deprecated in Ray), as a way to call ``init``.

``ray.client().connect()`` starts the local runtime; ``ray.client("ray://host:10001")`` (or
``"host:10001"``) connects to that Ray cluster through the Ray backend, with the builder's
namespace and runtime_env."""
from __future__ import annotations

from typing import Any

__all__ = ["ClientBuilder", "client"]


class ClientBuilder:
    def __init__(self, address: str | None) -> None:
        self.address = address
        self._namespace: str | None = None
        self._env: dict | None = None
        self._kwargs: dict[str, Any] = {}

    def env(self, env: dict[str, Any]) -> ClientBuilder:
        """The job's runtime_env."""
        self._env = env
        return self

    def namespace(self, namespace: str) -> ClientBuilder:
        self._namespace = namespace
        return self

    def _init_args(self, **kwargs) -> ClientBuilder:
        """Further init() arguments, as Ray's builder takes them."""
        self._kwargs.update(kwargs)
        return self

    def connect(self):
        """``init`` with what the builder holds; returns init's context (its ``disconnect()``
        shuts down)."""
        import raylite
        return raylite.init(self.address, namespace=self._namespace, runtime_env=self._env, **self._kwargs)


def client(address: str | None = None, _deprecation_warn_enabled: bool = True) -> ClientBuilder:
    """A builder for ``init``: None or "local" for the local runtime, else a Ray cluster's address
    ("ray://" is added to a bare host:port, as Ray Client's default)."""
    if address is not None and address != "local" and "://" not in address:
        address = f"ray://{address}"
    return ClientBuilder(address)
