"""Class trainables (tune.Trainable): setup/step/save/load/reset/cleanup, Ray's checkpoint options,
stopping, retries from a checkpoint, resume after the driver is killed, reuse_actors, Tuner and
with_parameters. Classes are defined inside the tests so cloudpickle ships them by value; they
record what was called in files under the test's tmp_path (the worker is another process)."""
from __future__ import annotations

import json
import os
import signal

import pytest

pytest.importorskip("optuna")

from raylite import tune  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def make_counter(log_dir: str, fail_at: int | None = None, resets: bool = False):
    class Counter(tune.Trainable):
        """x grows by lr per step; every call is logged as a line "<event> <pid> <id(self)> <value>"."""

        def _log(self, event, value=""):
            with open(os.path.join(log_dir, "calls"), "a") as f:
                f.write(f"{event} {os.getpid()} {id(self)} {value}\n")

        def setup(self, config):
            self.x, self.lr = 0.0, config["lr"]
            self._log("setup", config["lr"])

        def step(self):
            self.x += self.lr
            marker = os.path.join(log_dir, "failed")
            if fail_at is not None and self.iteration + 1 == fail_at and not os.path.exists(marker):
                open(marker, "w").close()
                raise RuntimeError("step failed once")
            return {"x": self.x}

        def save_checkpoint(self, checkpoint_dir):
            return {"x": self.x}

        def load_checkpoint(self, checkpoint):
            self.x = checkpoint["x"]
            self._log("load", checkpoint["x"])

        def reset_config(self, new_config):
            if not resets:
                return False
            self.x, self.lr = 0.0, new_config["lr"]
            self._log("reset", new_config["lr"])
            return True

        def cleanup(self):
            self._log("cleanup")

    return Counter


def calls(log_dir) -> list[list[str]]:
    with open(os.path.join(log_dir, "calls")) as f:
        return [line.split() for line in f]


def checkpoint_iterations(trial) -> list[int]:
    names = sorted(n for n in os.listdir(trial.path) if n.startswith("checkpoint_"))
    return [json.load(open(os.path.join(trial.path, n, ".tune_checkpoint.json")))["training_iteration"] for n in names]


def test_class_trainable_steps_checkpoints_and_stops(ray_start, tmp_path):
    cls = make_counter(str(tmp_path))
    a = tune.run(cls, config={"lr": tune.grid_search([1.0, 2.0])}, stop={"training_iteration": 5},
                 storage_path=str(tmp_path / "r"), verbose=0,
                 checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=2, checkpoint_at_end=True))
    assert [t.status for t in a.trials] == ["TERMINATED"] * 2
    assert sorted(t.last_result["x"] for t in a.trials) == [5.0, 10.0]
    for t in a.trials:
        assert t.last_result["training_iteration"] == 5
        assert checkpoint_iterations(t) == [2, 4, 5]            # every 2nd iteration, and at the end
        assert tune.Checkpoint(t.checkpoint.path).metadata["training_iteration"] == 5
    events = [c[0] for c in calls(tmp_path)]
    assert events.count("setup") == 2 and events.count("cleanup") == 2 and "load" not in events


def test_done_and_should_checkpoint_in_a_result(ray_start, tmp_path):
    class Ends(tune.Trainable):
        def step(self):
            return {"i": self.iteration, "done": self.iteration == 2, "should_checkpoint": self.iteration == 1}

        def save_checkpoint(self, checkpoint_dir):
            with open(os.path.join(checkpoint_dir, "state.txt"), "w") as f:
                f.write(str(self.iteration))

    a = tune.run(Ends, storage_path=str(tmp_path), verbose=0)
    t = a.trials[0]
    assert t.status == "TERMINATED" and t.last_result["training_iteration"] == 3
    assert checkpoint_iterations(t) == [2]
    assert open(os.path.join(t.checkpoint.path, "state.txt")).read() == "2"   # saved after the step it came with


def test_a_failed_step_restarts_from_the_latest_checkpoint(ray_start, tmp_path):
    cls = make_counter(str(tmp_path), fail_at=4)
    a = tune.run(cls, config={"lr": 1.0}, stop={"training_iteration": 6}, max_failures=1,
                 storage_path=str(tmp_path / "r"), verbose=0,
                 checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=2))
    t = a.trials[0]
    assert t.status == "TERMINATED" and t.num_failures == 1
    assert t.last_result["x"] == 6.0 and t.last_result["training_iteration"] == 6
    assert [c[0] for c in calls(tmp_path)] == ["setup", "cleanup", "setup", "load", "cleanup"]
    assert calls(tmp_path)[3][3] == "2.0"                       # iteration 2's state, not a fresh start
    rows = [json.loads(line)["training_iteration"] for line in open(os.path.join(t.path, "result.json"))]
    assert rows == [1, 2, 3, 4, 5, 6]


