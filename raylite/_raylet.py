"""``ray._raylet``'s public classes, for code that imports them from there (Ray's streaming
generator docs do: ``from ray._raylet import ObjectRefGenerator``)."""
from raylite.core.client.objects import ObjectRef
from raylite.core.client.streams import ObjectRefGenerator

StreamingObjectRefGenerator = ObjectRefGenerator   # its former name in Ray

__all__ = ["ObjectRef", "ObjectRefGenerator", "StreamingObjectRefGenerator"]
