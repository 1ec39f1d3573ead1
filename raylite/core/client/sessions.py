"""Where running drivers are found, and how another process talks to one (the client side of
raylite.core.api.control; public as raylite.control).

The sessions root is ``$RAYLITE_SESSIONS_DIR``, else ``<tmp>/raylite-<uid>/sessions``: this user's,
0700. Each driver's session directory in it is named by the session id, which starts with the
driver's pid, and holds ``session.json`` and ``control.sock``. A directory whose driver is gone
(a SIGKILL leaves it behind) is ignored and removed when the sessions are listed.
"""
from __future__ import annotations

import os
import socket
import struct

# json, shutil and tempfile (~8 ms together) are imported where used: init imports this module
# (raylite.core.api.control), and the endpoint's thread does the file work

SESSIONS_ENV = "RAYLITE_SESSIONS_DIR"
INFO_FILE, SOCKET_FILE = "session.json", "control.sock"


class SessionError(RuntimeError):
    """No session to talk to, or it answered with an error (``kind`` names the error's type;
    "SessionGone": its endpoint has closed, as when the driver shuts down)."""

    def __init__(self, message: str, kind: str = "SessionError"):
        super().__init__(message)
        self.kind = kind


def root() -> str:
    if os.environ.get(SESSIONS_ENV):
        return os.environ[SESSIONS_ENV]
    import tempfile
    return os.path.join(tempfile.gettempdir(), f"raylite-{os.getuid()}", "sessions")


def _private_dir(path: str) -> None:
    """Make ``path`` (and missing parents) as 0700 directories, refusing one another user owns."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if st.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.getuid()})")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)


def session_dir(session: str) -> str:
    return os.path.join(root(), session)


def session_private_dir() -> str:
    """This session's directory, made if missing (0700, this user's), in the driver or a worker:
    where an upper layer keeps files for the session's lifetime (raylite.train's rendezvous). The
    runtime removes it with everything in it when the session ends: at shutdown, and when the
    driver dies (its zygote does, a SIGKILL included). RuntimeError unless the local runtime runs
    (the Ray backend has no such directory)."""
    from raylite.core.client.link import process
    from raylite.core.wire.segments import session_of
    if process.client is None:
        raise RuntimeError("session_private_dir: the local raylite runtime is not running (call init first)")
    directory = session_dir(session_of(process.client.shm_prefix))
    _private_dir(root())
    _private_dir(directory)
    return directory


def listen(directory: str, info: dict) -> socket.socket:
    """Bind the session's socket and write its session.json (last, so a listed session answers)."""
    _private_dir(root())
    _private_dir(directory)
    path = os.path.join(directory, SOCKET_FILE)
    if os.path.exists(path):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(16)
        write_info(directory, info)
    except BaseException:
        sock.close()
        raise
    return sock


def write_info(directory: str, info: dict) -> None:
    import json
    tmp = os.path.join(directory, f".{INFO_FILE}.tmp")
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.replace(tmp, os.path.join(directory, INFO_FILE))


def peer_is_me(conn: socket.socket) -> bool:
    """Whether the connected process runs as this user (Linux's SO_PEERCRED; elsewhere the 0700
    directory is the guard)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return True
    _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i")))
    return uid == os.getuid()


def remove(directory: str) -> None:
    import shutil
    shutil.rmtree(directory, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie, whose parent has not reaped it yet, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _answers(directory: str) -> bool:
    """False when nothing listens on the socket: the driver died and its pid was reused."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(os.path.join(directory, SOCKET_FILE))
    except (FileNotFoundError, ConnectionRefusedError):
        return False
    except OSError:
        return True   # (busy: its backlog is full)
    finally:
        sock.close()
    return True


class Session:
    """One running driver, as its session.json describes it."""

    def __init__(self, directory: str, info: dict):
        self.dir, self.info = directory, info
        self.id, self.pid = info["session"], info["pid"]

    def __repr__(self) -> str:
        return f"Session({self.id!r}, pid={self.pid})"

    def alive(self) -> bool:
        return _alive(self.pid)

    def request(self, op: str, timeout: float = 30.0, **args):
        """Ask the driver; its answer, or SessionError with its message."""
        import json
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            try:
                sock.connect(os.path.join(self.dir, SOCKET_FILE))
            except (FileNotFoundError, ConnectionRefusedError) as e:
                raise SessionError(f"session {self.id} (pid {self.pid}) is not answering: {e}", "SessionGone") from e
            try:
                sock.sendall(json.dumps({"op": op, **args}).encode() + b"\n")
            except (BrokenPipeError, ConnectionResetError):
                pass   # it answered already (a refusal): read that
            chunks = []
            while True:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
        except socket.timeout as e:
            raise SessionError(f"session {self.id} (pid {self.pid}) did not answer within {timeout} s") from e
        finally:
            sock.close()
        if not chunks:
            raise SessionError(f"session {self.id} (pid {self.pid}) closed the connection without an answer")
        reply = json.loads(b"".join(chunks))
        if "error" in reply:
            raise SessionError(reply["error"], reply.get("type", "SessionError"))
        return reply["ok"]


def list_sessions() -> list[Session]:
    """The running drivers' sessions, oldest first; directories of dead drivers are removed."""
    import json
    base = root()
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        directory = os.path.join(base, name)
        try:
            with open(os.path.join(directory, INFO_FILE)) as f:
                info = json.load(f)
            session = Session(directory, info)
        except (OSError, ValueError, KeyError, TypeError):
            pid = name.split("-", 1)[0]   # being written, or a dead driver's half-made directory
            if pid.isdigit() and not _alive(int(pid)):
                remove(directory)
            continue
        if session.alive() and _answers(directory):
            found.append(session)
        else:
            remove(directory)
    return sorted(found, key=lambda s: s.info.get("started", 0))


def find_session(session: str | None = None) -> Session:
    """The session whose id (or pid, or a prefix of the id) is ``session``; the newest without one.
    SessionError when there is none."""
    running = list_sessions()
    if not running:
        raise SessionError(f"no raylite session is running (no driver of this user's in {root()})")
    if session is None:
        return running[-1]
    matches = [s for s in running if s.id == session or str(s.pid) == session] or \
              [s for s in running if s.id.startswith(session)]
    if len(matches) != 1:
        known = ", ".join(f"{s.id} (pid {s.pid})" for s in running)
        raise SessionError(f"{'no' if not matches else 'more than one'} running session matches "
                           f"--session {session!r}; running: {known}")
    return matches[0]
