"""``ray.types``: ``ObjectRef`` for type annotations (``ObjectRef[int]``)."""
from raylite.core.objects import ObjectRef

__all__ = ["ObjectRef"]
