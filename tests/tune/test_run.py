"""tune.run on the real runtime: concurrency, best trial, stop criteria, time budget, errors and
retries, infeasible requests, fractional GPUs, nested raylite work inside a trial, output.

Trainables are defined inside the tests so cloudpickle ships them by value; they only use stdlib
modules and raylite. Concurrency is checked with the trials' own (start, end) windows, not timings.
"""
from __future__ import annotations

import os

import pytest

pytest.importorskip("optuna")

import raylite as ray  # noqa: E402
from raylite import tune  # noqa: E402

pytestmark = pytest.mark.timeout(90)


def max_overlap(windows) -> int:
    """The most windows open at once ((start, end) pairs; an end before a start at a tie)."""
    events = sorted([(s, 1) for s, _ in windows] + [(e, -1) for _, e in windows], key=lambda x: (x[0], x[1]))
    best = cur = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def meeting(directory: str, n: int = 2):
    """A function that a trial calls to wait (30 s at most) until n trials have called it: then
    they overlap whatever the machine's speed, so a check that n ran at once cannot miss it."""
    def meet():
        import os
        import time
        import uuid
        open(os.path.join(directory, uuid.uuid4().hex), "w").close()
        deadline = time.monotonic() + 30
        while len(os.listdir(directory)) < n and time.monotonic() < deadline:
            time.sleep(0.01)
    return meet


def windowed(config):
    import time
    start = time.time()
    time.sleep(config.get("sleep", 0.3))
    tune.report({"start": start, "end": time.time(), "x": config.get("x", 0)})


def windows_of(analysis):
    return [(t.last_result["start"], t.last_result["end"]) for t in analysis.trials]


def test_sweep_respects_cpu_concurrency(ray_start, tmp_path):
    (tmp_path / "met").mkdir()
    meet = meeting(str(tmp_path / "met"))

    def trainable(config):
        import time
        start = time.time()
        meet()   # the first two overlap for sure; the rest run for as long, so a third would show
        time.sleep(0.3)
        tune.report({"start": start, "end": time.time(), "score": config["x"]})

    a = tune.run(trainable, config={"x": tune.uniform(0, 1)}, num_samples=6, resources_per_trial={"cpu": 1},
                 metric="score", mode="max", storage_path=str(tmp_path), verbose=0)
    assert len(a.trials) == 6 and all(t.status == "TERMINATED" for t in a.trials)
    assert max_overlap(windows_of(a)) == 2          # two 1-CPU trials at a time on 2 CPUs, never three
    assert len({t.runtime["pid"] for t in a.trials}) >= 2


def test_max_concurrent_trials_and_whole_machine_trials(ray_start, tmp_path):
    def trainable(config):
        import time
        start = time.time()
        time.sleep(0.15)
        tune.report({"start": start, "end": time.time()})

    a = tune.run(trainable, num_samples=3, max_concurrent_trials=1, storage_path=str(tmp_path), name="one",
                 verbose=0)
    assert max_overlap(windows_of(a)) == 1
    b = tune.run(trainable, num_samples=3, resources_per_trial={"cpu": 2}, storage_path=str(tmp_path),
                 name="two", verbose=0)
    assert max_overlap(windows_of(b)) == 1


def test_grid_times_num_samples_runs_every_point(ray_start, tmp_path):
    def trainable(config):
        tune.report({"a": config["a"], "b": config["b"]})

    a = tune.run(trainable, config={"a": tune.grid_search([1, 2, 3]), "b": tune.grid_search(["x", "y"]),
                                    "u": tune.uniform(0, 1)},
                 num_samples=2, storage_path=str(tmp_path), verbose=0)
    assert len(a.trials) == 12
    points = sorted((t.config["a"], t.config["b"]) for t in a.trials)
    assert points == sorted([(x, y) for x in (1, 2, 3) for y in ("x", "y")] * 2)
    assert {(t.last_result["a"], t.last_result["b"]) for t in a.trials} == set(points)


