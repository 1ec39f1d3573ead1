"""How the driver reads a reported result, as Ray does: NumPy scalars are metrics (and JSON
numbers on disk). Trainables are defined inside the tests (cloudpickle ships them by value)."""
from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("optuna")
np = pytest.importorskip("numpy")

from raylite import tune  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def run_config(tmp_path, name, **kw):
    return tune.RunConfig(name=name, storage_path=str(tmp_path), verbose=0, **kw)


# ---------------------------------------------------------------------------- numpy scalars
def test_numpy_scalar_metrics_count_everywhere(ray_module, tmp_path):
    def trainable(config):
        import numpy as np
        for i in range(1, 9):
            tune.report({"loss": np.float32(config["x"] * 10 / i), "steps": np.int64(i),
                         "arr": np.array([1.0, 2.0])})

    grid = tune.Tuner(
        trainable, param_space={"x": tune.grid_search([0.1, 0.9, 0.8, 0.7])},
        tune_config=tune.TuneConfig(metric="loss", mode="min", max_concurrent_trials=1,
                                    scheduler=tune.ASHAScheduler(max_t=8, grace_period=2, reduction_factor=2)),
        run_config=run_config(tmp_path, "np", stop={"steps": 6})).fit()
    iters = [r.metrics["training_iteration"] for r in grid]
    assert iters[0] == 6 and min(iters) == 2   # the stop bound and ASHA both read np.int64/np.float32
    assert grid.get_best_result().config == {"x": 0.1}
    values = [t.value for t in grid._analysis.study.trials]
    assert values[0] == pytest.approx(10 * 0.1 / 6)   # OptunaSearch/the study got the float
    with open(os.path.join(grid[0].path, "result.json")) as f:
        first = json.loads(f.readline())
    assert first["loss"] == pytest.approx(1.0) and first["steps"] == 1 and first["arr"] == [1.0, 2.0]


# ---------------------------------------------------------------------------- nested metrics
def test_nested_metrics_are_read_flattened(ray_module, tmp_path):
    def trainable(config):
        for i, loss in enumerate([5, 1, 4, 2, 3, 0]):
            tune.report({"val": {"loss": loss * config["a"], "acc": i}},
                        checkpoint=tune.Checkpoint.from_dict({"i": i}))

    grid = tune.Tuner(
        trainable, param_space={"a": tune.grid_search([2, 1])},
        tune_config=tune.TuneConfig(metric="val/loss", mode="min"),
        run_config=run_config(tmp_path, "nested", stop={"val/acc": 4},
                              checkpoint_config=tune.CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="val/loss",
                                                                      checkpoint_score_order="min"))).fit()
    assert [r.metrics["training_iteration"] for r in grid] == [5, 5]   # stopped at val/acc == 4
    best = grid.get_best_result()
    assert best.config == {"a": 1} and best.metrics["val"] == {"loss": 3, "acc": 4}   # Result.metrics stays nested
    assert grid.get_best_result("val/acc", "max").metrics["val"]["acc"] == 4
    # kept: the two lowest val/loss (i=1, i=3) plus the latest (i=4)
    assert sorted(c.to_dict()["i"] for c, _ in best.best_checkpoints) == [1, 3, 4]
    analysis = grid._analysis
    assert analysis.get_best_checkpoint(analysis.best_trial).to_dict() == {"i": 1}
    assert "val/loss" in analysis.best_trial.metric_analysis


# ---------------------------------------------------------------------------- strict metric check
def test_a_result_without_the_metric_is_an_error(ray_module, tmp_path, monkeypatch):
    def trainable(config):
        tune.report({"loss": 1.0})

    def fit(name):
        return tune.Tuner(trainable, tune_config=tune.TuneConfig(metric="los", mode="min"),
                          run_config=run_config(tmp_path, name)).fit()

    with pytest.raises(ValueError, match="specified metric.*`los`.*TUNE_DISABLE_STRICT_METRIC_CHECKING"):
        fit("typo")
    monkeypatch.setenv("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    assert fit("lenient")[0].metrics["loss"] == 1.0


# ---------------------------------------------------------------------------- done=True
def test_a_result_with_done_ends_the_trial(ray_module, tmp_path):
    def trainable(config):
        for i in range(1, 20):
            tune.report({"loss": 1.0 / i, "done": i == 4})

    grid = tune.Tuner(trainable, run_config=run_config(tmp_path, "done")).fit()
    assert grid.num_errors == 0 and grid[0].metrics["training_iteration"] == 4
    assert len(grid[0].metrics_dataframe) == 4


# ---------------------------------------------------------------------------- storage URIs
def test_storage_path_file_uri_is_local_and_other_schemes_are_errors(ray_module, tmp_path):
    def trainable(config):
        tune.report({"loss": 1.0})

    grid = tune.Tuner(trainable, run_config=run_config(f"file://{tmp_path}/uri", "exp")).fit()
    assert grid.experiment_path == str(tmp_path / "uri" / "exp") and os.path.isdir(grid[0].path)
    analysis = tune.run(trainable, storage_path=f"file://{tmp_path}/run", name="exp", verbose=0)
    assert analysis.experiment_path == str(tmp_path / "run" / "exp")
    with pytest.raises(ValueError, match="s3://bucket/x.*local"):
        tune.RunConfig(storage_path="s3://bucket/x")
    with pytest.raises(ValueError, match="gs://bucket/x"):
        tune.run(trainable, storage_path="gs://bucket/x", verbose=0)
    assert not os.path.exists("gs:") and not os.path.exists("s3:")


# ---------------------------------------------------------------------------- BasicVariantGenerator
def test_basic_variant_generator_takes_rays_arguments(ray_module, tmp_path):
    from raylite.tune.search import BasicVariantGenerator

    def trainable(config):
        import time
        time.sleep(0.05)
        tune.report({"loss": config["b"]})

    space = {"a": tune.grid_search([1, 2, 3]), "b": tune.uniform(0, 1)}
    rc = dict(storage_path=str(tmp_path), verbose=0)
    bvg = BasicVariantGenerator([{"b": 0.5}], 1, True, 0)   # Ray's positional order
    analysis = tune.run(trainable, config=space, num_samples=3, search_alg=bvg, name="cgs", **rc)
    configs = [t.config for t in sorted(analysis.trials, key=lambda t: t.index)]
    assert [c["a"] for c in configs] == [1, 2, 3] * 3
    assert configs[0]["b"] == 0.5   # the point to evaluate
    for sample in range(1, 3):      # constant_grid_search: one draw per sample, kept over the grid
        assert len({c["b"] for c in configs[3 * sample:3 * sample + 3]}) == 1
    assert configs[3]["b"] != configs[6]["b"]
    starts = sorted((t.start_time, t.end_time) for t in analysis.trials)
    assert all(b[0] >= a[1] - 0.01 for a, b in zip(starts, starts[1:]))   # max_concurrent=1
    with pytest.raises(TypeError, match="random_state="):
        BasicVariantGenerator(42)
