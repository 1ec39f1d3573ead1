"""The worker's side of ``breakpoint()`` and of ``RAY_DEBUG_POST_MORTEM=1`` (raylite.util.rpdb is
the terminal's side, and Ray's name for both): a pdb session on a Unix socket in a directory only
this user may enter, that waits for this user's debugger (its peer credentials are checked)."""
from __future__ import annotations

import os
import pdb
import socket
import struct
import sys
import tempfile


def debug_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"raylite-debug-{os.getuid()}")


class _SocketPdb(pdb.Pdb):
    """pdb over an accepted connection; the session ends when the user continues or quits."""

    def __init__(self, conn: socket.socket):
        self._conn = conn
        # two files: one text file read and written drops what it had read ahead when it writes
        self._in = conn.makefile("r", encoding="utf-8", errors="replace")
        self._out = conn.makefile("w", buffering=1, encoding="utf-8", errors="replace")
        super().__init__(stdin=self._in, stdout=self._out, nosigint=True)
        self.use_rawinput = False
        self.prompt = "(raylite-pdb) "

    def _end(self) -> None:
        for close in (self._out.close, self._in.close, self._conn.close):
            try:
                close()
            except OSError:
                pass

    def do_continue(self, arg):
        result = super().do_continue(arg)
        if not self.breaks:   # (with breakpoints set, the session goes on at the next one)
            self._end()
        return result

    do_c = do_cont = do_continue

    def do_quit(self, arg):
        result = super().do_quit(arg)
        self._end()
        return result

    do_q = do_exit = do_quit

    def do_EOF(self, arg):   # the debugger went away: let the task go on
        return self.do_continue(arg)


def set_trace(frame=None) -> None:
    """Wait for a debugger on a Unix socket, then stop in pdb at the caller's line."""
    frame = frame or sys._getframe().f_back
    _SocketPdb(_wait_for_debugger(f"breakpoint() at {frame.f_code.co_filename}:{frame.f_lineno}")).set_trace(frame)


def post_mortem(tb) -> None:
    """With RAY_DEBUG_POST_MORTEM=1, a task's uncaught exception: wait for a debugger, then let it
    look at the frames the exception passed through; the error then goes to the caller as usual."""
    last = tb
    while last.tb_next is not None:
        last = last.tb_next
    where = f"{last.tb_frame.f_code.co_filename}:{last.tb_lineno}"
    debugger = _SocketPdb(_wait_for_debugger(f"an uncaught exception at {where} (RAY_DEBUG_POST_MORTEM)"))
    debugger.reset()
    debugger.interaction(None, tb)
    debugger._end()


def _wait_for_debugger(what: str) -> socket.socket:
    """The connection of a debugger (this user's) to this worker's socket."""
    directory = debug_dir()
    os.makedirs(directory, mode=0o700, exist_ok=True)
    if os.stat(directory).st_uid != os.getuid():
        raise PermissionError(f"{directory} belongs to another user: it cannot hold this user's debugger sockets")
    os.chmod(directory, 0o700)
    path = os.path.join(directory, f"{os.getpid()}.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    server.bind(path)
    server.listen(1)
    print(f"raylite: {what} (pid {os.getpid()}) waits for a debugger: attach with "
          f"`python -m raylite.util.rpdb {os.getpid()}`", file=sys.stderr, flush=True)
    try:
        while True:
            conn, _ = server.accept()
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            if struct.unpack("3i", creds)[1] == os.getuid():
                break
            conn.close()   # another user's process
    finally:
        server.close()
        os.unlink(path)
    return conn
