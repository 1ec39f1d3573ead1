"""``ray.runtime_context``'s names (the implementation is raylite.core.client.context)."""
from raylite.core.api.context import RuntimeContext, get_runtime_context

__all__ = ["RuntimeContext", "get_runtime_context"]
