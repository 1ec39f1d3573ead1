"""The main job, examples/wine_quality.py, on the shared wine data with few steps."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO_ROOT

pytest.importorskip("numpy")
pytest.importorskip("torch")

ROOT = REPO_ROOT
EXAMPLE = ROOT / "examples" / "wine_quality.py"
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "wine-quality" / "winequality-red.csv"
STEPS = 200


def _data_path() -> Path:
    return Path(os.environ.get("RAYLITE_WINE_DATA") or DEFAULT_DATA)


@pytest.fixture(scope="module")
def wq():
    """The example, imported as a module under its own name."""
    name = "wine_quality"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def data_path() -> Path:
    p = _data_path()
    if not p.is_file():
        pytest.skip(f"wine-quality data not found at {p} (set RAYLITE_WINE_DATA)")
    return p


@pytest.fixture(scope="module")
def data(wq, data_path):
    X, quality = wq.load_wine(data_path)
    return wq.prepare(X, quality)


def _check_trained(wq, data, res):
    baseline = wq.majority_baseline(data)
    assert len(res.losses) == STEPS
    assert res.accuracy > baseline + 0.1, (res.accuracy, baseline)
    first, last = sum(res.losses[:20]) / 20, sum(res.losses[-20:]) / 20
    assert last < first - 0.05, (first, last)
    assert res.seconds > 0 and res.loop_seconds > 0


def test_load_and_prepare(wq, data_path, data):
    X, quality = wq.load_wine(data_path)
    assert X.shape == (1599, 11) and quality.shape == (1599,)
    assert len(data["X_train"]) + len(data["X_test"]) == 1599
    assert abs(len(data["X_test"]) / 1599 - 0.33) < 0.01
    # standardised on the train split
    assert abs(data["X_train"].mean(axis=0)).max() < 1e-4
    assert abs(data["X_train"].std(axis=0) - 1).max() < 1e-3
    assert set(data["y_train"].tolist()) == {0.0, 1.0}
    # the split is fixed by its seed
    again = wq.prepare(X, quality)
    assert (again["X_test"] == data["X_test"]).all()


def test_semicolon_separated_like_uci(wq, data_path, tmp_path):
    lines = data_path.read_text().splitlines()
    header = ";".join(f'"{h}"' for h in lines[0].split(","))
    semi = tmp_path / "winequality-red.csv"
    semi.write_text("\n".join([header] + [ln.replace(",", ";") for ln in lines[1:]]) + "\n")
    Xc, qc = wq.load_wine(data_path)
    Xs, qs = wq.load_wine(semi)
    assert (Xc == Xs).all() and (qc == qs).all()


def test_torch_mode_learns(wq, data):
    res = wq.run_torch(data, steps=STEPS)
    assert res.mode == "torch"
    _check_trained(wq, data, res)


def test_raylite_mode_learns(wq, data):
    pytest.importorskip("cloudpickle")
    import raylite as ray  # fails (not skips) until the runtime lands

    res = wq.run_raylite(data, steps=STEPS, num_cpus=2)
    assert res.mode == "raylite"
    _check_trained(wq, data, res)
    assert "worker pid" in res.note  # really ran in another process
    assert not ray.is_initialized()  # run_raylite shut down the runtime it started


def test_missing_data_path_is_a_clear_error(wq, tmp_path, capsys):
    missing = tmp_path / "no-such-dir" / "winequality-red.csv"
    assert wq.main(["--data", str(missing), "--mode", "torch", "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "not found" in err


def test_missing_env_path_is_a_clear_error(wq, tmp_path, monkeypatch):
    missing = tmp_path / "absent.csv"
    monkeypatch.setenv("RAYLITE_WINE_DATA", str(missing))
    with pytest.raises(wq.DataError, match="RAYLITE_WINE_DATA") as exc:
        wq.resolve_data_path(None)
    assert str(missing) in str(exc.value)


def test_bad_header_is_a_clear_error(wq, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(wq.DataError, match="quality"):
        wq.load_wine(bad)


def test_cli_torch_mode_end_to_end(data_path, tmp_path):
    """What the README's first command does, in small: table printed, plot written."""
    plot = tmp_path / "loss.png"
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--data", str(data_path), "--mode", "torch",
         "--steps", "50", "--plot", str(plot)],
        capture_output=True, text=True, timeout=100, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "torch" in proc.stdout and "accuracy" in proc.stdout
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in proc.stderr
    else:
        assert plot.is_file() and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the Lightning modes (issue 5) ---------------------------------------------------------------

@pytest.fixture
def one_thread():
    """As the CLI does (--threads 1): a model this small only loses time to intra-op threads."""
    import torch
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def test_lightning_mode_learns(wq, data, one_thread):
    pytest.importorskip("pytorch_lightning")
    res = wq.run_lightning(data, steps=STEPS)
    assert res.mode == "lightning"
    _check_trained(wq, data, res)


def test_ray_lightning_mode_learns(wq, data, one_thread):
    pytest.importorskip("pytorch_lightning")
    import raylite as ray

    res = wq.run_ray_lightning(data, steps=STEPS, num_cpus=2, num_workers=2, warm_refit=False)
    assert res.mode == "ray-lightning"
    _check_trained(wq, data, res)          # rank 0's losses came back with the weights
    assert "2 workers" in res.note and re.search(r"first step after \d+\.\d\d s", res.note)   # where cold time went
    assert not ray.is_initialized()        # it shut down the runtime it started


def test_ray_lightning_mode_with_more_workers_than_cpus(wq, data, one_thread):
    """3 workers on 2 CPUs: each gets 0.6666 CPU (2/3 rounded down to the runtime's grid), not an error."""
    pytest.importorskip("pytorch_lightning")
    res = wq.run_ray_lightning(data, steps=20, num_cpus=2, num_workers=3, warm_refit=False)
    assert res.mode == "ray-lightning" and "3 workers" in res.note and len(res.losses) == 20


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["lightning", "ray-lightning"])
def test_ctrl_c_in_a_lightning_mode_says_it_was_interrupted(data_path, tmp_path, wait_until, mode):
    """SIGINT once training runs: one line saying so and where the results are, the shell's status 130
    (Lightning itself catches the KeyboardInterrupt and exits 1 without a word at this log level)."""
    import signal
    import threading

    pytest.importorskip("pytorch_lightning")
    proc = subprocess.Popen([sys.executable, str(EXAMPLE), "--data", str(data_path), "--mode", mode,
                             "--steps", "1000000", "--no-plot"], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        wait_until(lambda: any("training started" in ln for ln in lines) or proc.poll() is not None,
                   timeout=180, what="the example to start training")
        assert proc.poll() is None, "".join(lines)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) == 130, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    said = [ln for ln in lines if "interrupted" in ln]
    assert said == [f"interrupted (Ctrl-C) during mode {mode}: no mode had finished, so there are no results "
                    f"(nothing was written)\n"], "".join(lines)


def test_all_modes_listed(wq):
    assert list(wq.MODES) == ["torch", "raylite", "lightning", "ray-lightning"]
    assert wq.parse_args([]).num_workers == 2 and wq.parse_args([]).mode == "all"
