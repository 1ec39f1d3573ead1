"""raylite.experimental.tqdm_ray draws real bars in the driver from workers' updates (as Ray's
does): the board (raylite.core.node.bars) on a fake terminal, and a driver on a real pseudo-terminal."""
from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import sys
import textwrap
import time

from helpers import REPO_ROOT

REPO = str(REPO_ROOT)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _state_line(uuid: str, x: int, total: int, closed: bool = False, desc: str = "epoch") -> bytes:
    from raylite.core.node.bars import MAGIC
    state = {"uuid": uuid, "desc": desc, "x": x, "total": total, "unit": "it", "pos": 0, "elapsed": 2.0,
             "closed": closed}
    return (MAGIC + json.dumps(state)).encode()


def test_the_board_keeps_live_bars_below_worker_output():
    from raylite.core.node.bars import Board
    term = _Terminal()
    board = Board(stream=term)
    rest = board.take("(work pid=7) ", 7, [b"hello", _state_line("a", 2, 10), _state_line("b", 5, 5, desc="load")])
    assert rest == [b"hello"] and board.drawn == 2
    screen = term.getvalue()
    assert "epoch:  20%|" in screen and "| 2/10 it [00:02, 1.0 it/s] (work pid=7)" in screen
    assert "load: 100%|" + "█" * 24 + "|" in screen
    term.truncate(0), term.seek(0)
    board.around(lambda: term.write("(work pid=7) a line of output\n"))
    assert term.getvalue().startswith("\x1b[2F\x1b[J(work pid=7) a line of output\n")   # cleared, printed, redrawn
    assert term.getvalue().count("\n") == 3 and board.drawn == 2
    term.truncate(0), term.seek(0)
    board.take("(work pid=7) ", 7, [_state_line("a", 10, 10, closed=True)])
    assert board.drawn == 1 and term.getvalue().count("100%|") == 2   # the closed one stays, printed once
    board.forget(7)
    assert board.drawn == 0 and board.bars == {}


def test_without_a_terminal_states_are_status_lines():
    from raylite.core.node.bars import Board
    board = Board(stream=io.StringIO())
    rest = board.take("(work pid=7) ", 7, [_state_line("a", 4, 10), _state_line("a", 4, 10, closed=True)])
    assert rest == [b"epoch:  40% 4/10 it [2.0 it/s]"] and board.drawn == 0   # the close said nothing new


DRIVER = textwrap.dedent("""
    import time
    import raylite as ray
    from raylite.experimental.tqdm_ray import tqdm
    ray.init(num_cpus=1)

    @ray.remote
    def work():
        for _ in tqdm(range(5), desc="ptybar", flush_interval_s=0):
            time.sleep(0.02)
        print("work-done", flush=True)

    ray.get(work.remote())
    ray.shutdown()   # (it prints what the worker wrote last)
    print("DONE", flush=True)
""")


def test_a_driver_on_a_terminal_draws_the_workers_bars(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            env=dict(os.environ, PYTHONPATH=REPO, COLUMNS="120"), close_fds=True)
    os.close(slave)
    screen = b""
    deadline = time.monotonic() + 60
    try:
        while b"DONE" not in screen and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    screen += os.read(master, 65536)
                except OSError:   # the driver closed the terminal
                    break
    finally:
        proc.wait(30)
        os.close(master)
    text = screen.decode(errors="replace")
    assert "DONE" in text, text
    assert "ptybar: 100%|" + "█" * 24 + "| 5/5 it" in text and "\x1b[" in text and "(work pid=" in text
    assert "__raylite_tqdm__" not in text and "work-done" in text
