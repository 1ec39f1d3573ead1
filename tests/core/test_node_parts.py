"""The node manager's shape (issue 26): its state in one object (raylite.core.node.state), each
responsibility a class given that state and the parts it calls, each need declared as a small
Protocol; no mixins. The first test reads the source; the second checks a running node's wiring."""
import ast
import inspect
import pathlib
import typing

import pytest

import raylite
from raylite.core.node.state import NodeState

NODE_DIR = pathlib.Path(raylite.__file__).parent / "core" / "node"


def _classes() -> dict[str, list[str]]:
    """Every class defined in raylite/core/node/*.py: its name -> the names of its bases."""
    found = {}
    for path in sorted(NODE_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found[f"{path.name}:{node.name}"] = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
    return found


def test_no_class_of_the_node_inherits_from_another_and_node_has_no_bases():
    classes = _classes()
    defined = {key.split(":")[1] for key in classes}
    inheriting = {key: [b for b in bases if b in defined] for key, bases in classes.items()}
    assert {key: bases for key, bases in inheriting.items() if bases} == {}, \
        "a node class subclasses another node class (a mixin is back): give it the state and its peers instead"
    assert classes["manager.py:Node"] == [], "Node is the facade that wires the parts: no base classes"
    assert "Protocol" in {b for bases in classes.values() for b in bases}, "the parts' needs are Protocols"


def test_the_node_keeps_placement_groups_as_plain_data_not_the_clients_handle():
    """The API builds a group's handle (and its ready ref's value); the node stores ids, bundles,
    strategy, name and state, and never imports the client layer's PlacementGroup."""
    importers = []
    for path in sorted(NODE_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "raylite.core.client.placement_group":
                importers.append(path.name)
    assert importers == []


def _protocol_members(proto) -> list[str]:
    return [name for name, value in vars(proto).items() if inspect.isfunction(value) and not name.startswith("_")]


def _needs(part) -> list[tuple[str, type]]:
    """(attribute, Protocol) for each peer the part was built or connected with."""
    needs = []
    for method in ("__init__", "connect"):
        fn = getattr(type(part), method, None)
        if fn is None or fn is object.__init__:
            continue
        hints = typing.get_type_hints(fn, vars(inspect.getmodule(type(part))))
        needs += [(name, hint) for name, hint in hints.items()
                  if getattr(hint, "_is_protocol", False) and name != "return"]
    return needs


@pytest.mark.local_only("white-box: the local node manager's parts")
def test_each_part_gets_peers_that_satisfy_its_protocols(ray_start):
    from raylite.core.api import runtime as api
    node = api._node
    parts = {name: part for name, part in vars(node).items() if getattr(part, "s", None) is node.shared}
    assert isinstance(node.shared, NodeState)
    assert len(parts) >= 12, sorted(parts)
    checked = 0
    for name, part in parts.items():
        for attr, proto in _needs(part):
            peer = getattr(part, attr)
            assert peer is not None, f"{name}.{attr} was never wired"
            for member in _protocol_members(proto):
                assert callable(getattr(peer, member, None)), \
                    f"{name}.{attr} ({type(peer).__name__}) lacks {member}, which {proto.__name__} declares"
                wanted = [p for p in inspect.signature(getattr(proto, member)).parameters if p != "self"]
                given = inspect.signature(getattr(peer, member)).parameters
                takes_any = any(p.kind is p.VAR_POSITIONAL for p in given.values())
                assert takes_any or all(p in given for p in wanted), \
                    f"{name}.{attr}.{member} takes {list(given)}, {proto.__name__} declares {wanted}"
                checked += 1
    assert checked > 40, checked   # (the wiring above is what Node passes its parts)
