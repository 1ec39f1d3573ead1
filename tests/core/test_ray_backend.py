"""The Ray backend (issue 7): raylite programs on a multi-node Ray cluster started on this machine
with ``ray.cluster_utils.Cluster`` (a head and a second node, each with 1 CPU and 1 logical GPU).

raylite joins it the way a notebook on a Ray cluster does: ``RAY_ADDRESS`` set, a bare ``init()``.
Remote code is defined inside the tests (shipped by value), as in the core tests.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import raylite
from raylite import exceptions

from helpers import REPO_ROOT, TESTS_DIR

ROOT = REPO_ROOT
TESTS = TESTS_DIR

pytestmark = pytest.mark.timeout(300)


# ---------------------------------------------------------------------------------------------
# without a cluster
# ---------------------------------------------------------------------------------------------

def test_importing_raylite_never_imports_ray():
    code = ("import sys, raylite, raylite.train, raylite.tune, raylite.plugins, raylite.util\n"
            "assert 'ray' not in sys.modules, 'ray was imported'\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("RAY_ADDRESS", None)
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


def test_backend_choice(monkeypatch):
    from raylite.control import uses_local_runtime as local
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert local(None, None)
    assert local("local", None)
    assert not local("auto", None)
    assert not local("ray://head:10001", None)
    assert not local(None, "ray")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert not local(None, None)
    assert local(None, "local")
    with pytest.raises(ValueError, match="backend='local'.*address='auto'"):
        local("auto", "local")
    with pytest.raises(ValueError, match="backend='spark'"):
        local(None, "spark")


def test_bad_input_is_named_before_any_backend_is_asked():
    assert not raylite.is_initialized()
    with pytest.raises(ValueError, match="Invalid type of object refs, int"):
        raylite.get(123)
    with pytest.raises(TypeError, match="expects ObjectRefs, got str"):
        raylite.wait(["not a ref"])


def test_missing_ray_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)   # `import ray` raises ImportError
    with pytest.raises(ImportError, match=r"raylite\[ray\]"):
        raylite.init(address="auto")
    assert not raylite.is_initialized()


def test_a_translated_actor_error_keeps_the_actors_id():
    import ray
    from raylite.core.client.ray_backend import translate
    actor_id = "5e9f813a6310f55a9965528706000000"
    for theirs in (ray.exceptions.RayActorError(actor_id=actor_id),
                   ray.exceptions.ActorUnavailableError("restarting", bytes.fromhex(actor_id))):
        ours = translate(theirs)
        assert type(ours) is getattr(exceptions, type(theirs).__name__) and ours.actor_id == actor_id


def test_local_mode_warns_on_the_ray_backend_too(monkeypatch):
    from raylite.core.client import ray_backend
    monkeypatch.setattr(ray_backend, "connect", lambda *args, **kwargs: "connected")   # (no cluster needed)
    with pytest.warns(UserWarning, match=r"local_mode=True\) is not supported"):
        assert raylite.init(backend="ray", local_mode=True) == "connected"


def test_init_after_ray_closed_the_connection_itself_starts_afresh(monkeypatch):
    """init's context on Ray is Ray's: its disconnect() (or a bare ray.shutdown()) ends Ray's
    connection without raylite, and the next init is a new one, not a second init."""
    import ray
    from raylite.core.client import ray_backend
    from raylite.core.client.link import process
    assert not ray.is_initialized()
    monkeypatch.setattr(process, "ray", ray_backend)   # as connect() leaves it
    monkeypatch.setattr(ray_backend, "connect", lambda *args, **kwargs: "connected")   # (no cluster needed)
    assert raylite.init(backend="ray") == "connected"


@pytest.mark.parametrize("before", [None, "pdb.set_trace"])
@pytest.mark.parametrize("ended_by", ["raylite", "ray"])
def test_the_breakpoint_hook_rays_init_set_is_taken_back_when_the_connection_ends(monkeypatch, before, ended_by):
    """Ray's init points PYTHONBREAKPOINT at Ray's debugger for good: once raylite's connection
    ends (its shutdown, or Ray's own), the driver's value is back, so a local runtime started
    next in this process does not hand its workers' breakpoint() to a debugger nothing serves."""
    import ray
    from raylite.core.client import ray_backend
    initialized = []

    def ray_init(**kwargs):   # what Ray's init does to the environment (no cluster needed)
        os.environ["PYTHONBREAKPOINT"] = "ray.util.rpdb._driver_set_trace"
        initialized.append(True)

    monkeypatch.setattr(ray, "init", ray_init)
    monkeypatch.setattr(ray, "shutdown", initialized.clear)
    monkeypatch.setattr(ray, "is_initialized", lambda: bool(initialized))
    if before is None:
        monkeypatch.delenv("PYTHONBREAKPOINT", raising=False)
    else:
        monkeypatch.setenv("PYTHONBREAKPOINT", before)
    ray_backend.connect(None, False, True, True)
    assert os.environ["PYTHONBREAKPOINT"] == "ray.util.rpdb._driver_set_trace"   # Ray's, while connected
    if ended_by == "raylite":
        ray_backend.shutdown()
    else:
        ray.shutdown()
        assert ray_backend.disconnected()
    assert os.environ.get("PYTHONBREAKPOINT") == before


def test_register_serializer_refuses_bad_arguments_on_the_ray_backend_too(monkeypatch):
    from raylite.core.client import link
    from raylite.util import register_serializer

    class Unsent:
        pass

    monkeypatch.setattr(link, "on_ray", lambda: True)   # (Ray's own register_serializer takes anything)
    with pytest.raises(TypeError, match="serializer must be callable, got None"):
        register_serializer(Unsent, serializer=None, deserializer=str)


def test_a_bad_placement_group_is_refused_before_ray_sees_it(monkeypatch):
    """Ray's placement_group takes a bundle {'CPU': '1'}, and its raylet then crashed (a failed
    resource check); raylite refuses it by name on either backend."""
    import types
    from raylite.core.api import placement_groups
    handed = []
    rays_util = types.SimpleNamespace(placement_group=lambda *args, **kwargs: handed.append(args))
    monkeypatch.setattr(placement_groups, "_ray_util", lambda: rays_util)
    with pytest.raises(TypeError, match=r"bundles\[0\]"):
        placement_groups.placement_group([{"CPU": "1"}])
    with pytest.raises(ValueError, match="strategy"):
        placement_groups.placement_group([{"CPU": 1}], strategy="PAK")
    assert handed == []
    placement_groups.placement_group([{"CPU": 1}])
    assert handed == [([{"CPU": 1}],)]


def test_unreachable_address_fails_fast():
    pytest.importorskip("ray")
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match="127.0.0.1:9"):
        raylite.init(address="127.0.0.1:9")
    assert time.monotonic() - t0 < 30
    assert not raylite.is_initialized()


