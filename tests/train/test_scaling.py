"""ScalingConfig(accelerator_type=...): each worker asks for Ray's tiny ``accelerator_type:<T>``
resource, so a group only starts where that accelerator type is, and fails at once elsewhere."""
from __future__ import annotations

import sys

import cloudpickle
import pytest

import raylite as ray
from raylite import train
from raylite.train import RunConfig, ScalingConfig
from raylite.train.data_parallel_trainer import DataParallelTrainer

pytestmark = pytest.mark.timeout(120)
cloudpickle.register_pickle_by_value(sys.modules[__name__])   # workers need not import this module


# a runtime with one A100's accelerator-type resource, for each test that uses it
ON_AN_A100 = pytest.mark.parametrize("ray_start", [{"num_cpus": 2, "resources": {"accelerator_type:A100": 1}}],
                                     indirect=True, ids=["a100"])


def test_accelerator_type_is_a_tiny_resource_per_worker():
    request = ScalingConfig(num_workers=2, accelerator_type="A100").worker_request(use_gpu=False)
    assert request["resources"] == {"accelerator_type:A100": 0.001}
    with pytest.raises(ValueError, match="accelerator_type"):
        ScalingConfig(accelerator_type="")


def _free_a100():
    train.report({"free": ray.available_resources().get("accelerator_type:A100", 0)})


@ON_AN_A100
def test_workers_hold_the_accelerator_type_resource(ray_start, tmp_path):
    result = DataParallelTrainer(_free_a100, scaling_config=ScalingConfig(num_workers=2, accelerator_type="A100"),
                                 run_config=RunConfig(storage_path=str(tmp_path))).fit()
    assert result.metrics["free"] == pytest.approx(1 - 2 * 0.001)


@ON_AN_A100
def test_an_accelerator_type_the_runtime_lacks_fails_at_once(ray_start, tmp_path):
    trainer = DataParallelTrainer(_free_a100, scaling_config=ScalingConfig(num_workers=2, accelerator_type="H100"),
                                  run_config=RunConfig(storage_path=str(tmp_path)))
    with pytest.raises(ValueError, match=r"accelerator_type='H100'.*\['A100'\]"):
        trainer.fit()
