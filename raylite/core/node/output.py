"""Worker output: each line a worker prints reaches the driver's stdout or stderr with Ray's
prefix, `(name pid=N) ...`. A part of the node (raylite.core.node.manager wires it)."""
from __future__ import annotations

import os
import selectors
import sys
import time
from collections import deque

from raylite.core.node import bars, log_dedup
from raylite.core.node.records import WorkerProc
from raylite.core.node.state import NodeState

MAX_PARTIAL_LINE = 1 << 16   # worker output without a newline is printed once this long
RECENT_LINES = 2000          # worker output lines the control endpoint can show (raylite.core.api.control)


def _last_drawing(line: bytes) -> bytes:
    """What a terminal would show of a line redrawn with carriage returns (tqdm's bars): the
    text after the last one (a trailing one, as in CRLF, ends the line)."""
    if b"\r" not in line:
        return line
    line = line.rstrip(b"\r")
    return line[line.rfind(b"\r") + 1:]


class RecentOutput:
    """The last RECENT_LINES lines workers wrote, for `raylite logs` and the dashboard: (time, pid,
    name, stream, bytes) each; line number ``total - 1`` is the newest. Written by the node thread;
    read under the node lock."""

    def __init__(self):
        self.lines: deque = deque(maxlen=RECENT_LINES)
        self.total = 0

    def add(self, w: WorkerProc, stream: str, lines: list[bytes]) -> None:
        now = time.time()
        self.lines.extend((now, w.pid, w.name, stream, line) for line in lines)
        self.total += len(lines)

    def since(self, seq: int) -> tuple[list, int]:
        """(entries numbered seq and after that are still kept, the next number)."""
        first = self.total - len(self.lines)
        return list(self.lines)[max(0, seq - first):], self.total


class _DedupTimer:
    """A node timer (ObjectTable.add_timer) that prints what log deduplication held once its window ends."""

    done = False

    def __init__(self, output: WorkerOutput):
        self.output = output

    def expire(self) -> None:
        self.output.dedup_timer = None
        self.output.release_held(time.monotonic())


class WorkerOutput:
    """Forwards the workers' stdout and stderr pipes; needs nothing but the state."""

    def __init__(self, state: NodeState):
        self.s = state
        dedup = log_dedup.from_environment()   # (Ray's RAY_DEDUP_LOGS variables)
        self.dedup = None if dedup is None else {"stdout": dedup, "stderr": log_dedup.from_environment()}
        self.dedup_timer: _DedupTimer | None = None
        self.recent_output = RecentOutput()

    def on_output(self, w: WorkerProc, fd: int, stream: str) -> None:
        s = self.s
        if fd not in (w.out_fd, w.err_fd):   # closed already (a stale event): the number may be reused
            return
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            s.sel.unregister(fd)
            os.close(fd)
            if fd == w.out_fd:
                w.out_fd = -1
            else:
                w.err_fd = -1
            data = b"\n" if w.partial.get(fd) else b""
            if (live := bars.live()) is not None:
                live.forget(w.pid)
        text = w.partial.pop(fd, b"") + data
        *lines, rest = text.split(b"\n")
        rest = _last_drawing(rest)   # a progress bar redraws its line with \r for days
        if len(rest) > MAX_PARTIAL_LINE:
            lines.append(rest)
            rest = b""
        if rest:
            w.partial[fd] = rest
        if not lines:
            return
        if w.pid is None:   # its hello (on the control socket) is not read yet: the lines wait for
            w.early_output.append((stream, lines))   # the pid that names them (see emit_early_output)
            return
        self._emit(w, stream, lines)

    def emit_early_output(self, w: WorkerProc) -> None:
        """What a worker wrote before the node read its hello, now that its pid is known (or it
        died without one)."""
        early, w.early_output = w.early_output, []
        for stream, lines in early:
            self._emit(w, stream, lines)

    def _emit(self, w: WorkerProc, stream: str, lines: list[bytes]) -> None:
        s = self.s
        if any(line.startswith(bars.MAGIC_BYTES) for line in lines):   # tqdm_ray's states: the driver draws them
            lines = bars.board().take(f"({w.name} pid={w.pid}) ", w.pid, lines)
            if not lines:
                return
        self.recent_output.add(w, stream, lines)
        if s.log_dir is not None:
            self._to_log_file(w, stream, lines)
        else:
            prefix = f"({w.name} pid={w.pid}) "
            text = [_last_drawing(line).decode(errors="replace") for line in lines]
            if self.dedup is None:
                return _write(stream, [prefix + line for line in text])
            _write(stream, self.dedup[stream].lines(w.pid, prefix, text, time.monotonic()))
            self._arm_dedup_timer()

    def _arm_dedup_timer(self) -> None:
        s = self.s
        due = [d for d in (self.dedup["stdout"].next_due(), self.dedup["stderr"].next_due()) if d is not None]
        if due and self.dedup_timer is None:
            self.dedup_timer = _DedupTimer(self)
            s.table.add_timer(min(due) - time.monotonic(), self.dedup_timer)

    def release_held(self, now: float, everything: bool = False) -> None:
        """Print the repeats log deduplication held whose window ended (all of them at shutdown)."""
        for stream, dedup in self.dedup.items():
            _write(stream, dedup.expired(now, everything))
        if not everything:
            self._arm_dedup_timer()

    def _to_log_file(self, w: WorkerProc, stream: str, lines: list[bytes]) -> None:
        """log_to_driver=False, for a worker that could not open its log files itself (see
        worker._log_to_files): its output goes to worker-<pid>.out / .err all the same."""
        s = self.s
        path = os.path.join(s.log_dir, f"worker-{w.pid}.{'out' if stream == 'stdout' else 'err'}")
        try:
            os.makedirs(s.log_dir, mode=0o700, exist_ok=True)
            with open(path, "ab") as f:
                f.write(b"".join(_last_drawing(line) + b"\n" for line in lines))
        except OSError:
            pass

    def drain(self) -> bool:
        """After the loop stopped: print what workers wrote last; True while pipes are open."""
        s = self.s
        keys = [k for k in s.sel.keys() if isinstance(k.fileobj, int)]
        for key in keys:
            key.data(selectors.EVENT_READ)
        return bool(keys)


def _write(stream: str, lines: list[str]) -> None:
    if not lines:
        return
    if (live := bars.live()) is not None:   # above the progress bars drawn at the bottom
        return live.around(lambda: _put(stream, lines))
    _put(stream, lines)


def _put(stream: str, lines: list[str]) -> None:
    out = getattr(sys, stream)
    try:
        out.write("".join(line + "\n" for line in lines))
        out.flush()
    except (OSError, ValueError):
        pass
