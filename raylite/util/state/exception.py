"""``ray.util.state.exception``'s error, for code that catches it by that path."""
from raylite.core.state_api import RayStateApiException

__all__ = ["RayStateApiException"]
