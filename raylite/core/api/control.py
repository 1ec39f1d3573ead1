"""The driver's control endpoint: read-only state on a Unix socket, for the ``raylite`` CLI and
the dashboard (raylite.core.api.dashboard).

Each local-runtime driver is one session with a directory of its own (raylite.core.client.sessions says
where): ``session.json`` (pid, command line, start time, dashboard URL) and ``control.sock``. The
directory is 0700 and the endpoint answers only peers with this process's uid (SO_PEERCRED).
Nothing listens on TCP unless the dashboard is asked for.

One request per connection: a JSON object on one line, answered by one JSON line, ``{"ok": value}``
or ``{"error": message, "type": name}``. The answers come from the public state API, run in this
process, so they are what ``raylite.util.state`` returns here. ``stop`` is the one request that
does something: it sends this process SIGINT, as Ctrl-C would, so the program unwinds and shuts
down as it would then (a program that ignores SIGINT is shut down and sent SIGTERM).

Cost: ``start`` starts a daemon thread, which makes the directory, binds the socket and writes
the file (system calls, during which init's thread runs on), then blocks in select().
``RAYLITE_CONTROL=0`` turns it off.

Upper layers (Tune, Train) publish their state here with ``register_panel``: a function called
when someone asks, in the endpoint's thread, whose JSON-able answer the CLI and the dashboard show.
"""
from __future__ import annotations

import itertools
import os
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable

from raylite.core.client import sessions
from raylite.core.wire.polling import start_sleeper

CONTROL_ENV = "RAYLITE_CONTROL"
FINISHED_KEPT = 5        # finished panels of each kind still shown
_REQUEST_LIMIT = 1 << 16

_panels_lock = threading.Lock()
_panels: dict[int, tuple[str, Callable[[], dict]]] = {}
_finished: dict[str, list[dict]] = {}
_panel_ids = itertools.count(1)


# ---------------------------------------------------------------- panels (the public hook)
def register_panel(kind: str, source: Callable[[], dict]) -> int:
    """Publish a live view of some work (kind "tune" or "train", say): ``source()`` returns a
    JSON-able dict and is called, in another thread, whenever the CLI or the dashboard asks. It
    should only read (copy what it needs). Returns a handle for ``unregister_panel``."""
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"register_panel needs a non-empty kind, got kind={kind!r}")
    if not callable(source):
        raise TypeError(f"register_panel needs a callable source, got {type(source).__name__}")
    with _panels_lock:
        handle = next(_panel_ids)
        _panels[handle] = (kind, source)
    return handle


def unregister_panel(handle: int) -> None:
    """The work is over: its last view stays shown (the newest FINISHED_KEPT of each kind)."""
    with _panels_lock:
        entry = _panels.pop(handle, None)
    if entry is None:
        return
    kind, source = entry
    view = _read_panel(source)
    view["finished"] = True
    with _panels_lock:
        kept = _finished.setdefault(kind, [])
        kept.append(view)
        del kept[:-FINISHED_KEPT]


def _read_panel(source: Callable[[], dict]) -> dict:
    try:
        view = dict(source())
    except Exception as e:   # noqa: BLE001 - a broken panel must not break the endpoint
        view = {"error": f"{type(e).__name__}: {e}"}
    view.setdefault("finished", False)
    return view


def panels() -> dict[str, list[dict]]:
    """Every kind's views: the finished ones first, then the live ones."""
    with _panels_lock:
        live = list(_panels.values())
        out = {kind: list(views) for kind, views in _finished.items()}
    for kind, source in live:
        out.setdefault(kind, []).append(_read_panel(source))
    return out


# ---------------------------------------------------------------- what the endpoint answers
def _status(node, views: dict | None = None) -> dict:
    """Resources (total, used, per device), tasks and actors by state, object store use. Runs
    under the node lock (node.call_sync). ``views``: the tasks', actors' and objects' rows
    (Node.state) when the caller built them already (the dashboard's poll shows them too)."""
    from raylite.core.wire.resources import from_fixed
    if views is None:
        views = {what: node.state(what, False) for what in ("tasks", "actors", "objects")}
    total, available = node.resource_view()   # (available leaves out what is used up)
    used = {k: max(0.0, round(v - available.get(k, 0.0), 4)) for k, v in total.items() if not k.startswith("node:")}
    devices = {res: [{"id": dev, "used": round(1 - from_fixed(units), 4)}
                     for dev, units in node.res.device_free(res).items()] for res in node.res.device_ids}
    (tasks, dropped), (actors, _), (objects, _) = views["tasks"], views["actors"], views["objects"]
    return {"resources": {"total": {k: v for k, v in total.items() if not k.startswith("node:")},
                          "used": used, "available": available},
            "devices": devices,
            "tasks": _count(tasks, "state"), "tasks_dropped": dropped,
            "actors": _count(actors, "state"),
            "objects": {"count": len(objects),
                        "bytes": sum(r["object_size"] for r in objects if r["object_size"] > 0),
                        "capacity": total.get("object_store_memory", 0)},
            "workers": sum(1 for w in node.workers.values() if w.pid is not None)}


