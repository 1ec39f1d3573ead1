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
import socket
import sys

from raylite.core.worker.debugger import debug_dir, post_mortem, set_trace

__all__ = ["attach", "debug_dir", "main", "post_mortem", "set_trace", "waiting"]


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