def test_gpu_workers_find_their_assigned_device():
    """What train and RayStrategy use to pick a GPU worker's device: the runtime's assignment,
    looked up in CUDA_VISIBLE_DEVICES (Ray may leave that variable listing every GPU)."""
    raylite.init(backend="local", num_cpus=2, num_gpus=2)
    try:
        @raylite.remote(num_gpus=1)
        def index():
            from raylite.util.placement import assigned_cuda_index
            gpu = raylite.get_gpu_ids()[0]
            isolated = assigned_cuda_index()
            os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"   # as with RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES
            return gpu, isolated, assigned_cuda_index()

        out = raylite.get([index.remote() for _ in range(2)])
    finally:
        raylite.shutdown()
    assert sorted(o[0] for o in out) == [0, 1]
    assert all(isolated == 0 and shared == gpu for gpu, isolated, shared in out)


# ---------------------------------------------------------------------------------------------
# on a two-node Ray cluster
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_cluster():
    """A two-node Ray cluster (1 CPU + 1 GPU each) for the module, raylite joined to it by a bare init()."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster
    if raylite.is_initialized():
        raylite.shutdown()
    saved = {k: os.environ.get(k) for k in ("RAY_ADDRESS", "PYTHONPATH")}
    # Ray's nodes (and so their workers) inherit this: workers import raylite and, for by-reference
    # pickles, the tests' modules, as the driver does.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(TESTS), saved["PYTHONPATH"]]))
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 1, "resources": {"head": 1},
                                                       "include_dashboard": False})
    try:
        c.add_node(num_cpus=1, num_gpus=1, resources={"second": 1})
        c.wait_for_nodes()
        os.environ["RAY_ADDRESS"] = c.address
        raylite.init()   # a bare init() joins RAY_ADDRESS, as in the Databricks notebook flow
        yield c
    finally:
        raylite.shutdown()
        c.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _snippets(ray) -> dict:
    """Ray Core's doc snippets; returns what they print, backend-independent."""
    import numpy as np

    @ray.remote
    def square(x):
        return x * x

    @ray.remote
    class Counter:
        def __init__(self):
            self.n = 0

        def inc(self):
            self.n += 1
            return self.n

    @ray.remote
    def total(a):
        return float(a.sum())

    @ray.remote
    def fan_out(n):
        return sum(ray.get([square.remote(i) for i in range(n)]))

    @ray.remote
    def bump(counter):
        return ray.get(counter.inc.remote())

    @ray.remote
    def fail():
        raise ValueError("bad input 42")

    @ray.remote(num_gpus=1)
    def gpu_task():
        ids = ray.get_gpu_ids()
        return len(ids), os.environ.get("CUDA_VISIBLE_DEVICES") == ",".join(str(i) for i in ids)

    @ray.remote(num_gpus=0.5)
    def half_gpu():
        return len(ray.get_gpu_ids())

    out = {"squares": ray.get([square.remote(i) for i in range(4)])}
    counter = Counter.remote()
    out["counter"] = [ray.get(counter.inc.remote()) for _ in range(3)]
    out["handle_in_task"] = ray.get(bump.remote(counter))
    ref = ray.put(np.arange(1_000_000, dtype=np.float64))
    out["put_is_ref"] = isinstance(ref, ray.ObjectRef)
    out["handle_is_handle"] = isinstance(counter, ray.ActorHandle)
    out["sum_by_ref"] = ray.get(total.remote(ref))
    out["nested"] = ray.get(fan_out.remote(5))
    refs = [square.remote(i) for i in (3, 1, 2)]
    ready, not_ready = ray.wait(refs, num_returns=3, timeout=60)
    out["wait"] = (ray.get(ready), len(not_ready))
    try:
        ray.get(fail.remote())
    except ValueError as e:
        out["error"] = (type(e).__name__, isinstance(e, ray.exceptions.RayTaskError), "bad input 42" in str(e))
    out["gpu"] = ray.get(gpu_task.remote())
    out["half_gpu"] = ray.get([half_gpu.remote() for _ in range(2)])
    ray.kill(counter)
    deadline = time.monotonic() + 30   # Ray kills asynchronously: a call right after may still run
    while "killed" not in out and time.monotonic() < deadline:
        try:
            ray.get(counter.inc.remote())
        except ray.exceptions.RayActorError as e:
            out["killed"] = type(e).__name__
        else:
            time.sleep(0.1)
    return out


