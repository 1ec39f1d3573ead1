"""Population Based Training: exploit/explore on both trainable kinds, synch mode, the config
history in results, Ray's policy files and their replay, argument checks.

The toy problem: a score that grows by `1 - 4 * (lr - target)**2` per step, where the best lr
(target) is 0.8 for the first half of the run and 0.2 after, so no fixed lr does well throughout
and following the target pays. Four trials share the 2 CPUs (0.5 each) so they run as a population."""
from __future__ import annotations

import json
import os
import random

import pytest

pytest.importorskip("optuna")

from raylite import tune  # noqa: E402
from raylite.tune.schedulers import PopulationBasedTraining, PopulationBasedTrainingReplay  # noqa: E402

pytestmark = pytest.mark.timeout(120)

STEPS, GRID, LRS = 24, [0.2, 0.4, 0.6, 0.8], [0.2, 0.5, 0.8]


def gain(lr: float, t: int) -> float:
    return 1 - 4 * (lr - (0.8 if t <= STEPS // 2 else 0.2)) ** 2


def toy_function(config):
    import time
    ckpt = tune.get_checkpoint()
    x, t = (ckpt.to_dict()["x"], ckpt.to_dict()["t"]) if ckpt else (0.0, 0)
    while True:
        time.sleep(0.04)   # a population: the trials' steps interleave
        t += 1
        x += gain(config["lr"], t)
        tune.report({"score": x, "t": t}, checkpoint={"x": x, "t": t})


def make_toy_class(log_dir: str):
    class Toy(tune.Trainable):
        def setup(self, config):
            self.lr, self.x, self.t = config["lr"], 0.0, 0
            with open(os.path.join(log_dir, "setups"), "a") as f:
                f.write("x")

        def step(self):
            import time
            time.sleep(0.04)
            self.t += 1
            self.x += gain(self.lr, self.t)
            return {"score": self.x, "t": self.t}

        def save_checkpoint(self, checkpoint_dir):
            return {"x": self.x, "t": self.t}

        def load_checkpoint(self, checkpoint):
            self.x, self.t = checkpoint["x"], checkpoint["t"]

        def reset_config(self, new_config):
            self.lr = new_config["lr"]
            with open(os.path.join(log_dir, "resets"), "a") as f:
                f.write("x")
            return True

    return Toy


def run_toy(trainable, tmp_path, name, scheduler=None, **kw):
    random.seed(0)
    return tune.run(trainable, config={"lr": tune.grid_search(GRID)}, metric="score", mode="max",
                    scheduler=scheduler, stop={"training_iteration": STEPS}, resources_per_trial={"cpu": 0.5},
                    storage_path=str(tmp_path), name=name, verbose=0, **kw)


def pbt(interval=2, **kw):
    return PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=interval,
                                   hyperparam_mutations={"lr": LRS}, quantile_fraction=0.25, **kw)


def best(analysis) -> float:
    return max(t.last_result["score"] for t in analysis.trials)


def results(trial) -> list[dict]:
    return [json.loads(line) for line in open(os.path.join(trial.path, "result.json"))]


def test_pbt_beats_every_fixed_config(ray_start, tmp_path):
    """Synchronous PBT with a seeded `random` decides the same way however the trials interleave."""
    fixed = run_toy(toy_function, tmp_path, "fixed")
    scheduler = pbt(4, synch=True)
    a = run_toy(toy_function, tmp_path, "pbt", scheduler=scheduler)
    assert best(fixed) == pytest.approx(14.4)                 # 0.4 or 0.6 all along: the best a fixed lr does
    assert best(a) > best(fixed) + 2.0, [t.last_result["score"] for t in a.trials]
    policy = [json.loads(line) for line in open(tmp_path / "pbt" / "pbt_global.txt")]
    steps = [line[2] for line in policy]
    assert steps and all(s % 4 == 0 for s in steps)             # only at the common perturbation points
    assert all(s == c for _, _, s, c, _, _ in policy)           # every trial had reached the same point
    assert all(t.last_result["training_iteration"] == STEPS for t in a.trials)


class Restores(tune.Callback):
    def __init__(self):
        self.restored = []

    def on_trial_restore(self, iteration, trials, trial, **info):
        self.restored.append(trial.trial_id)


def test_async_pbt_exploits_and_records_the_history(ray_start, tmp_path):
    scheduler, seen = pbt(), Restores()
    a = run_toy(toy_function, tmp_path, "pbt", scheduler=scheduler, callbacks=[seen])
    assert scheduler.num_perturbations >= 1
    assert len(seen.restored) == sum(t.attempt for t in a.trials) - len(a.trials) >= 1   # once per restart
    assert all(t.status == "TERMINATED" and t.last_result["training_iteration"] >= STEPS for t in a.trials)
    changed = [t for t in a.trials if len({r["config"]["lr"] for r in results(t)}) > 1]
    assert changed                                             # each result says which config it came from
    exp = tmp_path / "pbt"
    policy = [json.loads(line) for line in open(exp / "pbt_global.txt")]
    assert len(policy) == scheduler.num_perturbations
    for tag, clone_tag, step, clone_step, clone_config, new_config in policy:
        assert tag != clone_tag and new_config["lr"] in LRS and clone_config["lr"] in LRS + GRID
    for t in changed:   # its params.json is its config now, and it has the lineage file replay reads
        assert json.load(open(os.path.join(t.path, "params.json"))) == t.config
        assert (exp / f"pbt_policy_{t.trial_id}.txt").exists()


def test_pbt_with_a_class_trainable_resets_it_in_place(ray_start, tmp_path):
    toy = make_toy_class(str(tmp_path))
    scheduler = pbt()
    a = run_toy(toy, tmp_path, "pbt", scheduler=scheduler, reuse_actors=True)
    assert scheduler.num_perturbations >= 1
    resets = len(open(tmp_path / "resets").read()) if (tmp_path / "resets").exists() else 0
    setups = len(open(tmp_path / "setups").read())
    restarts = sum(t.attempt for t in a.trials) - len(a.trials)
    assert resets >= 1 and setups + resets == 4 + restarts      # a reset instead of a new object
    for t in a.trials:   # the restarted trials go on from the copied checkpoint's iteration
        assert t.last_result["training_iteration"] >= STEPS


def test_synch_pbt_with_a_class_trainable(ray_start, tmp_path):
    scheduler = pbt(4, synch=True)
    a = run_toy(make_toy_class(str(tmp_path)), tmp_path, "synch", scheduler=scheduler)
    assert best(a) > 14.4 + 2.0
    assert all(t.last_result["training_iteration"] == STEPS for t in a.trials)


def collapse(values: list) -> list:
    return [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]


def test_replay_follows_a_trials_schedule(ray_start, tmp_path):
    run_toy(toy_function, tmp_path, "pbt", scheduler=pbt(4, synch=True))
    files = sorted((tmp_path / "pbt").glob("pbt_policy_*.txt"), key=lambda p: -len(p.read_text().splitlines()))
    assert files, "no trial was perturbed"
    replay = PopulationBasedTrainingReplay(str(files[0]))
    schedule = [replay.config["lr"]] + [config["lr"] for _, config in replay.policy]
    steps = [step for step, _ in replay.policy]
    r = tune.run(toy_function, config={"lr": 0.5}, scheduler=replay, stop={"training_iteration": STEPS},
                 storage_path=str(tmp_path), name="replay", verbose=0)
    rows = results(r.trials[0])
    assert collapse([row["config"]["lr"] for row in rows]) == collapse(schedule)
    if collapse(schedule) != schedule:   # a change to the same value shows in no result
        return
    for step, (prev, row) in zip(steps, [(p, q) for p, q in zip(rows, rows[1:]) if p["config"] != q["config"]]):
        assert prev["training_iteration"] == step               # changed right at the step PBT changed it


def test_a_time_budget_ends_paused_trials(ray_start, tmp_path):
    a = tune.run(toy_function, config={"lr": tune.grid_search(GRID)}, metric="score", mode="max",
                 scheduler=pbt(2, synch=True), time_budget_s=1.5, resources_per_trial={"cpu": 0.5},
                 storage_path=str(tmp_path), verbose=0)
    assert [t.status for t in a.trials] == ["TERMINATED"] * 4
    assert all(json.load(open(os.path.join(t.path, "trial.json")))["status"] == "TERMINATED" for t in a.trials)


def test_mutations_fill_a_config_that_lacks_them(ray_start, tmp_path):
    def trainable(config):
        tune.report({"score": config["lr"], "done": True})

    a = tune.run(trainable, config={}, num_samples=2, metric="score", mode="max",
                 scheduler=PopulationBasedTraining(hyperparam_mutations={"lr": tune.uniform(0.1, 0.2)}),
                 storage_path=str(tmp_path), verbose=0)
    assert all(0.1 <= t.config["lr"] <= 0.2 for t in a.trials)


@pytest.mark.parametrize("kwargs, error, match", [
    ({}, ValueError, "hyperparam_mutations, custom_explore_fn"),
    ({"hyperparam_mutations": {"lr": [0.1]}, "quantile_fraction": 0.7}, ValueError, "quantile_fraction=0.7"),
    ({"hyperparam_mutations": {"lr": [0.1]}, "perturbation_interval": 0}, ValueError, "perturbation_interval=0"),
    ({"hyperparam_mutations": {"lr": 3}}, TypeError, r"hyperparam_mutations\['lr'\]=3"),
    ({"hyperparam_mutations": {"lr": [0.1]}, "resample_probability": 2}, ValueError, "resample_probability=2"),
])
def test_bad_arguments_name_the_field(kwargs, error, match):
    with pytest.raises(error, match=match):
        PopulationBasedTraining(**kwargs)


def test_replay_needs_a_policy_file(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        PopulationBasedTrainingReplay(str(tmp_path / "missing.txt"))
