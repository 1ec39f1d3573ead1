"""What the machine was like while a bench script ran (peers.py, lightning_overhead.py): the load
average, how fast it runs plain Python, and, on Linux, how much CPU time the hypervisor took away
(steal time).

Small-task figures are mostly Python executed per task, so on a shared VM they follow the host's
mood: a day whose pure-Python loop runs 1.3x slower, or whose vCPUs lose a tenth of their time to
other guests, moves every figure, and moves the peers by different amounts (a peer that sleeps more
loses less to steal). Printing both beside the figures says whether a run was on an "otherwise idle
machine" and whether two runs can be compared at all.
"""
from __future__ import annotations

import os
import time

_LOOP = 1_000_000   # iterations of the speed probe


def python_ns_per_iteration(rounds: int = 5) -> float:
    """The best of `rounds` timings of a plain `for` loop adding integers, in ns per iteration."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        x = 0
        for i in range(_LOOP):
            x += i
        best = min(best, time.perf_counter() - t0)
    return best / _LOOP * 1e9


def cpu_ticks(stat_text: str | None = None) -> tuple[int, int] | None:
    """(every tick, stolen ticks) of all CPUs so far, from /proc/stat's "cpu" line (or the text
    given); None where there is no such file or line."""
    if stat_text is None:
        try:
            with open("/proc/stat") as f:
                stat_text = f.read()
        except OSError:
            return None
    for line in stat_text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            # user nice system idle iowait irq softirq steal [guest guest_nice: already in user]
            ticks = [int(v) for v in fields[1:9]]
            if len(ticks) < 8:
                return None
            return sum(ticks), ticks[7]
    return None


def stolen_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of all CPUs' time the hypervisor took between two cpu_ticks readings."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    return (after[1] - before[1]) / (after[0] - before[0])


class Context:
    """Started before the measuring; `figures()` once it is over, and `line()` says them."""

    def __init__(self):
        self.load = os.getloadavg()[0]
        self.ticks = cpu_ticks()
        self.ns = python_ns_per_iteration()
        self._end: dict | None = None

    def figures(self) -> dict:
        """What --json files keep: read at the first call after the measuring, then kept."""
        if self._end is None:
            self._end = {"load": [self.load, os.getloadavg()[0]], "python_ns_per_iteration": self.ns,
                         "stolen_share": stolen_share(self.ticks, cpu_ticks())}
        return self._end

    def line(self) -> str:
        f = self.figures()
        stolen = f["stolen_share"]
        return (f"machine: {os.cpu_count()} CPUs, load average {f['load'][0]:.2f} at the start and "
                f"{f['load'][1]:.2f} at the end; a pure-Python loop at {self.ns:.1f} ns an iteration "
                "(small-task figures scale with it)"
                + ("" if stolen is None else f"; CPU time taken by the hypervisor meanwhile {stolen:.1%}"))