def test_seed_snippets_give_the_same_answers_on_both_backends(ray_cluster):
    on_ray = _snippets(raylite)
    raylite.shutdown()
    try:
        raylite.init(backend="local", num_cpus=2, num_gpus=2)
        local = _snippets(raylite)
    finally:
        raylite.shutdown()
        raylite.init()   # back on the cluster for the other tests
    assert on_ray == local
    assert on_ray["squares"] == [0, 1, 4, 9] and on_ray["error"] == ("RayTaskError(ValueError)", True, True)
    assert on_ray["killed"] == "ActorDiedError"


def test_dag_api_runs_on_the_cluster(ray_cluster):
    from raylite.dag import InputNode, MultiOutputNode

    @raylite.remote
    def add(a, b):
        return a + b

    @raylite.remote
    class Total:
        def __init__(self, start):
            self.total = start

        def add(self, x):
            self.total += x
            return self.total

    with InputNode() as inp:
        total = Total.bind(10)
        total.add.bind(inp[0])
        dag = MultiOutputNode([add.bind(inp[0], inp.y), total.add.bind(inp.y)])
    with pytest.warns(DeprecationWarning):
        assert raylite.get(dag.execute(1, y=2)) == [3, 13]
    handle = Total.remote(0)   # Ray's own handle: its .bind gives Ray's nodes, which raylite's refuse
    with pytest.raises(TypeError, match="Ray's own DAG API"):
        add.bind(handle.add.bind(1), 2)