def status_reply(info: dict, status: dict) -> dict:
    """The `status` answer: the session's info, its uptime, ``status`` (_status's) and the panels."""
    return {**info, "uptime_s": time.time() - info["started"], **status, "panels": panels()}


def _count(rows: list[dict], column: str) -> dict[str, int]:
    return dict(Counter(row[column] for row in rows))


def _logs(node, after: int, pid: int | None, limit: int) -> dict:
    entries, nxt = node.recent_output.since(after)
    if pid is not None:
        entries = [e for e in entries if e[1] == pid]
    entries = entries[-limit:] if limit > 0 else entries
    return {"lines": [{"time": t, "pid": p, "name": name, "stream": stream,
                       "line": line.decode(errors="replace")} for t, p, name, stream, line in entries],
            "next": nxt, "log_dir": node.log_dir}


def _filters(raw) -> list[tuple]:
    if not isinstance(raw, list):
        raise ValueError(f"filters must be a list of [key, '=' or '!=', value], got {raw!r}")
    return [tuple(f) for f in raw]


def session_info(node, dashboard_url: str | None) -> dict:
    """What session.json and the `info` request say of this driver."""
    return {"session": node.session, "pid": os.getpid(), "started": time.time(), "cmdline": _cmdline(),
            "cwd": os.getcwd(), "dashboard_url": dashboard_url, "python": sys.version.split()[0],
            "node_id": node.node_id, "namespace": node.namespace}


def answer(node, info: dict, req: dict):
    """The value for one request (raises on a bad one); the dashboard calls this too."""
    from raylite.core.api import state as state_api
    op = req.get("op")
    if op == "info":
        return info
    if op == "status":
        return status_reply(info, node.call_sync(_status, node))
    if op == "list":
        what = req.get("what")
        lister = _LISTERS.get(what)
        if lister is None:
            raise ValueError(f"list: what must be one of {', '.join(_LISTERS)}, got what={what!r}")
        limit = req.get("limit", state_api.DEFAULT_LIMIT)
        if not isinstance(limit, int) or limit < 0:
            raise ValueError(f"list: limit must be a non-negative integer, got limit={limit!r}")
        records = getattr(state_api, lister)(filters=_filters(req.get("filters", [])), limit=limit,
                                             detail=bool(req.get("detail")), raise_on_missing_output=False)
        return [r.asdict() for r in records]
    if op == "summary":
        what = req.get("what")
        if what not in ("tasks", "actors", "objects"):
            raise ValueError(f"summary: what must be tasks, actors or objects, got what={what!r}")
        return getattr(state_api, f"summarize_{what}")(raise_on_missing_output=False)
    if op == "timeline":
        return state_api.timeline()
    if op == "logs":
        after, pid, limit = req.get("after", 0), req.get("pid"), req.get("limit", 0)
        if not isinstance(after, int) or (pid is not None and not isinstance(pid, int)) or not isinstance(limit, int):
            raise ValueError(f"logs: after, pid and limit must be integers, got {after!r}, {pid!r}, {limit!r}")
        return node.call_sync(_logs, node, after, pid, limit)
    if op == "panels":
        return panels()
    if op == "stop":   # the endpoint stops this process once it has sent the reply (Endpoint._run)
        return {"pid": os.getpid()}
    raise ValueError(f"unknown request op={op!r} (info, status, list, summary, timeline, logs, panels, stop)")


def _stop(shutdown: Callable[[], None]) -> None:
    """`raylite stop`: Ctrl-C's KeyboardInterrupt in the main thread, so the program unwinds and
    shuts down as it would then. A program that ignores SIGINT (started with `&` or nohup) gets
    the runtime shut down here (``shutdown``, init's counterpart that started this), then SIGTERM."""
    if callable(signal.getsignal(signal.SIGINT)):
        os.kill(os.getpid(), signal.SIGINT)
        return
    shutdown()
    os.kill(os.getpid(), signal.SIGTERM)


_LISTERS = {"tasks": "list_tasks", "actors": "list_actors", "objects": "list_objects",
            "workers": "list_workers", "nodes": "list_nodes", "placement_groups": "list_placement_groups",
            "jobs": "list_jobs"}


