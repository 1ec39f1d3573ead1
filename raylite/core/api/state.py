"""Ray's state API (``ray.util.state``; its logs are raylite.core.api.state_logs) and ``ray.timeline()`` on
the local runtime.

The node answers with plain rows (raylite.core.node.snapshot); here they are filtered, limited and
returned as Ray's record classes, which allow both ``rec.state`` and ``rec["state"]``. The
functions keep Ray's signatures: ``filters=[(column, "=" or "!=", value)]`` on the columns Ray
lets you filter (strings compare without case), ``limit`` (100), ``detail`` (the extra columns;
without it they are None, as in Ray), and ``raise_on_missing_output``: when the bounded task
record (raylite.core.node.events) has dropped finished tasks, task listings raise
``RayStateApiException`` unless it is False, as Ray does once its own bound drops task events.
``address`` and ``timeout`` are accepted for Ray code; the one local node answers at once. On the
Ray backend every function is Ray's own.
"""
from __future__ import annotations

import sys
import warnings

from raylite.core.client import link
from raylite.core.client.objects import ObjectRef
from raylite.core.client.link import process
from raylite.core.node import events

DEFAULT_LIMIT = 100
DEFAULT_RPC_TIMEOUT = 30


class RayStateApiException(Exception):
    """The state could not be returned in full (Ray's ray.util.state.exception class)."""


class StateRecord:
    """Base of the record classes. ``columns`` is (base, detail): column names in Ray's order,
    a trailing ``*`` marking one that filters may use."""

    columns: tuple[str, str] = ("", "")
    fields: tuple[str, ...] = ()
    base: frozenset = frozenset()
    filterable: frozenset = frozenset()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        base, detail = (part.split() for part in cls.columns)
        cls.fields = tuple(c.rstrip("*") for c in base + detail)
        cls.base = frozenset(c.rstrip("*") for c in base)
        cls.filterable = frozenset(c.rstrip("*") for c in base + detail if c.endswith("*"))

    def __init__(self, **values):
        for name in self.fields:
            setattr(self, name, values.get(name))

    def __getitem__(self, key: str):
        return getattr(self, key)

    def __setitem__(self, key: str, value) -> None:
        setattr(self, key, value)

    def get(self, key: str, default=None):
        return getattr(self, key, default)

    def asdict(self) -> dict:
        return {name: getattr(self, name) for name in self.fields}

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.asdict() == self.asdict()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.asdict().items())})"


class ActorState(StateRecord):
    columns = ("actor_id* class_name* state* job_id* name* node_id* pid* ray_namespace*",
               "serialized_runtime_env required_resources death_cause is_detached placement_group_id* "
               "repr_name* num_restarts num_restarts_due_to_lineage_reconstruction "
               "num_restarts_due_to_node_preemption call_site label_selector fallback_strategy")


class TaskState(StateRecord):
    columns = ("task_id* attempt_number* name* state* job_id* actor_id* type* func_or_class_name* "
               "parent_task_id* node_id* worker_id* worker_pid* error_type*",
               "language* required_resources runtime_env_info placement_group_id* events profiling_data "
               "creation_time_ms start_time_ms end_time_ms task_log_info error_message is_debugger_paused* "
               "call_site label_selector fallback_strategy")


class ObjectState(StateRecord):
    # reference_count: raylite's own column, the object table's count of refs to the object
    columns = ("object_id* object_size* task_status* attempt_number* reference_type* call_site* type* pid* ip* "
               "reference_count", "")


class NodeState(StateRecord):
    columns = ("node_id* node_ip* is_head_node* state* state_message node_name* resources_total labels",
               "start_time_ms end_time_ms")


class WorkerState(StateRecord):
    columns = ("worker_id* is_alive* worker_type* exit_type* node_id* ip* pid*",
               "exit_detail worker_launch_time_ms worker_launched_time_ms start_time_ms end_time_ms "
               "debugger_port* num_paused_threads*")


class PlacementGroupState(StateRecord):
    columns = ("placement_group_id* name* creator_job_id* state*",
               "bundles is_detached* stats topology_strategy topology_assignments")


class JobState(StateRecord):
    columns = ("job_id* submission_id* entrypoint type* status* message error_type driver_info",
               "start_time end_time metadata runtime_env driver_agent_http_address driver_node_id "
               "driver_exit_code")


