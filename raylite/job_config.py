"""``ray.job_config``'s JobConfig (the implementation is raylite.core.api.job_config)."""
from raylite.core.api.job_config import JobConfig

__all__ = ["JobConfig"]
