"""``ray.remote_function``: the type of a ``@remote`` function, for annotations and isinstance."""
from raylite.core.api.remote import RemoteFunction

__all__ = ["RemoteFunction"]