class RuntimeEnvState(StateRecord):
    columns = ("runtime_env* success* creation_time_ms node_id*", "ref_cnt error*")


class ClusterEventState(StateRecord):
    columns = ("severity* time source_type* message event_id*", "custom_fields")


# ---------------------------------------------------------------- plumbing
def _ray_state():
    """Ray's ``ray.util.state`` while raylite runs on Ray, else None."""
    if link.on_ray():
        return process.ray.state_api()
    return None


def _query(what: str, detail: bool) -> tuple[list[dict], int]:
    return link.require().state(what, detail)


def _checked(filters, cls: type[StateRecord]) -> list[tuple]:
    out = []
    for item in filters or ():
        if not isinstance(item, (tuple, list)) or len(item) != 3:
            raise ValueError(f"The given filter has incorrect input type, {item!r}. "
                             "Provide (key, predicate, value) tuples.")
        key, predicate, value = item
        if predicate not in ("=", "!="):
            raise ValueError(f"Unsupported filter predicate {predicate!r} is given. Available predicates: =, !=.")
        key = str(key).lower()
        if key not in cls.filterable:
            raise ValueError(f"The given filter column {key!r} is not supported by {cls.__name__}. "
                             f"Supported filter columns: {', '.join(sorted(cls.filterable))}")
        out.append((key, predicate, value))
    return out


def _equal(have, value) -> bool:
    """Ray's filter comparison: strings without case; a string value read as the column's type."""
    if isinstance(value, str) and not isinstance(have, str) and have is not None:
        if isinstance(have, bool):
            return have == (value.lower() == "true")
        if isinstance(have, int):
            try:
                return have == int(value)
            except ValueError:
                return False
    if isinstance(value, str) and isinstance(have, str):
        return have.lower() == value.lower()
    return have == value


def _matches(row: dict, checked: list[tuple]) -> bool:
    return all(_equal(row.get(key), value) == (predicate == "=") for key, predicate, value in checked)


def _record(cls: type[StateRecord], row: dict, detail: bool) -> StateRecord:
    return cls(**(row if detail else {k: v for k, v in row.items() if k in cls.base}))


def _missing(what: str, dropped: int, kept: int) -> str:
    return (f"Failed to retrieve all {kept + dropped} {what} because {dropped} finished ones were dropped from "
            f"the bounded task record (the newest {kept} are kept; {events.LIMIT_ENV} sets the bound before "
            f"init). To avoid raising an exception and allow having missing output, set "
            f"`raise_on_missing_output=False`.")


def _list(what: str, cls: type[StateRecord], filters, limit: int, detail: bool, raise_on_missing_output: bool,
          _explain: bool) -> list:
    checked = _checked(filters, cls)
    rows, dropped = _query(what, detail)
    if dropped and raise_on_missing_output:
        raise RayStateApiException(_missing(what, dropped, len(rows)))
    rows = [row for row in rows if _matches(row, checked)]
    if _explain and len(rows) > limit:
        warnings.warn(f"Limit last {limit} entries (Total {len(rows)}). Use `filters` to reduce the amount of "
                      f"data to return or setting a higher `limit` to see all data.", stacklevel=3)
    return [_record(cls, row, detail) for row in rows[:max(0, limit)]]


# ---------------------------------------------------------------- the API
def _lister(kind: str, cls: type, name: str, doc: str):
    """One of Ray's list_* functions, with Ray's signature: the local node's rows, or Ray's own."""
    def list_state(address: str | None = None, filters: list | None = None, limit: int = DEFAULT_LIMIT,
                   timeout: int = DEFAULT_RPC_TIMEOUT, detail: bool = False, raise_on_missing_output: bool = True,
                   _explain: bool = False) -> list:
        if (ray := _ray_state()) is not None:
            return getattr(ray, name)(address, filters, limit, timeout, detail, raise_on_missing_output, _explain)
        return _list(kind, cls, filters, limit, detail, raise_on_missing_output, _explain)
    list_state.__name__ = list_state.__qualname__ = name
    list_state.__doc__ = doc
    return list_state


list_actors = _lister("actors", ActorState, "list_actors", "Actors alive, and dead ones while their record is kept.")
list_tasks = _lister("tasks", TaskState, "list_tasks", "Tasks, actor creations and actor calls: unfinished ones, "
                     "then the newest finished ones kept.")
