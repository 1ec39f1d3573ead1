"""Placement groups on the local runtime (Ray Core's "Placement Groups" docs): bundles reserved
together, tasks and actors drawing from a bundle (and seeing its devices), removal releasing the
resources and killing what runs in the group, and clear errors for what can never be placed."""
import os

import pytest

import raylite as ray
from backend import ON_RAY
from raylite.util.placement_group import (get_current_placement_group, get_placement_group, placement_group,
                                          placement_group_table, remove_placement_group)
from raylite.util.scheduling_strategies import PlacementGroupSchedulingStrategy

pytestmark = pytest.mark.timeout(60)


@ray.remote(num_cpus=1)
def hold(flag):
    """Keeps its CPU (a task blocked in get would lend it back) until the file `flag` exists."""
    import time
    while not os.path.exists(flag):
        time.sleep(0.01)
    return "held"


@ray.remote(num_cpus=1)
def quick():
    return "ran"


def in_bundle(pg, index=-1, capture=None):
    return PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index,
                                            placement_group_capture_child_tasks=capture)


def test_doc_snippet_reserve_then_schedule_an_actor_in_a_bundle(ray_init, wait_until):
    ray_init(num_cpus=2, num_gpus=2)
    pg = placement_group([{"CPU": 1, "GPU": 1}], strategy="STRICT_PACK")
    assert ray.get(pg.ready(), timeout=10) == pg
    assert ray.available_resources()["CPU"] == 1.0 and ray.available_resources()["GPU"] == 1.0

    @ray.remote(num_cpus=1, num_gpus=1)
    class Actor:
        def devices(self):
            return os.environ["CUDA_VISIBLE_DEVICES"], ray.get_runtime_context().get_accelerator_ids()["GPU"]

    actor = Actor.options(scheduling_strategy=in_bundle(pg, 0)).remote()
    visible, ids = ray.get(actor.devices.remote())
    assert len(ids) == 1 and visible == ids[0]
    assert ray.available_resources()["GPU"] == 1.0   # the actor used the bundle's GPU, not another
    remove_placement_group(pg)

    def actor_dead():
        try:
            ray.get(actor.devices.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return True
        return False

    def all_free():
        return ray.available_resources().get("CPU") == 2.0 and ray.available_resources().get("GPU") == 2.0
    if ON_RAY:   # Ray kills a removed group's actors and returns its resources asynchronously
        wait_until(actor_dead, timeout=20, message="the removed group's actor kept answering")
        wait_until(all_free, timeout=20, message="the removed group's resources never came back")
    else:        # the local runtime has done both by the time remove_placement_group returns
        assert actor_dead() and all_free()


def test_tasks_in_a_bundle_share_only_its_resources(ray_init, tmp_path):
    ray_init(num_cpus=2)
    pg = placement_group([{"CPU": 1}])
    ray.get(pg.ready())
    flag = str(tmp_path / "go")
    first = hold.options(scheduling_strategy=in_bundle(pg)).remote(flag)
    second = quick.options(scheduling_strategy=in_bundle(pg)).remote()
    ready, _ = ray.wait([second], timeout=0.5)
    assert not ready   # the bundle's one CPU is taken by `first`
    assert ray.get(quick.remote()) == "ran"   # the node's other CPU is free for everything else
    open(flag, "w").close()
    assert ray.get([first, second]) == ["held", "ran"]


def test_a_group_waits_until_all_its_bundles_fit(ray_init, tmp_path, wait_until):
    ray_init(num_cpus=2)
    flag = str(tmp_path / "go")
    busy = hold.remote(flag)
    wait_until(lambda: ray.available_resources().get("CPU") == 1.0, timeout=10, message="hold never started")
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], name="pair")
    assert not pg.wait(timeout_seconds=0.5)
    pending = placement_group_table(pg)
    assert pending["state"] == "PENDING" and pending["bundles_to_node_id"] == {0: "", 1: ""}
    assert pending["stats"]["scheduling_state"] == "NO_RESOURCES" and pending["stats"]["scheduling_attempt"] >= 1
    open(flag, "w").close()
    assert ray.get(busy) == "held"
    assert pg.wait(timeout_seconds=10)
    assert get_placement_group("pair") == pg
    created = placement_group_table(pg)
    node_id = ray.get_runtime_context().get_node_id()
    assert created["state"] == "CREATED" and created["bundles_to_node_id"] == {0: node_id, 1: node_id}
    assert created["stats"]["scheduling_state"] == "FINISHED"
    assert created["stats"]["end_to_end_creation_latency_ms"] >= 400   # it waited for hold's CPU
    remove_placement_group(pg)
    assert placement_group_table(pg)["state"] == "REMOVED"
    with pytest.raises(ValueError, match="pair"):
        get_placement_group("pair")


def test_a_pending_group_does_not_block_other_tasks(ray_init, tmp_path, wait_until):
    ray_init(num_cpus=2)
    flag = str(tmp_path / "go")
    blockers = [hold.options(num_cpus=0.5).remote(flag) for _ in range(2)]
    wait_until(lambda: ray.available_resources().get("CPU") == 1.0, timeout=10, message="holds never started")
    pg = placement_group([{"CPU": 2}])
    assert not pg.wait(timeout_seconds=0.3)
    assert ray.get(quick.options(num_cpus=0.5).remote()) == "ran"
    open(flag, "w").close()
    ray.get(blockers)
    assert pg.wait(timeout_seconds=10)


