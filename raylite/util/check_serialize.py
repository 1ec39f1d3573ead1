"""``ray.util.inspect_serializability``: which part of a function or object keeps it from being
sent to a worker. It tries to pickle the object as a task would (cloudpickle), and on failure
looks inside, depth first: a function's closure variables and the globals it names, an object's
attributes. The innermost parts that fail are the culprits, as in Ray's report."""
from __future__ import annotations

import inspect
import sys
from typing import Any


class FailureTuple:
    """One part that cannot be pickled: the object, its path of names from the inspected object
    (``("train", "lock")``), and the object it was found in."""

    def __init__(self, obj: Any, path: tuple, parent: Any):
        self.obj, self.path, self.parent = obj, path, parent

    @property
    def name(self) -> str:
        return self.path[-1] if self.path else ""

    def __repr__(self) -> str:
        return f"FailTuple({self.name} [path={'.'.join(self.path)}, obj={self.obj!r}, parent={self.parent!r}])"


def inspect_serializability(base_obj: Any, name: str | None = None, depth: int = 3,
                            print_file: Any = None) -> tuple[bool, set[FailureTuple]]:
    """(whether `base_obj` can be sent to a worker, the parts that cannot), printing what it
    looked at, indented by depth."""
    name = name or getattr(base_obj, "__name__", None) or type(base_obj).__name__
    out = print_file if print_file is not None else sys.stdout
    print(f"Checking serializability of {name!r}", file=out)
    failures: set[FailureTuple] = set()
    ok = _serializable(base_obj)
    if not ok:
        _look_inside(base_obj, (name,), depth, failures, out, 1)
        if not failures:   # nothing inside fails alone: the object itself is the culprit
            failures.add(FailureTuple(base_obj, (name,), None))
    print(f"{name!r} {'can' if ok else 'cannot'} be serialized" +
          ("" if ok else f"; the parts that cannot: {', '.join('.'.join(f.path) for f in failures)}"), file=out)
    return ok, failures


def _serializable(obj: Any) -> bool:
    from raylite.core.wire import serialization
    try:
        serialization.dumps_function(obj)
        return True
    except Exception:  # noqa: BLE001 - any pickling failure counts
        return False


def _parts(obj: Any) -> list[tuple[str, Any]]:
    """(name, value) of what pickling `obj` takes with it."""
    if inspect.isfunction(obj):
        code, parts = obj.__code__, []
        if obj.__closure__:
            parts += [(n, c.cell_contents) for n, c in zip(code.co_freevars, obj.__closure__)
                      if _has_contents(c)]
        parts += [(n, obj.__globals__[n]) for n in code.co_names if n in obj.__globals__
                  and not inspect.ismodule(obj.__globals__[n])]
        return parts
    if inspect.ismethod(obj):
        return [("__self__", obj.__self__), ("__func__", obj.__func__)]
    if isinstance(obj, dict):
        return [(str(k), v) for k, v in obj.items()]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [(str(i), v) for i, v in enumerate(obj)]
    return list(getattr(obj, "__dict__", {}).items())


def _has_contents(cell) -> bool:
    try:
        cell.cell_contents
        return True
    except ValueError:   # not assigned yet
        return False


def _look_inside(obj: Any, path: tuple, depth: int, failures: set, out, level: int) -> None:
    if depth <= 0:
        return
    for part_name, part in _parts(obj):
        if _serializable(part):
            continue
        print("  " * level + f"{part_name!r} ({type(part).__name__}) cannot be serialized", file=out)
        before = len(failures)
        _look_inside(part, path + (part_name,), depth - 1, failures, out, level + 1)
        if len(failures) == before:   # nothing inside it fails on its own: it is a culprit
            failures.add(FailureTuple(part, path + (part_name,), obj))
