"""Ray's lazy DAG API: `.bind()` on remote functions, actor classes and actor methods, InputNode,
MultiOutputNode and `execute()`, with Ray's semantics (checked against Ray 2.60): each node runs
once per execute, a ClassNode's actor is created per execute and its calls run in bind order."""
import subprocess
import sys
import types

import pytest

import raylite as ray
from raylite.dag import (ClassMethodNode, ClassNode, DAGInputData, FunctionNode, InputAttributeNode, InputNode,
                         MultiOutputNode)

# execute() warns as Ray 2.60's does; test_execute_warns_as_ray_does checks it
pytestmark = pytest.mark.filterwarnings("ignore:DAGNode.execute:DeprecationWarning")


def _counter_class():
    @ray.remote
    class Counter:
        def __init__(self, start=0):
            self.n = start

        def inc(self, k=1):
            self.n += k
            return self.n

        def get(self):
            return self.n

        @ray.method(num_returns=2)
        def pair(self):
            return self.n, -self.n

    return Counter


# --------------------------------------------------------------------------
# functions
# --------------------------------------------------------------------------


def test_function_nodes_compute_through_the_graph(ray_start):
    @ray.remote
    def inc(x):
        return x + 1

    @ray.remote
    def add(a, b):
        return a + b

    dag = add.bind(inc.bind(1), b=inc.bind(inc.bind(10)))
    assert isinstance(dag, FunctionNode)
    ref = dag.execute()
    assert isinstance(ref, ray.ObjectRef)
    assert ray.get(ref) == 2 + 12
    assert ray.get(dag.execute()) == 14   # a graph runs again on every execute


def test_options_bind_keeps_the_options(ray_start):
    @ray.remote
    def two():
        return 1, 2

    refs = two.options(num_returns=2).bind().execute()
    assert isinstance(refs, list) and ray.get(refs) == [1, 2]
    with pytest.raises(ValueError, match="'nope'"):
        two.options(nope=1).bind()


def test_nodes_nested_in_lists_and_dicts_arrive_as_refs(ray_start):
    """As with .remote(): only top-level arguments are resolved."""
    @ray.remote
    def inc(x):
        return x + 1

    @ray.remote
    def inspect(items, table):
        assert all(isinstance(r, ray.ObjectRef) for r in [*items, table["k"]])
        return ray.get(list(items)) + [ray.get(table["k"])]

    assert ray.get(inspect.bind((inc.bind(1), inc.bind(2)), {"k": inc.bind(3)}).execute()) == [2, 3, 4]


@pytest.mark.local_only("on Ray, actor handles are Ray's: their .bind gives Ray's DAG nodes")
def test_a_shared_node_runs_once_per_execute(ray_start):
    @ray.remote
    def add(a, b):
        return a + b

    counter = _counter_class().remote()
    shared = counter.inc.bind()
    dag = add.bind(shared, add.bind(shared, 100))
    assert ray.get(dag.execute()) == 1 + 101
    assert ray.get(counter.get.remote()) == 1
    assert ray.get(dag.execute()) == 2 + 102
    assert ray.get(counter.get.remote()) == 2


def test_a_long_chain_executes_without_recursion(ray_start):
    @ray.remote
    def inc(x):
        return x + 1

    node = inc.bind(0)
    for _ in range(sys.getrecursionlimit()):
        node = inc.bind(node)
    assert ray.get(node.execute(), timeout=30) == sys.getrecursionlimit() + 1


# --------------------------------------------------------------------------
# actors
# --------------------------------------------------------------------------


def test_class_node_makes_a_new_actor_per_execute_and_runs_calls_in_bind_order(ray_start):
    actor = _counter_class().bind(10)
    assert isinstance(actor, ClassNode)
    actor.inc.bind(1)
    actor.inc.options(num_returns=1).bind(k=2)
    total = actor.get.bind()
    assert isinstance(total, ClassMethodNode)
    # only `total` is executed, yet the calls bound before it on the same actor run first
    assert ray.get(total.execute()) == 13
    assert ray.get(total.execute()) == 13   # a fresh actor: state does not carry over

    handle = _counter_class().bind(5).execute()
    assert isinstance(handle, ray.ActorHandle)
    assert ray.get(handle.inc.remote()) == 6


