"""What counts as a metric, and how a result is looked at and written: one place for Ray's rules.

Ray counts any `numbers.Number` as a metric (so NumPy's scalars, which register as numbers, count
without numpy being imported here), flattens nested results with "/" before stoppers,
schedulers, searchers and the best-trial lookup see them, and writes NumPy values as JSON numbers
and lists (its SafeFallbackEncoder).
"""
from __future__ import annotations

import math
import numbers


def is_number(v) -> bool:
    """A real number that is not a bool: int, float, or a NumPy scalar such as np.float32."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def is_finite(v) -> bool:
    return is_number(v) and math.isfinite(v)


def flatten(d: dict, prefix: str = "") -> dict:
    """`{"a": {"b": 1}}` -> `{"a/b": 1}` (empty dicts stay values, as in Ray's flatten_dict)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "/"))
        else:
            out[key] = v
    return out


def flat_result(result: dict) -> dict:
    """The result as stoppers, schedulers and searchers see it; itself when nothing is nested, as
    in most results (trials may report thousands a second)."""
    for v in result.values():
        if type(v) is dict and v:
            return flatten(result)
    return result


def lookup(result: dict, name: str):
    """`result[name]`, or for "a/b" the nested `result["a"]["b"]`; None when absent."""
    if name in result:
        return result[name]
    node = result
    for key in name.split("/"):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def json_default(v):
    """JSON for what json cannot write itself: NumPy arrays and scalars as lists and numbers,
    other numbers as int/float, anything else as its repr (readable in the file, never an error)."""
    if type(v).__module__ == "numpy" and hasattr(v, "tolist"):
        return v.tolist()
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        return float(v)
    return repr(v)


# Ray's DEBUG_METRICS: keys every result carries, which alone do not make a result worth checking
_DEBUG_KEYS = frozenset(("trial_id", "experiment_id", "date", "timestamp", "pid", "hostname", "node_ip", "config",
                         "done"))


def check_metrics(flat: dict, expected: list[tuple[str, str]]) -> None:
    """Ray's strict metric check: a result that lacks a metric the experiment ranks or stops trials
    by (`expected`: (metric, who expects it)) is a ValueError, so a typo fails the first result
    instead of a sweep whose every trial silently goes unranked. Results of only debug keys pass."""
    if sum(k not in _DEBUG_KEYS for k in flat) <= 1:
        return
    for metric, where in expected:
        if metric not in flat:
            raise ValueError(f"Trial returned a result which did not include the specified metric(s) `{metric}` "
                             f"that `{where}` expects. Make sure your calls to `tune.report()` include the metric, "
                             f"or set the TUNE_DISABLE_STRICT_METRIC_CHECKING environment variable to 1. "
                             f"Result: {flat}")