def test_tuner_reuse_actors_resets_the_object_in_place(ray_start, tmp_path):
    cls = make_counter(str(tmp_path), resets=True)
    grid = tune.Tuner(cls, param_space={"lr": tune.grid_search([1.0, 2.0, 3.0, 4.0])},
                      tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=1),
                      run_config=tune.RunConfig(stop={"training_iteration": 2}, storage_path=str(tmp_path / "r"),
                                                verbose=0)).fit()
    assert sorted(r.metrics["x"] for r in grid) == [2.0, 4.0, 6.0, 8.0]   # each trial started from its own config
    log = calls(tmp_path)
    made = {c[2] for c in log if c[0] == "setup"}
    per_pid_objects: dict[str, set] = {}
    for event, pid, obj, *_ in log:
        if event in ("setup", "reset"):
            per_pid_objects.setdefault(pid, set()).add(obj)
    assert all(len(objs) == 1 for objs in per_pid_objects.values())   # one object per worker, reset in place
    assert len(made) == len(per_pid_objects) < 4
    assert sum(c[0] == "reset" for c in log) == 4 - len(made)
    assert not any(c[0] == "cleanup" for c in log)              # kept for the next trial until the worker exits


def test_without_reset_config_each_trial_builds_its_own(ray_start, tmp_path):
    cls = make_counter(str(tmp_path), resets=False)
    tune.run(cls, config={"lr": tune.grid_search([1.0, 2.0, 3.0])}, stop={"training_iteration": 1}, reuse_actors=True,
             max_concurrent_trials=1, storage_path=str(tmp_path / "r"), verbose=0)
    log = calls(tmp_path)
    assert [c[0] for c in log].count("setup") == 3 and not any(c[0] == "reset" for c in log)
    for pid in {c[1] for c in log}:                             # a refused reset drops the worker's old object
        mine = [c[0] for c in log if c[1] == pid]
        assert mine.count("cleanup") == mine.count("setup") - 1


def test_with_parameters_reaches_setup(ray_start, tmp_path):
    class Uses(tune.Trainable):
        def setup(self, config, data=None):
            self.total = sum(data)

        def step(self):
            return {"total": self.total, "done": True}

    a = tune.run(tune.with_parameters(Uses, data=list(range(10))), storage_path=str(tmp_path), verbose=0)
    assert a.trials[0].last_result["total"] == 45


def test_bad_classes_and_options_are_refused_before_any_trial(tmp_path):
    class NotATrainable:
        pass

    with pytest.raises(TypeError, match="NotATrainable is a class but not a tune.Trainable"):
        tune.run(NotATrainable, storage_path=str(tmp_path), verbose=0)
    with pytest.raises(ValueError, match="checkpoint_frequency"):
        tune.run(lambda config: None, storage_path=str(tmp_path), verbose=0,
                 checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=2))
    assert not os.listdir(tmp_path)


def test_a_trainable_runs_on_its_own(tmp_path):
    cls = make_counter(str(tmp_path))
    t = cls({"lr": 0.5})
    assert t.train()["training_iteration"] == 1 and t.train()["x"] == 1.0
    path = t.save()
    other = cls({"lr": 0.5})
    other.restore(path)
    assert other.x == 1.0
    with pytest.raises(NotImplementedError, match="must implement step"):
        tune.Trainable().train()


DRIVER = r'''
import os, sys, time
import raylite as ray
from raylite import tune

LOG = sys.argv[1]

class Slow(tune.Trainable):
    def setup(self, config):
        self.x = 0
    def step(self):
        time.sleep(0.2)
        self.x += 1
        return {"x": self.x}
    def save_checkpoint(self, checkpoint_dir):
        return {"x": self.x}
    def load_checkpoint(self, checkpoint):
        with open(os.path.join(LOG, "loaded"), "a") as f:
            f.write(f"{checkpoint['x']}\n")
        self.x = checkpoint["x"]

class Printer(tune.Callback):
    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        print("CHECKPOINT", trial.last_result["training_iteration"], flush=True)

ray.init(num_cpus=2)
if sys.argv[2] == "1":
    tuner = tune.Tuner.restore(os.path.join(LOG, "r", "cls"), Slow)
else:
    tuner = tune.Tuner(Slow, run_config=tune.RunConfig(
        name="cls", storage_path=os.path.join(LOG, "r"), stop={"training_iteration": 6}, callbacks=[Printer()],
        checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=2), verbose=0))
r = tuner.fit()[0]
print("FINAL", r.metrics["x"], r.metrics["training_iteration"], flush=True)
ray.shutdown()
'''


def test_resume_after_driver_sigkill(tmp_path, driver_process):
    code = DRIVER.replace("sys.argv[1]", repr(str(tmp_path)))
    first = driver_process(code.replace('sys.argv[2] == "1"', "False"))
    first.wait_for_line("CHECKPOINT", timeout=60)
    os.killpg(first.pid, signal.SIGKILL)
    first.proc.wait(10)
    second = driver_process(code.replace('sys.argv[2] == "1"', "True"))
    line = second.wait_for_line("FINAL", timeout=90)
    assert second.wait_exit(30) == 0
    assert line.split() == ["6", "6"]                            # resumed where its checkpoint left it, not from 0
    loaded = [int(x) for x in open(tmp_path / "loaded").read().split()]
    assert len(loaded) == 1 and loaded[0] >= 2 and loaded[0] % 2 == 0
