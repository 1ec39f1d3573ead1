"""Ray Tune behaviour that tutorial code relies on: trials run in their trial directory, session
functions outside a trial warn and return None, numpy's seed repeats the default search, and the
API of Ray's docs (OptunaSearch's warm start and storage, Result.get_best_checkpoint,
with_resources(ScalingConfig), log_to_file, trial name creators, the Lightning integration path).
Trainables are defined inside the tests (cloudpickle ships them by value)."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

from helpers import REPO_ROOT

pytest.importorskip("optuna")

import raylite as ray  # noqa: E402
from raylite import tune  # noqa: E402
from raylite.tune import session  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def run_config(tmp_path, name, **kw):
    return tune.RunConfig(name=name, storage_path=str(tmp_path), verbose=0, **kw)


def worker_cwds(n: int = 6) -> set:
    """(cwd, TUNE_ORIG_WORKING_DIR) of the workers that run n plain tasks: for n > 1, both of the
    2-CPU runtime's (the first two tasks wait, 30 s at most, until both have started)."""
    import tempfile
    met, meet = tempfile.mkdtemp(), min(n, 2)

    @ray.remote
    def cwd():
        import os
        import time
        import uuid
        open(os.path.join(met, uuid.uuid4().hex), "w").close()
        deadline = time.monotonic() + 30
        while len(os.listdir(met)) < meet and time.monotonic() < deadline:
            time.sleep(0.01)
        return os.getcwd(), os.environ.get("TUNE_ORIG_WORKING_DIR"), os.getpid()

    try:
        found = ray.get([cwd.remote() for _ in range(n)])
    finally:
        import shutil
        shutil.rmtree(met)
    assert len({pid for _, _, pid in found}) >= meet, "the tasks did not reach both workers"
    return {(where, orig) for where, orig, _ in found}


# ---------------------------------------------------------------------------- working directory
def test_trials_run_in_their_directory_and_workers_get_their_cwd_back(ray_module, tmp_path):
    before = worker_cwds()

    def trainable(config):
        with open("./model.pth", "w") as f:   # the tutorials' relative save
            f.write(str(config["x"]))
        tune.report({"cwd": os.getcwd(), "orig": os.environ.get("TUNE_ORIG_WORKING_DIR")})

    grid = tune.Tuner(trainable, param_space={"x": tune.grid_search([1, 2, 3])},
                      run_config=run_config(tmp_path, "cwd")).fit()
    assert grid.num_errors == 0
    for r in grid:
        assert r.metrics["cwd"] == r.path
        assert open(os.path.join(r.path, "model.pth")).read() == str(r.config["x"])   # not overwritten
        assert r.metrics["orig"] in {cwd for cwd, _ in before}
    assert not os.path.exists("model.pth")
    assert worker_cwds() == before   # the next tasks are unaffected


