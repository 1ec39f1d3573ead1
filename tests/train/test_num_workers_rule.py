"""One rule per meaning for a worker group's size, shared by Train and the plugins
(raylite.train.config): ``check_num_workers`` (an integer in range) and ``check_placeable`` (more
than the runtime has in total). Each caller's whole message is checked: its name, the field and the
value, then the rule; placement errors are raised before any worker starts."""
from __future__ import annotations

import re

import pytest

from raylite import train
from raylite.train.config import check_placeable

INT_RULE = "num_workers must be an integer >= "


def _trainer(**kw):
    return lambda: train.Trainer(**kw)


def _strategy(name, **kw):
    def call():
        pytest.importorskip("pytorch_lightning")
        import raylite.plugins as plugins
        getattr(plugins, name)(**kw)
    return call


def _tune_resources(**kw):
    def call():
        pytest.importorskip("pytorch_lightning")
        from raylite.plugins.tune import get_tune_resources
        get_tune_resources(**kw)
    return call


# (case id, call, the whole message)
CASES = [
    ("scaling-config", lambda: train.ScalingConfig(num_workers=-1),
     f"ScalingConfig(num_workers=-1): {INT_RULE}0 (0: local mode)"),
    ("scaling-config-float", lambda: train.ScalingConfig(num_workers=1.5),
     f"ScalingConfig(num_workers=1.5): {INT_RULE}0 (0: local mode)"),
    ("trainer-zero", _trainer(num_workers=0),
     f"Trainer(num_workers=0): {INT_RULE}1 (local mode, num_workers=0, is for Ray 2.x trainers' fit)"),
    ("trainer-negative", _trainer(num_workers=-2),
     f"Trainer(num_workers=-2): {INT_RULE}1 (local mode, num_workers=0, is for Ray 2.x trainers' fit)"),
    ("ray-strategy", _strategy("RayStrategy", num_workers=0), f"RayStrategy(num_workers=0): {INT_RULE}1"),
    ("ray-sharded-strategy", _strategy("RayShardedStrategy", num_workers=True),
     f"RayShardedStrategy(num_workers=True): {INT_RULE}1"),
    ("get-tune-resources", _tune_resources(num_workers="2"), f"get_tune_resources(num_workers='2'): {INT_RULE}1"),
]


@pytest.mark.parametrize("call, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_caller_words_the_num_workers_rule_alike(call, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call()


@pytest.mark.parametrize("who, cpu_field, per_worker, total, message", [
    ("RayStrategy", "num_cpus_per_worker", {"CPU": 1, "GPU": 0}, {"CPU": 2.0},
     "RayStrategy(num_workers=6) can never be placed: 6 workers x 1 CPU = 6 CPU, but the runtime has 2 CPU in "
     "total. Pass fewer num_workers, less per worker (num_cpus_per_worker=0.3333, resources_per_worker=...), "
     "or ray.init(...) with more"),
    ("ScalingConfig", "resources_per_worker['CPU']", {"CPU": 1, "GPU": 1}, {"CPU": 1.8, "GPU": 1.0},
     "ScalingConfig(num_workers=6) can never be placed: 6 workers x 1 CPU = 6 CPU, but the runtime has 1.8 CPU "
     "in total; 6 workers x 1 GPU = 6 GPU, but the runtime has 1 GPU in total. Pass fewer num_workers, less per "
     "worker (resources_per_worker['CPU']=0.3, resources_per_worker=...), or ray.init(...) with more"),
    ("ScalingConfig", "resources_per_worker['CPU']", {"CPU": 0, "accel": 1}, {"CPU": 2.0},
     "ScalingConfig(num_workers=6) can never be placed: 6 workers x 1 accel = 6 accel, but the runtime has 0 "
     "accel in total. Pass fewer num_workers, less per worker (resources_per_worker=...), or ray.init(...) with "
     "more"),
], ids=["plugins", "train-cpu-and-gpu", "train-custom"])
def test_one_placement_rule_for_train_and_the_plugins(who, cpu_field, per_worker, total, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_placeable(who, 6, per_worker, total, cpu_field)
    check_placeable(who, 1, per_worker, {**total, "GPU": 1, "accel": 1}, cpu_field)   # one worker fits


@pytest.mark.parametrize("call", [
    lambda: train.ScalingConfig(num_workers=0), lambda: train.ScalingConfig(num_workers=3),
    _trainer(num_workers=2), _strategy("RayStrategy", num_workers=2), _tune_resources(num_workers=2),
], ids=["scaling-local-mode", "scaling", "trainer", "strategy", "tune-resources"])
def test_valid_counts_pass(call):
    call()
