"""``ray.util.state.exception``'s error, for code that catches it by that path."""
from raylite.core.api.state import RayStateApiException

__all__ = ["RayStateApiException"]
