"""Progress bars drawn by the driver (raylite.experimental.tqdm_ray), as Ray draws its tqdm_ray bars.

A bar in a worker prints its state as one marked line (MAGIC, then JSON) on its stderr; the node
(raylite.core.node.output) hands such lines here instead of printing them. On a terminal the board
keeps one live line per bar at the bottom of stderr, redrawn in place; worker output goes above
it (``around`` clears the bars for the write and draws them again), and a bar that closes stays
printed in its final state. Without a terminal each state arrives as a status line with the
worker's prefix, ``(name pid=N) desc:  40% 4/10 it [2.1 it/s]``, as in a log file. A bar in the
driver itself goes to the same board.
"""
from __future__ import annotations

import sys
import threading

MAGIC = "__raylite_tqdm__ "
MAGIC_BYTES = MAGIC.encode()
BAR_WIDTH = 24


def _fields(state: dict) -> tuple:
    """(head, count, total, unit, elapsed, rate) of a bar's state, as both texts show them."""
    x, total, unit = state.get("x", 0), state.get("total"), state.get("unit") or "it"
    elapsed = state.get("elapsed", 0.0)
    head = f"{state['desc']}: " if state.get("desc") else ""
    return head, x, total, unit, elapsed, x / max(elapsed, 1e-9)


def status_text(state: dict) -> str:
    """``desc:  40% 4/10 it [2.1 it/s]``: one bar's state as a plain line."""
    head, x, total, unit, _, rate = _fields(state)
    done = f"{x}/{total}" if total else str(x)
    percent = f"{100 * x / total:3.0f}% " if total else ""
    return f"{head}{percent}{done} {unit} [{rate:.1f} {unit}/s]"


def bar_text(state: dict, width: int) -> str:
    """``desc:  40%|██████          | 4/10 it [00:02, 2.1 it/s]``, cut to the terminal's width."""
    head, x, total, unit, elapsed, rate = _fields(state)
    clock = f"{int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}"
    if total:
        filled = min(BAR_WIDTH, int(BAR_WIDTH * x / total))
        bar = f"{100 * x / total:3.0f}%|{'█' * filled}{' ' * (BAR_WIDTH - filled)}| {x}/{total}"
    else:
        bar = f"{x}"
    text = f"{head}{bar} {unit} [{clock}, {rate:.1f} {unit}/s]{state.get('suffix', '')}"
    return text[:max(10, width - 1)]


class Board:
    """The bars shown now, keyed by (pid, bar id); one lock for the node's thread and user threads."""

    def __init__(self, stream=None):
        self._stream = stream
        self.bars: dict[tuple, dict] = {}
        self.drawn = 0   # live lines on the terminal now
        self.printed: dict[tuple, int] = {}   # no terminal: the count each bar's last status line showed
        self.lock = threading.RLock()

    @property
    def stream(self):
        return self._stream if self._stream is not None else sys.stderr

    def tty(self) -> bool:
        try:
            return self.stream.isatty()
        except (AttributeError, ValueError):
            return False

    def take(self, prefix: str, pid: int | None, lines: list[bytes]) -> list[bytes]:
        """A worker's output lines less its bars' states (drawn here); on no terminal those
        states come back as status lines."""
        import json  # (here: the node imports this module at init, and most runs draw no bars)
        rest = []
        for line in lines:
            if not line.startswith(MAGIC_BYTES):
                rest.append(line)
                continue
            try:
                state = json.loads(line[len(MAGIC_BYTES):])
            except ValueError:
                rest.append(line)
                continue
            state["suffix"] = f" {prefix.strip()}" if prefix else ""
            key = (pid, state.get("uuid"))
            if self.update(key, state):
                continue
            shown = self.printed.pop(key, None) if state.get("closed") else None
            if shown != state.get("x"):   # (a close that says nothing new prints nothing)
                rest.append(status_text(state).encode())
                if not state.get("closed"):
                    self.printed[key] = state.get("x")
        return rest

    def update(self, key: tuple, state: dict) -> bool:
        """Show a bar's new state; False when there is no terminal to draw on (the caller prints)."""
        if not self.tty():
            return False
        with self.lock:
            self._hide()
            if state.get("closed"):
                self.bars.pop(key, None)
                self._write(bar_text(state, self._width()) + "\n")   # stays, in its final state
            else:
                self.bars[key] = state
            self._show()
        return True

    def forget(self, pid: int | None) -> None:
        """A worker's pipes closed: its bars stop being live (their last states stay printed)."""
        with self.lock:
            mine = [k for k in self.bars if k[0] == pid]
            if not mine:
                return
            self._hide()
            for key in mine:
                self._write(bar_text(self.bars.pop(key), self._width()) + "\n")
            self._show()

    def around(self, write) -> None:
        """Run ``write`` (printing worker output) with the live bars cleared, then draw them again."""
        if not self.drawn:
            return write()
        with self.lock:
            self._hide()
            try:
                write()
            finally:
                self._show()

    def _width(self) -> int:
        import shutil
        return shutil.get_terminal_size((100, 20)).columns

    def _hide(self) -> None:
        if self.drawn:
            self._write(f"\x1b[{self.drawn}F\x1b[J")   # up to the first live line, clear to the end
            self.drawn = 0

    def _show(self) -> None:
        width = self._width()
        shown = sorted(self.bars.values(), key=lambda s: s.get("pos") or 0)
        if shown:
            self._write("".join(bar_text(s, width) + "\n" for s in shown))
        self.drawn = len(shown)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            pass


_board: Board | None = None


def live() -> Board | None:
    """The board while it has bars drawn, else None (one attribute read on the output path)."""
    return _board if _board is not None and _board.drawn else None


def board() -> Board:
    """This process's board (the driver's: workers' bars and its own)."""
    global _board
    if _board is None:
        _board = Board()
    return _board
