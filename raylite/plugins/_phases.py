"""Where a RayStrategy call's time goes: wall-clock marks taken in the driver and in rank 0.

Every process of one machine shares ``time.time()``, so rank 0's marks and the driver's line up;
``strategy.worker_results["phases"]`` gives each as seconds since the driver's ``launch``. A mark
is one clock read: always on.
"""
from __future__ import annotations

import time


class Phases:
    """Named moments, first one wins (``first_step`` is marked on every step, kept once)."""

    def __init__(self) -> None:
        self.marks: dict[str, float] = {}

    def mark(self, name: str) -> None:
        self.marks.setdefault(name, time.time())

    def update(self, marks: dict | None) -> None:
        for name, at in (marks or {}).items():
            self.marks.setdefault(name, at)

    def relative(self, start: str = "launch") -> dict[str, float]:
        """Each mark as seconds after ``start``, in time order."""
        origin = self.marks.get(start, min(self.marks.values(), default=0.0))
        return {k: round(v - origin, 4) for k, v in sorted(self.marks.items(), key=lambda kv: kv[1])}
