"""raylite.tune on disk: the experiment directory, the SQLite Optuna study, ExperimentAnalysis(path),
plots, and resume after the driver is SIGKILLed (no finished trial runs twice, none is lost)."""
from __future__ import annotations

import csv
import json
import os
import signal
import time

import pytest

optuna = pytest.importorskip("optuna")

from raylite import tune  # noqa: E402
from helpers import pid_alive as _pid_alive

pytestmark = pytest.mark.timeout(120)


def checkpointing(config):
    import json
    import os
    ckpt = tune.get_checkpoint()
    start = 0
    if ckpt:
        with open(os.path.join(ckpt.path, "state.json")) as f:
            start = json.load(f)["step"]
    for step in range(start, 4):
        d = os.path.join(tune.get_trial_dir(), "scratch")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "state.json"), "w") as f:
            json.dump({"step": step + 1}, f)
        tune.report({"loss": config["x"] / (step + 1), "nested": {"a": step}},
                    checkpoint=tune.Checkpoint.from_directory(d))


def test_experiment_directory_layout_and_reload(ray_start, tmp_path):
    a = tune.run(checkpointing, config={"x": tune.grid_search([1.0, 2.0, 3.0])}, metric="loss", mode="min",
                 storage_path=str(tmp_path), name="layout", verbose=0)
    exp = tmp_path / "layout"
    meta = json.loads((exp / "experiment_state.json").read_text())
    assert meta["metric"] == "loss" and meta["status"] == "finished" and meta["total_trials"] == 3
    for t in a.trials:
        d = exp / os.path.basename(t.path)   # Ray's <trainable>_<trial id>_<tag>_<date>
        assert d.name.startswith(f"checkpointing_{t.trial_id}_{t.index}_x={t.config['x']:g}_") and t.path == str(d)
        assert json.loads((d / "params.json").read_text()) == t.config
        state = json.loads((d / "trial.json").read_text())
        assert state["status"] == "TERMINATED" and state["last_result"]["training_iteration"] == 4
        lines = [json.loads(x) for x in (d / "result.json").read_text().splitlines()]
        assert [r["training_iteration"] for r in lines] == [1, 2, 3, 4]
        assert lines[0]["nested"] == {"a": 0}
        rows = list(csv.DictReader(open(d / "progress.csv")))
        assert len(rows) == 4 and "nested/a" in rows[0] and rows[3]["training_iteration"] == "4"
        ckpts = sorted(p.name for p in d.iterdir() if p.name.startswith("checkpoint_"))
        assert ckpts == ["checkpoint_000000", "checkpoint_000001", "checkpoint_000002", "checkpoint_000003"]   # Ray's
        assert json.loads((d / "checkpoint_000003" / "state.json").read_text()) == {"step": 4}
    best = a.best_checkpoint
    assert best.path.endswith("checkpoint_000003") and a.best_config == {"x": 1.0}

    # The Optuna study in SQLite: every trial, with the tune trial id.
    study = optuna.load_study(study_name="layout", storage=f"sqlite:///{exp}/study.db")
    assert sorted(t.user_attrs["trial_id"] for t in study.trials) == sorted(t.trial_id for t in a.trials)
    assert {t.state.name for t in study.trials} == {"COMPLETE"}
    assert study.best_trial.params == {"x": 1.0}

    # Reloaded from disk: same trials, best trial, dataframe.
    b = tune.ExperimentAnalysis(str(exp))
    assert [t.trial_id for t in b.trials] == [t.trial_id for t in a.trials]
    assert b.best_trial.trial_id == a.best_trial.trial_id and b.best_config == {"x": 1.0}
    assert b.get_best_trial("loss", "min", scope="all").config == {"x": 1.0}
    assert len(b.dataframe()) == 3 and b.best_checkpoint.path == best.path
    assert b.study.best_trial.user_attrs["trial_id"] == a.best_trial.trial_id

    with pytest.raises(ValueError, match="already exists"):
        tune.run(checkpointing, config={"x": 1.0}, storage_path=str(tmp_path), name="layout", verbose=0)


def test_plots(ray_start, tmp_path):
    pytest.importorskip("matplotlib")

    def trainable(config):
        tune.report({"loss": (config["x"] - 1) ** 2 + 0.1 * config["y"]})

    a = tune.run(trainable, config={"x": tune.uniform(-3, 3), "y": tune.uniform(0, 1)}, num_samples=12,
                 metric="loss", mode="min", storage_path=str(tmp_path), name="plots", verbose=0)
    files = a.plot(str(tmp_path / "figs"))
    assert [os.path.basename(f) for f in files] == ["optimization_history.png", "param_importances.png"]
    for f in files:
        with open(f, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    files = tune.ExperimentAnalysis(str(tmp_path / "plots")).plot(str(tmp_path / "again.png"))
    assert [os.path.basename(f) for f in files] == ["again_history.png", "again_importances.png"]


def checkpoint_names(path) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.startswith("checkpoint_"))


