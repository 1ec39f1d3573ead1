"""Public names of Ray Core 2.x that programs import, on raylite: ray.ObjectID, the ID types,
ray.job_config / ray.types / ray.remote_function / ray.cross_language, ray.client, and
ray.util's log_once, pdb, get_node_instance_id and joblib."""
import importlib

import pytest

import raylite as ray

# Ray's top-level names raylite leaves out: its private config, cluster-only modules and
# libraries that are not Ray Core.
NOT_IN_RAYLITE = {"_config", "autoscaler", "data", "internal", "widgets", "workflow"}


def test_rays_top_level_names_exist():
    real_ray = pytest.importorskip("ray")
    missing = [name for name in real_ray.__all__ if name not in NOT_IN_RAYLITE and not hasattr(ray, name)]
    assert missing == []


def test_rays_util_names_exist():
    real_util = pytest.importorskip("ray.util")
    left_out = {"iter", "ray_debugpy", "collective"}   # removed in Ray / a debugpy hook / GPU collective groups
    assert [n for n in real_util.__all__ if n not in left_out and not hasattr(ray.util, n)] == []


def test_object_id_is_object_ref(ray_start):
    assert ray.ObjectID is ray.ObjectRef and isinstance(ray.put(1), ray.ObjectID)


@pytest.mark.local_only("on Ray each test is a new job of a shared cluster: the job id's int is not 1")
def test_id_types_round_trip_the_getters_hex(ray_start):
    ctx = ray.get_runtime_context()
    node = ray.NodeID.from_hex(ctx.get_node_id())
    assert node.hex() == ctx.get_node_id() and node == ray.NodeID.from_hex(ctx.get_node_id())
    assert {node: 1}[ray.NodeID(node.binary())] == 1 and node != ray.WorkerID(node.binary())
    assert ray.JobID.from_hex(ctx.get_job_id()).int() == 1 and repr(ray.JobID.from_int(1)) == "JobID(01000000)"
    assert ray.ActorID.nil().is_nil() and ray.ActorID.size() == 16 and len(ray.TaskID.from_random().binary()) == 24
    with pytest.raises(ValueError, match="from_hex takes a hex string, got 'xyz'"):
        ray.NodeID.from_hex("xyz")
    pg = ray.util.placement_group([{"CPU": 1}])
    assert isinstance(pg.id, ray.PlacementGroupID)
    ray.util.remove_placement_group(pg)


def test_module_paths_of_ray_core():
    assert ray.types.ObjectRef is ray.ObjectRef
    from raylite.remote_function import RemoteFunction
    assert isinstance(ray.remote(lambda: 1), RemoteFunction)
    from raylite.actor import method
    assert method is ray.method
    assert ray.runtime_context.RuntimeContext is type(ray.runtime_context.RuntimeContext())
    assert ray.SCRIPT_MODE == 0 and ray.WORKER_MODE == 1 and ray.Language.PYTHON.name == "PYTHON"


def test_java_and_cpp_say_why_they_are_not_here():
    for call in (lambda: ray.java_function("Cls", "f"), lambda: ray.java_actor_class("Cls"),
                 lambda: ray.cpp_function("f")):
        with pytest.raises(NotImplementedError, match="Python workers only"):
            call()


def test_client_builder_connects_through_init():
    context = ray.client().namespace("client-ns").env({"env_vars": {"VIA": "client"}}).connect()
    try:
        @ray.remote
        def via():
            import os
            return os.environ.get("VIA")

        assert ray.get_runtime_context().namespace == "client-ns" and ray.get(via.remote()) == "client"
    finally:
        context.disconnect()
    assert not ray.is_initialized()
    assert ray.client("10.0.0.1:10001").address == "ray://10.0.0.1:10001"


def test_log_once_and_util_helpers(monkeypatch):
    from raylite.util import debug
    monkeypatch.setattr(debug, "_logged", set())
    assert ray.util.log_once("k") and not ray.util.log_once("k")
    debug.reset_log_once("k")
    assert ray.util.log_once("k")
    monkeypatch.setattr(debug, "_disabled", False)
    ray.util.disable_log_once_globally()
    assert not ray.util.log_once("other")
    assert ray.util.pdb is importlib.import_module("raylite.util.rpdb")
    monkeypatch.setenv("RAY_CLOUD_INSTANCE_ID", "i-123")
    assert ray.util.get_node_instance_id() == "i-123"
    with pytest.raises(ValueError, match="secure"):
        ray.util.connect("localhost:10001", secure=True)


def test_util_connect_calls_init_as_the_client_builder_does(monkeypatch):
    calls = []
    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: calls.append((args, kwargs)))
    ray.util.connect("localhost:10001", namespace="ns", ray_init_kwargs={"num_cpus": 1})
    ray.util.connect("ray://host:10001")
    assert calls[0][0] == ("ray://localhost:10001",)
    assert calls[0][1]["namespace"] == "ns" and calls[0][1]["num_cpus"] == 1
    assert calls[1][0] == ("ray://host:10001",) and calls[1][1]["namespace"] is None