def test_class_node_passed_to_a_task_arrives_as_a_handle(ray_start):
    @ray.remote
    def bump(counter):
        return ray.get(counter.inc.remote(7))

    assert ray.get(bump.bind(_counter_class().bind(1)).execute()) == 8


@pytest.mark.local_only("on Ray, actor handles are Ray's: their .bind gives Ray's DAG nodes")
def test_binding_on_an_existing_handle_keeps_the_actors_state(ray_start):
    counter = _counter_class().remote()
    with InputNode() as inp:
        dag = counter.inc.bind(inp)
    assert [ray.get(dag.execute(k)) for k in (1, 2, 3)] == [1, 3, 6]
    assert ray.get(counter.inc.options(num_returns=1).bind(4).execute()) == 10
    first, second = counter.pair.bind()   # num_returns=2: a node per return value, as Ray gives
    assert ray.get(MultiOutputNode([first, second]).execute()) == [10, -10]


def test_actor_pipeline_from_rays_docs(ray_start):
    Counter = _counter_class()

    @ray.remote
    def combine(a, b):
        return a + b

    with InputNode() as inp:
        m1 = Counter.bind(1)
        m2 = Counter.bind(2)
        dag = combine.bind(m1.inc.bind(inp[0]), m2.inc.bind(inp.x))
    assert ray.get(dag.execute(1, x=2)) == (1 + 1) + (2 + 2)


# --------------------------------------------------------------------------
# InputNode and MultiOutputNode
# --------------------------------------------------------------------------


def test_input_node_indexing_keys_and_attributes(ray_start):
    @ray.remote
    def echo(*args):
        return args

    with InputNode() as inp:
        assert isinstance(inp[0], InputAttributeNode) and isinstance(inp.x, InputAttributeNode)
        parts = echo.bind(inp[0], inp[-1], inp.x, inp["y"])
        whole = echo.bind(inp)
        nested = echo.bind([inp, inp[0]])
    assert ray.get(parts.execute(1, 2, x=3, y=4)) == (1, 2, 3, 4)
    # a single argument is the whole input: inp[i] / inp["k"] / inp.k read from it
    assert ray.get(echo.bind(inp.x).execute(types.SimpleNamespace(x=5))) == (5,)
    assert ray.get(echo.bind(inp[0], inp[1]).execute([7, 8])) == (7, 8)
    assert ray.get(echo.bind(inp["k"]).execute({"k": 9})) == (9,)
    assert ray.get(whole.execute(10)) == (10,)
    assert ray.get(nested.execute([11])) == ([[11], 11],)
    # several arguments (or keywords) reach a bare `inp` as DAGInputData, as in Ray
    (data,) = ray.get(whole.execute(1, 2, k=3))
    assert isinstance(data, DAGInputData) and (data[0], data[1], data["k"]) == (1, 2, 3)
    # an ObjectRef input is resolved like any top-level argument
    assert ray.get(whole.execute(ray.put(12))) == (12,)


def test_multi_output_node_returns_a_list(ray_start):
    @ray.remote
    def square(x):
        return x * x

    with InputNode() as inp:
        dag = MultiOutputNode([square.bind(inp), square.bind(square.bind(inp))])
    refs = dag.execute(3)
    assert isinstance(refs, list) and all(isinstance(r, ray.ObjectRef) for r in refs)
    assert ray.get(refs) == [9, 81]
    assert ray.get(MultiOutputNode((square.bind(2),)).execute()) == [4]
    assert MultiOutputNode([1, "a"]).execute() == [1, "a"]
    with pytest.raises(ValueError, match="list or tuple of nodes.*FunctionNode"):
        MultiOutputNode(square.bind(2))


# --------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------


