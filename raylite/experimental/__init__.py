"""`ray.experimental` names raylite provides: `tqdm_ray` (progress bars from tasks and actors)."""
