"""The node's tables as Ray's state API rows (plain dicts, so they pickle to a worker that asks):
tasks from the event record (raylite.core.node.events), actors, objects, workers, the node, its
placement groups and the job, and the finished tasks as Chrome trace events for ``timeline()``;
also the unfinished actor calls (for ``cancel``) and the workers' log directory.

Runs in the node manager, under its lock (``Node.state``); the public side, with filters, limits
and Ray's record classes, is raylite.core.api.state.
"""
from __future__ import annotations

import os

from raylite.core.envs import runtime_env
from raylite.core.node import events
from raylite.core.wire.ids import NODE_IP
from raylite.core.wire.resources import from_fixed

_TASK_TYPES = {"task": "NORMAL_TASK", "actor_create": "ACTOR_CREATION_TASK", "actor_call": "ACTOR_TASK"}
_ACTOR_STATES = {"PENDING": "PENDING_CREATION", "ALIVE": "ALIVE", "RESTARTING": "RESTARTING", "DEAD": "DEAD"}


def view(node, what: str, detail: bool) -> tuple[list[dict], int]:
    """(rows, records dropped by the event bound) of one kind of state."""
    node.task_events.settle()
    rows = _VIEWS[what](node, detail)
    return rows, node.task_events.dropped if what in ("tasks", "timeline") else 0


def _hex(n: int | None, width: int = 28) -> str | None:
    return None if n is None else f"{n:0{width}x}"


def _ms(t: float | None) -> int | None:
    return None if t is None else int(t * 1000)


def _resources(units: dict | None) -> dict:
    return {k: from_fixed(v) for k, v in (units or {}).items()}


def _task_name(spec) -> str:
    return f"{spec.name}.__init__" if spec.kind == "actor_create" else spec.name


# ---------------------------------------------------------------- tasks
def _calls_running(node) -> set[int]:
    """Actor calls sent to their actor that run now, once its constructor is done: each
    one-at-a-time actor's first (they run in order), every call sent to another actor."""
    record = node.task_events
    running = set()
    for actor in node.actors.values():
        creation = record.live.get(actor.spec.task_id)
        if not actor.inflight or creation is None or creation.state is None:
            continue
        if actor.spec.actor_id in record.free_at:
            running.add(next(iter(actor.inflight)))
        else:
            running.update(actor.inflight)
    return running


def task_state(node, rec: events.TaskEvent, running: set[int]) -> str:
    """Ray's TaskStatus: the outcome of a finished task, else where the node has it now."""
    spec = rec.facts()
    actor = node.actors.get(spec.actor_id) if spec.actor_id else None
    if rec.state is not None:   # done (an actor's constructor: unless the actor is restarting)
        return events.PENDING_NODE_ASSIGNMENT if actor is not None and actor.state == "RESTARTING" else rec.state
    proc = rec.proc
    if spec.kind == "actor_call":
        if spec.task_id in running:
            return events.RUNNING
        if actor is not None and spec.task_id in actor.inflight:
            return events.SUBMITTED_TO_WORKER
    elif proc is not None and (proc.task is spec or (actor is not None and actor.worker is proc)):
        if proc.pid is None:   # sent to a worker whose hello is not read yet: not known to run
            return events.SUBMITTED_TO_WORKER
        return events.RUNNING
    elif spec.kind == "task" and any(spec in w.ahead for w in node.workers.values()):
        return events.SUBMITTED_TO_WORKER   # sent ahead: in a busy worker's line (node/lines.py)
    return events.PENDING_ARGS_AVAIL if _waits_for_args(node, spec) else events.PENDING_NODE_ASSIGNMENT


def _waits_for_args(node, spec) -> bool:
    objects = node.table.objects
    return any(d not in objects or objects[d].value is None for d in spec.deps)


def tasks(node, detail: bool) -> list[dict]:
    running = _calls_running(node)
    return [_task_row(node, rec, task_state(node, rec, running), detail) for rec in node.task_events.records()]


