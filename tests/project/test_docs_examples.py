"""Every Python code block of README.md and docs/ runs, each in a fresh interpreter with a timeout.

A block runs on its own, in its own temporary directory (also its HOME and RAYLITE_RESULTS_DIR), so
blocks share nothing and the tests may run in parallel. An HTML comment on the line before a block
changes that (docs/contributing.md documents it):

    <!-- docs-test: skip=gpu -->       not run: needs a GPU (or skip=cluster, skip=network)
    <!-- docs-test: continue -->       runs after the page's previous block, in the same interpreter
    <!-- docs-test: timeout=120 slow --> a longer limit (default 60 s), and pytest's slow marker

The README is also held to its landing-page shape: at most 250 lines, the set-up commands exactly as
CI runs them, and links that resolve.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers import REPO_ROOT

REPO = REPO_ROOT
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
SKIP_REASONS = ("cluster", "gpu", "network")
DEFAULT_TIMEOUT_S = 60
README_MAX_LINES = 250
# the two set-up commands, byte for byte (the second is what .ci/run does)
SETUP_COMMANDS = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e "
    "'.[train,lightning,plot]' && python examples/wine_quality.py --data "
    "../shared/data/wine-quality/winequality-red.csv",
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e "
    "'.[dev]' && python -m pytest -q -x",
)

FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*docs-test:(?P<words>.*?)-->\s*$")


@dataclass
class Block:
    page: Path
    line: int                      # 1-based line of the opening fence
    code: str
    words: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    """The page's Python blocks, in order, dedented, each with its marker's words."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m["lang"]:
            i += 1
            continue
        indent, start = m["indent"], i
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        i += 1
        if m["lang"] not in ("python", "py"):
            continue
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(before)
        found.append(Block(page, start + 1, "\n".join(body) + "\n", marker["words"].split() if marker else []))
    return found


def programs() -> list[tuple[Block, str]]:
    """(first block, program) for each block not skipped, with `continue` blocks appended to theirs."""
    runs: list[list] = []
    for page in PAGES:
        previous = None
        for block in blocks_of(page):
            if "continue" in block.words and previous is not None:
                previous[1] += block.code
                previous[0].words += [w for w in block.words if w.startswith("timeout=") or w == "slow"]
                continue
            previous = None
            if any(w.startswith("skip=") for w in block.words):
                continue
            previous = [block, block.code]
            runs.append(previous)
    return [(b, code) for b, code in runs]


def marker_problems() -> list[str]:
    problems = []
    for page in PAGES:
        previous_ran = False
        for block in blocks_of(page):
            for word in block.words:
                key, _, value = word.partition("=")
                if key == "skip" and value not in SKIP_REASONS:
                    problems.append(f"{block.name}: skip={value!r}, not one of {SKIP_REASONS}")
                elif key == "timeout" and not value.isdigit():
                    problems.append(f"{block.name}: timeout={value!r} is not a number of seconds")
                elif key not in ("skip", "timeout", "continue", "slow"):
                    problems.append(f"{block.name}: unknown docs-test word {word!r}")
            skipped = any(w.startswith("skip=") for w in block.words)
            if "continue" in block.words and not previous_ran:
                problems.append(f"{block.name}: 'continue' after a block that does not run")
            previous_ran = not skipped
    return problems


def _timeout(block: Block) -> int:
    return max([int(w[8:]) for w in block.words if w.startswith("timeout=")] or [DEFAULT_TIMEOUT_S])


def _param(block: Block, code: str):
    # pytest-timeout's limit (120 s in pyproject) must not cut a block's own longer one short
    marks = [pytest.mark.timeout(_timeout(block) + 30)] + ([pytest.mark.slow] if "slow" in block.words else [])
    return pytest.param(block, code, id=block.name, marks=marks)


@pytest.mark.parametrize(("block", "code"), [_param(b, c) for b, c in programs()])
def test_code_block_runs(block: Block, code: str, tmp_path: Path):
    timeout = _timeout(block)
    script = tmp_path / "block.py"
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "HOME": str(tmp_path), "RAYLITE_RESULTS_DIR": str(tmp_path / "results"),
           "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "MPLBACKEND": "Agg"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)   # its own session: the block's workers go with it
        out, _ = proc.communicate()
        pytest.fail(f"{block.name} ran past {timeout} s; its output:\n{out[-4000:]}")
    assert proc.returncode == 0, f"{block.name} exited {proc.returncode}; its output:\n{out[-4000:]}"


def test_markers_are_known():
    assert marker_problems() == []


def test_block_extraction_reads_markers_and_indented_fences(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("- item\n\n  ```python\n  x = 1\n  ```\n\n<!-- docs-test: skip=gpu -->\n```python\n"
                    "import torch\n```\n\n```bash\nls\n```\n", encoding="utf-8")
    found = blocks_of(page)
    assert [(b.line, b.code, b.words) for b in found] == [(3, "x = 1\n", []), (8, "import torch\n", ["skip=gpu"])]


def test_readme_is_a_landing_page():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    for command in SETUP_COMMANDS:
        assert command in lines, f"README.md lost the set-up command {command!r}"


def test_readme_links_resolve():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    missing = [target for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
               if "://" not in target and not (REPO / target).exists()]
    assert missing == []
