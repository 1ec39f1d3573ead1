"""Names from Ray Core's docs that Ray code uses unchanged: every public ray.exceptions class (with
Ray's bases), RuntimeContext's remaining members, ray.runtime_env.RuntimeEnv, the ray.actor types
and ray.cloudpickle."""
import inspect
import json
import os
import re
import subprocess
import sys
import warnings

import pytest

import raylite as ray
from raylite import exceptions as exc
from raylite.runtime_env import RuntimeEnv, RuntimeEnvConfig
from raylite.util.placement_group import placement_group
from raylite.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from helpers import REPO_ROOT

# Ray internals no user code catches: the plasma store's "not yet", gRPC failures, the end-of-stream
# signal a streaming generator turns into StopIteration, and a misuse check of Ray's own pickler.
SKIPPED_RAY_INTERNALS = {"PlasmaObjectNotAvailable", "RpcError", "ObjectRefStreamEndOfStreamError",
                         "OufOfBandObjectRefSerializationException"}


# --------------------------------------------------------------------------
# exceptions
# --------------------------------------------------------------------------


def test_every_public_ray_exception_exists_with_rays_bases():
    ray_exceptions = pytest.importorskip("ray.exceptions")
    ray_classes = {name: cls for name, cls in vars(ray_exceptions).items()
                   if inspect.isclass(cls) and issubclass(cls, BaseException)
                   and cls.__module__ == "ray.exceptions"}
    assert SKIPPED_RAY_INTERNALS <= set(ray_classes), "a skipped name left Ray: drop it from the list"
    for name, ray_cls in ray_classes.items():
        if name in SKIPPED_RAY_INTERNALS:
            continue
        ours = getattr(exc, name, None)
        assert inspect.isclass(ours), f"raylite.exceptions lacks {name}"
        our_mro = {c.__name__ for c in ours.__mro__}
        for base in ray_cls.__bases__:
            assert base.__name__ in our_mro, f"{name} should derive from {base.__name__}"


def test_new_exceptions_keep_rays_hierarchy_for_except_clauses():
    assert issubclass(exc.OwnerDiedError, exc.ObjectLostError)
    assert issubclass(exc.ObjectReconstructionFailedError, exc.ObjectLostError)
    assert issubclass(exc.ReferenceCountingAssertionError, AssertionError)
    assert issubclass(exc.RayChannelTimeoutError, TimeoutError)
    assert issubclass(exc.RayChannelError, exc.RaySystemError)
    with pytest.raises(ValueError, match="taken"):
        raise exc.ActorAlreadyExistsError("name taken")
    assert str(exc.TaskUnschedulableError("no node fits")) == "no node fits"


@pytest.mark.local_only("Ray leaves an infeasible task pending (an autoscaler may add a node)")
def test_an_infeasible_task_is_a_task_unschedulable_error(ray_start):
    @ray.remote(num_cpus=64)
    def too_big():
        return 1

    with pytest.warns(UserWarning, match="never be scheduled"):
        ref = too_big.remote()
    with pytest.raises(ray.exceptions.TaskUnschedulableError, match="can never be scheduled") as info:
        ray.get(ref, timeout=10)
    assert isinstance(info.value, ray.exceptions.InfeasibleTaskError)


# --------------------------------------------------------------------------
# RuntimeContext
# --------------------------------------------------------------------------


@pytest.mark.local_only("Ray's NodeID/JobID objects do not compare equal to their hex strings")
def test_deprecated_id_properties_warn_and_match_the_getters(ray_start):
    ctx = ray.get_runtime_context()
    with pytest.warns(DeprecationWarning, match=r"get_node_id\(\)"):
        node_id = ctx.node_id
    assert node_id == ctx.get_node_id() and node_id.hex() == ctx.get_node_id()
    with pytest.warns(DeprecationWarning, match=r"get_job_id\(\)"):
        assert ctx.job_id.hex() == ctx.get_job_id()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert ctx.task_id is None and ctx.actor_id is None   # the driver runs no task
    with pytest.warns(DeprecationWarning, match=r"get_accelerator_ids\(\)"):
        assert ctx.get_resource_ids() == ctx.get_accelerator_ids()


@pytest.mark.local_only("Ray's driver context has a GCS address and node labels of its own")
def test_driver_context_members(ray_start):
    ctx = ray.get_runtime_context()
    assert re.fullmatch(r"session_\S+", ctx.get_session_name())
    assert os.path.isdir(ctx.get_temp_dir())
    assert ctx.get_node_labels() == {"ray.io/node-id": ctx.get_node_id()}
    assert ctx.get_node_labels() == ray.util.state.list_nodes()[0]["labels"]
    assert ctx.get_task_function_name() is None
    assert ctx.get_placement_group_id() is None
    assert ctx.should_capture_child_tasks_in_placement_group is False
    with pytest.warns(DeprecationWarning):
        assert ctx.current_placement_group_id is None
    assert getattr(ctx, "gcs_address", None) is None
    with pytest.raises(AttributeError, match="no GCS"):
        ctx.gcs_address


def test_task_and_actor_context_members(ray_start):
    @ray.remote
    def where():
        c = ray.get_runtime_context()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return c.task_id.hex(), c.get_task_id(), c.get_task_function_name(), c.get_session_name()

    @ray.remote
    class Who:
        def ids(self):
            c = ray.get_runtime_context()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                return c.actor_id.hex(), c.get_actor_id(), c.get_task_function_name()

    task_hex, task_id, fn_name, session = ray.get(where.remote())
    assert task_hex == task_id and task_id is not None
    assert fn_name == f"{__name__}.where"   # module.function, as in Ray
    assert session == ray.get_runtime_context().get_session_name()
    actor_hex, actor_id, method_name = ray.get(Who.remote().ids.remote())
    assert actor_hex == actor_id and actor_id is not None
    assert method_name == f"{__name__}.Who.ids"