def _task_row(node, rec: events.TaskEvent, state: str, detail: bool) -> dict:
    spec = rec.facts()
    worker, pid = rec.worker_pid()
    name = _task_name(spec)
    row = {"task_id": _hex(spec.task_id), "attempt_number": rec.attempt, "name": name, "state": state,
           "job_id": node.job_id, "actor_id": _hex(spec.actor_id or None), "type": _TASK_TYPES[spec.kind],
           "func_or_class_name": name, "parent_task_id": _parent_id(node, rec.parent),
           "node_id": node.node_id if worker is not None else None,
           "worker_id": _hex(worker, 16), "worker_pid": pid, "error_type": rec.error_type,
           # not a column: get_task(ref) finds the task by the ref
           "return_id": _hex(spec.return_ids[0]) if spec.return_ids else None}
    if detail:
        steps = [(events.PENDING_ARGS_AVAIL, rec.created)]
        if rec.started is not None:
            steps.append((events.RUNNING, rec.started))
        if rec.ended is not None:
            steps.append((rec.state, rec.ended))
        row.update(language="PYTHON", required_resources=_resources(spec.request),
                   placement_group_id=_hex(spec.placement[0]) if spec.placement else None,
                   events=[{"state": s, "created_ms": _ms(t)} for s, t in steps],
                   creation_time_ms=_ms(rec.created), start_time_ms=_ms(rec.started),
                   end_time_ms=_ms(rec.ended), error_message=rec.error, is_debugger_paused=False,
                   task_log_info=dict(rec.log) if rec.log is not None else None)
    return row


def driver_task_id(job_id: str) -> str:
    """Ray's id of the driver's own task, the parent of what the driver submits: all ones, then
    the job id."""
    return "f" * (28 - len(job_id)) + job_id


def _parent_id(node, parent: int | None) -> str | None:
    if parent is None:
        return driver_task_id(node.job_id)
    return None if parent == events.UNKNOWN_PARENT else _hex(parent)


def timeline(node, detail: bool) -> list[dict]:
    """Chrome trace "complete" events of the finished tasks, as Ray's ``timeline()`` writes them:
    one row ("tid") per worker process, times in microseconds."""
    out = []
    for rec in node.task_events.records():
        if rec.ended is None or rec.started is None:
            continue
        worker, _ = rec.worker_pid()
        spec = rec.facts()
        name = _task_name(spec)
        out.append({"cat": f"task::{name}", "name": name, "pid": NODE_IP, "tid": f"worker:{worker:016x}",
                    "ts": rec.started * 1e6, "dur": (rec.ended - rec.started) * 1e6, "ph": "X",
                    "cname": "generic_work", "args": {"name": name, "task_id": _hex(spec.task_id)}})
    return out


# ---------------------------------------------------------------- actors
def actors(node, detail: bool) -> list[dict]:
    """Live actors, and dead ones while their creation record is kept."""
    creations = {}
    for rec in node.task_events.records():
        spec = rec.facts()
        if spec.kind == "actor_create":
            creations[spec.actor_id] = rec
    rows = [_dead_actor_row(node, rec, detail) for actor_id, rec in creations.items()
            if actor_id not in node.actors and rec.death is not None]
    rows += [_actor_row(node, actor, creations.get(actor_id), detail) for actor_id, actor in node.actors.items()]
    return rows


def _actor_names(node, actor_name) -> tuple[str, str]:
    """(name, namespace) of an actor's spec.actor_name: (namespace, name), or None (the job's)."""
    if not actor_name:
        return "", node.namespace
    namespace, name = actor_name
    return name, namespace or node.namespace