def test_best_trial_scopes_results_and_dataframe(ray_start, tmp_path):
    # Curves: trial k reports values[k]; "last", "all" (best ever), "avg" pick different trials.
    curves = {0: [5.0, 5.0, 5.0], 1: [9.0, 1.0, 1.0], 2: [0.0, 0.0, 6.0]}

    def trainable(config):
        for v in config["curve"]:
            tune.report({"score": v})

    a = tune.run(trainable, config={"k": tune.grid_search([0, 1, 2]),
                                    "curve": tune.sample_from(lambda spec: curves[spec.config.k])},
                 metric="score", mode="max", storage_path=str(tmp_path), verbose=0)
    by_k = {t.config["k"]: t for t in a.trials}
    assert a.best_trial is by_k[2] and a.best_config["k"] == 2 and a.best_result["score"] == 6.0
    assert a.get_best_trial("score", "max", scope="last") is by_k[2]
    assert a.get_best_trial("score", "max", scope="all") is by_k[1]      # 9.0 once
    assert a.get_best_trial("score", "max", scope="avg") is by_k[0]      # 5.0 on average
    assert a.get_best_trial("score", "min", scope="all") in (by_k[2],)   # 0.0
    assert a.get_best_trial("score", "min", scope="last") is by_k[1]
    assert a.get_best_config("score", "max", scope="avg")["k"] == 0
    assert a.results[by_k[1].trial_id]["training_iteration"] == 3
    df = a.dataframe()
    assert len(df) == 3 and {"score", "training_iteration", "config/k", "trial_id"} <= set(df.columns)
    best_rows = a.dataframe(metric="score", mode="max")
    assert sorted(best_rows["score"]) == [5.0, 6.0, 9.0]
    assert set(a.results_df.index) == {t.trial_id for t in a.trials}
    assert len(a.trial_dataframes[by_k[0].trial_id]) == 3
    unscored = tune.ExperimentAnalysis(a.trials)
    with pytest.raises(ValueError, match="metric"):
        unscored.best_trial


# One curve per scope, each the best (lowest) under its scope only; fillers are worse under all.
SCOPE_CURVES = {"last": [9.0] * 11 + [0.5], "all": [0.1] + [9.0] * 11, "avg": [2.5] * 12,
                "last-5-avg": [9.0] * 7 + [1.0, 1.0, 1.0, 1.0, 2.0], "last-10-avg": [20.0] * 2 + [1.5] * 10}


def test_finished_trials_stay_small_and_rank_by_every_scope(ray_start, tmp_path):
    # A week-long sweep keeps every trial in the driver: a finished trial holds its metrics' summaries
    # (~6.5 KB a trial here, the study's record included), not a 10-value window and an object per
    # metric, automatic ones included (~18 KB). Rankings are those of the raw results, reloaded too.
    import gc
    import statistics
    import tracemalloc

    n, curves = 100, list(SCOPE_CURVES.values())
    summary = {"max": max, "min": min, "last": lambda c: c[-1], "avg": statistics.fmean,
               "last-5-avg": lambda c: statistics.fmean(c[-5:]), "last-10-avg": lambda c: statistics.fmean(c[-10:])}

    def trainable(config):
        k = config["k"]
        for v in (curves[k] if k < len(curves) else [10.0] * 3):
            tune.report({"loss": v, "score": -v})

    def check(analysis, ids):
        for k, scope in enumerate(SCOPE_CURVES):
            assert analysis.get_best_trial("loss", "min", scope=scope).trial_id == ids[k], scope
            assert analysis.get_best_trial("score", "max", scope=scope).trial_id == ids[k], scope
        by_id = {t.trial_id: t for t in analysis.trials}
        for k, curve in enumerate(curves):
            loss = by_id[ids[k]].metric_analysis["loss"]
            assert {s: loss[s] for s in summary} == pytest.approx({s: f(curve) for s, f in summary.items()})
        assert by_id[ids[0]].metric_analysis["training_iteration"]["last-5-avg"] == 10.0   # automatic ones too

    gc.collect()
    tracemalloc.start()
    try:
        a = tune.run(trainable, config={"k": tune.grid_search(list(range(n)))}, metric="loss", mode="min",
                     storage_path=str(tmp_path), name="scopes", verbose=0)
        ids = {t.config["k"]: t.trial_id for t in a.trials}
        check(a, ids)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        del a
        gc.collect()
        per_trial = (held - tracemalloc.get_traced_memory()[0]) / n
    finally:
        tracemalloc.stop()
    assert per_trial < 10_000, f"{per_trial:.0f} bytes per finished trial"
    check(tune.ExperimentAnalysis(str(tmp_path / "scopes")), ids)