def test_cluster_is_visible_through_raylite(ray_cluster):
    assert raylite.is_initialized()
    assert len([n for n in raylite.nodes() if n["Alive"]]) == 2
    assert raylite.cluster_resources()["GPU"] == 2

    @raylite.remote(resources={"second": 1})
    def where():
        ctx = raylite.get_runtime_context()
        return ctx.get_node_id(), ctx.get_assigned_resources()

    node, assigned = raylite.get(where.remote())
    assert node != raylite.get_runtime_context().get_node_id()   # the driver is on the head node
    assert assigned.get("second") == 1


def test_get_runtime_context_before_init_joins_ray_address_and_gives_rays_context(ray_cluster):
    raylite.shutdown()   # RAY_ADDRESS names the cluster: the auto-init joins it, as Ray's does
    ctx = raylite.get_runtime_context()
    assert raylite.is_initialized() and type(ctx).__module__ == "ray.runtime_context"
    assert ctx.get_node_id() in {n["NodeID"] for n in raylite.nodes()}


def test_label_selection_is_rays_own_on_a_cluster(ray_cluster):
    from raylite.util.scheduling_strategies import In, NodeLabelSchedulingStrategy

    @raylite.remote
    def node():
        return raylite.get_runtime_context().get_node_id()

    second = raylite.get(node.options(resources={"second": 1}).remote())
    by_label = NodeLabelSchedulingStrategy({"ray.io/node-id": In(second)})
    assert raylite.get(node.options(scheduling_strategy=by_label).remote(), timeout=60) == second
    assert raylite.get(node.options(label_selector={"ray.io/node-id": second}).remote(), timeout=60) == second


def test_metrics_are_rays_own_on_a_cluster(ray_cluster):
    from ray.util import metrics as ray_metrics

    from raylite.util.metrics import Counter, Histogram

    @raylite.remote
    def record(counter):
        counter.inc(tags={"k": "v"})
        return type(counter._ray).__name__, type(counter._ray).__module__

    counter = Counter("raylite_backend_calls", tag_keys=("k",))
    assert isinstance(counter._ray, ray_metrics.Counter)
    assert raylite.get(record.remote(counter)) == ("Counter", "ray.util.metrics")
    assert isinstance(Histogram("raylite_backend_lat", boundaries=[1.0])._ray, ray_metrics.Histogram)


def test_placement_groups_are_rays_own_on_a_cluster(ray_cluster):
    from raylite.util.placement_group import placement_group, placement_group_table, remove_placement_group
    from raylite.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = placement_group([{"CPU": 1, "second": 1}])   # only the second node has "second"
    assert raylite.get(pg.ready(), timeout=60) is not None
    assert placement_group_table(pg)["state"] == "CREATED"

    @raylite.remote(num_cpus=1)
    def node_of():
        return raylite.get_runtime_context().get_node_id()

    strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)   # raylite's class
    assert raylite.get(node_of.options(scheduling_strategy=strategy).remote()) != \
        raylite.get_runtime_context().get_node_id()
    remove_placement_group(pg)