def _actor_row(node, actor, rec: events.TaskEvent | None, detail: bool) -> dict:
    state = _ACTOR_STATES[actor.state]
    if state == "PENDING_CREATION" and _waits_for_args(node, actor.spec):
        state = "DEPENDENCIES_UNREADY"
    worker = actor.worker
    pid = worker.pid if worker is not None else rec.worker_pid()[1] if rec is not None else None
    death = events.death_of(actor, rec) if actor.state == "DEAD" else None
    return _actor_fields(node, actor.spec.actor_id, actor.spec.name, state, actor.spec.actor_name, pid,
                         actor.spec.request, actor.spec.placement, rec.attempt if rec is not None else 0,
                         death, detail)


def _dead_actor_row(node, rec: events.TaskEvent, detail: bool) -> dict:
    spec = rec.facts()
    return _actor_fields(node, spec.actor_id, spec.name, "DEAD", spec.actor_name, rec.worker_pid()[1],
                         spec.request, spec.placement, rec.attempt, rec.death, detail)


def _actor_fields(node, actor_id, class_name, state, actor_name, pid, request, placement, restarts, death,
                  detail) -> dict:
    name, namespace = _actor_names(node, actor_name)
    row = {"actor_id": _hex(actor_id), "class_name": class_name, "state": state, "job_id": node.job_id,
           "name": name, "node_id": node.node_id, "pid": pid or 0, "ray_namespace": namespace}
    if detail:
        row.update(required_resources=_resources(request), is_detached=False, repr_name="",
                   placement_group_id=_hex(placement[0]) if placement else None, num_restarts=restarts,
                   num_restarts_due_to_lineage_reconstruction=0, num_restarts_due_to_node_preemption=0,
                   death_cause=_death_cause(death, actor_id, class_name, name, namespace, pid))
    return row


def _death_cause(death, actor_id, class_name, name, namespace, pid) -> dict | None:
    """Ray's ActorDeathCause as a dict (the proto's field names)."""
    if death is None:
        return None
    reason, message = death
    if reason == "CREATION_FAILED":
        return {"creation_task_failure_context": {"language": "PYTHON", "formatted_exception_string": message}}
    if reason == "UNSCHEDULABLE":
        return {"actor_unschedulable_context": {"error_message": message}}
    return {"actor_died_error_context": {"error_message": message, "reason": reason, "actor_id": _hex(actor_id),
                                         "class_name": class_name, "name": name, "ray_namespace": namespace,
                                         "pid": pid or 0, "node_ip_address": NODE_IP, "never_started": not pid}}


# ---------------------------------------------------------------- objects, workers, node, groups
def objects(node, detail: bool) -> list[dict]:
    live, running = node.task_events.live, _calls_running(node)
    rows = []
    for oid, entry in node.table.objects.items():
        value = entry.value
        producer = node.producers.get(oid)
        rec = live.get(producer.task_id) if producer is not None else None
        if value is not None:
            size = len(value.data) + sum(b[1] if type(b) is tuple else len(b) for b in value.buffers)
            status = events.FAILED if value.is_error else events.FINISHED
        else:
            size, status = 0, task_state(node, rec, running) if rec is not None else "NIL"
        rows.append({"object_id": _hex(oid), "object_size": size, "task_status": status,
                     "attempt_number": rec.attempt if rec is not None else 0,
                     "reference_type": "PINNED_IN_MEMORY" if entry.pinned else "LOCAL_REFERENCE",
                     "call_site": "disabled", "type": "DRIVER", "pid": os.getpid(), "ip": NODE_IP,
                     "reference_count": entry.refs})
    return rows


def workers(node, detail: bool) -> list[dict]:
    """The driver, every worker process alive, then the last ones that ended (newest last)."""
    procs = ([(0, "DRIVER", os.getpid(), None, None, node.task_events.started_at, None)]
             + [(w.index, "WORKER", w.pid, None, None, w.launched, None) for w in node.workers.values()]
             + [(index, "WORKER", pid, kind, why, launched, ended)
                for index, pid, kind, why, launched, ended in node.dead_workers])
    rows = []
    for index, kind, pid, exit_type, why, started, ended in procs:
        row = {"worker_id": _hex(index, 16), "is_alive": ended is None, "worker_type": kind,
               "exit_type": exit_type, "node_id": node.node_id, "ip": NODE_IP, "pid": pid or 0}
        if detail:
            row.update(exit_detail=why, worker_launch_time_ms=_ms(started), worker_launched_time_ms=_ms(started),
                       start_time_ms=_ms(started), end_time_ms=_ms(ended) if ended is not None else 0)
        rows.append(row)
    return rows


