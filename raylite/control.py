"""The control endpoint's public side (raylite.core.api.control has the server).

For other processes: ``list_sessions()`` and ``find_session(id_or_pid=None)`` find the running
drivers on this machine (this user's), and ``Session.request(op, **args)`` asks one; the
``raylite`` CLI (raylite.cli) is built on these. For upper layers in the driver:
``register_panel(kind, source)`` publishes a live view of some work (Tune and Train publish theirs)
to the CLI and the dashboard, and ``unregister_panel(handle)`` ends it; ``session_private_dir()``
is this session's 0700 directory for files that must go when the session does (even after a SIGKILL);
``uses_local_runtime(address, backend)`` says whether ``init`` with those would start this machine's
runtime rather than connect to Ray (to size what it starts: a cluster's CPUs are its own).
"""
from __future__ import annotations

from raylite.core.api.control import register_panel, unregister_panel
from raylite.core.api.startup import use_ray
from raylite.core.client.sessions import Session, SessionError, find_session, list_sessions, session_private_dir

__all__ = ["Session", "SessionError", "find_session", "list_sessions", "register_panel", "session_private_dir",
           "unregister_panel", "uses_local_runtime"]


def uses_local_runtime(address: str | None = None, backend: str | None = None) -> bool:
    """Whether ``init(address, backend=backend)`` runs the local runtime, not the Ray backend:
    init's own rule (``backend``, else ``address``, else RAY_ADDRESS; "local" or none is local)."""
    return not use_ray(address, backend)
