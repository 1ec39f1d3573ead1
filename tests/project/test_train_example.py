"""examples/train_wine_quality.py: the wine model with Trainer(num_workers=2) on the shared data."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO_ROOT

pytest.importorskip("torch")

ROOT = REPO_ROOT
EXAMPLE = ROOT / "examples" / "train_wine_quality.py"
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "wine-quality" / "winequality-red.csv"
EPOCHS = 5


@pytest.fixture(scope="module")
def data_path() -> Path:
    p = Path(os.environ.get("RAYLITE_WINE_DATA") or DEFAULT_DATA)
    if not p.is_file():
        pytest.skip(f"wine-quality data not found at {p} (set RAYLITE_WINE_DATA)")
    return p


def _run(args, cwd, timeout=150):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=env)


@pytest.mark.timeout(180)
def test_example_trains_with_two_workers_and_checkpoints(data_path, tmp_path):
    proc = _run(["--data", str(data_path), "--epochs", str(EPOCHS), "--num-workers", "2",
                 "--storage-path", str(tmp_path), "--keep", "2"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    rows = re.findall(r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)
    assert [int(r[0]) for r in rows] == list(range(EPOCHS))
    losses = [float(r[1]) for r in rows]
    assert losses[-1] < losses[0]
    assert re.search(r"rank 0 pid \d+ \(cpu\), rank 1 pid \d+ \(cpu\)", out)
    acc, base = map(float, re.search(r"accuracy of the final checkpoint: ([\d.]+) \(majority class: ([\d.]+)\)",
                                     out).groups())
    assert acc > base + 0.1, out
    ckpt = re.search(r"final checkpoint: (\S+)", out).group(1)
    run_dir = os.path.dirname(ckpt)
    assert ckpt.endswith(f"checkpoint_{EPOCHS - 1:06d}") and os.path.isfile(os.path.join(ckpt, "model.pt"))
    assert sorted(n for n in os.listdir(run_dir) if n.startswith("checkpoint_")) == \
        [f"checkpoint_{EPOCHS - 2:06d}", f"checkpoint_{EPOCHS - 1:06d}"]
    with open(os.path.join(run_dir, "result.json")) as f:
        history = [json.loads(line) for line in f]
    assert [h["epoch"] for h in history] == list(range(EPOCHS))
    assert os.path.isfile(os.path.join(run_dir, "progress.csv"))


def test_example_missing_data_is_a_clear_error(tmp_path):
    missing = tmp_path / "nope.csv"
    proc = _run(["--data", str(missing), "--epochs", "1"], tmp_path, timeout=100)
    assert proc.returncode == 2
    assert str(missing) in proc.stderr and "not found" in proc.stderr
