"""Ray's compiled graphs (`dag.experimental_compile()`, from Ray's "Compiled Graph" quickstart) on
raylite: the same API and rules, executed as ordinary actor calls."""
import asyncio

import pytest

import raylite as ray
from raylite.dag import InputNode, MultiOutputNode

pytestmark = pytest.mark.local_only("on Ray an actor handle is Ray's, so handle.method.bind() gives Ray's DAG nodes, "
                                    "which take Ray's own ray.dag.InputNode (and compile as Ray's compiled graphs), "
                                    "not raylite's")


def _echo_class():
    @ray.remote
    class EchoActor:
        def echo(self, msg):
            return msg

        def add(self, x, y):
            return x + y

        def fail(self, x):
            raise ValueError(f"bad input {x}")

    return EchoActor


def test_quickstart_chain_and_repeated_executions(ray_start):
    Echo = _echo_class()
    a, b = Echo.remote(), Echo.remote()
    with InputNode() as inp:
        dag = b.echo.bind(a.echo.bind(inp))
    compiled = dag.experimental_compile()
    ref = compiled.execute("hello")
    assert type(ref).__name__ == "CompiledDAGRef"
    assert ray.get(ref) == "hello"
    assert ray.get([compiled.execute(i) for i in range(5)]) == list(range(5))
    with pytest.raises(ValueError, match="can only be called once"):
        ray.get(ref)
    compiled.teardown()
    with pytest.raises(ray.exceptions.RayChannelError):
        compiled.execute("after teardown")


def test_multiple_outputs_inputs_by_position_and_name_and_errors(ray_start):
    Echo = _echo_class()
    a, b = Echo.remote(), Echo.remote()
    with InputNode() as inp:
        dag = MultiOutputNode([a.echo.bind(inp[0]), b.add.bind(inp[1], inp.y)])
    compiled = dag.experimental_compile()
    first, second = compiled.execute("x", 2, y=3)
    assert (ray.get(first), ray.get(second)) == ("x", 5)
    with pytest.raises(ValueError, match="must be called with 2 positional args, got 1"):
        compiled.execute("x", y=3)
    with pytest.raises(ValueError, match="must be called with kwarg `y`"):
        compiled.execute("x", 2)
    with InputNode() as inp:
        failing = a.fail.bind(inp).experimental_compile()
    with pytest.raises(ValueError, match="bad input 7") as info:
        ray.get(failing.execute(7))
    assert isinstance(info.value, ray.exceptions.RayTaskError)


def test_in_flight_executions_are_bounded_until_results_are_got(ray_start):
    Echo = _echo_class()
    a = Echo.remote()
    with InputNode() as inp:
        compiled = a.echo.bind(inp).experimental_compile(_max_inflight_executions=2)
    kept = [compiled.execute(1), compiled.execute(2)]
    with pytest.raises(ray.exceptions.RayCgraphCapacityExceeded, match="more than 2 in-flight executions"):
        compiled.execute(3)
    assert ray.get(kept[1]) == 2   # reading the second reads the first too (Ray buffers it)
    assert ray.get(compiled.execute(3)) == 3
    assert ray.get(kept[0]) == 1
    del kept
    refs = [compiled.execute(i) for i in range(2)]
    del refs   # dropped results no longer count
    assert ray.get(compiled.execute(9)) == 9


def test_execute_async_returns_futures_to_await(ray_start):
    Echo = _echo_class()
    a = Echo.remote()
    with InputNode() as inp:
        compiled = a.echo.bind(inp).experimental_compile(enable_asyncio=True)

    async def main():
        futures = [await compiled.execute_async(i) for i in range(3)]
        return [await f for f in futures]

    assert asyncio.run(main()) == [0, 1, 2]
    with pytest.raises(ValueError, match="Use execute_async if enable_asyncio=True"):
        compiled.execute(1)


def test_rays_rules_for_what_can_be_compiled(ray_start):
    Echo = _echo_class()
    a = Echo.remote()

    @ray.remote
    def task(x):
        return x

    with InputNode() as inp:
        with_task = task.bind(a.echo.bind(inp))
    with pytest.raises(NotImplementedError, match="only support actor method nodes"):
        with_task.experimental_compile()
    with InputNode() as inp:
        on_class_node = Echo.bind().echo.bind(inp)
    with pytest.raises(ValueError, match="already created with Actor.remote"):
        on_class_node.experimental_compile()
    with InputNode() as inp:
        node_as_kwarg = a.add.bind(inp, y=a.echo.bind(inp))
    with pytest.raises(ValueError, match="binding to other DAG nodes as kwargs"):
        node_as_kwarg.experimental_compile()
    with InputNode() as inp:
        mixed = MultiOutputNode([a.echo.bind(inp), a.echo.bind(inp[0])])
    with pytest.raises(ValueError, match="use InputNode\\(\\) directly, or they must index"):
        mixed.experimental_compile()
    with InputNode() as inp:
        transported = a.echo.bind(inp).with_tensor_transport("nccl")
    assert ray.get(transported.experimental_compile().execute(4)) == 4


