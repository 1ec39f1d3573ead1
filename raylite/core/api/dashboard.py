"""The dashboard: ``init(include_dashboard=True, dashboard_port=...)`` serves one live page on
127.0.0.1, guarded by a random token in its URL (printed at init, ``init(...).dashboard_url``);
a request without it gets 403.

The page (dashboard_page/: HTML, CSS and JS, shipped in the package, no build step, no CDN)
polls ``/api/snapshot`` every two seconds: what the control endpoint answers (raylite.core.api.control)
plus the tasks and actors tables and the worker output since its last poll. ``/api/status``,
``/api/tasks``, ``/api/actors``, ``/api/logs`` and ``/api/panels`` give the parts alone.

Cost: init binds the port (so a port in use fails init before anything starts); the control
endpoint's thread (raylite.core.api.control) watches it, and only the first connection imports
http.server (~40 ms). Nothing of it is on the task path.
"""
from __future__ import annotations

import hmac
import os
import socket
import sys
import time
import warnings

DEFAULT_PORT = 8265   # Ray's; taken, the dashboard picks a free one (an explicit port must be free)
_PAGE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dashboard_page")
_TASK_COLUMNS = ("task_id", "name", "state", "type", "worker_pid", "actor_id", "error_type",
                 "creation_time_ms", "start_time_ms", "end_time_ms")
_ACTOR_COLUMNS = ("actor_id", "class_name", "name", "state", "pid", "num_restarts")
TABLE_ROWS = 200


class Dashboard:
    """The page's server: bound at construction, answering once ``start`` gives it the node. The
    control endpoint's thread accepts its connections (no thread of its own to start at init)."""

    def __init__(self, host: str | None, port: int | None):
        if host not in (None, "127.0.0.1", "localhost"):
            warnings.warn(f"dashboard_host={host!r}: raylite serves its dashboard on 127.0.0.1 only (use an SSH "
                          f"tunnel to see it from elsewhere)", stacklevel=4)
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535):
            raise ValueError(f"dashboard_port must be a port number (0-65535; 0: any free one), got "
                             f"dashboard_port={port!r}")
        self.token = os.urandom(16).hex()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._bind(port)
            self._sock.listen(64)
        except BaseException:
            self._sock.close()
            raise
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/?token={self.token}"
        self._server = None
        self.node = self.info = None

    def _bind(self, port: int | None) -> None:
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind(("127.0.0.1", DEFAULT_PORT if port is None else port))
        except OSError as e:
            if port is not None:
                raise ValueError(f"dashboard_port={port} cannot be used ({e.strerror}); pick another, or 0 for any "
                                 f"free port") from e
            self._sock.bind(("127.0.0.1", 0))

    def start(self, node, info: dict) -> None:
        self.node, self.info = node, info
        print(f"raylite: dashboard at {self.url}", file=sys.stderr)

    @property
    def socket(self) -> socket.socket:
        """The listening socket, which the control endpoint's thread watches (raylite.core.api.control)."""
        return self._sock

    def accept_one(self) -> None:
        """Take the connection waiting on the socket; its request runs in a thread of its own."""
        if self._server is None:
            self._server = _server(self)
        self._server.handle_request()

    def close(self) -> None:
        if self._server is not None:
            self._server.socket = None   # ours, closed here
        self._sock.close()

    # ------------------------------------------------------------ what the page reads
    def allowed(self, query: dict) -> bool:
        token = query.get("token", [""])[0]
        return hmac.compare_digest(token.encode(), self.token.encode())

    def snapshot(self, after: int) -> dict:
        """One poll: the tasks', actors' and objects' rows built once, under one node call, for the
        status counts and the tables alike."""
        from raylite.core.api import control

        def board():
            views = {what: self.node.state(what, True) for what in ("tasks", "actors", "objects")}
            return views, control._status(self.node, views)

        views, status = self.node.call_sync(board)
        return {"status": control.status_reply(self.info, status), "tasks": _tasks(views["tasks"][0]),
                "actors": _actors(views["actors"][0]), "logs": self.part("logs", after), "time": time.time()}

    def part(self, name: str, after: int = 0):
        from raylite.core.api import control
        if name == "tasks":
            return _tasks(control.answer(self.node, self.info, {"op": "list", "what": "tasks", "detail": True,
                                                                 "limit": 10 ** 6}))
        if name == "actors":
            return _actors(control.answer(self.node, self.info, {"op": "list", "what": "actors", "detail": True,
                                                                  "limit": TABLE_ROWS}))
        if name == "logs":
            return control.answer(self.node, self.info, {"op": "logs", "after": after, "limit": 500})
        return control.answer(self.node, self.info, {"op": name})


def _tasks(rows: list[dict]) -> list[dict]:
    """The tasks table: running ones first, then the newest."""
    rows = sorted(rows, key=lambda r: (r["state"] != "RUNNING", -(r["creation_time_ms"] or 0)))
    return [{k: r.get(k) for k in _TASK_COLUMNS} for r in rows[:TABLE_ROWS]]


def _actors(rows: list[dict]) -> list[dict]:
    return [{k: r.get(k) for k in _ACTOR_COLUMNS} for r in rows[:TABLE_ROWS]]


def _page() -> bytes:
    """The page with its stylesheet and script inlined: one request, nothing from elsewhere."""
    def read(name: str) -> str:
        with open(os.path.join(_PAGE_DIR, name), encoding="utf-8") as f:
            return f.read()
    html = read("index.html").replace("/*STYLE*/", read("dashboard.css")).replace("/*SCRIPT*/", read("dashboard.js"))
    return html.encode()


def _server(dashboard: Dashboard):
    """An http.server on the dashboard's bound socket (imported on the first connection)."""
    import json
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlsplit

    page = _page()
    parts = {"/api/status": "status", "/api/tasks": "tasks", "/api/actors": "actors", "/api/logs": "logs",
             "/api/panels": "panels"}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            if not dashboard.allowed(query):
                return self._send(403, "text/plain", b"403: this page needs its token: open the URL that init "
                                                     b"printed (init(...).dashboard_url)\n")
            if url.path in ("/", "/index.html"):
                return self._send(200, "text/html; charset=utf-8", page)
            if url.path != "/api/snapshot" and url.path not in parts:
                return self._send(404, "text/plain", b"404: no such page\n")
            try:
                after = int(query.get("after", ["0"])[0])
                value = (dashboard.snapshot(after) if url.path == "/api/snapshot"
                         else dashboard.part(parts[url.path], after))
            except Exception as e:   # noqa: BLE001 - the page shows it
                return self._send(500, "application/json", json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
            self._send(200, "application/json", json.dumps(value, default=repr).encode())

        def _send(self, code: int, kind: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("Referrer-Policy", "no-referrer")   # the token stays in this page
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args):   # quiet: the driver's terminal is the user's
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True

    server = Server(("127.0.0.1", dashboard.port), Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = dashboard._sock   # bound and listening since init
    server.timeout = 0   # handle_request after select said a connection waits
    return server
