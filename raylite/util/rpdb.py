"""``breakpoint()`` inside a task or actor (Ray's ``ray.util.rpdb``; Ray's debugger docs), and
post-mortem debugging of a task's uncaught exception with ``RAY_DEBUG_POST_MORTEM=1``.

A worker has no terminal, so ``breakpoint()`` there opens a pdb session on a Unix socket and
says so in its output (which reaches the driver); the task waits until a debugger attaches, as
with Ray's ``ray debug``. Attach from a terminal on this machine::

    python -m raylite.util.rpdb          # the only waiting breakpoint, or a list of them
    python -m raylite.util.rpdb PID      # the one in that worker

The sockets live in a directory only this user may enter, and a connection from another user is
refused (its peer credentials are checked), so nothing is reachable from elsewhere. ``c``
(continue) ends the session and lets the task go on; ``PYTHONBREAKPOINT`` still decides, as in
Python, when it is set.
"""
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


def waiting() -> dict[int, str]:
    """Worker pid -> socket path, for every breakpoint waiting for a debugger."""
    directory = debug_dir()
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return {}
    return {int(n[:-5]): os.path.join(directory, n) for n in names if n.endswith(".sock") and n[:-5].isdigit()}


def attach(path: str, stdin=None, stdout=None) -> None:
    """Relay a terminal (stdin, stdout) to the pdb session at path until it ends."""
    import select
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    sources = [conn, stdin]
    try:
        while True:
            ready, _, _ = select.select(sources, [], [])
            if conn in ready:
                data = conn.recv(65536)
                if not data:   # the session ended (continue, quit)
                    return
                stdout.write(data.decode("utf-8", "replace"))
                stdout.flush()
            if stdin in ready:   # raw reads: select sees no data a buffered reader already took
                data = os.read(stdin.fileno(), 65536)
                if not data:   # end of input: let the task go on
                    sources.remove(stdin)
                    data = b"c\n"
                conn.sendall(data)
    except (BrokenPipeError, ConnectionResetError):   # it ended while we wrote
        return
    finally:
        conn.close()


def main(argv: list[str]) -> int:
    found = waiting()
    if argv:
        pid = int(argv[0])
        if pid not in found:
            print(f"no breakpoint waits in pid {pid}; waiting: {sorted(found) or 'none'}", file=sys.stderr)
            return 1
    elif len(found) == 1:
        pid = next(iter(found))
    else:
        print("breakpoints waiting for a debugger (pid): " + (", ".join(map(str, sorted(found))) or "none")
              + ("; pass one" if found else ""), file=sys.stderr)
        return 1 if not found else 2
    attach(found[pid])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
