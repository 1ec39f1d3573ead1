"""A tune trial that runs a raylite.train Trainer: a 1-CPU trial on 2 CPUs starts two 1-CPU
training workers (its blocked get gives its CPU back) and reports their all-reduced value."""
from __future__ import annotations

import pytest

pytest.importorskip("optuna")

from raylite import tune  # noqa: E402


@pytest.mark.timeout(150)
def test_trial_runs_nested_trainer(ray_start, tmp_path):
    train = pytest.importorskip("raylite.train")
    pytest.importorskip("torch")
    if not hasattr(train, "Trainer"):
        pytest.skip("raylite.train has no Trainer")

    def trainable(config):
        from raylite.train import Trainer

        def train_func(cfg):
            import torch.distributed as dist
            t = __import__("torch").tensor([float(cfg["x"])])
            dist.all_reduce(t)
            return float(t.item())

        with Trainer(num_workers=2, use_gpu=False, logdir=config["logdir"]) as trainer:
            per_worker = trainer.run(train_func, config={"x": config["x"]})
        tune.report({"reduced": per_worker[0], "n": len(per_worker)})

    a = tune.run(trainable, config={"x": 2.5, "logdir": str(tmp_path / "train")}, resources_per_trial={"cpu": 1},
                 storage_path=str(tmp_path),
                 verbose=0)
    assert a.trials[0].status == "TERMINATED"
    assert a.trials[0].last_result == {**a.trials[0].last_result, "reduced": 5.0, "n": 2}
