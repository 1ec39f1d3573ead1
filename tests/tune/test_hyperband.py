"""HyperBand: Ray's synchronous brackets (HyperBandScheduler), and ASHA with several brackets on
Optuna's HyperbandPruner (AsyncHyperBandScheduler is ASHA, as in Ray)."""
from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("optuna")

from raylite import tune  # noqa: E402
from raylite.tune.schedulers import HyperBandScheduler  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def climber(config):
    """score = x * iteration; checkpoints every iteration, so a paused trial goes on where it was."""
    import time
    ckpt = tune.get_checkpoint()
    i = ckpt.to_dict()["i"] if ckpt else 0
    while True:
        time.sleep(0.02)
        i += 1
        tune.report({"score": config["x"] * i}, checkpoint={"i": i})


def test_synchronous_brackets_keep_the_best_third_at_each_rung(ray_start, tmp_path):
    hb = HyperBandScheduler(max_t=9, reduction_factor=3)   # s_max = 2: first bracket 9 trials from rung 1
    xs = [0.1 * k for k in range(1, 10)]
    a = tune.run(climber, config={"x": tune.grid_search(xs)}, metric="score", mode="max", scheduler=hb,
                 resources_per_trial={"cpu": 0.5}, storage_path=str(tmp_path), verbose=0)
    reached = {round(t.config["x"], 1): t.last_result["training_iteration"] for t in a.trials}
    assert sorted(reached.values()) == [1] * 6 + [3] * 2 + [9]  # 9 at rung 1, 3 at rung 3, 1 to max_t
    assert reached[0.9] == 9 and reached[0.8] == reached[0.7] == 3
    assert all(t.status == "TERMINATED" for t in a.trials)
    assert sum(t.early_stopped for t in a.trials) == 8
    for t in a.trials:   # a paused trial went on from its checkpoint: no iteration twice, none skipped
        rows = [json.loads(line)["training_iteration"] for line in open(os.path.join(t.path, "result.json"))]
        assert rows == list(range(1, len(rows) + 1))
    assert "stopped early" in hb.describe()


def test_bracket_sizes_follow_rays_formula():
    hb = HyperBandScheduler(max_t=81, reduction_factor=3)
    first = hb._new_bracket()
    hb.brackets.append(first)
    second = hb._new_bracket()
    assert (first.size, first.rung) == (81, 1) and (second.size, second.rung) == (34, 3)
    assert hb.rungs() == [1, 3, 9, 27]


def test_asha_with_brackets_runs_on_optunas_hyperband_pruner():
    import optuna
    asha = tune.schedulers.AsyncHyperBandScheduler(max_t=27, grace_period=1, reduction_factor=3, brackets=3)
    assert isinstance(asha.make_pruner(), optuna.pruners.HyperbandPruner)
    assert tune.ASHAScheduler is tune.AsyncHyperBandScheduler
    from raylite.tune.schedulers.async_hyperband import ASHAScheduler
    assert ASHAScheduler is tune.ASHAScheduler


@pytest.mark.parametrize("kwargs, match", [({"max_t": 0}, "max_t=0"), ({"reduction_factor": 1}, "reduction_factor=1")])
def test_bad_arguments_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HyperBandScheduler(**kwargs)