def test_placement_group_id_and_capture_in_a_task(ray_start):
    @ray.remote(num_cpus=0)
    def placed():
        c = ray.get_runtime_context()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return (c.get_placement_group_id(), c.current_placement_group_id.hex(),
                    c.should_capture_child_tasks_in_placement_group)

    pg = placement_group([{"CPU": 1}])
    ray.get(pg.ready(), timeout=10)
    capture = PlacementGroupSchedulingStrategy(pg, placement_group_capture_child_tasks=True)
    assert ray.get(placed.options(scheduling_strategy=capture).remote()) == (pg.id.hex(), pg.id.hex(), True)
    plain = PlacementGroupSchedulingStrategy(pg)
    assert ray.get(placed.options(scheduling_strategy=plain).remote()) == (pg.id.hex(), pg.id.hex(), False)


@pytest.mark.local_only("Ray's context returns Ray's RuntimeEnv, not raylite's")
def test_runtime_env_objects_pass_through_init_and_options_and_show_in_the_context(ray_init):
    ray_init(runtime_env=RuntimeEnv(env_vars={"JOB_VAR": "job"}))

    @ray.remote
    def seen():
        c = ray.get_runtime_context()
        env = c.runtime_env
        return (os.environ.get("JOB_VAR"), os.environ.get("TASK_VAR"), type(env).__name__, dict(env),
                c.get_runtime_env_string())

    driver = ray.get_runtime_context()
    assert isinstance(driver.runtime_env, RuntimeEnv)
    assert driver.runtime_env == {"env_vars": {"JOB_VAR": "job"}}
    assert json.loads(driver.get_runtime_env_string()) == {"env_vars": {"JOB_VAR": "job"}}

    task_env = RuntimeEnv(env_vars={"TASK_VAR": "task"})
    job, task, kind, env, text = ray.get(seen.options(runtime_env=task_env).remote())
    assert (job, task, kind) == ("job", "task", "RuntimeEnv")
    assert env == {"env_vars": {"JOB_VAR": "job", "TASK_VAR": "task"}}
    assert json.loads(text) == env


# --------------------------------------------------------------------------
# ray.runtime_env
# --------------------------------------------------------------------------


def test_runtime_env_is_a_dict_of_the_given_fields():
    env = RuntimeEnv(env_vars={"A": "1"}, working_dir="/src", nsight="default", extra_field=3)
    assert isinstance(env, dict)
    assert env == {"env_vars": {"A": "1"}, "working_dir": "/src", "_nsight": "default", "extra_field": 3}
    plain = env.to_dict()
    plain["env_vars"]["A"] = "changed"
    assert env["env_vars"] == {"A": "1"}, "to_dict must copy, not share, nested values"
    assert RuntimeEnv() == {}
    assert RuntimeEnv.deserialize(env.serialize()) == env
    assert ray.runtime_env.RuntimeEnv is RuntimeEnv


def test_runtime_env_config_and_validation():
    env = RuntimeEnv(env_vars={"A": "1"}, config={"setup_timeout_seconds": 30})
    assert isinstance(env["config"], RuntimeEnvConfig)
    assert env.to_dict()["config"] == {"setup_timeout_seconds": 30, "eager_install": True, "log_files": []}
    assert type(env.to_dict()["config"]) is dict
    with pytest.warns(UserWarning, match="unknown"):
        assert RuntimeEnv(config={"bogus": 1})["config"] == RuntimeEnvConfig()
    with pytest.raises(ValueError, match="cannot be given together"):
        RuntimeEnv(pip=["requests"], conda="base")
    with pytest.raises(ValueError, match="'container' cannot be combined"):
        RuntimeEnv(container={"image": "x"}, working_dir="/src")
    with pytest.raises(ValueError, match="greater than zero"):
        RuntimeEnvConfig(setup_timeout_seconds=0)
    with pytest.raises(TypeError, match="eager_install"):
        RuntimeEnvConfig(eager_install="yes")


# --------------------------------------------------------------------------
# ray.actor types and ray.cloudpickle
# --------------------------------------------------------------------------


def test_actor_types_annotate_what_remote_returns(ray_start):
    @ray.remote
    class Counter:
        def inc(self) -> int:
            return 1

    def call(handle: ray.actor.ActorHandle) -> int:
        return ray.get(handle.inc.remote())

    assert isinstance(Counter, ray.actor.ActorClass)
    handle = Counter.remote()
    assert isinstance(handle, ray.actor.ActorHandle)
    assert isinstance(handle.inc, ray.actor.ActorMethod)
    assert call(handle) == 1


def test_runtime_context_module_names_the_context_type(ray_start):
    from raylite.runtime_context import RuntimeContext, get_runtime_context

    def node_of(ctx: RuntimeContext) -> str:   # annotations written against ray.runtime_context
        return ctx.get_node_id()

    assert isinstance(ray.get_runtime_context(), RuntimeContext)
    assert node_of(get_runtime_context()) == ray.get_runtime_context().get_node_id()


def test_cloudpickle_is_reachable_but_not_imported_by_import_raylite():
    script = ("import sys, raylite\n"
              "assert 'cloudpickle' not in sys.modules and 'raylite.runtime_env' not in sys.modules\n"
              "from raylite import cloudpickle\n"
              "import raylite.cloudpickle as again\n"
              "assert again is cloudpickle is raylite.cloudpickle\n"
              "offset = 5\n"
              "print(cloudpickle.loads(cloudpickle.dumps(lambda x: x + offset))(1))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "6"
