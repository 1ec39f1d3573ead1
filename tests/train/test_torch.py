"""raylite.train.torch helpers on 2 CPU workers, and TorchTrainer.fit's Result (Ray Train 2.x)."""
from __future__ import annotations

import json
import os
import sys

import cloudpickle
import pytest

torch = pytest.importorskip("torch")

from raylite import train  # noqa: E402
from raylite.train import (Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig,  # noqa: E402
                           Trainer, TrainingFailedError)
from raylite.train.torch import TorchConfig, TorchTrainer, get_device, prepare_data_loader, prepare_model  # noqa: E402

pytestmark = pytest.mark.timeout(120)
cloudpickle.register_pickle_by_value(sys.modules[__name__])   # workers need not import this module


def test_prepare_model_and_data_loader_with_two_workers(ray_module, tmp_path):
    def train_func(config):
        import torch
        import torch.distributed as dist
        from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

        from raylite.train import torch as train_torch
        n = config["n"]
        ds = TensorDataset(torch.arange(n, dtype=torch.float32).reshape(-1, 1), torch.arange(n))
        loader = train_torch.prepare_data_loader(DataLoader(ds, batch_size=4, shuffle=True))
        seen, devices = [], set()
        loader.sampler.set_epoch(0)
        for xb, idx in loader:
            devices.add(str(xb.device))
            seen.extend(idx.tolist())
        torch.manual_seed(0)
        reference = torch.nn.Linear(1, 1)   # the same steps without DDP, on every rank's data
        model = train_torch.prepare_model(torch.nn.Linear(1, 1))
        model.module.load_state_dict(reference.state_dict())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
        x = torch.full((4, 1), float(train.world_rank() + 1))   # different data on each rank
        for _ in range(3):   # bucket-view gradients: set to None by zero_grad, views again next step
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()
            ref_opt.zero_grad()
            sum(reference(torch.full((4, 1), float(r + 1))).pow(2).sum()
                for r in range(train.world_size())).div(train.world_size()).backward()
            ref_opt.step()
        matches_reference = all(torch.allclose(p, q) for p, q in zip(model.parameters(), reference.parameters()))
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(train.world_size())]
        dist.all_gather(gathered, flat)
        return {"seen": seen, "devices": sorted(devices), "len": len(loader),
                "sampler": type(loader.sampler).__name__, "is_dist_sampler": isinstance(loader.sampler,
                                                                                      DistributedSampler),
                "ddp": type(model).__name__, "bucket_view": model.gradient_as_bucket_view,
                "hooks": [type(state).__name__ for _hook, state in getattr(model, "_comm_hooks", [])],
                "matches_reference": matches_reference,
                "params_equal": all(torch.equal(g, gathered[0]) for g in gathered),
                "device": str(train_torch.get_device())}

    with Trainer(num_workers=2, logdir=tmp_path) as trainer:
        out = trainer.run(train_func, {"n": 22})
    seen0, seen1 = out[0]["seen"], out[1]["seen"]
    assert len(seen0) == len(seen1) == 11                      # DistributedSampler pads to equal shards
    assert set(seen0) | set(seen1) == set(range(22))
    assert len(set(seen0) & set(seen1)) == 0
    assert sorted(seen0) != seen0 or sorted(seen1) != seen1     # shuffle=True kept
    for o in out:
        assert o["is_dist_sampler"] and o["len"] == 3
        assert o["devices"] == ["cpu"] and o["device"] == "cpu"
        assert o["ddp"] == "DistributedDataParallel"
        assert o["bucket_view"] is True                         # prepare_model's default
        assert o["hooks"] == ["LocalGroup"]                     # averaged through shared memory, not gloo
        assert o["matches_reference"]                           # averaged gradients, step after step
        assert o["params_equal"]                                # DDP averaged the gradients


def test_prepared_model_copies_like_ddp(ray_module, tmp_path):
    """deepcopy / torch.save of a shared-memory-hooked model work as with plain DDP: the copy is a
    DDP model on the default group whose reducer has no hook (gloo), the live ring is untouched."""
    def train_func():
        import copy
        import io

        import torch

        from raylite.train import torch as train_torch
        torch.manual_seed(0)
        model = train_torch.prepare_model(torch.nn.Linear(2, 1))
        x = torch.full((3, 2), float(train.world_rank() + 1))
        clone = copy.deepcopy(model)
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        clone(x).sum().backward()                               # a gloo allreduce: no ring
        model(x).sum().backward()                               # the ring, still in step
        return {"types": [type(m).__name__ for m in (clone, loaded)],
                "states": [type(st).__name__ for m in (model, clone, loaded) for _h, st in m._comm_hooks],
                "forward": torch.equal(loaded(x), model(x)),
                "grads": [clone.module.weight.grad.tolist(), model.module.weight.grad.tolist()]}

    with Trainer(num_workers=2, logdir=tmp_path) as trainer:
        out = trainer.run(train_func)
    for o in out:
        assert o["types"] == ["DistributedDataParallel"] * 2
        assert o["states"] == ["LocalGroup", "NoneType", "NoneType"]
        assert o["forward"]
        assert o["grads"] == [[[4.5, 4.5]], [[4.5, 4.5]]]       # mean of 3 x 1 and 3 x 2, both ways


def test_helpers_outside_a_run_and_with_one_worker():
    model = torch.nn.Linear(2, 1)
    assert prepare_model(model) is model                       # no process group: no DDP
    loader = torch.utils.data.DataLoader(list(range(6)), batch_size=2)
    wrapped = prepare_data_loader(loader)
    assert [b.tolist() for b in wrapped] == [[0, 1], [2, 3], [4, 5]] and len(wrapped) == 3
    assert wrapped.batch_size == 2                              # attributes pass through
    assert get_device() == torch.device("cpu")
    with pytest.raises(ValueError, match="parallel_strategy"):
        prepare_model(model, parallel_strategy="fsdp2")


