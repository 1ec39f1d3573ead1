"""Node labels (`init(labels=...)`), the `label_selector` option and NodeLabelSchedulingStrategy /
NodeAffinitySchedulingStrategy: a selection this node meets runs as usual; one it can never meet
is infeasible (a warning at .remote(), InfeasibleTaskError at get), never a silent hang."""
import pytest

import raylite as ray
from raylite.util.scheduling_strategies import (DoesNotExist, Exists, In, NodeAffinitySchedulingStrategy,
                                                NodeLabelSchedulingStrategy, NotIn)
from raylite.util.state import list_nodes


@pytest.mark.local_only("list_nodes: Ray's state API needs Ray's dashboard")
def test_node_labels_are_visible_everywhere(ray_init):
    ray_init(labels={"zone": "eu-1", "example.com/tier": "batch"})

    @ray.remote
    def labels_inside():
        return ray.get_runtime_context().get_node_labels()

    node_id = ray.get_runtime_context().get_node_id()
    expected = {"ray.io/node-id": node_id, "zone": "eu-1", "example.com/tier": "batch"}
    assert ray.get_runtime_context().get_node_labels() == expected
    assert ray.get(labels_inside.remote()) == expected
    assert ray.nodes()[0]["Labels"] == expected
    assert list_nodes()[0]["labels"] == expected


@pytest.mark.parametrize("selector", [{"zone": "eu-1"}, {"zone": "!us-1"}, {"zone": "in(us-1, eu-1)"},
                                      {"zone": "!in(us-1,us-2)"}, {"gpu": "!h100"}])
def test_a_selector_this_node_meets_runs(ray_init, selector):
    ray_init(labels={"zone": "eu-1"})

    @ray.remote
    def one():
        return 1

    assert ray.get(one.options(label_selector=selector).remote()) == 1


def test_strategies_this_node_meets_run(ray_init):
    ray_init(labels={"zone": "eu-1"})

    @ray.remote
    def one():
        return 1

    here = NodeLabelSchedulingStrategy({"zone": In("eu-1", "eu-2"), "gpu": DoesNotExist(), "ray.io/node-id": Exists()},
                                       soft={"disk": In("ssd")})
    assert ray.get(one.options(scheduling_strategy=here).remote()) == 1
    assert ray.get(one.options(scheduling_strategy=NodeLabelSchedulingStrategy({"zone": NotIn("us-1")})).remote()) == 1
    this_node = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    assert ray.get(one.options(scheduling_strategy=this_node).remote()) == 1
    assert ray.get(one.options(scheduling_strategy=NodeAffinitySchedulingStrategy("ab" * 28, soft=True)).remote()) == 1
    assert ray.get(one.options(scheduling_strategy="SPREAD").remote()) == 1


@pytest.mark.parametrize("options, why", [
    ({"label_selector": {"zone": "us-1"}}, "label 'zone' is 'us-1', but this node's is 'eu-1'"),
    ({"label_selector": {"gpu": "in(a100,h100)"}}, "'gpu' is one of 'a100', 'h100', but this node has no such label"),
    ({"scheduling_strategy": NodeLabelSchedulingStrategy({"zone": NotIn("eu-1")})}, "is not 'eu-1'"),
    ({"scheduling_strategy": NodeLabelSchedulingStrategy({"gpu": Exists()})}, "'gpu' is set, but this node has no"),
    ({"scheduling_strategy": NodeAffinitySchedulingStrategy("ab" * 14, soft=False)}, "asks for node 'abab"),
])
@pytest.mark.local_only("Ray logs the warning and leaves the task pending (an autoscaler may add a node)")
def test_a_selection_this_node_never_meets_is_infeasible(ray_init, options, why):
    ray_init(labels={"zone": "eu-1"})

    @ray.remote
    def one():
        return 1

    with pytest.warns(UserWarning, match="can never be scheduled"):
        ref = one.options(**options).remote()
    with pytest.raises(ray.exceptions.InfeasibleTaskError, match=why):
        ray.get(ref, timeout=10)
    assert ray.get(one.remote()) == 1   # the node is fine


@pytest.mark.local_only("Ray logs the warning and leaves the actor pending (an autoscaler may add a node)")
def test_an_actor_this_node_never_meets_is_dead_with_the_reason(ray_init):
    ray_init()

    @ray.remote
    class Worker:
        def ping(self):
            return 1

    with pytest.warns(UserWarning, match="can never be scheduled"):
        actor = Worker.options(label_selector={"accelerator": "tpu-v5"}).remote()
    with pytest.raises(ray.exceptions.ActorDiedError, match="'accelerator' is 'tpu-v5', but this node has no"):
        ray.get(actor.ping.remote(), timeout=10)


def test_bad_labels_and_selectors_name_the_field():
    @ray.remote
    def one():
        return 1

    with pytest.raises(ValueError, match="invalid selector 'in\\(\\)' for label 'zone'"):
        one.options(label_selector={"zone": "in()"})
    with pytest.raises(TypeError, match="label_selector must be a dict"):
        one.options(label_selector=["zone"])
    with pytest.raises(ValueError, match="scheduling_strategy must be 'DEFAULT', 'SPREAD'"):
        one.options(scheduling_strategy="PACK")
    with pytest.raises(ValueError, match="condition on label 'zone' must be In, NotIn"):
        NodeLabelSchedulingStrategy({"zone": "eu-1"})
    with pytest.raises(ValueError, match="In\\(...\\) takes one or more label values"):
        In()
    with pytest.raises(ValueError, match="label key 'ray.io/zone' is reserved"):
        ray.init(num_cpus=1, labels={"ray.io/zone": "x"})
    with pytest.raises(ValueError, match="invalid value 'two words' for label 'zone'"):
        ray.init(num_cpus=1, labels={"zone": "two words"})
    assert not ray.is_initialized()
