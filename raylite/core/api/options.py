"""Task, actor and method options, checked as Ray checks them: a value of the wrong type is a
TypeError, a value of the right type that is out of range a ValueError, an unknown keyword a
ValueError, and every message names the option and the value. Resource quantities are checked
by raylite.core.wire.resources.normalize_request (the one place for requests); the rest here, at
decoration or `.options()` time, so nothing is submitted with a bad option.

Where raylite is stricter than Ray it says so: a bool is not taken for a count (Ray's isinstance
check lets `max_retries=True` through as 1), and `max_pending_calls=0` (no call could ever be
made) is refused.
"""
from __future__ import annotations

from typing import NoReturn

from raylite.core.client import streams

from raylite.core.envs import runtime_env

_COUNT = "an integer"


def _fail_type(key: str, value, expected: str) -> NoReturn:
    raise TypeError(f"option {key} must be {expected}, got {key}={value!r} ({type(value).__name__})")


def _count(key: str, value, minimum: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        _fail_type(key, value, _COUNT + (" (-1: no limit)" if minimum < 0 else ""))
    if value < minimum:
        raise ValueError(f"option {key} must be an integer >= {minimum}"
                         + (" (-1: no limit)" if minimum < 0 else "") + f", got {key}={value!r}")


def _typed(key: str, value, types: tuple, expected: str) -> None:
    if value is not None and (not isinstance(value, types) or (bool not in types and isinstance(value, bool))):
        _fail_type(key, value, expected)


def _text(key: str, value) -> None:
    _typed(key, value, (str,), "a string (or None)")
    if value == "":
        raise ValueError(f"option {key} must be a non-empty string (or None), got {key}=''")


def _flag(key: str, value) -> None:
    _typed(key, value, (bool,), "True or False")


def _num_returns(key: str, value) -> None:
    if value is None or value in streams.MODES:
        return
    if isinstance(value, str):   # Ray's check fails on comparing a string with 0: a TypeError
        _fail_type(key, value, "a non-negative integer, 'streaming' or 'dynamic'")
    _count(key, value, 0)


def _lifetime(key: str, value) -> None:
    _typed(key, value, (str,), "'detached', 'non_detached' or None")
    if value not in (None, "detached", "non_detached"):
        raise ValueError(f"option lifetime must be 'detached', 'non_detached' or None, got lifetime={value!r}")


def _pending_calls(key: str, value) -> None:
    _count(key, value, -1)
    if value == 0:
        raise ValueError("option max_pending_calls must be -1 (no limit) or a positive integer, got "
                         "max_pending_calls=0 (no call could ever be made)")


def _strategy(key: str, value) -> None:
    if value is None or type(value).__name__.endswith("SchedulingStrategy"):
        return
    if not isinstance(value, str):
        _fail_type(key, value, "'DEFAULT', 'SPREAD' or a strategy object (ray.util.scheduling_strategies)")
    if value not in ("DEFAULT", "SPREAD"):
        raise ValueError(f"option scheduling_strategy must be 'DEFAULT', 'SPREAD' or a strategy object "
                         f"(ray.util.scheduling_strategies), got scheduling_strategy={value!r}")


def _group(key: str, value) -> None:
    if value is None or value == "default" or type(value).__name__ == "PlacementGroup":
        return
    _fail_type(key, value, "a placement group made by placement_group() (or None)")


def _bundle_index(key: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail_type(key, value, "an integer (-1: any bundle)")
    if value < -1:
        raise ValueError(f"option placement_group_bundle_index must be -1 (any bundle) or a bundle's index, "
                         f"got placement_group_bundle_index={value!r}")


def _concurrency_groups(key: str, value) -> None:
    _typed(key, value, (dict, list), "a dict of group names to integers >= 1")
    if value is not None and not (isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 1
            for k, v in value.items())):
        raise ValueError(f"option concurrency_groups must map group names to integers >= 1, "
                         f"got concurrency_groups={value!r}")


def _env(key: str, value) -> None:
    if value is not None:   # checked here; applied (and cached) at .remote()
        runtime_env.normalize(value, "option runtime_env")


def _labels(key: str, value) -> None:
    if value is not None:
        from raylite.core.wire import labels   # (only where labels are used: workers stay small)
        labels.selector(value)


def _dict(key: str, value) -> None:
    _typed(key, value, (dict,), "a dict (or None)")


# None: a resource quantity, which normalize_request checks
_COMMON = {"accelerator_type": _text, "memory": None, "name": _text, "num_cpus": None, "num_gpus": None,
           "resources": None, "object_store_memory": lambda k, v: _count(k, v, 0),
           "placement_group": _group, "placement_group_bundle_index": _bundle_index,
           "placement_group_capture_child_tasks": _flag, "runtime_env": _env, "scheduling_strategy": _strategy,
           "label_selector": _labels, "_metadata": _dict, "enable_task_events": _flag, "_labels": _dict}
TASK_OPTIONS = {**_COMMON, "max_calls": lambda k, v: _count(k, v, 0), "max_retries": lambda k, v: _count(k, v, -1),
                "num_returns": _num_returns, "retry_exceptions": lambda k, v: retry_on(v)}
ACTOR_OPTIONS = {**_COMMON, "max_restarts": lambda k, v: _count(k, v, -1),
                 "max_task_retries": lambda k, v: _count(k, v, -1),
                 "max_concurrency": lambda k, v: _count(k, v, 1), "max_pending_calls": _pending_calls,
                 "namespace": _text, "lifetime": _lifetime, "get_if_exists": _flag,
                 "concurrency_groups": _concurrency_groups, "allow_out_of_order_execution": _flag}
METHOD_OPTIONS = {"num_returns": _num_returns, "name": _text, "max_task_retries": lambda k, v: _count(k, v, -1),
                  "retry_exceptions": lambda k, v: retry_on(v), "concurrency_group": _text, "enable_task_events": _flag}


def check(options: dict, allowed: dict, what: str) -> dict:
    """Raise for the first bad option (TypeError or ValueError, as Ray); return `options`."""
    for key, value in options.items():
        if key not in allowed:
            raise ValueError(f"Invalid option keyword {key!r} for {what}; valid options: {sorted(allowed)}")
        if allowed[key] is not None:
            allowed[key](key, value)
    index = options.get("placement_group_bundle_index", -1)
    in_group = (options.get("placement_group", "default") not in ("default", None)
                or type(options.get("scheduling_strategy")).__name__ == "PlacementGroupSchedulingStrategy")
    if index != -1 and not in_group:
        raise ValueError(f"option placement_group_bundle_index={index!r} needs a placement group: pass "
                         f"placement_group= too (or scheduling_strategy=PlacementGroupSchedulingStrategy(pg, "
                         f"placement_group_bundle_index={index!r})); without one it must be -1")
    if options.get("get_if_exists") and not options.get("name"):
        raise ValueError("option get_if_exists=True needs the actor's name: pass name= too")
    return options


def retry_on(value) -> bool | tuple[str, ...]:
    """retry_exceptions as a spec carries it: True, False, or "module.Name" type names (the worker
    matches a raised exception's class and bases against them; names travel where classes may not,
    and not qualified ones: a class defined in a function arrives with its bare name as qualname)."""
    if isinstance(value, bool):
        return value
    if not isinstance(value, (list, tuple)):
        _fail_type("retry_exceptions", value, "True, False or a list of exception types")
    if value and all(isinstance(t, type) and issubclass(t, BaseException) for t in value):
        return tuple(f"{t.__module__}.{t.__name__}" for t in value)
    raise ValueError(f"option retry_exceptions must be True, False or a non-empty list of exception types, "
                     f"got retry_exceptions={value!r}")
