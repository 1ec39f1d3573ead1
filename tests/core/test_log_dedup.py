"""Ray's log deduplication of worker output (RAY_DEDUP_LOGS): a line several workers print,
numbers aside, is printed once and its repeats are counted, then summarised."""
import os
import time

import raylite as ray
from raylite.core.node.log_dedup import Deduplicator


def test_repeats_from_other_workers_are_counted_then_summarised():
    dedup = Deduplicator(window_s=5)
    assert dedup.lines(1, "(f pid=1) ", ["loaded shard 1", "step 0.5"], now=0) == ["(f pid=1) loaded shard 1",
                                                                                  "(f pid=1) step 0.5"]
    assert dedup.lines(1, "(f pid=1) ", ["loaded shard 2"], now=1) == ["(f pid=1) loaded shard 2"]   # its own
    assert dedup.lines(2, "(f pid=2) ", ["loaded shard 3"], now=2) == []
    assert dedup.lines(3, "(f pid=3) ", ["loaded shard 4"], now=3) == []
    assert dedup.next_due() == 5
    summary = dedup.expired(now=5)
    assert summary[0].startswith("(f pid=3) loaded shard 4 [repeated 2x across cluster] (raylite deduplicates")
    assert dedup.lines(4, "(f pid=4) ", ["loaded shard 5"], now=6) == []   # it goes on counting
    assert dedup.expired(now=20, everything=True) == ["(f pid=4) loaded shard 5"]   # one repeat: as it was
    assert dedup.recent == {}


def test_lines_that_are_never_held():
    dedup = Deduplicator(window_s=5, allow="KEEP", skip="NOISE")
    for source in (1, 2):
        assert dedup.lines(source, "", ["42", "KEEP me", "NOISE here", "train: 40% 4/10 it [2.1 it/s]"], now=0) == [
            "42", "KEEP me", "train: 40% 4/10 it [2.1 it/s]"]   # only numbers; allowed; skipped; progress bars


def test_workers_repeating_a_line_print_it_once_with_a_count(monkeypatch, read_output):
    monkeypatch.setenv("RAY_DEDUP_LOGS_AGG_WINDOW_S", "0.5")
    ray.init(num_cpus=3)
    try:
        @ray.remote
        def hello(i, gate):
            import time
            while time.time() < gate:   # the three run at once, so on three workers
                time.sleep(0.001)
            print(f"hello from task {i}")
            return os.getpid()

        pids = ray.get([hello.remote(i, time.time() + 1.0) for i in range(3)])
        out, _ = read_output(lambda o, e: "repeated" in o, timeout=10)   # the window ends without more output
    finally:
        ray.shutdown()
    assert len(set(pids)) == 3
    lines = [line for line in out.splitlines() if "hello from task" in line]
    assert len(lines) == 2 and "repeated" not in lines[0], out
    assert lines[1].endswith("[repeated 2x across cluster] (raylite deduplicates logs as Ray does by default. Set "
                             "RAY_DEDUP_LOGS=0 to disable log deduplication.)"), out


def test_ray_dedup_logs_0_prints_every_line(monkeypatch, read_output):
    monkeypatch.setenv("RAY_DEDUP_LOGS", "0")
    ray.init(num_cpus=2)
    try:
        @ray.remote
        def hello(i):
            print(f"hello from task {i}")

        ray.get([hello.remote(i) for i in range(4)])
        out, _ = read_output(lambda o, e: o.count("hello from task") == 4)
    finally:
        ray.shutdown()
    assert out.count("hello from task") == 4