def test_checkpoint_config_bounds_the_checkpoints_kept(ray_start, tmp_path):
    """CheckpointConfig(num_to_keep=N) deletes the other checkpoints as trials report (the latest always
    stays, to restart from; also after a retry): a long sweep checkpointing every epoch would otherwise
    fill the disk."""
    def trainable(config):
        import os
        ckpt = tune.get_checkpoint()
        start = ckpt.to_dict()["step"] if ckpt else 0
        for step in range(start, 6):
            marker = os.path.join(tune.get_trial_dir(), "failed")
            if step == 4 and not os.path.exists(marker):
                open(marker, "w").close()
                raise RuntimeError("once")
            tune.report({"score": [3, 9, 1, 5, 0, 2][step]}, checkpoint={"step": step + 1})

    a = tune.run(trainable, num_samples=2, storage_path=str(tmp_path), name="newest", verbose=0, max_failures=1,
                 checkpoint_config=tune.CheckpointConfig(num_to_keep=2))
    for t in a.trials:
        assert t.num_failures == 1 and t.last_result["training_iteration"] == 6
        assert checkpoint_names(t.path) == ["checkpoint_000004", "checkpoint_000005"]   # numbered on after the retry
        assert [os.path.basename(p) for p, _ in t.checkpoints] == checkpoint_names(t.path)

    grid = tune.Tuner(trainable, run_config=tune.RunConfig(
        name="best", storage_path=str(tmp_path), verbose=0, failure_config=tune.FailureConfig(max_failures=1),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="score"))).fit()
    best = grid[0]   # score 9 at iteration 2 and 5 at 4 are the best two; 6 is the latest
    assert checkpoint_names(best.path) == ["checkpoint_000001", "checkpoint_000003", "checkpoint_000005"]
    assert [c.to_dict()["step"] for c, _ in best.best_checkpoints] == [2, 4, 6]
    assert best.checkpoint.to_dict() == {"step": 6}

    with pytest.raises(TypeError, match="checkpoint_config must be a tune.CheckpointConfig"):
        tune.run(trainable, storage_path=str(tmp_path), verbose=0, checkpoint_config={"num_to_keep": 1})


@pytest.mark.parametrize("legacy", [False, True])
def test_resume_leaves_no_gap_in_a_trials_results(ray_start, tmp_path, legacy):
    """A driver killed mid-drain may not have written a trial's last results, though the trial wrote
    checkpoints after them: resuming restarts from the newest checkpoint whose earlier results are all
    on disk (and drops newer ones, and partial copies), so the trial's history has no hole.
    `legacy`: the checkpoints are named by iteration, as raylite wrote them before Ray's numbering."""
    def trainable(config):
        ckpt = tune.get_checkpoint()
        start = ckpt.to_dict()["step"] if ckpt else 0
        for step in range(start, 5):
            tune.report({"start": start}, checkpoint={"step": step + 1} if step % 2 else None)

    a = tune.run(trainable, storage_path=str(tmp_path), name="gap", verbose=0)
    d = a.trials[0].path
    state = json.loads(open(os.path.join(d, "trial.json")).read())
    state["status"] = "RUNNING"                      # as the killed driver left it: results 2-5 never written,
    with open(os.path.join(d, "trial.json"), "w") as f:   # checkpoints of iterations 2 and 4 on disk
        json.dump(state, f)
    with open(os.path.join(d, "result.json")) as f:
        first = f.readline()
    with open(os.path.join(d, "result.json"), "w") as f:
        f.write(first)
    assert checkpoint_names(d) == ["checkpoint_000000", "checkpoint_000001"]
    if legacy:
        for index, iteration in ((0, 2), (1, 4)):
            old, new = f"checkpoint_{index:06d}", f"checkpoint_{iteration:06d}"
            meta_path = os.path.join(d, old, ".tune_checkpoint.json")
            meta = json.loads(open(meta_path).read())
            meta["result"]["checkpoint_dir_name"] = new
            with open(meta_path, "w") as f:
                json.dump(meta, f)
            os.rename(os.path.join(d, old), os.path.join(d, new))
    os.makedirs(os.path.join(d, "checkpoint_000005.tmp4242"))   # a copy its trial was killed in the middle of

    b = tune.run(trainable, storage_path=str(tmp_path), name="gap", verbose=0, resume=True)
    t = b.trials[0]
    assert t.status == "TERMINATED" and t.last_result["start"] == 2   # restarted from iteration 2's, not 4's
    lines = [json.loads(x) for x in open(os.path.join(d, "result.json"))]
    assert [r["training_iteration"] for r in lines] == [1, 2, 3, 4, 5]
    kept = "checkpoint_000002" if legacy else "checkpoint_000000"   # numbered on after the one kept
    assert checkpoint_names(d) == [kept, "checkpoint_000003" if legacy else "checkpoint_000001"]
    assert [os.path.basename(p) for p, _ in t.checkpoints] == checkpoint_names(d)
    assert t.checkpoint.to_dict() == {"step": 4}

