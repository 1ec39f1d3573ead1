"""``ray.types``: ``ObjectRef`` for type annotations (``ObjectRef[int]``)."""
from raylite.core.client.objects import ObjectRef

__all__ = ["ObjectRef"]
