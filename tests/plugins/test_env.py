"""raylite.plugins with processes raylite started itself: RayEnvironment (pl.Trainer(strategy="ddp",
plugins=[RayEnvironment()]) inside raylite.train workers) and the Tune report callbacks under
raylite.tune. Tests that need raylite.train / raylite.tune skip, saying so, while those packages do
not provide the API yet.
"""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("pytorch_lightning")

import raylite as ray  # noqa: E402

pytestmark = pytest.mark.timeout(150)


@pytest.fixture(autouse=True)
def _idle_workers_released():
    """Idle RayStrategy workers would hold the CPUs the next test needs (tests/plugins/test_plugins.py
    covers their reuse; its __main__ script covers workers importing torch + Lightning themselves)."""
    yield
    from raylite.plugins import release_workers
    release_workers()


def _ddp_fit_in_worker(max_steps=8):
    """Runs in each worker: Lightning's own "ddp" joining the processes raylite started.

    Self-contained (imports inside) so it travels by value. Returns what the tests compare.
    """
    import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from raylite.plugins import RayEnvironment

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.seen = 0

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.seen += len(x)
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("rank_sum", float(self.global_rank), reduce_fx="sum", sync_dist=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    env = RayEnvironment()
    torch.manual_seed(0)
    model = Net()
    trainer = pl.Trainer(strategy="ddp", accelerator="cpu", devices=env.local_world_size(), plugins=[env],
                         max_steps=max_steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader)
    return {"rank": trainer.global_rank, "world": trainer.world_size, "local_rank": trainer.local_rank,
            "batches": trainer.num_training_batches, "seen": model.seen, "pid": os.getpid(),
            "rank_sum": trainer.callback_metrics["rank_sum"].item(),
            "weight": model.layer.weight.detach().clone()}


def _check_ddp_results(results, world=2):
    assert sorted(r["rank"] for r in results) == list(range(world))
    assert [r["world"] for r in results] == [world] * world
    assert len({r["pid"] for r in results}) == world                     # Lightning spawned nothing
    assert all(r["batches"] == 64 // 8 // world for r in results)         # distributed samplers
    assert all(r["rank_sum"] == sum(range(world)) for r in results)       # a real all_reduce
    assert all(torch.equal(r["weight"], results[0]["weight"]) for r in results)   # DDP kept them equal


def test_ray_environment_from_environment_variables(ray_preloaded):
    """Two raylite tasks given RANK/WORLD_SIZE/... (what raylite.train sets) join one DDP run."""
    from raylite.plugins.environment import free_port

    @ray.remote(num_cpus=1)
    def worker(rank, world, port):
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        saved = {k: os.environ.get(k) for k in keys}
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                          LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        try:
            return _ddp_fit_in_worker()
        finally:
            import torch.distributed as dist
            if dist.is_initialized():
                dist.destroy_process_group()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    port = free_port()
    _check_ddp_results(ray.get([worker.remote(r, 2, port) for r in range(2)], timeout=120))


def test_ray_environment_settings_and_mismatch(monkeypatch):
    from raylite.plugins import RayEnvironment

    for k, v in dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT="29512").items():
        monkeypatch.setenv(k, v)
    env = RayEnvironment()
    assert env.creates_processes_externally
    assert (env.global_rank(), env.world_size(), env.local_rank(), env.node_rank()) == (1, 2, 1, 0)
    assert (env.main_address, env.main_port) == ("127.0.0.1", 29512)
    env.set_global_rank(0)   # Lightning's guess from devices: the real rank wins
    env.set_world_size(1)
    assert (env.global_rank(), env.world_size()) == (1, 2)
    env.validate_settings(num_devices=2, num_nodes=1)
    with pytest.raises(ValueError, match=r"devices=2, num_nodes=1"):
        env.validate_settings(num_devices=1, num_nodes=1)
    env.teardown()
    assert os.environ["WORLD_SIZE"] == "2"   # unlike Lightning's default environment


def test_ray_environment_inside_train_trainer(ray_preloaded):
    from raylite import train
    trainer = train.Trainer(backend="torch", num_workers=2)
    trainer.start()
    try:
        results = trainer.run(lambda: _ddp_fit_in_worker())
    finally:
        trainer.shutdown()
    _check_ddp_results(results)


def _ray_train_lightning_func():
    """Ray 2.x's "Train with PyTorch Lightning" guide, as written (devices="auto")."""
    import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from raylite import train
    from raylite.train.lightning import (RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback,
                                         prepare_trainer)

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss, sync_dist=True)
            self.log("rank_sum", float(self.global_rank), reduce_fx="sum", sync_dist=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    torch.manual_seed(0)
    trainer = pl.Trainer(devices="auto", accelerator="auto", strategy=RayDDPStrategy(),
                         plugins=[RayLightningEnvironment()], callbacks=[RayTrainReportCallback()],
                         enable_checkpointing=False, max_epochs=2, logger=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer = prepare_trainer(trainer)
    trainer.fit(Net(), train_dataloaders=loader)
    assert trainer.num_training_batches == 64 // 8 // train.get_context().get_world_size()


def test_ray_train_lightning_api_in_torch_trainer(ray_preloaded, tmp_path):
    from raylite import train
    from raylite.train.torch import TorchTrainer

    result = TorchTrainer(_ray_train_lightning_func, scaling_config=train.ScalingConfig(num_workers=2),
                          run_config=train.RunConfig(storage_path=str(tmp_path), name="lightning")).fit()
    assert result.error is None
    assert result.metrics["epoch"] == 1 and result.metrics["step"] == 8
    assert result.metrics["rank_sum"] == 1.0 and result.metrics["train_loss"] >= 0
    with result.checkpoint.as_directory() as d:
        state = torch.load(os.path.join(d, "checkpoint.ckpt"), weights_only=False)
    assert state["epoch"] == 1 and "layer.weight" in state["state_dict"]


def test_prepare_trainer_rejects_other_strategies():
    from raylite.train.lightning import prepare_trainer

    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    with pytest.raises(RuntimeError, match="must be RayDDPStrategy or RayFSDPStrategy"):
        prepare_trainer(trainer)


def _lightning_trainable(config):
    """A Tune function trainable: a plain pl.Trainer in the trial's own process."""
    import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from raylite.plugins import TuneReportCallback

    class Net(pl.LightningModule):
        def __init__(self, lr):
            super().__init__()
            self.lr = lr
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
    strategy = "auto"
    if config.get("workers"):
        from raylite.plugins import RayStrategy
        strategy = RayStrategy(num_workers=config["workers"])
    trainer = pl.Trainer(max_epochs=3, strategy=strategy, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=[TuneReportCallback({"loss": "val_loss"}, on="validation_end")])
    trainer.fit(Net(config["lr"]), loader, loader)


@pytest.mark.parametrize("workers", [0, 2], ids=["in-trial", "raystrategy-in-trial"])
def test_tune_report_callback_under_tune_run(ray_preloaded, tmp_path, workers):
    from raylite import tune
    analysis = tune.run(_lightning_trainable, config={"lr": 0.05, "workers": workers}, num_samples=1,
                        resources_per_trial={"cpu": 1}, metric="loss", mode="min",
                        storage_path=str(tmp_path), verbose=0)
    trial = analysis.trials[0]
    assert trial.last_result["loss"] > 0
    assert trial.last_result["training_iteration"] == 3   # one report per validation, none in sanity check


def test_get_tune_resources_bundles_and_a_raystrategy_trial(ray_preloaded, tmp_path):
    from raylite import tune
    from raylite.plugins import TuneReportCallback
    from raylite.plugins.tune import TuneReportCallback as Reexported
    from raylite.plugins.tune import get_tune_resources
    assert Reexported is TuneReportCallback
    pgf = get_tune_resources(num_workers=2, num_cpus_per_worker=2)   # ray_lightning's: a head + a bundle per worker
    assert pgf == tune.PlacementGroupFactory([{"CPU": 1}, {"CPU": 2}, {"CPU": 2}], strategy="PACK")
    with pytest.warns(PendingDeprecationWarning):
        assert get_tune_resources(cpus_per_worker=3).bundles == [{"CPU": 1}, {"CPU": 3}]
    with pytest.raises(ValueError, match="max_concurrent_trials"):
        get_tune_resources(num_workers=2, use_gpu=True)   # the trial would hold its workers' GPUs
    # The trial holds both CPUs and lends them to its RayStrategy worker while it waits for it.
    analysis = tune.run(_lightning_trainable, config={"lr": 0.05, "workers": 1}, num_samples=1,
                        resources_per_trial=get_tune_resources(num_workers=1), metric="loss", mode="min",
                        storage_path=str(tmp_path), verbose=0)
    assert analysis.trials[0].last_result["training_iteration"] == 3
