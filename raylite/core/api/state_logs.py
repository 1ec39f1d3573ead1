"""Ray's log API (``ray.util.state.list_logs`` and ``get_log``) on the local runtime.

With ``init(log_to_driver=False)`` each worker writes its output to worker-<pid>.out and .err in
the session's log directory (raylite.core.worker.loop); these read those files, in any process on the
machine. With ``log_to_driver=True`` (the default) the output is printed on the driver's terminal
and not kept, so there are no logs: ``list_logs`` returns {} and ``get_log`` says so.

As in Ray, ``get_log(task_id=...)`` of a task attempt that has run gives only its lines: its worker
notes the files' sizes when it starts and ends it, and the task's record keeps them (its
``task_log_info``). While the attempt runs, or if its worker died in it, it gives the whole output
of that worker. Ray's ``node_id``/``node_ip`` may be left out: there is one node.
"""
from __future__ import annotations

import fnmatch
import os
import re
import time
from collections import deque
from collections.abc import Iterator

from raylite.core.api.state import (DEFAULT_RPC_TIMEOUT, RayStateApiException, _query, _ray_state, get_actor,
                                    get_task, list_workers)

FOLLOW_INTERVAL_S = 0.5   # how often get_log(follow=True) looks for new lines
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]")
_NOT_KEPT = ("worker output is not kept: with init(log_to_driver=True), the default, it is printed on the "
             "driver's terminal; start with init(log_to_driver=False) to keep it in files that get_log reads")


def _log_dir() -> str | None:
    rows, _ = _query("log_dir", False)
    return rows[0]


def _check_node(node_id: str | None, node_ip: str | None) -> None:
    if node_id is None and node_ip is None:
        return
    from raylite.core.wire.ids import NODE_IP
    from raylite.core.api.context import RuntimeContext
    own = RuntimeContext().get_node_id()   # (not get_runtime_context(): asking must not start a runtime)
    if node_id is not None and node_id != own:
        raise ValueError(f"node_id={node_id!r} is not a node of this runtime (its one node is {own!r})")
    if node_ip is not None and node_ip != NODE_IP:
        raise ValueError(f"node_ip={node_ip!r} is not a node of this runtime (its one node is at {NODE_IP!r})")


def list_logs(address: str | None = None, node_id: str | None = None, node_ip: str | None = None,
              glob_filter: str | None = None, timeout: int = DEFAULT_RPC_TIMEOUT) -> dict[str, list[str]]:
    """The log files, grouped as Ray groups them: {"worker_out": [...], "worker_err": [...]}
    (only groups with files); {} while output goes to the driver's terminal."""
    if (ray := _ray_state()) is not None:
        return ray.list_logs(address=address, node_id=node_id, node_ip=node_ip, glob_filter=glob_filter,
                             timeout=timeout)
    _check_node(node_id, node_ip)
    directory = _log_dir()
    if directory is None or not os.path.isdir(directory):
        return {}
    groups: dict[str, list[str]] = {}
    for name in sorted(fnmatch.filter(os.listdir(directory), glob_filter or "*")):
        group = {".out": "worker_out", ".err": "worker_err"}.get(os.path.splitext(name)[1], "internal")
        groups.setdefault(group, []).append(name)
    return groups


def get_log(address: str | None = None, node_id: str | None = None, node_ip: str | None = None,
            filename: str | None = None, actor_id: str | None = None, task_id: str | None = None,
            pid: int | None = None, follow: bool = False, tail: int = -1, timeout: int = DEFAULT_RPC_TIMEOUT,
            suffix: str = "out", encoding: str | None = "utf-8", errors: str | None = "strict",
            submission_id: str | None = None, attempt_number: int = 0, _interval: float | None = None,
            filter_ansi_code: bool = False) -> Iterator:
    """Lines (each with its newline; bytes when ``encoding`` is None) of one log file, named by
    ``filename``, or found as Ray finds it by ``actor_id``, ``task_id`` (and ``attempt_number``)
    or ``pid``, with ``suffix`` "out" or "err"; the last ``tail`` lines when it is not -1.
    ``follow`` keeps yielding new lines until the runtime shuts down."""
    if (ray := _ray_state()) is not None:
        yield from ray.get_log(address=address, node_id=node_id, node_ip=node_ip, filename=filename,
                               actor_id=actor_id, task_id=task_id, pid=pid, follow=follow, tail=tail,
                               timeout=timeout, suffix=suffix, encoding=encoding, errors=errors,
                               submission_id=submission_id, attempt_number=attempt_number, _interval=_interval,
                               filter_ansi_code=filter_ansi_code)
        return
    if suffix not in ("out", "err"):
        raise ValueError(f"suffix must be 'out' or 'err', got suffix={suffix!r}")
    if type(tail) is not int or tail < -1:
        raise ValueError(f"tail must be a whole number of lines, or -1 for all of them; got tail={tail!r}")
    _check_node(node_id, node_ip)
    directory = _log_dir()
    if directory is None:
        raise RayStateApiException(_NOT_KEPT)
    interval = _interval or FOLLOW_INTERVAL_S
    span = None
    if task_id and not actor_id:
        name, span = _task_log(task_id, attempt_number, suffix)
        known = True
    else:
        name, known = _resolve(filename, actor_id, pid, suffix, submission_id)
    path = os.path.realpath(os.path.join(directory, name))
    if os.path.dirname(path) != os.path.realpath(directory):
        raise ValueError(f"filename={filename!r} is not a file in the log directory {directory}")
    if not known and not os.path.exists(path):
        raise RayStateApiException(f"Could not find a log file {name!r} in {directory} (list_logs() lists them)")
    lines = _read_span(path, span, tail) if span is not None else _read(path, tail, follow, interval)
    for line in lines:
        if filter_ansi_code:
            line = _ANSI.sub(b"", line)
        yield line if encoding is None else line.decode(encoding, errors or "strict")


