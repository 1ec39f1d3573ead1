"""Ray 2.60's smaller Train APIs: checkpoint metadata persisted with the checkpoint; train.collective;
get_dataset_shard's error; restore's deprecation;
UserCallback's hooks;
local mode (num_workers=0).

DataParallelTrainer with 2 workers and no process group: no torch import in the workers.
"""
from __future__ import annotations

import os
import sys
import time

import cloudpickle
import pytest

from raylite import train
from raylite.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig, collective
from raylite.train.checkpoint import METADATA_FILE
from raylite.train.data_parallel_trainer import DataParallelTrainer

pytestmark = pytest.mark.timeout(120)
cloudpickle.register_pickle_by_value(sys.modules[__name__])   # workers need not import this module


def _fit(loop, tmp_path, num_workers=2, **kwargs):
    return DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=num_workers),
                               run_config=RunConfig(storage_path=str(tmp_path), name="run"), **kwargs).fit()


def test_checkpoint_metadata_set_update_get(tmp_path):
    ckpt = Checkpoint.from_directory(tmp_path)
    assert ckpt.get_metadata() == {}
    ckpt.set_metadata({"epoch": 3, "tag": "a"})
    ckpt.update_metadata({"epoch": 4})
    assert ckpt.get_metadata() == {"epoch": 4, "tag": "a"}
    assert os.path.isfile(tmp_path / METADATA_FILE)
    ckpt.set_metadata({"x": 1})   # replaces
    assert Checkpoint(str(tmp_path)).get_metadata() == {"x": 1}


def _reports_metadata():
    import tempfile
    rank = train.get_context().get_world_rank()
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, f"w{rank}"), "w") as f:
            f.write("x")
        ckpt = Checkpoint.from_directory(d)
        ckpt.set_metadata({"epoch": 5, "rank": rank})
        train.report({"a": 1}, checkpoint=ckpt)


def test_metadata_set_in_a_worker_is_persisted_with_the_checkpoint(ray_module, tmp_path):
    result = _fit(_reports_metadata, tmp_path)
    assert result.checkpoint.get_metadata() == {"epoch": 5, "rank": 0}   # rank 0's, as for any file


def _collectives():
    rank = train.get_context().get_world_rank()
    got = collective.broadcast_from_rank_zero({"from": os.getpid()} if rank == 0 else None)
    if rank == 1:
        time.sleep(0.5)
    before = time.time()
    collective.barrier()
    train.report({"waited": time.time() - before, "got": got["from"]})   # report's round follows the collectives
    return got["from"], os.getpid()


class _Rounds:
    def __init__(self):
        self.rounds = []

    def after_report(self, run_context, metrics, checkpoint):
        self.rounds.append(metrics)


def test_broadcast_from_rank_zero_and_barrier(ray_module, tmp_path):
    seen = _Rounds()
    result = DataParallelTrainer(_collectives, scaling_config=ScalingConfig(num_workers=2),
                                 run_config=RunConfig(storage_path=str(tmp_path), callbacks=[seen])).fit()
    rank0_pid = result.return_value[1]
    assert [m["got"] for m in seen.rounds[0]] == [rank0_pid, rank0_pid]   # rank 0's data on both ranks
    assert result.metrics["waited"] > 0.3                                # rank 0 waited for rank 1 at the barrier


def test_collectives_outside_a_training_function_raise():
    with pytest.raises(RuntimeError, match="outside of a Ray Train training function"):
        collective.barrier()
    with pytest.raises(RuntimeError, match="broadcast_from_rank_zero"):
        collective.broadcast_from_rank_zero(1)


def test_get_dataset_shard_says_ray_data_is_not_supported():
    with pytest.raises(NotImplementedError, match="Ray Data is not supported.*train_loop_config"):
        train.get_dataset_shard("train")


@pytest.mark.parametrize("method", ["restore", "can_restore"])
def test_restore_and_can_restore_are_deprecated_as_in_ray_v2(method, tmp_path):
    from raylite.train.torch import TorchTrainer
    for cls in (DataParallelTrainer, TorchTrainer):
        with pytest.raises(DeprecationWarning, match="deprecated.*same RunConfig"):
            getattr(cls, method)(str(tmp_path))


class _Hooks(train.UserCallback):
    def __init__(self):
        self.calls = []

    def after_report(self, run_context, metrics, checkpoint):
        self.calls.append(("report", [m["attempt"] for m in metrics]))

    def after_exception(self, run_context, worker_exceptions):
        self.calls.append(("exception", {r: str(e) for r, e in worker_exceptions.items()}))


def _fails_once_on_rank_1(config):
    import pathlib
    marker = pathlib.Path(config["dir"], "failed")
    train.report({"attempt": int(marker.exists())})
    if train.get_context().get_world_rank() == 1 and not marker.exists():
        marker.touch()
        raise ValueError("boom")


def test_user_callback_hooks_after_report_and_after_exception(ray_module, tmp_path):
    hooks = _Hooks()
    DataParallelTrainer(_fails_once_on_rank_1, train_loop_config={"dir": str(tmp_path)},
                        scaling_config=ScalingConfig(num_workers=2),
                        run_config=RunConfig(storage_path=str(tmp_path), callbacks=[hooks],
                                             failure_config=FailureConfig(max_failures=1))).fit()
    assert [c[0] for c in hooks.calls] == ["report", "exception", "report"]
    assert hooks.calls[0][1] == [0, 0] and hooks.calls[2][1] == [1, 1]
    assert list(hooks.calls[1][1]) == [1] and "boom" in hooks.calls[1][1][1]
    assert train.UserCallback().after_report(None, [], None) is None   # the base hooks do nothing


def _local_loop(config):
    ctx = train.get_context()
    assert train.get_checkpoint() is None
    assert collective.broadcast_from_rank_zero({"x": 1}) == {"x": 1}
    collective.barrier()
    d = os.path.join(config["dir"], "ck")
    os.makedirs(d)
    train.report({"step": 1}, checkpoint=Checkpoint.from_directory(d))
    assert train.get_checkpoint().path == d   # the last reported one, as in Ray's local mode
    train.report({"step": 2, "ws": ctx.get_world_size(), "rank": ctx.get_world_rank()},
                 checkpoint=train.get_checkpoint())
    return os.getpid()


def test_num_workers_0_is_local_mode(tmp_path):
    from raylite.train.torch import TorchTrainer
    result = TorchTrainer(_local_loop, train_loop_config={"dir": str(tmp_path)},
                          scaling_config=ScalingConfig(num_workers=0)).fit()
    assert result.return_value == os.getpid()   # ran in this process
    assert result.metrics == {"step": 2, "ws": 1, "rank": 0}
    assert result.checkpoint.path == str(tmp_path / "ck") and result.path is None
    with pytest.raises(ValueError, match="num_workers"):
        train.Trainer(num_workers=0)


def test_local_mode_errors_propagate_as_they_are():
    def boom():
        raise KeyError("x")
    with pytest.raises(KeyError):
        DataParallelTrainer(boom, scaling_config=ScalingConfig(num_workers=0)).fit()
    assert not train.get_context().in_session()
