"""raylite.train fault tolerance and configuration errors: a worker SIGKILLed mid-run is replaced and
training resumes from the latest checkpoint (max_failures=1); without restarts left it is a clear
error; use_gpu=True without a usable GPU and use_gpu="auto"; worker counts that cannot fit.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import cloudpickle
import pytest

pytest.importorskip("torch")

import raylite as ray  # noqa: E402
import raylite.util  # noqa: E402
from raylite import train  # noqa: E402
from raylite.train import Checkpoint, ScalingConfig, Trainer, TrainingFailedError  # noqa: E402
from raylite.train.torch import TorchTrainer  # noqa: E402
from raylite.train.trainer import resolve_use_gpu  # noqa: E402

pytestmark = pytest.mark.timeout(120)
cloudpickle.register_pickle_by_value(sys.modules[__name__])   # workers need not import this module


def _stepper(config):
    """Counts steps from the checkpoint on; rank 1 SIGKILLs itself at config["die_at"] the first time
    (a marker file says it already did)."""
    import tempfile
    import torch
    import torch.distributed as dist
    start = 0
    ckpt = train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            start = json.load(f)["step"] + 1
    for step in range(start, config["steps"]):
        t = torch.ones(1)
        dist.all_reduce(t)   # the workers move in lock step
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"step": step}, f)
            train.report({"step": step, "start": start, "pid": os.getpid()},
                         checkpoint=Checkpoint.from_directory(d))
        if train.world_rank() == 1 and step == config["die_at"] and (
                config["always"] or not os.path.exists(config["marker"])):
            open(config["marker"], "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
    return start


def test_worker_killed_mid_run_restarts_and_resumes_from_checkpoint(ray_init, tmp_path, caplog):
    ray_init()
    marker = tmp_path / "killed-once"
    config = {"steps": 7, "die_at": 3, "marker": str(marker), "always": False}
    with Trainer(num_workers=2, logdir=tmp_path / "logs", max_failures=1) as trainer:
        first_pids = {i["pid"] for i in trainer.worker_infos}
        starts = trainer.run(_stepper, config)
        res = trainer.last_result
        new_pids = {i["pid"] for i in trainer.worker_infos}
    assert marker.exists()
    assert new_pids.isdisjoint(first_pids)                  # a new group
    history = res.metrics_history
    steps = [m["step"] for m in history]
    resumed_at = starts[0]
    # Rank 0 reported steps 0-2 before rank 1 could pass step 3's all_reduce; step 3's may be lost.
    assert starts == [resumed_at, resumed_at] and resumed_at in (3, 4)
    # First attempt: 0..k from the start; second: continues after the last checkpoint, to the end.
    first = [m["step"] for m in history if m["start"] == 0]
    second = [m["step"] for m in history if m["start"] == resumed_at]
    assert first == list(range(len(first))) and first[-1] == resumed_at - 1
    assert second == list(range(resumed_at, 7))
    assert steps == list(range(7))                         # nothing repeated, nothing lost
    assert res.metrics["step"] == 6 and res.error is None
    assert res.checkpoint.path.endswith("checkpoint_000006")
    assert "restarting the worker group" in caplog.text and "rank 1 of 2" in caplog.text
    ckpts = sorted(n for n in os.listdir(res.path) if n.startswith("checkpoint_"))
    assert ckpts == [f"checkpoint_{i:06d}" for i in range(7)]   # no orphans left by the dead attempt


def test_worker_deaths_beyond_max_failures_are_a_clear_error(ray_init, tmp_path):
    ray_init()
    config = {"steps": 5, "die_at": 1, "marker": str(tmp_path / "m"), "always": True}
    with Trainer(num_workers=2, logdir=tmp_path / "logs", max_failures=0) as trainer:
        with pytest.raises(TrainingFailedError) as exc:
            trainer.run(_stepper, config)
        assert isinstance(exc.value.__cause__, ray.exceptions.ActorDiedError)
        msg = str(exc.value)
        assert "rank 1 of 2 died" in msg and "max_failures=0" in msg
        assert "Latest checkpoint: " + str(tmp_path / "logs" / "run_001" / "checkpoint_00000") in msg
        assert trainer.last_result.error is exc.value


def test_reporter_killed_mid_run_restarts_with_a_new_one(ray_init, tmp_path, caplog):
    """The reporter actor dying takes the reports it held: like a worker's death, the attempt starts
    again from the latest persisted checkpoint with a new reporter (max_failures=-1), and later runs
    on the Trainer work (they all failed with "cannot run _Reporter.drain: the actor is dead")."""
    ray_init()
    waiting, killed = tmp_path / "waiting", tmp_path / "killed"

    def train_func():
        import tempfile
        import time
        start = 0
        ckpt = train.get_checkpoint()
        if ckpt is not None:
            with ckpt.as_directory() as d, open(os.path.join(d, "state.json")) as f:
                start = json.load(f)["step"] + 1
        for step in range(start, 6):
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "state.json"), "w") as f:
                    json.dump({"step": step}, f)
                train.report({"step": step, "start": start}, checkpoint=Checkpoint.from_directory(d))
            if step == 2 and not killed.exists():
                waiting.touch()
                while not killed.exists():   # steps 3-5 go to the dead reporter
                    time.sleep(0.01)
        return start

    with Trainer(num_workers=1, logdir=tmp_path / "logs", max_failures=-1) as trainer:
        reporter = trainer._reporter

        def drained_to_step_2():   # the worker waits, and the driver has recorded step 2 (result.json)
            lines = [line for f in (tmp_path / "logs").glob("*/result.json") for line in f.read_text().splitlines()]
            return waiting.exists() and any('"step": 2' in line for line in lines)

        def kill_reporter():
            deadline = time.monotonic() + 60
            while not drained_to_step_2() and time.monotonic() < deadline:
                time.sleep(0.01)
            ray.kill(reporter)
            killed.touch()

        killer = threading.Thread(target=kill_reporter, daemon=True)
        killer.start()
        starts = trainer.run(train_func)
        killer.join()
        res = trainer.last_result
        assert trainer.run(lambda: "again") == ["again"]
    assert starts == [3]
    assert [(m["step"], m["start"]) for m in res.metrics_history] == [(0, 0), (1, 0), (2, 0), (3, 3), (4, 3), (5, 3)]
    assert "the reporter actor died" in caplog.text and "restarting the worker group" in caplog.text
    ckpts = sorted(n for n in os.listdir(res.path) if n.startswith("checkpoint_"))
    assert ckpts == [f"checkpoint_{i:06d}" for i in range(6)]   # the lost reports' checkpoints were redone


def test_use_gpu_true_without_gpus_is_a_clear_error(ray_init, tmp_path):
    ray_init()   # no GPU in the runtime
    with pytest.raises(RuntimeError, match=r"use_gpu='auto'") as exc:
        Trainer(num_workers=2, use_gpu=True, logdir=tmp_path).start()
    assert "needs 2 GPU" in str(exc.value)
    with pytest.raises(RuntimeError, match=r"use_gpu='auto'"):
        TorchTrainer(lambda: None, scaling_config=ScalingConfig(num_workers=1, use_gpu=True)).fit()


def test_use_gpu_true_with_only_a_logical_gpu_is_a_clear_error(ray_init, tmp_path, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)   # as on a CPU-only box
    ray_init(num_gpus=1)   # a logical GPU: schedulable, but NCCL cannot use it
    assert ray.cluster_resources().get("GPU") == 1
    with pytest.raises(RuntimeError, match=r"(?s)torch.cuda.is_available\(\) is False.*use_gpu='auto'"):
        Trainer(num_workers=1, use_gpu=True, logdir=tmp_path).start()
    assert ray.available_resources().get("GPU") == 1            # nothing started, nothing held


def test_use_gpu_auto_decisions(ray_init, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ray_init(num_gpus=1)
    calls = []

    def probe(timeout=240.0, num_gpus=1, num_cpus=1):
        calls.append((num_gpus, num_cpus))
        return {"num_cpus": num_cpus}   # "no GPU for you"

    assert resolve_use_gpu(False, 1, 1, 1) is False
    assert resolve_use_gpu("auto", 2, 1, 1) is False and calls == []   # 2 GPUs needed, 1 present
    monkeypatch.setattr(raylite.util, "probe_gpu_resources", probe, raising=False)
    assert resolve_use_gpu("auto", 1, 1, 1) is False and calls == [(1, 1)]
    monkeypatch.setattr(raylite.util, "probe_gpu_resources",
                        lambda timeout, num_gpus, num_cpus: {"num_cpus": 1, "num_gpus": 1})
    assert resolve_use_gpu("auto", 1, 1, 1) is False   # the probe got a GPU, but CUDA is not usable
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_use_gpu("auto", 1, 1, 1) is True
    assert resolve_use_gpu(True, 1, 1, 1) is True


def test_use_gpu_auto_falls_back_to_cpu_workers_and_init_hook_runs(ray_init, tmp_path):
    ray_init()
    trainer = Trainer(num_workers=1, use_gpu="auto", logdir=tmp_path)
    try:
        trainer.start(initialization_hook=lambda: os.environ.__setitem__("RAYLITE_TEST_HOOK", "ran"))
        assert trainer.use_gpu is False and trainer.worker_infos[0]["device"] == "cpu"

        def train_func():
            import torch.distributed as dist
            from raylite.train.torch import get_device
            return str(get_device()), dist.get_backend(), os.environ.get("RAYLITE_TEST_HOOK")

        assert trainer.run(train_func) == [("cpu", "gloo", "ran")]
    finally:
        trainer.shutdown()


def test_workers_that_cannot_fit_fail_fast(ray_init, tmp_path):
    ray_init()
    with pytest.raises(ValueError, match=r"3 workers x 1 CPU = 3 CPU.*has 2 CPU"):
        Trainer(num_workers=3, logdir=tmp_path).start()
    with pytest.raises(ValueError, match="custom"):
        Trainer(num_workers=1, resources_per_worker={"CPU": 1, "custom": 1}, logdir=tmp_path).start()
    with pytest.raises(ValueError, match="use_gpu is False but GPU"):
        Trainer(num_workers=1, resources_per_worker={"GPU": 1})
    with pytest.raises(ValueError, match="backend"):
        Trainer(backend="tensorflow")
    assert ray.available_resources()["CPU"] == 2


def test_workers_are_reserved_as_a_gang(ray_init, tmp_path, wait_until):
    """A Trainer's workers get their resources all together or not at all (one placement group):
    with one of two CPUs taken, a 2-worker Trainer holds nothing while it waits (placed one by one,
    its first worker would sit on the free CPU), and starts once the CPU frees."""
    ray_init()
    flag = tmp_path / "go"

    @ray.remote(num_cpus=1)
    def blocker():
        import time
        while not flag.exists():
            time.sleep(0.01)

    @ray.remote(num_cpus=0)
    def train_in_a_task():
        t = Trainer(num_workers=2, logdir=str(tmp_path / "logs"))
        try:
            t.start()
            return t.run(lambda: train.get_context().get_world_rank())
        finally:
            t.shutdown()

    held = blocker.remote()
    wait_until(lambda: ray.available_resources().get("CPU") == 1.0, timeout=10, what="the blocker holding a CPU")
    out = train_in_a_task.remote()
    wait_until(lambda: [g["state"] for g in raylite.util.placement_group_table().values()] == ["PENDING"],
               timeout=30, what="the trainer's group waiting")
    assert ray.available_resources().get("CPU") == 1.0   # no worker took the free CPU alone
    flag.touch()
    ray.get(held)
    assert ray.get(out, timeout=100) == [0, 1]