def _resolve(filename, actor_id, pid, suffix, submission_id) -> tuple[str, bool]:
    """(file name, whether it belongs to a worker known to exist): a known worker that wrote
    nothing yet has no file, and its log is empty, as in Ray."""
    if actor_id:
        actor = get_actor(actor_id)
        if actor is None:
            raise RayStateApiException(f"Actor ID {actor_id} not found.")
        if not actor.pid:
            raise RayStateApiException(f"Actor {actor_id} has no worker process yet (state {actor.state})")
        return f"worker-{actor.pid}.{suffix}", True
    if submission_id:
        raise RayStateApiException(f"No job with submission_id={submission_id!r}: raylite has no job submission")
    if pid:
        name = f"worker-{pid}.{suffix}"
        return name, any(w.pid == pid for w in list_workers(limit=1 << 30))
    if filename:
        return filename, False
    raise ValueError("get_log needs the log's filename, or an actor_id, task_id or pid to find it by")


def _task_log(task_id: str, attempt_number: int, suffix: str) -> tuple[str, tuple[int, int] | None]:
    """(the task attempt's worker's log file, the attempt's byte range in it once it has run)."""
    task = get_task(task_id)
    if task is None or task.attempt_number != attempt_number:
        raise RayStateApiException(f"Could not find log file for task attempt: {task_id}({attempt_number})")
    if task.actor_id is not None:   # as Ray: an actor's calls share its log
        raise RayStateApiException(f"For actor task, please query actor log for actor({task.actor_id}): "
                                   f"get_log(actor_id={task.actor_id!r})")
    if task.worker_pid is None:
        raise RayStateApiException(f"Task {task_id} has not run on a worker yet (state {task.state})")
    info, key = task.task_log_info, "stdout" if suffix == "out" else "stderr"
    if info is None:
        return f"worker-{task.worker_pid}.{suffix}", None
    return info[f"{key}_file"], (info[f"{key}_start"], info[f"{key}_end"])


def _read_span(path: str, span: tuple[int, int], tail: int) -> list[bytes]:
    start, end = span
    try:
        with open(path, "rb") as f:
            f.seek(start)
            lines = f.read(max(0, end - start)).splitlines(keepends=True)
    except FileNotFoundError:   # it wrote nothing
        return []
    return lines if tail == -1 else lines[max(0, len(lines) - tail):]


def _read(path: str, tail: int, follow: bool, interval: float) -> Iterator[bytes]:
    """The file's lines; with `follow`, then new ones as they come (each whole: a worker's line
    that has no end yet waits for it)."""
    try:
        with open(path, "rb") as f:
            lines = f.readlines() if tail == -1 else list(deque(f, maxlen=tail))
            position = f.tell()
    except FileNotFoundError:   # a known worker that has written nothing yet
        lines, position = [], 0
    if follow and lines and not lines[-1].endswith(b"\n"):
        position -= len(lines.pop())
    yield from lines
    if not follow:
        return
    from raylite.core.api.runtime import is_initialized
    while is_initialized():
        time.sleep(interval)
        lines, position = _lines_from(path, position, True)
        yield from lines


def _lines_from(path: str, position: int, whole: bool) -> tuple[list[bytes], int]:
    """The lines after `position` (only whole ones if `whole`), and the position after them."""
    try:
        with open(path, "rb") as f:
            f.seek(position)
            lines = f.readlines()
    except FileNotFoundError:   # a known worker that has written nothing yet
        return [], position
    if whole and lines and not lines[-1].endswith(b"\n"):
        lines.pop()
    return lines, position + sum(map(len, lines))