list_objects = _lister("objects", ObjectState, "list_objects", "Objects in the object table: size in bytes, "
                       "producing task's status, ref count.")
list_nodes = _lister("nodes", NodeState, "list_nodes", "The one local node.")
list_workers = _lister("workers", WorkerState, "list_workers", "The driver, the worker processes alive, and the "
                       "last 1,000 that ended (is_alive False, with Ray's exit_type; exit_detail with detail=True).")
list_placement_groups = _lister("placement_groups", PlacementGroupState, "list_placement_groups",
                                "Placement groups, with their bundles and state.")
list_jobs = _lister("jobs", JobState, "list_jobs", "The one job: this driver's (type DRIVER, status RUNNING).")
list_runtime_envs = _lister("runtime_envs", RuntimeEnvState, "list_runtime_envs",
                            "Every runtime_env a worker started with, and those that could not be set up "
                            "(success False; their error with detail=True).")


def list_cluster_events(address: str | None = None, filters: list | None = None, limit: int = DEFAULT_LIMIT,
                        timeout: int = DEFAULT_RPC_TIMEOUT, detail: bool = False,
                        raise_on_missing_output: bool = True, _explain: bool = False) -> list[dict]:
    """The last 1,000 events, oldest first, as dicts (as Ray returns them): workers that died
    unexpectedly (severity ERROR when the out-of-memory killer ended them), work that can never be
    scheduled, runtime_envs that could not be set up."""
    if (ray := _ray_state()) is not None:
        return ray.list_cluster_events(address, filters, limit, timeout, detail, raise_on_missing_output, _explain)
    return [record.asdict() if detail else {k: record[k] for k in ClusterEventState.fields if k in ClusterEventState.base}
            for record in _list("cluster_events", ClusterEventState, filters, limit, detail, raise_on_missing_output,
                                _explain)]


def _getter(kind: str, cls: type, column: str, name: str, doc: str, every: bool = False):
    """One of Ray's get_* functions, with Ray's signature: the record whose ``column`` is ``id``
    (with the detail columns), or None; ``every``: all such records, or None if there are none."""
    def get_state(id: str, address: str | None = None, timeout: int = DEFAULT_RPC_TIMEOUT,
                  _explain: bool = False):
        if (ray := _ray_state()) is not None:
            return getattr(ray, name)(id, address, timeout, _explain)
        found = _list(kind, cls, [(column, "=", id)], sys.maxsize, True, False, _explain)
        return (found if every else found[0]) if found else None
    get_state.__name__ = get_state.__qualname__ = name
    get_state.__doc__ = doc
    return get_state


get_actor = _getter("actors", ActorState, "actor_id", "get_actor",
                    "One actor by its hex id (``handle._actor_id`` on Ray; ``get_actor_id()`` inside it), or None.")
get_worker = _getter("workers", WorkerState, "worker_id", "get_worker", "One worker process by its id, or None.")
get_node = _getter("nodes", NodeState, "node_id", "get_node", "The node, given its id; else None.")
get_placement_group = _getter("placement_groups", PlacementGroupState, "placement_group_id", "get_placement_group",
                              "One placement group by its hex id, or None.")
get_objects = _getter("objects", ObjectState, "object_id", "get_objects",
                      "The object with that hex id (``ref.hex()``) as a one-record list, or None.", every=True)
get_job = _getter("jobs", JobState, "submission_id", "get_job",
                  "A submitted job by its submission id, as Ray's (which finds no driver job by its job id): "
                  "raylite has no job submission, so this is None; list_jobs() has the driver's job.")


def get_task(id, address: str | None = None, timeout: int = DEFAULT_RPC_TIMEOUT,
             _explain: bool = False) -> TaskState | None:
    """One task by its hex id, or by an ObjectRef it returns; None if no record of it is kept."""
    if (ray := _ray_state()) is not None:
        return ray.get_task(id, address, timeout, _explain)
    key = id.hex() if isinstance(id, ObjectRef) else str(id).lower()
    rows, _ = _query("tasks", True)
    found = next((row for row in rows if key in (row["task_id"], row["return_id"])), None)
    return None if found is None else _record(TaskState, found, True)


