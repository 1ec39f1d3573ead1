"""Ray's log deduplication for worker output: a line that several workers print (numbers aside)
is printed the first time, and its repeats from other workers are counted for a window
(``RAY_DEDUP_LOGS_AGG_WINDOW_S``, 5 s) and then printed once as ``line [repeated 7x across
cluster]``. ``RAY_DEDUP_LOGS=0`` turns it off; ``RAY_DEDUP_LOGS_ALLOW_REGEX`` lines are never held,
``RAY_DEDUP_LOGS_SKIP_REGEX`` lines never printed. A worker's own repeats are printed as they come.
"""
from __future__ import annotations

import os
import re

_NUMBERED = re.compile(r"\S*\d\S*")   # a word with a digit (hex "0x..." words have one too)
_PROGRESS = re.compile(r" \[[0-9.]+ \S+/s\]$")   # raylite.experimental.tqdm_ray's status lines: each bar its own
_HINT = (" (raylite deduplicates logs as Ray does by default. Set RAY_DEDUP_LOGS=0 to disable log "
         "deduplication.)")


def from_environment() -> Deduplicator | None:
    """The deduplicator Ray's variables ask for, or None when it is off."""
    if os.environ.get("RAY_DEDUP_LOGS", "1") == "0":
        return None
    return Deduplicator(float(os.environ.get("RAY_DEDUP_LOGS_AGG_WINDOW_S", 5)),
                        os.environ.get("RAY_DEDUP_LOGS_ALLOW_REGEX") or None,
                        os.environ.get("RAY_DEDUP_LOGS_SKIP_REGEX") or None)


def _pattern(line: str) -> str:
    """The line without its words that hold numbers (pids, counters, addresses differ by worker)."""
    return " ".join(_NUMBERED.sub("", line).split())


class _Held:
    __slots__ = ("since", "count", "line", "sources")

    def __init__(self, since: float, line: str, source: int):
        self.since, self.count, self.line, self.sources = since, 0, line, {source}


class Deduplicator:
    """One output stream's recent line patterns. Lines go in as (source, prefixed text, text)."""

    def __init__(self, window_s: float, allow: str | None = None, skip: str | None = None):
        self.window_s = window_s
        self.allow = re.compile(allow) if allow else None
        self.skip = re.compile(skip) if skip else None
        self.recent: dict[str, _Held] = {}   # pattern -> what was held of it, oldest first
        self.hinted = False

    def lines(self, source: int, prefix: str, lines: list[str], now: float) -> list[str]:
        """What to print now of these lines (prefixed), after what older patterns release."""
        out = self.expired(now)
        for line in lines:
            if self.skip is not None and self.skip.search(line):
                continue
            key = _pattern(line)
            if not key or _PROGRESS.search(line) or (self.allow is not None and self.allow.search(line)):
                out.append(prefix + line)
                continue
            held = self.recent.get(key)
            if held is None:
                self.recent[key] = _Held(now, prefix + line, source)
                out.append(prefix + line)
                continue
            held.sources.add(source)
            if len(held.sources) > 1:   # another worker's repeat: counted, printed when the window ends
                held.count += 1
                held.line = prefix + line
            else:
                out.append(prefix + line)
        return out

    def next_due(self) -> float | None:
        """When the oldest held pattern's window ends (None: nothing held)."""
        return next(iter(self.recent.values())).since + self.window_s if self.recent else None

    def expired(self, now: float, everything: bool = False) -> list[str]:
        """The summaries of the patterns whose window ended (all with `everything`)."""
        out = []
        while self.recent:
            key, held = next(iter(self.recent.items()))
            if not everything and now - held.since < self.window_s:
                break
            del self.recent[key]
            if held.count > 1:
                out.append(f"{held.line} [repeated {held.count}x across cluster]" + ("" if self.hinted else _HINT))
                self.hinted = True
                if not everything:   # it keeps counting, from now
                    held.since, held.count = now, 0
                    self.recent[key] = held
            elif held.count == 1:
                out.append(held.line)
        return out
