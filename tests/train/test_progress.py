"""Driver-side progress of Train runs (raylite.train.progress): the status line on a terminal, one
line per interval in a log, quiet with verbose=0, and the run's panel for the CLI and dashboard."""
from __future__ import annotations

import io
import types

import pytest

from helpers import REPO_ROOT, wait_until


class _Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def _fake_run(reports: int = 0, last: dict | None = None):
    trainer = types.SimpleNamespace(_group=object(), worker_infos=[{"rank": 0, "pid": 11, "device": "cpu",
                                                                    "gpu_ids": []}])
    recorder = types.SimpleNamespace(run_dir="/runs/demo", reports=reports, last=last, attempt=0, world_size=1)
    return trainer, recorder


def test_log_lines_per_interval_then_a_final_line(monkeypatch):
    from raylite.train.progress import RunProgress
    monkeypatch.setenv("RAYLITE_PROGRESS_INTERVAL_S", "0.02")
    trainer, recorder = _fake_run()
    out = _Stream(tty=False)
    shown = RunProgress(trainer, "demo_run", 1, stream=out)
    shown.start(recorder)
    wait_until(lambda: "0 reports" in out.getvalue(), what="a line before any report")
    recorder.reports, recorder.last = 7, {"loss": 0.123456, "training_iteration": 7, "timestamp": 1}
    wait_until(lambda: "7 reports" in out.getvalue(), what="a line after the reports")
    shown.close(None)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and len(lines) >= 3
    assert lines[-1].startswith("raylite.train demo_run: finished, 1 workers, 7 reports, iteration 7, ")
    assert lines[-1].endswith("| loss=0.1235") and "timestamp" not in lines[-1]


def test_a_terminal_gets_one_redrawn_line(monkeypatch):
    from raylite.train.progress import RunProgress
    monkeypatch.setenv("RAYLITE_PROGRESS_INTERVAL_S", "0.02")
    trainer, recorder = _fake_run()
    trainer._group = None   # the workers are starting
    out = _Stream(tty=True)
    shown = RunProgress(trainer, None, 1, stream=out)
    shown.start(recorder)
    wait_until(lambda: out.getvalue().count("\r") >= 2, what="two redraws")
    assert "starting workers" in out.getvalue() and "\n" not in out.getvalue()
    shown.close(RuntimeError("boom"))
    assert out.getvalue().endswith("\n") and out.getvalue().count("\n") == 1
    assert "raylite.train demo: failed" in out.getvalue().rsplit("\r", 1)[1]


def test_verbose_0_is_quiet_but_the_panel_is_published(monkeypatch):
    from raylite.core.api import control
    from raylite.train.progress import RunProgress
    monkeypatch.setenv("RAYLITE_PROGRESS_INTERVAL_S", "0.01")
    trainer, recorder = _fake_run(reports=2, last={"acc": 0.5, "training_iteration": 2})
    out = _Stream(tty=False)
    shown = RunProgress(trainer, "quiet_run", 0, stream=out)
    shown.start(recorder)
    [live] = [v for v in control.panels()["train"] if v["name"] == "quiet_run"]
    assert live["reports"] == 2 and live["iteration"] == 2 and live["last_metrics"] == {"acc": 0.5}
    assert live["worker_info"] == [{"rank": 0, "pid": 11, "devices": "cpu"}] and not live["finished"]
    shown.close(None)
    assert out.getvalue() == ""
    [ended] = [v for v in control.panels()["train"] if v["name"] == "quiet_run"]
    assert ended["finished"] and ended["state"] is None


def test_a_bad_interval_names_the_variable(monkeypatch):
    from raylite.train.progress import RunProgress
    monkeypatch.setenv("RAYLITE_PROGRESS_INTERVAL_S", "soon")
    with pytest.raises(ValueError, match="RAYLITE_PROGRESS_INTERVAL_S.*'soon'"):
        RunProgress(*_fake_run()[:1], "x", 1)


@pytest.mark.timeout(180)
def test_torch_trainer_fit_prints_its_progress(tmp_path, monkeypatch, capfd):
    import raylite as ray
    from raylite import train
    from raylite.train import RunConfig, ScalingConfig
    from raylite.train.torch import TorchTrainer
    monkeypatch.setenv("RAYLITE_PROGRESS_INTERVAL_S", "60")   # only the final line, in this log

    def loop(config):
        for i in range(3):
            train.report({"loss": 1.0 / (i + 1)})

    ray.init(num_cpus=2)
    try:
        for verbose in (1, 0):
            TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=1),
                         run_config=RunConfig(name=f"progress_{verbose}", storage_path=str(tmp_path),
                                              verbose=verbose)).fit()
    finally:
        ray.shutdown()
    err = capfd.readouterr().err
    assert "raylite.train progress_1: finished, 1 workers, 3 reports, iteration 3" in err
    assert "loss=0.3333" in err and "progress_0" not in err


def test_the_main_example_says_what_it_is_doing(tmp_path):
    import os
    import subprocess
    import sys
    repo = str(REPO_ROOT)
    data = os.environ.get("RAYLITE_WINE_DATA") or os.path.join(repo, "..", "shared", "data", "wine-quality",
                                                               "winequality-red.csv")
    if not os.path.isfile(data):
        pytest.skip(f"no wine data at {data}")
    done = subprocess.run([sys.executable, os.path.join(repo, "examples", "wine_quality.py"), "--data", data,
                           "--mode", "torch", "--steps", "20", "--no-plot"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    start = lines.index("[1/1] mode torch: training ...")
    assert lines[start + 1].startswith("[1/1] mode torch: done in ") and lines[start + 1].endswith(" s")
