"""raylite.train: Trainer on 2 CPU workers (gloo) -- ranks and a real all_reduce, config, warm
workers, report history and its files, checkpoints and their retention, the context outside a run,
and a train_func exception surfacing with its type, rank and traceback.

One warm Trainer serves the module (starting workers imports torch in each: seconds on a loaded
2-core machine). Functions that run in workers are defined inside the tests, so cloudpickle ships
them by value.
"""
from __future__ import annotations

import csv
import json
import os

import pytest

pytest.importorskip("torch")

import raylite as ray  # noqa: E402
from raylite import train  # noqa: E402
from raylite.train import Checkpoint, CheckpointConfig, Trainer  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def trainer(ray_module, tmp_path_factory):
    t = Trainer(backend="torch", num_workers=2, logdir=tmp_path_factory.mktemp("train_logs"))
    t.start()
    try:
        yield t
    finally:
        t.shutdown()


def test_two_workers_all_reduce_with_distinct_ranks_and_env(trainer):
    def train_func():
        import torch
        import torch.distributed as dist
        ctx = train.get_context()
        t = torch.tensor([float(ctx.get_world_rank() + 1)])
        dist.all_reduce(t)   # 1 + 2
        env = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                "MASTER_ADDR", "MASTER_PORT")}
        return {"rank": ctx.get_world_rank(), "local_rank": ctx.get_local_rank(), "size": ctx.get_world_size(),
                "local_size": ctx.get_local_world_size(), "node_rank": ctx.get_node_rank(),
                "v1": (train.world_rank(), train.local_rank(), train.world_size()),
                "sum": t.item(), "backend": dist.get_backend(), "dist_rank": dist.get_rank(),
                "pid": os.getpid(), "env": env, "threads": torch.get_num_threads()}

    out = trainer.run(train_func)
    assert [o["rank"] for o in out] == [0, 1]                      # rank order
    assert [o["dist_rank"] for o in out] == [0, 1]
    assert all(o["sum"] == 3.0 for o in out)
    assert all(o["size"] == 2 and o["local_size"] == 2 and o["node_rank"] == 0 for o in out)
    assert [o["v1"] for o in out] == [(0, 0, 2), (1, 1, 2)]
    assert {o["backend"] for o in out} == {"gloo"}
    assert len({o["pid"] for o in out}) == 2 and os.getpid() not in {o["pid"] for o in out}
    assert all(o["threads"] == 1 for o in out)                       # one CPU each
    for o in out:
        env = o["env"]
        assert env["RANK"] == env["LOCAL_RANK"] == str(o["rank"])
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
    assert out[0]["env"]["MASTER_PORT"] == out[1]["env"]["MASTER_PORT"]

    # Warm: the same processes take the next run.
    again = trainer.run(lambda: os.getpid())
    assert again == [o["pid"] for o in out]
    assert trainer.use_gpu is False


def test_config_is_passed_and_return_values_come_back(trainer):
    def train_func(config):
        return config["base"] + train.world_rank()

    assert trainer.run(train_func, config={"base": 10}) == [10, 11]
    assert trainer.run(lambda config: sorted(config)) == [[], []]     # no config: an empty dict
    pids = [i["pid"] for i in trainer.worker_infos]
    with pytest.raises(TypeError, match="takes no arguments"):   # caught in the driver
        trainer.run(lambda: 1, config={"a": 1})
    assert trainer.run(lambda: os.getpid()) == pids                 # the group is still warm


