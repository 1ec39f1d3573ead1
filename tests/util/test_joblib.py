"""ray.util.joblib.register_ray: joblib's Parallel under parallel_backend("ray") runs its work in
raylite's worker processes (the pool's actors), as Ray's backend does."""
import os

import joblib   # the dev extra has it
import pytest

import raylite as ray


def _where(x):
    import os as os_
    import raylite
    return x * x, os_.getpid(), raylite.get_runtime_context().get_actor_id()


@pytest.fixture
def joblib_backend():
    """joblib's "ray" backend registered (raylite.util.joblib); the runtime it starts is shut down after."""
    from raylite.util.joblib import register_ray
    register_ray()
    yield
    if ray.is_initialized():
        ray.shutdown()


def test_parallel_runs_on_raylite_workers(joblib_backend):
    ray.init(num_cpus=2)
    with joblib.parallel_backend("ray"):
        out = joblib.Parallel(n_jobs=2)(joblib.delayed(_where)(i) for i in range(12))
    assert [square for square, _, _ in out] == [i * i for i in range(12)]
    pids, actors = {pid for _, pid, _ in out}, {actor for _, _, actor in out}
    assert os.getpid() not in pids and None not in actors   # in raylite actors, not in this process
    workers = {row["pid"] for row in ray.util.state.list_actors() if row["class_name"] == "_PoolProcess"}
    assert pids <= workers


def test_all_cpus_with_n_jobs_minus_one_and_errors_propagate(joblib_backend):
    def boom(x):
        raise ValueError(f"bad input {x}")

    with joblib.parallel_backend("ray", n_jobs=-1):   # starts the runtime, as Ray's backend does
        assert joblib.Parallel()(joblib.delayed(abs)(-i) for i in range(4)) == [0, 1, 2, 3]
        assert joblib.Parallel().n_jobs == -1 and ray.is_initialized()
        with pytest.raises(ValueError, match="bad input"):
            joblib.Parallel()(joblib.delayed(boom)(i) for i in range(3))
    assert joblib.parallel.get_active_backend()[0].__class__.__name__ != "RayBackend"


def test_ray_remote_args_reach_the_pool_actors(joblib_backend):
    ray.init(num_cpus=2, resources={"pool_slot": 2})
    from raylite.util.joblib.ray_backend import RayBackend
    backend = RayBackend(ray_remote_args={"resources": {"pool_slot": 1}})
    assert backend.configure(n_jobs=2) == 2
    try:
        assert ray.available_resources().get("pool_slot", 0) == 0   # each of the 2 actors holds one
    finally:
        backend.terminate()
