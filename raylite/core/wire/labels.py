"""Node labels and the requests that select on them: ``init(labels=...)``, the ``label_selector``
option and ``NodeLabelSchedulingStrategy`` (Ray's syntax and checks).

On one node a selector either matches this node, and changes nothing, or can never be met: the
task or actor is then infeasible, as a request for more resources than the node has is, instead
of waiting forever for a node that will never join.
"""
from __future__ import annotations

import re

NODE_ID_KEY = "ray.io/node-id"
ACCELERATOR_TYPE_KEY = "ray.io/accelerator-type"
_NAME = r"[a-zA-Z0-9](?:[a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?"
_KEY = re.compile(rf"(?:{_NAME}(?:\.{_NAME})*/)?{_NAME}")
_VALUE = re.compile(rf"(?:{_NAME})?")
_SELECTOR = re.compile(rf"(!)?(?:in\(\s*({_NAME}(?:\s*,\s*{_NAME})*)\s*\)|({_NAME})?)")


def node_labels(node_id: str, user: dict | None) -> dict[str, str]:
    """This node's labels: its id (Ray's own label) and `init(labels=...)`'s."""
    labels = {NODE_ID_KEY: node_id}
    if user is None:
        return labels
    if not isinstance(user, dict):
        raise TypeError(f"init(labels=...) must be a dict of str to str, got {type(user).__name__}: {user!r}")
    for key, value in user.items():
        _check_key(key, "init(labels=...)")
        if key.startswith("ray.io/"):
            raise ValueError(f"init(labels=...): the label key {key!r} is reserved (ray.io/ keys are set by Ray)")
        if not isinstance(value, str) or not _VALUE.fullmatch(value):
            raise ValueError(f"init(labels=...): invalid value {value!r} for label {key!r}: 63 characters at most, "
                             f"letters, digits, -, _ and ., beginning and ending with a letter or digit")
    return {**labels, **user}


def _check_key(key, where: str) -> None:
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ValueError(f"{where}: invalid label key {key!r}: an optional DNS prefix and /, then a name of 63 "
                         f"characters at most (letters, digits, -, _ and ., beginning and ending with a letter "
                         f"or digit)")


def selector(value, where: str = "label_selector") -> tuple:
    """A ``label_selector`` dict as constraints (key, negated, values); an empty selector is ()."""
    if not isinstance(value, dict):
        raise TypeError(f"{where} must be a dict of label keys to selector strings, got "
                        f"{type(value).__name__}: {value!r}")
    out = []
    for key, text in value.items():
        _check_key(key, where)
        match = _SELECTOR.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise ValueError(f"{where}: invalid selector {text!r} for label {key!r}: use 'value', '!value', "
                             f"'in(a,b)' or '!in(a,b)'")
        negated, listed, single = match.groups()
        values = frozenset(v.strip() for v in listed.split(",")) if listed is not None else frozenset([single or ""])
        out.append((key, bool(negated), values))
    return tuple(out)


def unmet(constraints: tuple, labels: dict) -> str | None:
    """Why this node's labels do not satisfy the constraints, or None when they do. A constraint
    on a label the node lacks holds only when negated (Ray's !value and !in)."""
    for key, negated, values in constraints:
        have = labels.get(key)
        if (have in values) == negated:
            if None in values:   # Exists, DoesNotExist
                wanted = "set" if negated else "unset"
            else:
                wanted = ("not " if negated else "") + (repr(next(iter(values))) if len(values) == 1 else
                                                        "one of " + ", ".join(map(repr, sorted(values))))
            return (f"it selects nodes whose label {key!r} is {wanted}, but this node's is {have!r}" if key in labels
                    else f"it selects nodes whose label {key!r} is {wanted}, but this node has no such label")
    return None


class In:
    def __init__(self, *values: str):
        self.values = list(_strings(values, "In"))


class NotIn:
    def __init__(self, *values: str):
        self.values = list(_strings(values, "NotIn"))


class Exists:
    pass


class DoesNotExist:
    pass


def _strings(values: tuple, op: str) -> tuple:
    if not values or not all(isinstance(v, str) and _VALUE.fullmatch(v) for v in values):
        raise ValueError(f"{op}(...) takes one or more label values (str), got {values!r}")
    return values


class NodeLabelSchedulingStrategy:
    """``scheduling_strategy=`` by node labels: `hard` must hold; `soft` is a preference, which on
    one node changes nothing."""

    def __init__(self, hard: dict, *, soft: dict | None = None):
        self.hard, self.soft = hard, soft
        _conditions(hard, "hard")   # checked now, as Ray does
        if soft is not None:
            _conditions(soft, "soft")

    def constraints(self) -> tuple:
        """The hard conditions in the selector's form."""
        return _conditions(self.hard, "hard")


def _conditions(conditions, field: str) -> tuple:
    """In and NotIn as a selector's in() and !in(); Exists as "not absent", DoesNotExist as "absent"."""
    where = f"NodeLabelSchedulingStrategy({field}=...)"
    if not isinstance(conditions, dict):
        raise TypeError(f"{where} must be a dict of label keys to In, NotIn, Exists or DoesNotExist, got "
                        f"{type(conditions).__name__}: {conditions!r}")
    out = []
    for key, op in conditions.items():
        _check_key(key, where)
        if isinstance(op, (In, NotIn)):
            out.append((key, isinstance(op, NotIn), frozenset(op.values)))
        elif isinstance(op, (Exists, DoesNotExist)):
            out.append((key, isinstance(op, Exists), frozenset([None])))
        else:
            raise ValueError(f"{where}: the condition on label {key!r} must be In, NotIn, Exists or DoesNotExist, "
                             f"got {op!r}")
    return tuple(out)