def test_trainer_places_one_worker_per_node_with_a_working_all_reduce(ray_cluster):
    pytest.importorskip("torch")
    from raylite.train import Trainer

    def train_func():
        import torch
        import torch.distributed as dist
        from raylite import train
        t = torch.tensor([float(train.world_rank() + 1)])
        dist.all_reduce(t)
        ctx = train.get_context()
        return (raylite.get_runtime_context().get_node_id(), ctx.get_world_rank(), ctx.get_local_rank(),
                ctx.get_node_rank(), ctx.get_local_world_size(), os.environ["MASTER_ADDR"], t.item())

    with Trainer(num_workers=2, resources_per_worker={"CPU": 1}) as trainer:
        out = trainer.run(train_func)
    nodes = {o[0] for o in out}
    assert len(nodes) == 2                                   # 1 CPU per node: one worker each
    assert [o[1] for o in out] == [0, 1]
    assert [(o[2], o[3], o[4]) for o in out] == [(0, 0, 1), (0, 1, 1)]   # local rank, node rank, per node
    assert all(o[6] == 3.0 for o in out)                     # 1 + 2 summed across the nodes
    assert out[0][5] == out[1][5] != "127.0.0.1"            # rank 0's node IP, not loopback


def test_tune_spreads_trials_over_nodes(ray_cluster, tmp_path):
    from raylite import tune

    def trainable(config):
        import glob
        import os
        open(os.path.join(str(tmp_path), f"started-{config['x']}"), "w").close()
        deadline = time.monotonic() + 30   # the first two trials run at once, so one on each node
        while len(glob.glob(os.path.join(str(tmp_path), "started-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        tune.report({"score": config["x"], "node": raylite.get_runtime_context().get_node_id()})

    analysis = tune.run(trainable, config={"x": tune.grid_search([1, 2, 3, 4])}, resources_per_trial={"cpu": 1},
                        metric="score", mode="max", storage_path=str(tmp_path), name="spread", verbose=0)
    assert sorted(t.last_result["score"] for t in analysis.trials) == [1, 2, 3, 4]
    assert len({t.last_result["node"] for t in analysis.trials}) == 2
    assert analysis.best_config == {"x": 4}
    # 2 CPUs in all, but no node has 2: an error before any trial starts, not a trial stuck PENDING
    with pytest.raises(ValueError, match="none of the 2 nodes has it all"):
        tune.run(trainable, resources_per_trial={"cpu": 2}, storage_path=str(tmp_path), name="too-big", verbose=0)


def test_a_nested_tasks_error_keeps_the_users_class_at_any_depth(ray_cluster):
    @raylite.remote
    def divide():
        return 1 / 0

    @raylite.remote
    def middle():
        return raylite.get(divide.remote())

    @raylite.remote
    def outer():
        return raylite.get(middle.remote())

    for ref, name in ((middle.remote(), "middle"), (outer.remote(), "outer")):
        with pytest.raises(ZeroDivisionError) as info:
            raylite.get(ref)
        assert isinstance(info.value, exceptions.RayTaskError)
        assert type(info.value.cause) is ZeroDivisionError
        assert str(info.value).startswith(f"{name}() (pid=")


def test_error_headers_name_the_task_and_its_pid(ray_cluster):
    @raylite.remote
    def my_task():
        raise ValueError("from my_task")

    @raylite.remote
    class Named:
        def method(self):
            raise KeyError("from method")

    with pytest.raises(ValueError) as info:
        raylite.get(my_task.remote())
    assert str(info.value).startswith(f"my_task() (pid={info.value.pid}) raised:")
    assert info.value.function_name == "my_task" and info.value.pid > 0
    with pytest.raises(KeyError) as info:
        raylite.get(Named.remote().method.remote())
    assert str(info.value).startswith("Named.method() (pid=")
    assert "\x1b[" not in str(info.value)   # plain text, as locally (Ray colours its header)


def test_wait_gives_the_first_ready_refs_in_the_order_given(ray_cluster):
    @raylite.remote
    def ident(x):
        return x

    refs = [ident.remote(i) for i in range(6)]
    raylite.get(refs)
    for n in (1, 2, 5):
        assert raylite.wait(refs, num_returns=n, timeout=60) == (refs[:n], refs[n:])


def test_generator_tasks_give_rays_generator_which_raylite_takes(ray_cluster):
    @raylite.remote
    def count(n):
        for i in range(n):   # (not `yield from`: Ray's generator tasks call send() on what it delegates to)
            yield i

    @raylite.remote
    def ticking():
        while True:
            yield 1
            time.sleep(0.05)   # Ray notices the cancel at the next yield

    gen = count.remote(3)
    assert isinstance(gen, raylite.ObjectRefGenerator)
    assert raylite.wait([gen], timeout=60) == ([gen], [])
    assert [raylite.get(ref) for ref in gen] == [0, 1, 2]
    endless = ticking.remote()
    assert raylite.get(next(endless)) == 1
    raylite.cancel(endless)
    with pytest.raises(exceptions.TaskCancelledError):
        raylite.get(endless.completed(), timeout=60)


def test_exit_actor_in_a_worker_that_never_used_raylite(ray_cluster, tmp_path):
    from helpers import wait_until

    @raylite.remote
    class Leaving:
        def leave(self, path):   # raylite's first use in this worker
            import atexit
            atexit.register(lambda: open(path, "w").close())
            raylite.actor.exit_actor()

    marker = tmp_path / "atexit-ran"
    fresh = {"env_vars": {"RAYLITE_TEST_WORKER": tmp_path.name}}   # its own runtime env: a new worker
    actor = Leaving.options(runtime_env=fresh).remote()
    with pytest.raises(exceptions.ActorDiedError):
        raylite.get(actor.leave.remote(str(marker)), timeout=120)
    wait_until(marker.exists, timeout=30, what="the actor's atexit handler")


def test_node_removed_mid_run_fails_its_task_typed_and_retries_elsewhere(ray_cluster, tmp_path):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from helpers import wait_until
    doomed = ray_cluster.add_node(num_cpus=2, resources={"doomed": 1})
    ray_cluster.wait_for_nodes()

    @raylite.remote
    def node_id():
        return raylite.get_runtime_context().get_node_id()

    @raylite.remote
    def slow(seconds, started):
        if raylite.get_runtime_context().get_node_id() == doomed_id:
            open(started, "w").close()
        time.sleep(seconds)
        return raylite.get_runtime_context().get_node_id()

    doomed_id = raylite.get(node_id.options(resources={"doomed": 1}).remote())
    pinned = slow.options(resources={"doomed": 1}, max_retries=0).remote(60, str(tmp_path / "pinned"))
    soft = NodeAffinitySchedulingStrategy(doomed_id, soft=True)
    retried = slow.options(scheduling_strategy=soft, max_retries=1).remote(3, str(tmp_path / "retried"))
    wait_until(lambda: (tmp_path / "pinned").exists() and (tmp_path / "retried").exists(), timeout=60,
               what="both tasks running on the doomed node")
    ray_cluster.remove_node(doomed)
    with pytest.raises(exceptions.NodeDiedError, match="node"):
        raylite.get(pinned, timeout=120)
    assert raylite.get(retried, timeout=120) != doomed_id    # Ray re-ran it on a live node


def test_ray_strategy_fits_the_wine_model(ray_cluster):
    pytest.importorskip("pytorch_lightning")
    import importlib.util
    data_path = Path(os.environ.get("RAYLITE_WINE_DATA") or ROOT.parent / "shared" / "data" / "wine-quality"
                     / "winequality-red.csv")
    if not data_path.is_file():
        pytest.skip(f"wine-quality data not found at {data_path} (set RAYLITE_WINE_DATA)")
    spec = importlib.util.spec_from_file_location("wine_quality_on_ray", ROOT / "examples" / "wine_quality.py")
    wq = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = wq   # the example ships its own code by value to the workers
    try:
        spec.loader.exec_module(wq)
        data = wq.prepare(*wq.load_wine(data_path))
        steps = 150
        res = wq.run_ray_lightning(data, steps=steps, num_workers=2, warm_refit=False)
    finally:
        sys.modules.pop(spec.name, None)
    from raylite.plugins import launcher, release_workers
    group = launcher._pool.idle[0]   # kept warm for a next fit
    assert [lay.node_rank for lay in group.layouts] == [0, 1]   # one worker per node (1 CPU each)
    assert group.address != "127.0.0.1"                         # the rendezvous is rank 0's node IP
    release_workers()
    assert len(res.losses) == steps
    assert res.accuracy > wq.majority_baseline(data) + 0.1, res.accuracy
    assert sum(res.losses[-20:]) / 20 < sum(res.losses[:20]) / 20 - 0.05
