"""raylite.tune overhead (issue 6 targets).

    python bench/tune_overhead.py            # both figures
    python bench/tune_overhead.py --trials 100 --reports 20000

1. 100 trials of a function that sleeps 0.1 s and reports once, resources_per_trial={"cpu": 1} on
   init(num_cpus=2): the ideal is 100 * 0.1 / 2 = 5.0 s; target <= 5.5 s (Ray Tune 2.60 took 196 s
   on the project's machine). Timed from the tune.run call to its return: it includes creating the
   experiment directory, every trial's files, the Optuna study and its SQLite copy, and the final
   summary. Python, raylite and Optuna are imported before the clock starts. For scale, the same
   sleeps as bare raylite tasks (two at a time) are timed first: on a busy machine both grow.
2. Results per second for one trial calling tune.report as fast as it can: the rate seen inside
   the trial, and the rate at which the driver recorded them (result.json, progress.csv, stop
   criteria, scheduler) over the whole tune.run call.
3. Figure 1 with a class trainable (tune.Trainable whose step sleeps 0.1 s and says done).
4. PBT: 10 trials x 10 iterations of 0.1 s (a class trainable with reset_config, reuse_actors),
   cpu=1 on 2 CPUs, perturbation every 2 iterations: the same 100 x 0.1 s of work, so the same
   ideal 5.0 s; what it adds is the exploits (a trial stopped, a checkpoint copied, restarted).

Figures go to stdout as a table and, with --json PATH, to a JSON file.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import raylite as ray  # noqa: E402
from raylite import tune  # noqa: E402


def sleeper(config):
    time.sleep(0.1)
    tune.report({"score": config["x"]})


def fast_reporter(config):
    t0 = time.perf_counter()
    n = config["n"]
    for i in range(n):
        tune.report({"i": i})
    # the rate inside the trial, as one more (uncounted) field on a last result
    tune.report({"i": n, "trial_rate": n / (time.perf_counter() - t0)})


class SleeperClass(tune.Trainable):
    def setup(self, config):
        self.x = config["x"]

    def step(self):
        time.sleep(0.1)
        return {"score": self.x, "done": True}


class PBTSleeper(tune.Trainable):
    def setup(self, config):
        self.lr, self.score = config["lr"], 0.0

    def step(self):
        time.sleep(0.1)
        self.score += 1 - (self.lr - 0.5) ** 2
        return {"score": self.score}

    def save_checkpoint(self, checkpoint_dir):
        return {"score": self.score}

    def load_checkpoint(self, checkpoint):
        self.score = checkpoint["score"]

    def reset_config(self, new_config):
        self.lr = new_config["lr"]
        return True


def bare_sleep(_):
    time.sleep(0.1)
    return time.time()


class _LastEnd:
    def __init__(self):
        self.t = 0.0

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.t = time.perf_counter()

    def __getattr__(self, name):   # the other Callback hooks: nothing to do
        return lambda *a, **k: None


def bench_sleepers(n: int, storage: str) -> dict:
    ray.init(num_cpus=2)
    try:
        # The runtime's own floor right now: the same sleeps as bare tasks, two at a time.
        task = ray.remote(num_cpus=1)(bare_sleep)
        t0 = time.perf_counter()
        running, launched, done = [], 0, 0
        while done < n:
            while len(running) < 2 and launched < n:
                running.append(task.remote(launched))
                launched += 1
            ready, running = ray.wait(running, num_returns=1)
            done += len(ready)
        floor = time.perf_counter() - t0
    finally:
        ray.shutdown()
    ray.init(num_cpus=2)   # a fresh runtime: tune.run starts with no warm workers, as it would alone
    try:
        last = _LastEnd()
        t0 = time.perf_counter()
        a = tune.run(sleeper, config={"x": tune.uniform(0, 1)}, num_samples=n, resources_per_trial={"cpu": 1},
                     metric="score", mode="max", storage_path=storage, name="sleepers", verbose=0, callbacks=[last])
        wall = time.perf_counter() - t0
    finally:
        ray.shutdown()
    assert len(a.trials) == n and all(t.status == "TERMINATED" for t in a.trials)
    return {"trials": n, "wall_s": wall, "ideal_s": n * 0.1 / 2, "bare_tasks_s": floor,
            "last_trial_done_s": last.t - t0, "overhead_per_trial_ms": (wall - n * 0.05) / n * 1e3}


def bench_class(n: int, storage: str) -> dict:
    ray.init(num_cpus=2)
    try:
        t0 = time.perf_counter()
        a = tune.run(SleeperClass, config={"x": tune.uniform(0, 1)}, num_samples=n, resources_per_trial={"cpu": 1},
                     metric="score", mode="max", storage_path=storage, name="class", verbose=0)
        wall = time.perf_counter() - t0
    finally:
        ray.shutdown()
    assert len(a.trials) == n and all(t.status == "TERMINATED" for t in a.trials)
    return {"trials": n, "wall_s": wall, "ideal_s": n * 0.1 / 2}


def bench_pbt(trials: int, iterations: int, storage: str) -> dict:
    from raylite.tune.schedulers import PopulationBasedTraining
    pbt = PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=2,
                                  hyperparam_mutations={"lr": tune.uniform(0, 1)})
    ray.init(num_cpus=2)
    try:
        t0 = time.perf_counter()
        a = tune.run(PBTSleeper, config={"lr": tune.uniform(0, 1)}, num_samples=trials, scheduler=pbt,
                     resources_per_trial={"cpu": 1}, stop={"training_iteration": iterations}, reuse_actors=True,
                     metric="score", mode="max", storage_path=storage, name="pbt", verbose=0)
        wall = time.perf_counter() - t0
    finally:
        ray.shutdown()
    assert all(t.status == "TERMINATED" for t in a.trials)
    return {"trials": trials, "iterations": iterations, "wall_s": wall, "ideal_s": trials * iterations * 0.1 / 2,
            "perturbations": pbt.num_perturbations}


def bench_reports(n: int, storage: str) -> dict:
    ray.init(num_cpus=2)
    try:
        t0 = time.perf_counter()
        a = tune.run(fast_reporter, config={"n": n}, storage_path=storage, name="reports", verbose=0)
        wall = time.perf_counter() - t0
    finally:
        ray.shutdown()
    t = a.trials[0]
    assert t.last_result["training_iteration"] == n + 1
    return {"reports": n, "trial_rate_per_s": t.last_result["trial_rate"], "driver_rate_per_s": (n + 1) / wall,
            "wall_s": wall}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--reports", type=int, default=20000)
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    tune.run   # import Optuna before any clock starts
    storage = tempfile.mkdtemp(prefix="raylite-tune-bench-")
    try:
        s = bench_sleepers(args.trials, storage)
        r = bench_reports(args.reports, storage)
        c = bench_class(args.trials, storage)
        b = bench_pbt(10, 10, storage)
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    target = 5.5 * args.trials / 100
    print(f"{'figure':<62} {'value':>10}  target")
    print("-" * 84)
    label = f"1. {s['trials']} trials x sleep 0.1 s, cpu=1 on 2 CPUs: tune.run wall"
    print(f"{label:<62} "
          f"{s['wall_s']:>8.2f} s  <= {target:.1f} s (ideal {s['ideal_s']:.1f} s; Ray Tune 2.60: 196 s)"
          f"{'' if s['wall_s'] <= target else '  MISSED'}")
    print(f"{'   of which: last trial finished at':<62} {s['last_trial_done_s']:>8.2f} s  (then the study.db catch-up)")
    print(f"{'   overhead per trial (wall - ideal) / trials':<62} {s['overhead_per_trial_ms']:>7.1f} ms")
    print(f"{'   same sleeps as bare raylite tasks, 2 at a time (floor now)':<62} {s['bare_tasks_s']:>8.2f} s")
    print(f"{'2. one trial reporting flat out: reports/s inside the trial':<62} {r['trial_rate_per_s']:>8.0f} /s")
    print(f"{f'   results recorded by the driver / tune.run wall ({args.reports} reports)':<62} "
          f"{r['driver_rate_per_s']:>8.0f} /s")
    label = f"3. the same {c['trials']} trials as a class trainable: tune.run wall"
    print(f"{label:<62} {c['wall_s']:>8.2f} s  (ideal {c['ideal_s']:.1f} s)")
    label = f"4. PBT, {b['trials']} trials x {b['iterations']} x 0.1 s, perturb every 2: wall"
    print(f"{label:<62} {b['wall_s']:>8.2f} s  (ideal {b['ideal_s']:.1f} s; {b['perturbations']} perturbations)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sleepers": s, "reports": r, "class": c, "pbt": b}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