def summarize_tasks(address: str | None = None, timeout: int = DEFAULT_RPC_TIMEOUT,
                    raise_on_missing_output: bool = True, _explain: bool = False) -> dict:
    """Task counts per name and state, in Ray's shape: ``{"cluster": {"summary": {...}, ...}}``."""
    if (ray := _ray_state()) is not None:
        return ray.summarize_tasks(address, timeout, raise_on_missing_output, _explain)
    rows, dropped = _query("tasks", False)
    if dropped and raise_on_missing_output:
        raise RayStateApiException(_missing("tasks", dropped, len(rows)))
    summary: dict[str, dict] = {}
    totals = {"NORMAL_TASK": 0, "ACTOR_TASK": 0, "ACTOR_CREATION_TASK": 0}
    for row in rows:
        entry = summary.setdefault(row["name"], {"func_or_class_name": row["name"], "type": row["type"],
                                                 "state_counts": {}})
        entry["state_counts"][row["state"]] = entry["state_counts"].get(row["state"], 0) + 1
        totals[row["type"]] += 1
    return {"cluster": {"summary": summary, "total_tasks": totals["NORMAL_TASK"],
                        "total_actor_tasks": totals["ACTOR_TASK"],
                        "total_actor_scheduled": totals["ACTOR_CREATION_TASK"], "summary_by": "func_name"}}


def summarize_actors(address: str | None = None, timeout: int = DEFAULT_RPC_TIMEOUT,
                     raise_on_missing_output: bool = True, _explain: bool = False) -> dict:
    """Actor counts per class and state, in Ray's shape: ``{"cluster": {"summary": {...}, ...}}``."""
    if (ray := _ray_state()) is not None:
        return ray.summarize_actors(address, timeout, raise_on_missing_output, _explain)
    rows, _ = _query("actors", False)
    summary: dict[str, dict] = {}
    for row in rows:
        entry = summary.setdefault(row["class_name"], {"class_name": row["class_name"], "state_counts": {}})
        entry["state_counts"][row["state"]] = entry["state_counts"].get(row["state"], 0) + 1
    return {"cluster": {"summary": summary, "total_actors": len(rows), "summary_by": "class"}}


def summarize_objects(address: str | None = None, timeout: int = DEFAULT_RPC_TIMEOUT,
                      raise_on_missing_output: bool = True, _explain: bool = False) -> dict:
    """Object counts and sizes per call site, in Ray's shape: ``{"cluster": {"summary": {...}, ...}}``.
    Call sites are not recorded (as by Ray's default), so every object is under "disabled"."""
    if (ray := _ray_state()) is not None:
        return ray.summarize_objects(address, timeout, raise_on_missing_output, _explain)
    rows, _ = _query("objects", False)
    summary: dict[str, dict] = {}
    holders: dict[str, tuple[set, set]] = {}   # call site -> (pids, ips) referencing its objects
    total_mb = 0.0
    for row in rows:
        key = row["call_site"]
        entry = summary.get(key)
        if entry is None:
            entry = summary[key] = {"total_objects": 0, "total_size_mb": 0.0, "total_num_workers": 0,
                                    "total_num_nodes": 0, "task_state_counts": {}, "task_attempt_number_counts": {},
                                    "ref_type_counts": {}}
            holders[key] = (set(), set())
        for counts, value in ((entry["task_state_counts"], row["task_status"]),
                              (entry["task_attempt_number_counts"], str(row["attempt_number"])),
                              (entry["ref_type_counts"], row["reference_type"])):
            counts[value] = counts.get(value, 0) + 1
        entry["total_objects"] += 1
        if row["object_size"] != -1:   # Ray's "size unknown"
            entry["total_size_mb"] += row["object_size"] / 1024 ** 2
            total_mb += row["object_size"] / 1024 ** 2
        holders[key][0].add(row["pid"])
        holders[key][1].add(row["ip"])
    for key, (pids, ips) in holders.items():
        summary[key]["total_num_workers"], summary[key]["total_num_nodes"] = len(pids), len(ips)
    return {"cluster": {"summary": summary, "total_objects": len(rows), "total_size_mb": total_mb,
                        "callsite_enabled": "disabled" not in summary, "summary_by": "callsite"}}


def timeline(filename: str | None = None) -> list[dict] | None:
    """The finished tasks kept (see list_tasks) as Chrome trace events (chrome://tracing,
    Perfetto): the list, or, given ``filename``, written there as JSON."""
    if not link.is_initialized():
        raise RuntimeError("Ray has not been started yet. Timeline requires Ray to be initialized first.")
    return link.backend().timeline(filename)
