"""get_runtime_context() as Ray's: before init() it starts the runtime (Ray's auto-init), so its
ids are real; a context kept past shutdown() raises for what only a running runtime knows."""
import json
import logging
import warnings

import pytest

import raylite as ray


def test_get_runtime_context_before_init_starts_the_runtime():
    assert not ray.is_initialized()
    ctx = ray.get_runtime_context()
    assert ray.is_initialized()   # as Ray's (get_runtime_context is one of its auto-init APIs)
    assert ctx.get_node_id() == ray.nodes()[0]["NodeID"] and ctx.get_node_id()
    assert ctx.get_job_id() == ray.util.state.list_jobs()[0]["job_id"]
    assert ctx.get_task_id() is None and ctx.get_actor_id() is None   # the driver runs no task


def test_the_runtime_context_module_and_get_gpu_ids_start_it_too():
    from raylite.runtime_context import get_runtime_context
    assert get_runtime_context().get_worker_id() and ray.is_initialized()
    ray.shutdown()
    assert ray.get_gpu_ids() == [] and ray.is_initialized()   # Ray auto-inits get_gpu_ids as well


def test_a_context_kept_past_shutdown_gives_no_stale_ids():
    ctx = ray.get_runtime_context()
    ctx.get_job_id()
    ray.shutdown()
    for getter, what in (("get_job_id", "Job ID"), ("get_node_id", "Node ID"), ("get_worker_id", "Worker ID"),
                         ("get_session_name", "Session name")):
        with pytest.raises(RuntimeError, match=f"{what} is not available because raylite has not been initialized"):
            getattr(ctx, getter)()
    with pytest.raises(RuntimeError, match="Namespace is not available"):
        ctx.namespace
    for getter in ("get_assigned_resources", "get_accelerator_ids", "get_node_labels", "get_dashboard_url"):
        with pytest.raises(ray.exceptions.RaySystemError, match="has not been started yet"):
            getattr(ctx, getter)()
    assert ctx.get_task_id() is None and ctx.get_actor_id() is None   # as Ray outside a worker
    assert not ray.is_initialized()   # none of these started it again


@pytest.mark.local_only("Ray's RuntimeContext has no get_dashboard_url")
def test_get_dict_gives_id_objects_with_hex_and_warns(ray_start):
    @ray.remote
    def inside():
        c = ray.get_runtime_context()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            d = c.get()
        return d["task_id"].hex() == c.get_task_id(), d["job_id"].hex(), "actor_id" in d

    @ray.remote
    class Inside:
        def ids(self):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                d = ray.get_runtime_context().get()
            return d["actor_id"].hex() == ray.get_runtime_context().get_actor_id()

    ctx = ray.get_runtime_context()
    with pytest.warns(DeprecationWarning, match="get_xxx_id"):
        driver = ctx.get()
    assert driver["node_id"].hex() == ctx.get_node_id() and "task_id" not in driver
    assert ray.get(inside.remote()) == (True, ctx.get_job_id(), False)
    assert ray.get(Inside.remote().ids.remote()) is True
    assert ctx.get_dashboard_url() == ""   # no dashboard runs (Ray: "" with its dashboard off)


def test_a_log_record_after_shutdown_neither_restarts_nor_makes_up_ids(ray_init, capsys):
    ray_init(num_cpus=1, logging_config=ray.LoggingConfig(encoding="JSON"))
    root = logging.getLogger()
    try:
        ray.shutdown()
        logging.getLogger("after").warning("after shutdown")
    finally:   # init() gave this process's root logger a handler: leave other tests theirs
        root.handlers = [h for h in root.handlers if type(h.formatter).__module__ != "raylite.core.client.logging_config"]
    line = next(line for line in capsys.readouterr().err.splitlines() if "after shutdown" in line)
    assert "job_id" not in json.loads(line) and not ray.is_initialized()


def test_the_state_api_before_init_does_not_start_a_runtime():
    with pytest.raises(ray.exceptions.RaySystemError, match="not initialized"):
        ray.util.state.list_logs()
    with pytest.raises(RuntimeError, match="Node ID is not available"):
        ray.util.state.list_logs(node_id="abc")
    assert not ray.is_initialized()
