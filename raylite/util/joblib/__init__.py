"""``ray.util.joblib``: ``register_ray()`` makes ``joblib.parallel_backend("ray")`` run joblib's
work (scikit-learn's ``n_jobs`` loops, ``Parallel(...)(delayed(f)(x) ...)``) on raylite's workers."""
from __future__ import annotations

__all__ = ["register_ray"]


def register_ray() -> None:
    """Register the "ray" backend with joblib (joblib must be installed)."""
    try:
        from joblib.parallel import register_parallel_backend
    except ImportError as e:
        raise ImportError("register_ray() needs joblib: pip install joblib") from e
    from raylite.util.joblib.ray_backend import RayBackend
    register_parallel_backend("ray", RayBackend)