def test_chdir_off_with_ray_env_var(ray_module, tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_CHDIR_TO_TRIAL_DIR", "0")
    (cwd, _), = worker_cwds(1)

    def trainable(config):
        tune.report({"cwd": os.getcwd()})

    grid = tune.Tuner(trainable, run_config=run_config(tmp_path, "nochdir")).fit()
    assert grid[0].metrics["cwd"] == cwd
    with pytest.raises(DeprecationWarning, match="RAY_CHDIR_TO_TRIAL_DIR"):
        tune.TuneConfig(chdir_to_trial_dir=False)


# ---------------------------------------------------------------------------- outside a trial
def test_session_functions_outside_a_trial_warn_and_return_none():
    session._warned.clear()
    calls = {"report": lambda: tune.report({"a": 1}), "get_checkpoint": tune.get_checkpoint,
             "get_trial_id": tune.get_trial_id, "get_trial_dir": tune.get_trial_dir,
             "get_trial_resources": tune.get_trial_resources,
             "get_trial_name": lambda: tune.get_context().get_trial_name(),
             "get_experiment_name": lambda: tune.get_context().get_experiment_name()}
    for name, call in calls.items():
        with pytest.warns(UserWarning, match=f"`{name}` is meant to only be called inside"):
            assert call() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # once per function, as Ray's log_once
        assert tune.get_context().get_trial_id() is None and tune.get_context().get_trial_dir() is None
    assert tune.get_context().get_world_size() == 1 and tune.get_context().get_world_rank() == 0


# ---------------------------------------------------------------------------- reproducibility
def test_numpy_seed_repeats_the_default_search(ray_module, tmp_path):
    import numpy as np

    def trainable(config):
        tune.report({"v": config["seed"]})

    def seeds(seed, name):
        np.random.seed(seed)
        grid = tune.Tuner(trainable, param_space={"seed": tune.randint(0, 1_000_000), "u": tune.uniform(0, 1)},
                          tune_config=tune.TuneConfig(num_samples=4, search_alg=tune.search.BasicVariantGenerator()),
                          run_config=run_config(tmp_path, name)).fit()
        return sorted((r.config["seed"], r.config["u"]) for r in grid)

    first = seeds(1234, "a")
    assert seeds(1234, "b") == first and seeds(99, "c") != first


# ---------------------------------------------------------------------------- OptunaSearch
def test_optuna_evaluated_rewards_are_told_not_run(ray_module, tmp_path):
    points = [{"x": 1.0}, {"x": 4.0}]
    searcher = tune.OptunaSearch(points_to_evaluate=points, evaluated_rewards=[9.0, 0.0], seed=0)

    def trainable(config):
        tune.report({"loss": (config["x"] - 4) ** 2})

    analysis = tune.run(trainable, config={"x": tune.uniform(0, 10)}, num_samples=3, metric="loss", mode="min",
                        search_alg=searcher, storage_path=str(tmp_path), name="warm", verbose=0)
    assert len(analysis.trials) == 3 and all(t.config["x"] not in (1.0, 4.0) for t in analysis.trials)
    told = [t for t in analysis.study.trials if "trial_id" not in t.user_attrs]
    assert sorted((t.params["x"], t.value) for t in told) == [(1.0, 9.0), (4.0, 0.0)]

    with pytest.raises(ValueError, match="one per point"):
        tune.OptunaSearch(points_to_evaluate=points, evaluated_rewards=[1.0])
    with pytest.raises(TypeError, match="Define-by-run"):
        tune.OptunaSearch(space=lambda t: None, points_to_evaluate=points, evaluated_rewards=[1.0, 2.0])


def test_optuna_storage_and_study_name_keep_the_study(ray_module, tmp_path):
    import optuna
    url = f"sqlite:///{tmp_path}/searcher.db"

    def trainable(config):
        tune.report({"loss": config["x"]})

    for name in ("first", "second"):   # the second experiment loads the study: its sampler sees the first's trials
        tune.run(trainable, config={"x": tune.uniform(0, 1)}, num_samples=2, metric="loss", mode="min",
                 search_alg=tune.OptunaSearch(study_name="shared", storage=url, seed=1),
                 storage_path=str(tmp_path), name=name, verbose=0)
    trials = optuna.load_study(study_name="shared", storage=url).trials
    assert len(trials) == 4 and all(t.state.name == "COMPLETE" for t in trials)
    with pytest.raises(TypeError, match="storage"):
        tune.OptunaSearch(storage=3)


# ---------------------------------------------------------------------------- results
def test_result_best_checkpoint_and_string_and_nested_metrics(ray_module, tmp_path):
    def trainable(config):
        for score in (1, 3, 2):
            tune.report({"score": score, "tag": f"s{score}", "nested": {"m": -score}},
                        checkpoint=tune.Checkpoint.from_dict({"score": score}))

    result = tune.Tuner(trainable, run_config=run_config(tmp_path, "best")).fit()[0]
    assert result.get_best_checkpoint("score", "max").to_dict() == {"score": 3}
    assert result.get_best_checkpoint("nested/m", "max").to_dict() == {"score": 1}
    assert [m["tag"] for _, m in result.best_checkpoints] == ["s1", "s3", "s2"]
    assert result.best_checkpoints[0][1]["nested"] == {"m": -1}
    assert list(result.metrics_dataframe["nested/m"]) == [-1, -3, -2]
    with pytest.raises(RuntimeError, match="Invalid metric name"):
        result.get_best_checkpoint("nope", "max")
    with pytest.raises(ValueError, match="Unsupported mode"):
        result.get_best_checkpoint("score", "best")


# ---------------------------------------------------------------------------- resources
def test_with_resources_takes_a_scaling_config(ray_module, tmp_path):
    from raylite.train import ScalingConfig

    def trainable(config):
        tune.report({"res": tune.get_trial_resources()})

    wrapped = tune.with_resources(trainable, ScalingConfig(trainer_resources={"CPU": 1}, num_workers=1,
                                                           resources_per_worker={"CPU": 1}))
    assert tune.Tuner(wrapped, run_config=run_config(tmp_path, "sc")).fit()[0].metrics["res"] == {"CPU": 2.0}
    # Ray's as_placement_group_factory: the trainer's 1 CPU, and one bundle per worker
    assert tune.with_resources(trainable, ScalingConfig(num_workers=3)).resources == {"CPU": 4.0}
    assert tune.with_resources(trainable, ScalingConfig(num_workers=2, use_gpu=True)).resources == \
        {"CPU": 1.0, "GPU": 2.0}


# ---------------------------------------------------------------------------- names and output
def test_trial_names_dirnames_and_log_to_file(ray_module, tmp_path):
    def trainable(config):
        print("to stdout", config["x"])
        print("to stderr", config["x"], file=sys.stderr)
        tune.report({"name": tune.get_context().get_trial_name()})

    grid = tune.Tuner(trainable, param_space={"x": tune.grid_search([1, 2])},
                      run_config=run_config(tmp_path, "logs", log_to_file=True)).fit()
    for r in grid:
        trial_id = r.metrics["trial_id"]
        assert r.metrics["name"] == f"trainable_{trial_id}"
        assert os.path.basename(r.path).startswith(f"trainable_{trial_id}_{trial_id[-1]}_x={r.config['x']}_")
        assert open(os.path.join(r.path, "stdout")).read() == f"to stdout {r.config['x']}\n"
        assert open(os.path.join(r.path, "stderr")).read() == f"to stderr {r.config['x']}\n"

    analysis = tune.run(trainable, config={"x": 5}, log_to_file="both.log", reuse_actors=True,
                        trial_name_creator=lambda t: f"{t.trainable_name}-{t.trial_id}-named",
                        trial_dirname_creator=lambda t: f"dir_{t.trial_id}",
                        storage_path=str(tmp_path), name="named", verbose=0)
    t = analysis.trials[0]
    assert str(t) == t.last_result["name"] == f"trainable-{t.trial_id}-named"
    assert os.path.basename(t.path) == f"dir_{t.trial_id}"
    assert open(os.path.join(t.path, "both.log")).read() == "to stdout 5\nto stderr 5\n"
    assert str(tune.ExperimentAnalysis(str(tmp_path / "named")).trials[0]) == str(t)   # kept on disk

    with pytest.raises(ValueError, match="must not be empty or contain"):
        tune.run(trainable, config={"x": 1}, trial_dirname_creator=lambda t: "a/b",
                 storage_path=str(tmp_path), name="bad", verbose=0)
    with pytest.raises(ValueError, match="log_to_file"):
        tune.RunConfig(log_to_file=("only one",))


def test_lightning_integration_path_is_lazy():
    code = ("import sys, raylite.tune, raylite.tune.integration.pytorch_lightning as m\n"
            "assert not {'lightning', 'pytorch_lightning'} & set(sys.modules)\n"
            "from raylite.plugins import TuneReportCallback, TuneReportCheckpointCallback\n"
            "assert m.TuneReportCheckpointCallback is TuneReportCheckpointCallback\n"
            "assert m.TuneReportCallback is TuneReportCallback\n")
    root = str(REPO_ROOT)
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=60)