def test_stop_dict_function_and_returned_dict(ray_start, tmp_path):
    def trainable(config):
        for i in range(1000):
            tune.report(it=i, value=i * config["rate"])   # the 1.x keyword form

    a = tune.run(trainable, config={"rate": tune.grid_search([1, 2])}, stop={"value": 10},
                 storage_path=str(tmp_path), name="dict", verbose=0)
    for t in a.trials:   # a stop dict is also checked in the trial: it stops at exactly that result
        assert t.status == "TERMINATED" and not t.early_stopped
        assert t.last_result["value"] == 10 and t.last_result["training_iteration"] == 10 // t.config["rate"] + 1

    def slow(config):
        import time
        for i in range(1000):
            time.sleep(0.02)
            tune.report(it=i)

    # A function runs in the driver: the trial learns of the decision at a later report.
    b = tune.run(slow, stop=lambda tid, r: r["training_iteration"] >= 5, storage_path=str(tmp_path), name="fn",
                 verbose=0)
    assert b.trials[0].status == "TERMINATED"
    assert 5 <= b.trials[0].last_result["training_iteration"] < 100   # of 1000

    def returns(config):
        return {"final": config["x"] * 2}

    c = tune.run(returns, config={"x": 21}, storage_path=str(tmp_path), name="ret", verbose=0)
    assert c.trials[0].last_result["final"] == 42


def test_time_budget_stops_running_trials(ray_start, tmp_path):
    def reports_forever(config):
        import time
        while True:
            time.sleep(0.05)
            tune.report({"t": time.time()})

    a = tune.run(reports_forever, num_samples=4, time_budget_s=1.5, storage_path=str(tmp_path), name="rep",
                 verbose=0)
    statuses = [t.status for t in a.trials]
    assert statuses and all(s == "TERMINATED" for s in statuses)
    assert len(a.trials) == 2                   # the two that started; the rest never did
    assert all(t.last_result["training_iteration"] >= 3 for t in a.trials)


def test_time_budget_cancels_a_silent_trial(ray_start, tmp_path, monkeypatch):
    from raylite.tune import stopping
    monkeypatch.setattr(stopping, "STOP_GRACE_S", 0.5)

    def silent(config):
        import time
        time.sleep(60)

    import time
    t0 = time.monotonic()
    a = tune.run(silent, num_samples=1, time_budget_s=0.5, storage_path=str(tmp_path), verbose=0)
    assert time.monotonic() - t0 < 20
    assert a.trials[0].status == "TERMINATED"


def test_errors_retry_up_to_max_failures(ray_start, tmp_path):
    marker_dir = tmp_path / "markers"
    marker_dir.mkdir()

    def flaky(config):
        import os
        import uuid
        d = config["dir"]
        open(os.path.join(d, f"{config['fails']}-{uuid.uuid4().hex}"), "w").close()
        ckpt = tune.get_checkpoint()
        start = ckpt.to_dict()["i"] if ckpt else 0
        attempts = sum(1 for n in os.listdir(d) if n.startswith(f"{config['fails']}-"))
        for i in range(start, 4):
            tune.report({"i": i, "start": start}, checkpoint={"i": i + 1})
            if i >= 1 and attempts <= config["fails"]:
                raise ValueError(f"boom {attempts}")

    a = tune.run(flaky, config={"fails": tune.grid_search([0, 1, 3]), "dir": str(marker_dir)},
                 max_failures=2, raise_on_failed_trial=False, storage_path=str(tmp_path), verbose=0)
    by_f = {t.config["fails"]: t for t in a.trials}
    assert by_f[0].status == "TERMINATED" and by_f[0].num_failures == 0
    ok = by_f[1]
    assert ok.status == "TERMINATED" and ok.num_failures == 1
    assert ok.last_result["start"] == 2                     # restarted from its checkpoint
    bad = by_f[3]
    assert bad.status == "ERROR" and bad.num_failures == 3  # first run + 2 retries
    assert "boom" in bad.error_msg and "ValueError" in open(bad.error_file).read()
    with pytest.raises(tune.TuneError, match="did not complete"):
        tune.run(flaky, config={"fails": 5, "dir": str(marker_dir)}, storage_path=str(tmp_path), name="raise",
                 verbose=0)


