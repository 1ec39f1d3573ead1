"""Plain helpers shared by the test modules (conftest exposes them as fixtures too)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent   # the checkout: tests/ sits at its top
TESTS_DIR = REPO_ROOT / "tests"


def wait_until(predicate, timeout=15.0, interval=0.02, message=None, what=None):
    """Poll ``predicate`` until it returns a truthy value; return that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(message or f"{what or 'condition'} not reached within {timeout} s")
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (a zombie runs no code)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    # Format: pid (comm) state ... ; comm may contain spaces/parens.
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def make_tree(root, files: dict) -> str:
    """Write {relative path: text} under root (a pytest tmp_path): a fake /sys or /dev tree."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root)


def make_wheel(directory, name: str, version: str, source: str) -> str:
    """A pure-Python wheel holding one module `name` (pip installs it offline); its path."""
    import base64
    import hashlib
    import os
    import zipfile
    info = f"{name}-{version}.dist-info"
    files = {f"{name}.py": source,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: raylite-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    def digest(text: str) -> str:
        return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
    record = "".join(f"{p},{digest(c)},{len(c.encode())}\n" for p, c in files.items()) + f"{info}/RECORD,,\n"
    path = os.path.join(directory, f"{name}-{version}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as z:
        for p, c in files.items():
            z.writestr(p, c)
        z.writestr(f"{info}/RECORD", record)
    return path
