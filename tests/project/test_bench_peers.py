"""bench/peers.py runs end to end: a smoke run with tiny counts on raylite and multiprocessing.Pool."""
import json
import os
import subprocess
import sys

import pytest

from helpers import REPO_ROOT

ROOT = str(REPO_ROOT)
BENCH = os.path.join(ROOT, "bench", "peers.py")


def run_bench(*args, timeout=240):
    return subprocess.run([sys.executable, BENCH, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_quick_run_measures_every_figure(tmp_path):
    out = tmp_path / "figures.json"
    done = run_bench("--quick", "--peers", "raylite,mp", "--batch", "50", "--sync", "10", "--array-mb", "0.1",
                     "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    raylite, mp = figures["results"]["raylite"], figures["results"]["mp"]
    for key in ("start_s", "sync_per_s", "batch_per_s", "array_ms", "actor_per_s", "actor_batch_per_s",
                "putget_gbps", "copy_gbps", "putget_vs_copy"):
        assert isinstance(raylite[key], float) and raylite[key] > 0, (key, raylite[key])
    assert all(isinstance(mp[k], float) and mp[k] > 0 for k in ("start_s", "sync_per_s", "batch_per_s", "array_ms"))
    assert mp["actor_per_s"] == mp["putget_gbps"] == "n/a"   # a pool has neither actors nor an object store
    assert figures["pipe_per_s"] > 0
    table = done.stdout
    assert "tiny tasks, 50 submitted then gathered" in table and "raylite/best other" in table
    assert "error" not in table and "raw pipe round trip" in table


def test_only_measures_the_groups_named(tmp_path):
    out = tmp_path / "figures.json"
    done = run_bench("--quick", "--peers", "raylite", "--array-mb", "0.1", "--only", "putget", "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    raylite = json.loads(out.read_text())["results"]["raylite"]
    assert set(raylite) == {"start_s", "putget_gbps", "copy_gbps", "putget_vs_copy"}, raylite
    assert all(isinstance(v, float) and v > 0 for v in raylite.values())


@pytest.mark.parametrize("args, message", [(["--peers", "raylite,nope"], "unknown peer(s) 'nope'"),
                                           (["--rounds", "0"], "--rounds must be at least 1, got 0"),
                                           (["--only", "putget,nope"], "unknown figure group(s) 'nope'")])
def test_bad_flags_are_refused_before_measuring(args, message):
    done = run_bench(*args, timeout=60)
    assert done.returncode == 2 and message in done.stderr
    assert "measuring" not in done.stderr
