"""joblib's backend on raylite: each ``Parallel`` call runs its batches on a
``raylite.util.multiprocessing.Pool`` of ``n_jobs`` actors (``n_jobs=-1``: one per CPU of the
runtime, started if need be), through joblib's own pool-backend helpers (batching, callbacks,
error handling). ``ray_remote_args`` are the pool actors' options, as in Ray."""
from __future__ import annotations

from typing import Any

from joblib._parallel_backends import AutoBatchingMixin, ParallelBackendBase, PoolManagerMixin
from joblib.parallel import SequentialBackend

import raylite as ray
from raylite.util.multiprocessing.pool import Pool


class RayBackend(PoolManagerMixin, AutoBatchingMixin, ParallelBackendBase):
    supports_retrieve_callback = True
    supports_return_generator = False   # as Ray's (a multiprocessing-pool backend)

    def __init__(self, nesting_level: int | None = None, inner_max_num_threads: int | None = None,
                 ray_remote_args: dict[str, Any] | None = None, **kwargs):
        self.ray_remote_args = ray_remote_args
        super().__init__(nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads, **kwargs)

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        """n_jobs as given; negative counts back from the runtime's CPUs (-1: all of them)."""
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None:
            return 1
        if n_jobs < 0:
            if not ray.is_initialized():
                ray.init()
            return max(int(ray.cluster_resources().get("CPU", 1)) + 1 + n_jobs, 1)
        return n_jobs

    def configure(self, n_jobs: int = 1, parallel=None, prefer: str | None = None, require: str | None = None,
                  ray_remote_args: dict[str, Any] | None = None, **kwargs) -> int:
        """Start the pool for one Parallel call; n_jobs=1 runs in this process, as joblib's
        process backends do."""
        from joblib._parallel_backends import FallbackToBackend
        n_jobs = self.effective_n_jobs(n_jobs)
        if n_jobs == 1:
            raise FallbackToBackend(SequentialBackend(nesting_level=self.nesting_level))
        args = ray_remote_args if ray_remote_args is not None else self.ray_remote_args
        self._pool = Pool(n_jobs, ray_remote_args=args)
        self.parallel = parallel
        return n_jobs

    def terminate(self) -> None:
        super().terminate()
        self.reset_batch_stats()
