"""``ray.runtime_context``'s names (the implementation is raylite.core.context)."""
from raylite.core.context import RuntimeContext, get_runtime_context

__all__ = ["RuntimeContext", "get_runtime_context"]