def nodes(node, detail: bool) -> list[dict]:
    row = {"node_id": node.node_id, "node_ip": NODE_IP, "is_head_node": True, "state": "ALIVE",
           "state_message": None, "node_name": NODE_IP, "resources_total": _resources(node.res.total),
           "labels": dict(node.labels)}
    if detail:
        row["start_time_ms"] = _ms(node.task_events.started_at)
    return [row]


def placement_groups(node, detail: bool) -> list[dict]:
    rows = []
    for pg_id, group in node.groups.by_id.items():
        row = {"placement_group_id": _hex(pg_id), "name": group.name, "creator_job_id": node.job_id,
               "state": group.state}
        if detail:
            placed = node.node_id if group.state == "CREATED" else None
            row.update(is_detached=False, bundles=[
                {"bundle_id": f"{pg_id:028x}:{i}", "node_id": placed, "unit_resources": _resources(b)}
                for i, b in enumerate(group.bundles)])
        rows.append(row)
    return rows


def jobs(node, detail: bool) -> list[dict]:
    """The one job, the driver's (raylite has no job submission), with Ray's JobDetails fields."""
    row = {"job_id": node.job_id, "submission_id": None, "entrypoint": _entrypoint(), "type": "DRIVER",
           "status": "RUNNING", "message": None, "error_type": None,
           "driver_info": {"id": node.job_id, "node_ip_address": NODE_IP, "pid": str(os.getpid())}}
    if detail:   # end_time 0 while the job runs, as Ray's job table
        row.update(start_time=_ms(node.task_events.started_at), end_time=0, metadata={},
                   runtime_env=runtime_env.to_dict(node.job_env),
                   driver_agent_http_address=None, driver_node_id=None, driver_exit_code=None)
    return [row]


def _entrypoint() -> str:
    """The driver's command line, as Ray records it."""
    import subprocess
    import sys
    shell = "(interactive_shell) " if hasattr(sys, "ps1") else ""
    return shell + subprocess.list2cmdline(sys.orig_argv)


def actor_calls(node, detail: bool) -> list[int]:
    """First return ids of the actor calls not done yet (``cancel(force=True)`` refuses them)."""
    return [oid for oid, spec in node.producers.items() if spec.kind == "actor_call"]


def log_dir(node, detail: bool) -> list[str | None]:
    """Where worker output goes: the log directory with ``init(log_to_driver=False)``, else None."""
    return [node.log_dir]


def runtime_envs(node, detail: bool) -> list[dict]:
    """Every runtime_env a worker started with, or that could not be set up (success False)."""
    in_use: dict = {}
    for w in node.workers.values():
        in_use[w.key[2]] = in_use.get(w.key[2], 0) + 1
    rows = []
    for env, (created, error) in node.runtime_envs.items():
        row = {"runtime_env": runtime_env.to_dict(env), "success": error is None, "creation_time_ms": _ms(created),
               "node_id": node.node_id}
        if detail:
            row.update(ref_cnt=in_use.get(env, 0), error=error)
        rows.append(row)
    return rows


def cluster_events(node, detail: bool) -> list[dict]:
    return node.cluster_events.rows(detail)


_VIEWS = {"tasks": tasks, "actors": actors, "objects": objects, "workers": workers, "nodes": nodes,
          "placement_groups": placement_groups, "timeline": timeline, "jobs": jobs, "actor_calls": actor_calls,
          "log_dir": log_dir, "runtime_envs": runtime_envs, "cluster_events": cluster_events}