def test_crashed_worker_is_a_failure_that_retries(ray_start, tmp_path):
    def crashes_once(config):
        import os
        tune.report({"step": 1})
        marker = os.path.join(tune.get_trial_dir(), "crashed")
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(3)                      # the worker process dies mid-trial
        tune.report({"step": 2})

    a = tune.run(crashes_once, max_failures=1, storage_path=str(tmp_path), verbose=0)
    t = a.trials[0]
    assert t.status == "TERMINATED" and t.num_failures == 1 and t.last_result["step"] == 2
    assert "WorkerCrashedError" in t.error_msg


def test_infeasible_resources_fail_before_any_trial(ray_start, tmp_path):
    ran = tmp_path / "ran"

    def trainable(config):
        open(config["path"], "w").close()

    for res, word in (({"cpu": 3}, "CPU"), ({"cpu": 1, "gpu": 1}, "GPU"), ({"cpu": 1, "tpu_pod": 1}, "tpu_pod")):
        with pytest.raises(ValueError, match=word):
            tune.run(trainable, config={"path": str(ran)}, resources_per_trial=res, storage_path=str(tmp_path),
                     verbose=0)
    assert not ran.exists()


def test_fractional_gpu_trials_see_their_device(tmp_path):
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, num_gpus=1)
    try:
        def trainable(config):
            import os
            import time
            start = time.time()
            time.sleep(0.4)
            tune.report({"start": start, "end": time.time(), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
                         "gpus": tune.get_trial_resources().get("GPU")})

        a = tune.run(trainable, num_samples=4, resources_per_trial={"cpu": 0.5, "gpu": 0.5},
                     storage_path=str(tmp_path), verbose=0)
        assert {t.last_result["cvd"] for t in a.trials} == {"0"}
        assert {t.last_result["gpus"] for t in a.trials} == {0.5}
        assert all(t.runtime["accelerator_ids"]["GPU"] == ["0"] for t in a.trials)
        assert max_overlap(windows_of(a)) == 2          # two halves of the one GPU at a time
    finally:
        ray.shutdown()


def test_trial_runs_nested_raylite_tasks(ray_start, tmp_path):
    """A trial holding 1 CPU starts 2-CPU-worth of tasks: its blocked get gives its CPU back."""
    def trainable(config):
        @ray.remote(num_cpus=1)
        def square(x):
            return x * x

        tune.report({"sum": sum(ray.get([square.remote(i) for i in range(4)])) + config["x"]})

    a = tune.run(trainable, config={"x": tune.grid_search([0, 100])}, resources_per_trial={"cpu": 1},
                 storage_path=str(tmp_path), verbose=0)
    assert sorted(t.last_result["sum"] for t in a.trials) == [14, 114]


def test_trial_submitted_ahead_waits_for_a_slot_while_trials_block(ray_start, tmp_path):
    """The next trial is submitted before a slot frees (the node starts it when a trial ends). A
    running trial blocked in get gives its CPU back, so the node may start that next trial early:
    it must still wait for a trial to end before its body runs (never three at once on 2 CPUs)."""
    def trainable(config):
        import time
        start = time.time()

        @ray.remote(num_cpus=1)
        def square(x):
            time.sleep(0.05)
            return x * x

        total = sum(ray.get([square.remote(i) for i in range(3)]))
        time.sleep(0.1)
        tune.report({"start": start, "end": time.time(), "sum": total})

    a = tune.run(trainable, num_samples=5, resources_per_trial={"cpu": 1}, storage_path=str(tmp_path), verbose=0)
    assert len(a.trials) == 5 and all(t.status == "TERMINATED" for t in a.trials)
    assert all(t.last_result["sum"] == 5 for t in a.trials)
    assert max_overlap(windows_of(a)) == 2