def test_a_slow_result_times_out_as_rays_channel_does(ray_start):
    @ray.remote
    class Slow:
        def wait(self, seconds):
            import time
            time.sleep(seconds)
            return seconds

    with InputNode() as inp:
        compiled = Slow.remote().wait.bind(inp).experimental_compile()
    with pytest.raises(ray.exceptions.RayChannelTimeoutError):
        ray.get(compiled.execute(2), timeout=0.2)
    assert ray.get(compiled.execute(0)) == 0


def test_a_graph_that_returns_none(ray_start):
    @ray.remote
    class Sink:
        def take(self, x):
            return None

    with InputNode() as inp:
        compiled = Sink.remote().take.bind(inp).experimental_compile()
    assert ray.get(compiled.execute(1)) is None
    assert ray.get([compiled.execute(2), compiled.execute(3)]) == [None, None]


def test_compile_waits_for_the_actors_constructors(ray_start, tmp_path):
    """As Ray's: a slow constructor (a model loading) delays compile, not the first execution's
    get (which has RAY_CGRAPH_get_timeout); one that raised fails compile."""
    import time

    @ray.remote
    class Slow:
        def __init__(self, seconds):
            time.sleep(seconds)

        def echo(self, x):
            return x

    @ray.remote
    class Broken:
        def __init__(self):
            raise RuntimeError("no model")

        def echo(self, x):
            return x

    slow = Slow.remote(1.5)
    with InputNode() as inp:
        dag = slow.echo.bind(inp)
    started = time.monotonic()
    compiled = dag.experimental_compile()
    assert time.monotonic() - started >= 1.0
    assert ray.get(compiled.execute(7), timeout=0.5) == 7
    assert ray.get(slow.__ray_ready__.remote()) is True   # Ray's "constructor done" call
    broken = Broken.remote()
    with InputNode() as inp:
        dag = broken.echo.bind(inp)
    with pytest.raises(ray.exceptions.ActorDiedError, match="no model"):
        dag.experimental_compile()


def test_type_hints_import_from_rays_path_and_change_nothing_here(ray_start):
    from raylite.experimental.channel.torch_tensor_type import TorchTensorType
    Echo = _echo_class()
    a = Echo.remote()
    with InputNode() as inp:
        dag = a.echo.bind(inp).with_type_hint(TorchTensorType(transport=TorchTensorType.ACCELERATOR))
    compiled = dag.experimental_compile()
    assert ray.get(compiled.execute(3)) == 3
    with pytest.raises(ValueError, match="transport="):
        TorchTensorType(transport="pigeon")


def test_visualize_lists_the_graph_and_draws_with_graphviz(ray_start, monkeypatch, tmp_path):
    import sys
    import types
    Echo = _echo_class()
    a, b = Echo.remote(), Echo.remote()
    with InputNode() as inp:
        dag = MultiOutputNode([a.echo.bind(inp), b.add.bind(inp, 1)])
    compiled = dag.experimental_compile()
    text = compiled.visualize(format="ascii")
    assert text.splitlines()[0].startswith("0: InputNode") and text.count("<- 0") == 2
    monkeypatch.setitem(sys.modules, "graphviz", None)   # not installed: Ray's ImportError
    with pytest.raises(ImportError, match="pip install graphviz"):
        compiled.visualize()
    drawn = []

    class Digraph:   # records what a graphviz Digraph is given
        def __init__(self, name, format):
            self.lines = [f"digraph {name} {format}"]

        def node(self, key, label):
            self.lines.append(f"{key} [{label!r}]")

        def edge(self, a, b):
            self.lines.append(f"{a} -> {b}")

        def render(self, filename, view):
            drawn.append(filename)

        @property
        def source(self):
            return "\n".join(self.lines)

    monkeypatch.setitem(sys.modules, "graphviz", types.SimpleNamespace(Digraph=Digraph))
    source = compiled.visualize(filename=str(tmp_path / "g"))
    assert drawn == [str(tmp_path / "g")] and "0 -> 1" in source and "0 -> 2" in source