def test_missing_or_unreadable_input_is_named(ray_start):
    @ray.remote
    def add(a, b):
        return a + b

    with InputNode() as inp:
        dag = add.bind(inp[0], inp.y)
    assert ray.get(dag.execute(1, y=2)) == 3
    with pytest.raises(IndexError, match=r"inp\[0\], but execute\(\) got 0 positional argument\(s\)"):
        dag.execute(y=2)
    with pytest.raises(KeyError, match=r"inp.y, but execute\(\) got 2 positional argument\(s\) and keyword"):
        dag.execute(1, 2)
    with pytest.raises(TypeError, match=r"inp\[0\] from execute\(\)'s only argument, 1 \(int\), which is the "
                                        r"whole input: 'int' object is not subscriptable"):
        dag.execute(1)
    with pytest.raises(AttributeError, match="'list' object has no attribute 'y'"):
        dag.execute([1, 2])


def test_input_node_misuse_raises_as_ray_does(ray_start):
    @ray.remote
    def add(a, b):
        return a + b

    outside = InputNode()
    with pytest.raises(AssertionError, match="with InputNode"):
        add.bind(outside, 1).execute(1)
    with InputNode() as first, InputNode() as second:
        two_inputs = add.bind(first, second)
    with pytest.raises(AssertionError, match="only have one unique InputNode"):
        two_inputs.execute(1)
    with pytest.raises(ValueError, match=r"args=\(1,\)"):
        InputNode(1)
    with pytest.raises(AssertionError, match=r"int index or a str key, got inp\[1.5\]"):
        first[1.5]
    with pytest.raises(ValueError, match="InputNode cannot be an argument of Counter.bind"):
        _counter_class().bind([first])


def test_node_misuse_is_a_clear_error(ray_start):
    @ray.remote
    def inc(x):
        return x + 1

    node = inc.bind(1)
    with pytest.raises(AttributeError, match="bind.*cannot be used again on FunctionNode"):
        node.bind(2)
    with pytest.raises(AttributeError, match=r"use \.execute\(\)"):
        node.remote()
    actor = _counter_class().bind()
    with pytest.raises(AttributeError, match="actor class Counter has no method 'nope'"):
        actor.nope
    with pytest.raises(AttributeError, match=r"Use \.bind\(\)"):
        actor.inc.remote()
    with pytest.raises(ValueError, match="'nope'"):
        actor.inc.options(nope=1)
    ray_node = type("ClassMethodNode", (), {"__module__": "ray.dag.class_node"})()
    with pytest.raises(TypeError, match="Ray's own DAG API"):
        inc.bind(ray_node)


def test_execute_warns_as_ray_does(ray_start):
    @ray.remote
    def inc(x):
        return x + 1

    with pytest.warns(DeprecationWarning, match=r"DAGNode.execute\(\) is deprecated"):
        ref = inc.bind(1).execute()
    assert ray.get(ref) == 2


def test_dag_is_a_lazy_submodule():
    code = ("import sys, raylite\n"
            "assert 'raylite.dag' not in sys.modules\n"
            "assert raylite.dag.InputNode.__name__ == 'InputNode'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_rays_submodule_imports_give_the_same_classes():
    """Ray's DAG docs import from the submodules (`from ray.dag.input_node import InputNode`)."""
    from raylite import dag
    from raylite.dag.class_node import ClassMethodNode, ClassNode
    from raylite.dag.dag_node import DAGNode
    from raylite.dag.function_node import FunctionNode
    from raylite.dag.input_node import DAGInputData, InputAttributeNode, InputNode
    from raylite.dag.output_node import MultiOutputNode
    assert (ClassMethodNode, ClassNode, DAGNode, FunctionNode, DAGInputData, InputAttributeNode, InputNode,
            MultiOutputNode) == (dag.ClassMethodNode, dag.ClassNode, dag.DAGNode, dag.FunctionNode,
                                 dag.DAGInputData, dag.InputAttributeNode, dag.InputNode, dag.MultiOutputNode)