def test_with_parameters_callbacks_and_trial_context(ray_start, tmp_path):
    events = []

    class Recorder(tune.Callback):
        def on_trial_start(self, iteration, trials, trial, **info):
            events.append(("start", trial.trial_id))

        def on_trial_result(self, iteration, trials, trial, result, **info):
            events.append(("result", trial.trial_id))

        def on_trial_complete(self, iteration, trials, trial, **info):
            events.append(("complete", trial.trial_id))

        def on_experiment_end(self, trials, **info):
            events.append(("end", len(trials)))

    def trainable(config, data=None):
        tune.report({"n": len(data), "id": tune.get_trial_id(), "dir": tune.get_trial_dir()})

    a = tune.run(tune.with_parameters(trainable, data=list(range(1000))), num_samples=2,
                 storage_path=str(tmp_path), callbacks=[Recorder()], verbose=0)
    for t in a.trials:
        assert t.last_result["n"] == 1000 and t.last_result["id"] == t.trial_id
        assert t.last_result["dir"] == t.path
        assert [e[0] for e in events if e[1] == t.trial_id] == ["start", "result", "complete"]
    assert events[-1] == ("end", 2)


def test_callback_hooks_for_setup_steps_checkpoints_and_retries(ray_start, tmp_path):
    """The rest of Ray's tune.Callback hooks, in the order Ray fires them."""
    events = []

    class Recorder(tune.Callback):
        def setup(self, stop=None, num_samples=None, total_num_samples=None, **info):
            events.append(("setup", num_samples))

        def on_step_begin(self, iteration, trials, **info):
            events.append(("step",))

        def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
            events.append(("checkpoint", os.path.basename(checkpoint.path), os.path.isdir(checkpoint.path)))

        def on_trial_recover(self, iteration, trials, trial, **info):
            events.append(("recover",))

    def trainable(config):
        marker = os.path.join(config["dir"], "failed_once")
        tune.report({"x": 1}, checkpoint=tune.Checkpoint.from_dict({"x": 1}))
        if not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("first attempt fails")

    tune.run(trainable, config={"dir": str(tmp_path)}, storage_path=str(tmp_path), max_failures=1,
             callbacks=[Recorder()], verbose=0)
    assert events[0] == ("setup", 1) and ("step",) in events
    assert [e for e in events if e[0] in ("checkpoint", "recover")] == [
        ("checkpoint", "checkpoint_000000", True), ("recover",), ("checkpoint", "checkpoint_000001", True)]


def test_status_table_names_the_blocking_resource(ray_start, tmp_path, capsys):
    from raylite.tune import progress
    reports = []

    class Spy(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            if not reports:
                reports.append(runner_ref[0].reporter.status(runner_ref[0]))

    runner_ref = []
    orig = progress.ProgressReporter.maybe_status

    def capture(self, runner, force=False):
        if not runner_ref:
            runner_ref.append(runner)
        return orig(self, runner, force)

    def trainable(config):
        import time
        time.sleep(0.3)
        tune.report({"loss": config["x"]})

    progress.ProgressReporter.maybe_status = capture
    try:
        a = tune.run(trainable, config={"x": tune.uniform(0, 1)}, num_samples=5, resources_per_trial={"cpu": 1},
                     metric="loss", mode="min", storage_path=str(tmp_path), callbacks=[Spy()], verbose=1)
    finally:
        progress.ProgressReporter.maybe_status = orig
    table = reports[0]
    assert "PENDING" in table and "RUNNING" in table
    assert "waits for CPU (needs 1, 0 of 2 free, 2 held by 2 running trials)" in table
    out = capsys.readouterr().out
    assert "== Summary ==" in out and "5 TERMINATED" in out and a.best_trial.trial_id in out


def test_verbose_zero_is_silent(ray_start, tmp_path, capfd):
    def trainable(config):
        tune.report({"loss": 1.0})

    tune.run(trainable, num_samples=2, metric="loss", mode="min", storage_path=str(tmp_path), verbose=0)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_bad_arguments(ray_start, tmp_path):
    def trainable(config):
        pass

    with pytest.raises(ValueError, match="metric and mode"):
        tune.run(trainable, metric="loss", storage_path=str(tmp_path), verbose=0)
    with pytest.raises(ValueError, match="need"):
        tune.run(trainable, scheduler=tune.ASHAScheduler(), storage_path=str(tmp_path), verbose=0)
    with pytest.raises(TypeError, match="not a tune.Trainable subclass"):
        tune.run(type("T", (), {}), storage_path=str(tmp_path), verbose=0)
    from raylite.tune import session
    session._warned.discard("report")
    with pytest.warns(UserWarning, match="only be called inside"):   # as Ray: a warning, nothing reported
        assert tune.report({"x": 1}) is None
    assert not os.listdir(tmp_path)