def test_children_run_in_the_group_when_captured(ray_init):
    ray_init(num_cpus=2)
    pg = placement_group([{"CPU": 1}])   # the node's other CPU runs what is not captured

    @ray.remote(num_cpus=0.5)
    def child():
        current = get_current_placement_group()
        return None if current is None else current.id.hex()

    @ray.remote(num_cpus=0.5)
    def parent():
        return get_current_placement_group().id.hex(), ray.get(child.remote())

    assert ray.get(parent.options(scheduling_strategy=in_bundle(pg, capture=True)).remote()) == (pg.id.hex(),) * 2
    assert ray.get(parent.options(scheduling_strategy=in_bundle(pg)).remote()) == (pg.id.hex(), None)
    assert ray.get(child.options(placement_group=pg, placement_group_bundle_index=0).remote()) == pg.id.hex()
    assert ray.get(child.remote()) is None


def test_an_actors_methods_run_in_its_group_and_capture_their_children(ray_init):
    """The Tune/Train pattern: a trainer actor placed in a group starts its workers from a method."""
    ray_init(num_cpus=2)
    pg = placement_group([{"CPU": 2}])   # all the node's CPUs: a child outside the group never runs

    @ray.remote(num_cpus=1)
    def child():
        return ray.get_runtime_context().get_placement_group_id()

    @ray.remote(num_cpus=1)
    class Trainer:
        def run(self):
            return get_current_placement_group().id.hex(), ray.get(child.remote(), timeout=20)

    trainer = Trainer.options(scheduling_strategy=in_bundle(pg, capture=True)).remote()
    assert ray.get(trainer.run.remote()) == (pg.id.hex(),) * 2


@pytest.mark.local_only("Ray leaves a task sent to a removed group pending, with no error")
def test_removing_a_group_fails_its_queued_and_running_tasks(ray_init, tmp_path):
    ray_init(num_cpus=2)
    pg = placement_group([{"CPU": 1}])
    running = hold.options(scheduling_strategy=in_bundle(pg), max_retries=3).remote(str(tmp_path / "never"))
    queued = quick.options(scheduling_strategy=in_bundle(pg)).remote()
    ready, _ = ray.wait([queued], timeout=0.3)
    assert not ready
    remove_placement_group(pg)
    for ref in (running, queued):
        with pytest.raises(ray.exceptions.TaskPlacementGroupRemoved, match="placement group was removed"):
            ray.get(ref, timeout=10)
    with pytest.raises(ray.exceptions.InfeasibleTaskError, match="removed"):
        ray.get(quick.options(scheduling_strategy=in_bundle(pg)).remote())
    assert ray.available_resources()["CPU"] == 2.0


@pytest.mark.local_only("Ray leaves a group that cannot be placed pending (an autoscaler may add a node)")
def test_what_can_never_be_placed_is_a_clear_error(ray_init):
    ray_init(num_cpus=2)
    with pytest.raises(ValueError, match="STRICT_SPREAD"):
        placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    with pytest.raises(ValueError, match="together need"):
        placement_group([{"CPU": 2}, {"CPU": 1}])
    with pytest.raises(ValueError, match=r"bundle 0 \{GPU: 1\} does not fit"):
        placement_group([{"GPU": 1}])
    with pytest.raises(ValueError, match=r"bundles\[1\]\['CPU'\] must be non-negative"):
        placement_group([{"CPU": 1}, {"CPU": -1}])
    with pytest.raises(ValueError, match="strategy must be one of"):
        placement_group([{"CPU": 1}], strategy="TIGHT")
    with pytest.raises(ValueError, match=r"bundle 1 can never be placed: its bundle_label_selector .* this node "
                                         r"has no such label"):
        placement_group([{"CPU": 1}, {"CPU": 1}], bundle_label_selector=[{}, {"zone": "us-east"}])
    with pytest.raises(ValueError, match="must be a list of 2 dicts, one per bundle"):
        placement_group([{"CPU": 1}, {"CPU": 1}], bundle_label_selector=[{}])
    assert ray.available_resources()["CPU"] == 2   # nothing reserved by the refused groups
    node_id = ray.get_runtime_context().get_node_id()
    matching = placement_group([{"CPU": 1}], bundle_label_selector=[{"ray.io/node-id": node_id}])
    assert ray.get(matching.ready(), timeout=20) == matching   # the group itself, as in Ray
    remove_placement_group(matching)
    pg = placement_group([{"CPU": 1}])
    with pytest.raises(ValueError, match="placement_group_bundle_index must be -1 or in"):
        quick.options(scheduling_strategy=in_bundle(pg, 1)).remote()
    with pytest.raises(ValueError, match=r"request \{'CPU': 2.0\} cannot fit into bundle 0"):   # as Ray: at once
        quick.options(num_cpus=2, scheduling_strategy=in_bundle(pg, 0)).remote()