DRIVER = r'''
import json, os, sys, time, uuid
import raylite as ray
from raylite import tune

MARKERS = sys.argv[1]
STORAGE = sys.argv[2]
RESUME = sys.argv[3] == "1"

def trainable(config):
    ckpt = tune.get_checkpoint()
    step = ckpt.to_dict()["step"] if ckpt else 0
    open(os.path.join(MARKERS, f"start-{tune.get_trial_id()}-{step}-{os.getpid()}-{uuid.uuid4().hex}"),
         "w").close()
    while step < 3:
        time.sleep(0.25)
        step += 1
        tune.report({"loss": config["x"] + 1.0 / step}, checkpoint={"step": step})

class Printer(tune.Callback):
    def on_trial_complete(self, iteration, trials, trial, **info):
        print("COMPLETED", trial.trial_id, flush=True)

ray.init(num_cpus=2)
a = tune.run(trainable, config={"x": tune.uniform(0, 1)}, num_samples=8, metric="loss", mode="min",
             storage_path=STORAGE, name="killme", resume=RESUME, callbacks=[Printer()], verbose=0)
print("FINAL", json.dumps({t.trial_id: [t.status, t.last_result.get("training_iteration")] for t in a.trials}),
      flush=True)
ray.shutdown()
'''




def test_resume_after_driver_sigkill(tmp_path, driver_process):
    markers, storage = tmp_path / "markers", tmp_path / "results"
    markers.mkdir()
    code = DRIVER
    first = driver_process(code.replace("sys.argv[1]", repr(str(markers))).replace("sys.argv[2]", repr(str(storage)))
                           .replace('sys.argv[3] == "1"', "False"))
    for _ in range(3):
        first.wait_for_line("COMPLETED", timeout=60)
    os.killpg(first.pid, signal.SIGKILL)
    first.proc.wait(10)

    exp = storage / "killme"
    finished_at_kill = set()
    checkpoint_at_kill = {}
    for d in exp.iterdir():
        if (d / "trial.json").exists():
            state = json.loads((d / "trial.json").read_text())
            if state["status"] == "TERMINATED":
                finished_at_kill.add(state["trial_id"])
            steps = [json.loads((p / ".tune_checkpoint.json").read_text())["training_iteration"] for p in d.iterdir()
                     if p.name.startswith("checkpoint_") and (p / ".tune_checkpoint.json").exists()]
            recorded = len((d / "result.json").read_text().splitlines()) if (d / "result.json").exists() else 0
            usable = [s for s in steps if s <= recorded + 1]   # with every earlier result on disk
            if usable and state["status"] != "TERMINATED":
                checkpoint_at_kill[state["trial_id"]] = max(usable)
    assert len(finished_at_kill) >= 3
    first_pids = {int(m.split("-")[3]) for m in os.listdir(markers)}
    deadline = time.monotonic() + 15      # the killed driver's workers exit on their own
    while any(_pid_alive(p) for p in first_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_pid_alive(p) for p in first_pids), "workers of the killed driver are still running"
    starts_before = set(os.listdir(markers))

    second = driver_process(code.replace("sys.argv[1]", repr(str(markers))).replace("sys.argv[2]", repr(str(storage)))
                            .replace('sys.argv[3] == "1"', "True"))
    final = second.wait_for_json("FINAL", timeout=90)
    assert second.wait_exit(30) == 0

    assert len(final) == 8, final                               # none lost, none added
    assert all(status == "TERMINATED" and it == 3 for status, it in final.values()), final
    starts = [m.split("-") for m in os.listdir(markers)]
    per_trial: dict[str, list] = {}
    for _, tid, step, _pid, _ in starts:
        per_trial.setdefault(tid, []).append(int(step))
    assert set(per_trial) == set(final)
    for tid in finished_at_kill:                                 # finished before the kill: never again
        assert len(per_trial[tid]) == 1, (tid, per_trial[tid])
    new_starts = [m.split("-") for m in set(os.listdir(markers)) - starts_before]
    for _, tid, step, _pid, _ in new_starts:
        assert tid not in finished_at_kill
        if tid in checkpoint_at_kill:                            # restarted from its checkpoint
            assert int(step) == checkpoint_at_kill[tid], (tid, step, checkpoint_at_kill[tid])

    study = optuna.load_study(study_name="killme", storage=f"sqlite:///{exp}/study.db")
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert sorted(t.user_attrs["trial_id"] for t in complete) == sorted(final)
    meta = json.loads((exp / "experiment_state.json").read_text())
    assert meta["status"] == "finished"