def test_report_history_result_files_and_callbacks(trainer):
    class Collect:
        def __init__(self):
            self.rounds, self.started, self.finished = [], None, None

        def start_training(self, logdir, config):
            self.started = logdir

        def handle_result(self, results):
            self.rounds.append(results)

        def finish_training(self, error):
            self.finished = error

    def train_func(config):
        import numpy as np
        import torch
        for step in range(config["steps"]):
            if step % 2:
                train.report(step=step, loss=np.float32(1.0 / (step + 1)), rank=train.world_rank())   # 1.x form
            else:
                train.report({"step": step, "loss": torch.tensor(1.0 / (step + 1)), "rank": train.world_rank()})

    cb = Collect()
    trainer.run(train_func, config={"steps": 5}, callbacks=[cb])
    res = trainer.last_result
    assert res.error is None
    assert [m["step"] for m in res.metrics_history] == [0, 1, 2, 3, 4]
    assert all(m["rank"] == 0 for m in res.metrics_history)         # rank 0's metrics are the history
    assert [m["training_iteration"] for m in res.metrics_history] == [1, 2, 3, 4, 5]
    assert isinstance(res.metrics_history[1]["loss"], float)         # numpy / torch scalars -> floats
    assert res.metrics["step"] == 4 and res.metrics["loss"] == pytest.approx(0.2)
    assert res.path == trainer.latest_run_dir and os.path.basename(res.path).startswith("run_")
    # callbacks: one round per report with every rank's metrics, in rank order
    assert cb.started == res.path and cb.finished is False
    assert len(cb.rounds) == 5 and [[m["rank"] for m in r] for r in cb.rounds] == [[0, 1]] * 5
    # files: JSON lines and CSV
    with open(os.path.join(res.path, "result.json")) as f:
        lines = [json.loads(line) for line in f]
    assert [r["step"] for r in lines] == [0, 1, 2, 3, 4]
    with open(os.path.join(res.path, "progress.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [0, 1, 2, 3, 4] and "time_total_s" in rows[0]
    df = res.metrics_dataframe
    assert list(df["step"]) == [0, 1, 2, 3, 4]
    assert train.Result.from_path(res.path).metrics["step"] == 4


def test_history_stays_on_disk_not_in_the_driver(tmp_path):
    """A long run reporting every step must not grow the driver by every report (it kept each one,
    ~0.7 KB: 40k reports took the driver from 20 to 48 MB); result.json holds the history."""
    import tracemalloc
    from raylite.train.result import RunRecorder

    n = 5000
    recorder = RunRecorder(str(tmp_path / "run"), world_size=2)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for start in range(0, n, 100):   # as drained from the reporter: batches of both ranks' reports
            recorder.add([(0, rank, i, {"step": i, "loss": 1.0 / (i + 1), "lr": 1e-3}, None, 1e9 + i)
                          for i in range(start, start + 100) for rank in (0, 1)])
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 200_000, f"the driver kept {grown} bytes for {n} reports"
    res = recorder.finish()
    assert res.metrics["step"] == n - 1 and res.metrics["training_iteration"] == n
    assert [m["step"] for m in res.metrics_history] == list(range(n))        # read back from result.json
    assert res.metrics_history[-1]["training_iteration"] == n
    with open(os.path.join(res.path, "progress.csv")) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == n and rows[-1]["step"] == str(n - 1) and "time_total_s" in rows[0]


def test_checkpoints_persisted_kept_last_n_and_resumed(trainer, tmp_path):
    def train_func(config):
        import tempfile
        start = 0
        ckpt = train.get_checkpoint()
        if ckpt is not None:
            with ckpt.as_directory() as d:
                with open(os.path.join(d, "state.json")) as f:
                    start = json.load(f)["step"] + 1
        for step in range(start, start + config["steps"]):
            with tempfile.TemporaryDirectory() as d:   # removed right after report: report copies it
                with open(os.path.join(d, "state.json"), "w") as f:
                    json.dump({"step": step, "rank": train.world_rank()}, f)
                train.report({"step": step}, checkpoint=Checkpoint.from_directory(d))
        return start

    assert trainer.run(train_func, {"steps": 4}, checkpoint_strategy=CheckpointConfig(num_to_keep=2)) == [0, 0]
    res = trainer.last_result
    kept = sorted(n for n in os.listdir(res.path) if n.startswith("checkpoint_"))
    assert kept == ["checkpoint_000002", "checkpoint_000003"]
    assert res.checkpoint.path == os.path.join(res.path, "checkpoint_000003") == trainer.latest_checkpoint_dir
    with open(os.path.join(res.checkpoint.path, "state.json")) as f:
        assert json.load(f) == {"step": 3, "rank": 0}                # rank 0's checkpoint
    assert res.metrics["checkpoint_dir_name"] == "checkpoint_000003"
    assert [c.path for c, _ in res.best_checkpoints] == [os.path.join(res.path, k) for k in kept]

    # A new run that starts from that checkpoint (to_directory: a copy elsewhere).
    copy = Checkpoint.from_directory(res.checkpoint.to_directory(str(tmp_path / "copy")))
    assert trainer.run(train_func, {"steps": 2}, checkpoint=copy) == [4, 4]
    assert [m["step"] for m in trainer.last_result.metrics_history] == [4, 5]

    # Best-by-score retention: keep the lowest "loss" (and always the latest).
    def scored():
        import tempfile
        for step, loss in enumerate([5.0, 1.0, 3.0, 4.0]):
            with tempfile.TemporaryDirectory() as d:
                train.report({"loss": loss}, checkpoint=Checkpoint.from_directory(d))

    trainer.run(scored, checkpoint_strategy=CheckpointConfig(1, "loss", "min"))
    names = sorted(n for n in os.listdir(trainer.latest_run_dir) if n.startswith("checkpoint_"))
    assert names == ["checkpoint_000001", "checkpoint_000003"]


def test_ray_train_1x_save_and_load_checkpoint(trainer):
    def train_func():
        prev = train.load_checkpoint()
        train.save_checkpoint(epoch=(prev["epoch"] + 1) if prev else 0, rank=train.world_rank())
        return prev

    assert trainer.run(train_func) == [None, None]
    ckpt = trainer.latest_checkpoint
    assert ckpt.to_dict() == {"epoch": 0, "rank": 0}
    assert trainer.last_result.metrics_history == []                 # a checkpoint without metrics
    assert trainer.run(train_func, checkpoint=ckpt) == [{"epoch": 0, "rank": 0}] * 2
    assert trainer.latest_checkpoint.to_dict()["epoch"] == 1


def test_init_with_preload_names_torch_for_this_init_only(monkeypatch):
    seen = []
    monkeypatch.setattr(ray, "init", lambda **kw: seen.append((os.environ.get("RAYLITE_PRELOAD"), kw)))
    monkeypatch.setenv("RAYLITE_PRELOAD", "numpy, torch")
    train.init_with_preload(num_cpus=3)
    assert seen == [("numpy,torch,torch._dynamo", {"num_cpus": 3})]
    assert os.environ["RAYLITE_PRELOAD"] == "numpy, torch"     # restored
    monkeypatch.delenv("RAYLITE_PRELOAD")
    train.init_with_preload()
    assert seen[-1][0] == "torch,torch._dynamo" and "RAYLITE_PRELOAD" not in os.environ


def test_context_outside_a_run():
    assert (train.world_rank(), train.local_rank(), train.world_size()) == (0, 0, 1)
    ctx = train.get_context()
    assert (ctx.get_world_rank(), ctx.get_local_rank(), ctx.get_world_size(), ctx.get_local_world_size()) == \
        (0, 0, 1, 1)
    assert train.get_checkpoint() is None
    with pytest.warns(UserWarning, match="outside"):
        train.report({"x": 1})


def test_exception_surfaces_with_type_rank_and_traceback_then_trainer_recovers(trainer):
    def train_func():
        import torch.distributed as dist
        if train.world_rank() == 1:
            raise KeyError("bad-key-on-rank-1")
        dist.barrier()   # rank 0 waits for a peer that never comes: the group must be torn down

    old_pids = [i["pid"] for i in trainer.worker_infos]
    with pytest.raises(KeyError) as exc:
        trainer.run(train_func)
    err = exc.value
    assert isinstance(err, ray.exceptions.RayTaskError)
    assert err.world_rank == 1
    msg = str(err)
    assert "rank 1 of 2" in msg and "train_func" in msg
    assert "bad-key-on-rank-1" in msg and "Traceback" in msg and 'raise KeyError("bad-key-on-rank-1")' in msg
    assert trainer.last_result.error is err
    # The next run gets a fresh group.
    assert trainer.run(lambda: train.world_rank()) == [0, 1]
    assert {i["pid"] for i in trainer.worker_infos}.isdisjoint(old_pids)
