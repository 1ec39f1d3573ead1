"""No module in raylite/ over 500 lines (issue 26): a long module is split by responsibility.

Today's offenders are listed with their line counts as a ratchet: such a file may shrink but not
grow, and its entry goes once it is under the limit, so the list only gets shorter."""
from __future__ import annotations

from helpers import REPO_ROOT

PACKAGE = REPO_ROOT / "raylite"
LIMIT = 500

# path under raylite/: the line count it may not exceed (split it rather than raise the number)
OVER_LIMIT: dict[str, int] = {}   # none today (core/node/manager.py was the last: 1,136 lines when the ratchet came)


def _line_counts() -> dict[str, int]:
    return {path.relative_to(PACKAGE).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
            for path in sorted(PACKAGE.rglob("*.py"))}


def test_no_module_grows_past_the_limit():
    counts = _line_counts()
    problems = []
    for name, lines in counts.items():
        allowed = OVER_LIMIT.get(name, LIMIT)
        if lines > allowed:
            why = (f"{LIMIT}-line limit" if name not in OVER_LIMIT
                   else f"ratchet of {allowed} lines in tests/project/test_module_size.py (split it, do not raise the number)")
            problems.append(f"raylite/{name}: {lines} lines, over the {why}")
    for name, allowed in OVER_LIMIT.items():
        if name not in counts:
            problems.append(f"raylite/{name} is gone: remove its entry from OVER_LIMIT")
        elif counts[name] <= LIMIT:
            problems.append(f"raylite/{name} is {counts[name]} lines, within the limit: remove its entry from OVER_LIMIT")
    print(f"{len(OVER_LIMIT)} modules over {LIMIT} lines remain: "
          + ", ".join(f"{name} {counts.get(name)}/{allowed}" for name, allowed in OVER_LIMIT.items()))
    assert not problems, "\n".join(problems)
