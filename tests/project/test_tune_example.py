"""examples/tune_wine_quality.py end to end, small: a few trials, a few epochs, ASHA + TPE, plots."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO_ROOT

pytest.importorskip("optuna")
pytest.importorskip("torch")

ROOT = REPO_ROOT
EXAMPLE = ROOT / "examples" / "tune_wine_quality.py"
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "wine-quality" / "winequality-red.csv"


@pytest.mark.timeout(180)
def test_tune_wine_quality_example(tmp_path):
    data = Path(os.environ.get("RAYLITE_WINE_DATA") or DEFAULT_DATA)
    if not data.is_file():
        pytest.skip(f"wine-quality data not found at {data} (set RAYLITE_WINE_DATA)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--data", str(data), "--num-samples", "6", "--max-epochs", "6",
         "--grace-period", "1", "--num-cpus", "2", "--storage-path", str(tmp_path / "results"), "--name", "wine",
         "--plot", str(tmp_path / "wine.png"), "--verbose", "0"],
        capture_output=True, text=True, timeout=170, cwd=str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "6 trials in" in out and "best config: lr=" in out and "h1=" in out and "batch_size=" in out
    acc = float(out.split("test_acc ")[1].split()[0])
    assert acc > 0.6, out
    for name in ("wine_history.png", "wine_importances.png"):
        assert (tmp_path / name).stat().st_size > 1000
    assert (tmp_path / "results" / "wine" / "study.db").exists()

    missing = subprocess.run([sys.executable, str(EXAMPLE), "--data", str(tmp_path / "nope.csv")],
                             capture_output=True, text=True, timeout=60, env=env)
    assert missing.returncode == 2 and "not found" in missing.stderr
