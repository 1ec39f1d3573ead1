"""``ray.job_config``'s JobConfig (the implementation is raylite.core.job_config)."""
from raylite.core.job_config import JobConfig

__all__ = ["JobConfig"]
