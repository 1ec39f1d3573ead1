"""train.report across ranks, as Ray Train V2's: a barrier every rank must reach; the round's
checkpoint is the one directory every reporting rank copied its files into (a checkpoint from rank 1
alone counts too; on a file-name clash rank 0's is kept); a rank dying while the others wait in
report restarts the group from the last checkpoint every rank reached.

DataParallelTrainer with 2 workers and no process group: no torch import in the workers.
"""
from __future__ import annotations

import json
import os
import sys
import time

import cloudpickle
import pytest

from raylite import train
from raylite.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from raylite.train.data_parallel_trainer import DataParallelTrainer

pytestmark = pytest.mark.timeout(120)
cloudpickle.register_pickle_by_value(sys.modules[__name__])   # workers need not import this module


def _fit(loop, tmp_path, config=None, **run):
    return DataParallelTrainer(loop, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
                               run_config=RunConfig(storage_path=str(tmp_path), **run)).fit()


def _write(d: str, files: dict) -> Checkpoint:
    for name, text in files.items():
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    return Checkpoint.from_directory(d)


def _resume_step() -> int:
    """The step after the one in train.get_checkpoint()'s state.json (0 without a checkpoint)."""
    ckpt = train.get_checkpoint()
    if ckpt is None:
        return 0
    with ckpt.as_directory() as d, open(os.path.join(d, "state.json")) as f:
        return json.load(f)["step"] + 1


def _ranks_checkpoints(config):
    import tempfile
    rank = train.get_context().get_world_rank()
    for step, who in enumerate(config["who"]):
        with tempfile.TemporaryDirectory() as d:
            ckpt = _write(d, {f"shard-{rank}": str(step), "common": f"rank {rank}"}) if rank in who else None
            train.report({"step": step, "rank": rank}, checkpoint=ckpt)


def test_checkpoints_of_every_rank_are_merged_and_rank_1_alone_counts(ray_module, tmp_path):
    result = _fit(_ranks_checkpoints, tmp_path, {"who": [[0, 1], [1], [], [0]]})
    names = sorted(n for n in os.listdir(result.path) if n.startswith("checkpoint_"))
    assert names == ["checkpoint_000000", "checkpoint_000001", "checkpoint_000002"]
    first, second, third = (os.path.join(result.path, n) for n in names)
    assert sorted(os.listdir(first)) == ["common", "shard-0", "shard-1"]
    with open(os.path.join(first, "common")) as f:
        assert f.read() == "rank 0"                                # a clash: rank 0's file is kept
    assert sorted(os.listdir(second)) == ["common", "shard-1"]     # rank 1's alone is the round's
    assert sorted(os.listdir(third)) == ["common", "shard-0"]
    assert result.checkpoint.path == third
    assert [m["checkpoint_dir_name"] for m in result.metrics_history] == \
        ["checkpoint_000000", "checkpoint_000001", None, "checkpoint_000002"]
    assert [m["rank"] for m in result.metrics_history] == [0] * 4


def _late_rank_1(config):
    rank = train.get_context().get_world_rank()
    if rank == 1:
        time.sleep(config["late_s"])
    t0 = time.monotonic()
    train.report({"waited": 0.0})
    train.report({"waited": time.monotonic() - t0})


def test_report_is_a_barrier_across_ranks(ray_module, tmp_path):
    result = _fit(_late_rank_1, tmp_path, {"late_s": 1.5})
    assert result.metrics["waited"] >= 1.2                         # rank 0 waited for rank 1


def _dies_before_reporting(config):
    import tempfile
    rank = train.get_context().get_world_rank()
    start = _resume_step()
    for step in range(start, 4):
        if rank == 0 and step == 2:
            open(config["marker"] + "-rank-0", "w").close()   # it goes into report's wait next
        if rank == 1 and step == 2 and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            while not os.path.exists(config["marker"] + "-rank-0"):
                time.sleep(0.01)
            os._exit(1)
        with tempfile.TemporaryDirectory() as d:
            train.report({"step": step, "start": start},
                         checkpoint=_write(d, {"state.json": json.dumps({"step": step})}))


def test_a_rank_dying_while_others_wait_in_report_restarts_from_the_last_complete_round(ray_module, tmp_path):
    result = _fit(_dies_before_reporting, tmp_path, {"marker": str(tmp_path / "died")},
                  failure_config=FailureConfig(max_failures=1))
    assert (tmp_path / "died").exists()
    assert [(m["step"], m["start"]) for m in result.metrics_history] == [(0, 0), (1, 0), (2, 2), (3, 2)]
    assert sorted(n for n in os.listdir(result.path) if n.startswith("checkpoint_")) == \
        [f"checkpoint_{i:06d}" for i in range(4)]


def _resumable(config):
    import tempfile
    start = _resume_step()
    for step in range(start, 4):
        with tempfile.TemporaryDirectory() as d:
            train.report({"step": step, "start": start},
                         checkpoint=_write(d, {"state.json": json.dumps({"step": step})}))
        if step == 1 and config["crash"]:
            raise RuntimeError("the driver's job failed")


def test_rerun_with_the_same_name_resumes_from_that_runs_latest_checkpoint(ray_module, tmp_path):
    with pytest.raises(train.TrainingFailedError):
        _fit(_resumable, tmp_path, {"crash": True}, name="same")
    result = _fit(_resumable, tmp_path, {"crash": False}, name="same")   # Ray V2: same run, resumed
    assert result.path == str(tmp_path / "same") and not (tmp_path / "same_2").exists()
    assert [(m["step"], m["start"]) for m in result.metrics_history] == [(0, 0), (1, 0), (2, 2), (3, 2)]
    again = _fit(_resumable, tmp_path, {"crash": False}, name="same")    # finished: nothing left to do
    assert again.checkpoint.path.endswith("checkpoint_000003") and again.metrics["step"] == 3