# ---------------------------------------------------------------- the endpoint
class Endpoint:
    """The socket server of one session, and its dashboard if one was asked for: one thread
    watches both sockets. ``close`` stops both and removes the session directory."""

    def __init__(self, node, info: dict, serve: bool, dashboard, shutdown: Callable[[], None]):
        self.node, self.info, self.dashboard, self.serve = node, info, dashboard, serve
        self.shutdown = shutdown   # what `raylite stop` runs when the program ignores SIGINT
        self.dir: str | None = None   # set in the thread (the temp directory's lookup imports tempfile)
        self._sock: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._closed = False
        self.thread = start_sleeper(self._run, "raylite-control")   # (the driver's waits still poll)

    def _run(self) -> None:
        self.dir = sessions.session_dir(self.node.session)
        if self.serve:
            try:   # in this thread: the directory and the socket are file system calls (~1 ms on a busy
                self._sock = sessions.listen(self.dir, self.info)   # disk), and each one lets go of the GIL
            except OSError as e:
                print(f"raylite: the control endpoint could not start ({e}); `raylite` commands will not see "
                      f"this driver", file=sys.stderr)
            else:
                sessions.list_sessions()   # removes the directories dead drivers left (a SIGKILL leaves one)
        dash = self.dashboard.socket if self.dashboard is not None else None
        watched = [s for s in (self._sock, dash) if s is not None]
        if not watched:
            return
        import select  # (imported already: the selectors module uses it)
        while not self._closed:
            try:
                readable, _, _ = select.select([*watched, self._wake_r], [], [])
            except (OSError, ValueError):
                break
            if self._wake_r in readable:
                break
            if dash in readable:
                try:
                    self.dashboard.accept_one()
                except Exception as e:   # noqa: BLE001 - the endpoint goes on serving the CLI
                    print(f"raylite: the dashboard could not answer: {type(e).__name__}: {e}", file=sys.stderr)
            if self._sock in readable:
                try:
                    conn, _ = self._sock.accept()
                except OSError:
                    continue
                with conn:
                    stop = self._serve(conn)
                if stop:   # once the reply is sent and the connection closed
                    _stop(self.shutdown)

    def _serve(self, conn: socket.socket) -> bool:
        """Answer one request; whether it was a `stop` that the reply accepted."""
        import json
        conn.settimeout(5.0)
        try:
            data = b""
            while not data.endswith(b"\n") and len(data) < _REQUEST_LIMIT:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            if not data:   # a probe (raylite.core.client.sessions._answers)
                return False
            if not sessions.peer_is_me(conn):
                conn.sendall(b'{"error": "refused: another user", "type": "PermissionError"}\n')
                return False
            try:
                req = json.loads(data)
                if not isinstance(req, dict):
                    raise ValueError(f"a request is a JSON object, got {data[:80]!r}")
                reply = {"ok": answer(self.node, self.info, req)}
            except Exception as e:   # noqa: BLE001 - the client shows it
                reply = {"error": str(e), "type": type(e).__name__}
            conn.sendall(json.dumps(reply, default=repr).encode() + b"\n")
        except OSError:
            return False
        return "ok" in reply and req.get("op") == "stop"

    def close(self) -> None:
        """Stop answering and remove the session directory."""
        self._closed = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self.thread is not threading.current_thread():
            self.thread.join(5)
        if self.dashboard is not None:
            self.dashboard.close()
        if self._sock is not None:
            self._sock.close()
        self._wake_r.close()
        self._wake_w.close()
        if self.dir is not None:
            sessions.remove(self.dir)


def _cmdline() -> list[str]:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return [sys.executable, *sys.argv]


def enabled() -> bool:
    """Whether init starts the endpoint: RAYLITE_CONTROL, checked before init starts anything."""
    value = os.environ.get(CONTROL_ENV, "1").strip().lower()
    if value not in ("0", "1", "false", "true", "off", "on", ""):
        raise ValueError(f"{CONTROL_ENV} must be 0 or 1 (off or on), got {CONTROL_ENV}={value!r}")
    return value not in ("0", "false", "off")


def start(node, serve: bool, dashboard, shutdown: Callable[[], None]) -> Endpoint | None:
    """This driver's session: its endpoint (a thread does the work) when ``serve``, and the
    dashboard (raylite.core.api.dashboard) bound ahead, now given the node; None when neither runs.
    ``shutdown``: the runtime's, for `raylite stop`."""
    if not serve and dashboard is None:
        return None
    info = session_info(node, dashboard.url if dashboard is not None else None)
    if dashboard is not None:
        dashboard.start(node, info)
    return Endpoint(node, info, serve, dashboard, shutdown)