def _fit_loop(config):
    import tempfile

    import torch

    from raylite.train.torch import prepare_model
    model = prepare_model(torch.nn.Linear(3, 1))
    for epoch in range(config["epochs"]):
        metrics = {"epoch": epoch, "loss": 1.0 / (epoch + 1), "rank": train.get_context().get_world_rank()}
        if train.get_context().get_world_rank() == 0:
            with tempfile.TemporaryDirectory() as d:
                torch.save(getattr(model, "module", model).state_dict(), os.path.join(d, "model.pt"))
                with open(os.path.join(d, "meta.json"), "w") as f:
                    json.dump({"epoch": epoch}, f)
                train.report(metrics, checkpoint=Checkpoint.from_directory(d))
        else:
            train.report(metrics)
    if config.get("fail"):
        raise ValueError("fit-loop failure")


def test_torch_trainer_fit_result(ray_module, tmp_path):
    rounds = []

    class Cb:
        def handle_result(self, results):
            rounds.append([r["rank"] for r in results])

    trainer = TorchTrainer(
        _fit_loop, train_loop_config={"epochs": 3},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        torch_config=TorchConfig(timeout_s=60),
        run_config=RunConfig(name="exp", storage_path=str(tmp_path),
                             checkpoint_config=CheckpointConfig(num_to_keep=1),
                             failure_config=FailureConfig(max_failures=0), callbacks=[Cb()]))
    result = trainer.fit()
    assert isinstance(result, train.Result)
    assert result.error is None
    assert result.path == str(tmp_path / "exp")
    assert result.metrics["epoch"] == 2 and result.metrics["rank"] == 0
    assert result.metrics["training_iteration"] == 3 and result.metrics["time_total_s"] >= 0
    assert result.checkpoint.path == str(tmp_path / "exp" / "checkpoint_000002")
    with result.checkpoint.as_directory() as d:
        with open(os.path.join(d, "meta.json")) as f:
            assert json.load(f) == {"epoch": 2}
        state = torch.load(os.path.join(d, "model.pt"))
    assert set(state) == {"weight", "bias"}                     # saved from the module inside DDP
    assert sorted(n for n in os.listdir(result.path) if n.startswith("checkpoint_")) == ["checkpoint_000002"]
    df = result.metrics_dataframe
    assert list(df["epoch"]) == [0, 1, 2] and list(df["loss"]) == pytest.approx([1.0, 0.5, 1 / 3])
    assert os.path.isfile(os.path.join(result.path, "progress.csv"))
    assert rounds == [[0, 1]] * 3


def test_torch_trainer_fit_failure_raises_with_partial_result(ray_module, tmp_path):
    trainer = TorchTrainer(_fit_loop, {"epochs": 2, "fail": True},
                           scaling_config=ScalingConfig(num_workers=1),
                           run_config=RunConfig(name="exp", storage_path=str(tmp_path)))
    with pytest.raises(TrainingFailedError) as exc:
        trainer.fit()
    err = exc.value
    assert isinstance(err.__cause__, ValueError) and "fit-loop failure" in str(err)
    assert "rank 0 of 1" in str(err) and "Traceback" in str(err)
    assert err.result.error is err.__cause__
    assert err.result.path == str(tmp_path / "exp")
    assert [m["epoch"] for m in err.result.metrics_history] == [0, 1]
    assert err.result.checkpoint.path.endswith("checkpoint_000001")


def test_data_parallel_trainer_runs_workers_without_a_process_group(ray_module, tmp_path):
    from raylite.train.data_parallel_trainer import DataParallelTrainer
    from raylite.train.v2.api.data_parallel_trainer import DataParallelTrainer as V2DataParallelTrainer
    assert V2DataParallelTrainer is DataParallelTrainer and issubclass(TorchTrainer, DataParallelTrainer)
    assert TorchTrainer(_fit_loop).torch_config == TorchConfig()

    def loop(config):
        import tempfile
        ctx = train.get_context()
        dist = sys.modules.get("torch.distributed")
        for i in range(config["n"]):
            with tempfile.TemporaryDirectory() as d:
                train.report({"loss": i, "rank": ctx.get_world_rank(), "world": ctx.get_world_size(),
                              "process_group": dist is not None and dist.is_initialized(),
                              "master_port": "MASTER_PORT" in os.environ},
                             checkpoint=Checkpoint.from_directory(d))
        if config.get("fail"):
            raise RuntimeError("simulated")

    result = DataParallelTrainer(loop, train_loop_config={"n": 3}, scaling_config=ScalingConfig(num_workers=2),
                                 run_config=RunConfig(storage_path=str(tmp_path),
                                                      checkpoint_config=CheckpointConfig(num_to_keep=2))).fit()
    assert os.path.basename(result.path).startswith("DataParallelTrainer_")
    assert {k: result.metrics[k] for k in ("loss", "rank", "world", "process_group", "master_port")} == \
        {"loss": 2, "rank": 0, "world": 2, "process_group": False, "master_port": False}
    assert [m["loss"] for _, m in result.best_checkpoints] == [1, 2]
    with pytest.raises(train.WorkerGroupError) as exc:
        DataParallelTrainer(loop, train_loop_config={"n": 0, "fail": True},
                            run_config=RunConfig(storage_path=str(tmp_path))).fit()
    assert list(exc.value.worker_failures) == [0] and "simulated" in str(exc.value)
