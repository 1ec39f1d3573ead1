"""raylite.plugins: RayStrategy / RayShardedStrategy on pytorch_lightning 2.x.

One raylite runtime (2 CPUs) serves the whole module, so the 2-worker group started by the first
test is reused warm by the next ones (that reuse is part of what is tested). Models are tiny and
runs are a few steps. Classes defined here travel to the workers by value, as from a notebook.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("pytorch_lightning")
cloudpickle = pytest.importorskip("cloudpickle")

import raylite as ray  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

pytestmark = pytest.mark.timeout(120)

# Workers get this module's classes by value (as for a notebook's __main__), not by import.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Net(pl.LightningModule):
    """y = sum(x) regression; logs what the tests check about the distributed run."""

    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.lr = lr
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        self.log("world", float(self.trainer.world_size))
        self.log("rank_sum", float(self.global_rank), reduce_fx="sum", sync_dist=True)
        self.log("batches_per_epoch", float(self.trainer.num_training_batches))
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 0.0)
        self.log("worker_cpus", float(cpus))
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y), sync_dist=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self(x), y), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        return {"y": self(batch[0]), "first": batch[0][:, 0]}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class Wide(Net):
    """Enough parameters for FSDP to have something to shard."""

    def __init__(self):
        super().__init__(lr=0.01)
        self.layer = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class FailsOnRank1(Net):
    def training_step(self, batch, batch_idx):
        if self.global_rank == 1 and batch_idx == 2:
            raise KeyError("boom on rank 1")
        return super().training_step(batch, batch_idx)


def _data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def _loader(n=64, batch_size=8, seed=0):
    return DataLoader(TensorDataset(*_data(n, seed)), batch_size=batch_size)


def _trainer(strategy, tmp_path, **kw):
    kw.setdefault("max_steps", 12)
    return pl.Trainer(strategy=strategy, default_root_dir=str(tmp_path), logger=False,
                      enable_progress_bar=False, enable_model_summary=False, **kw)


def test_fit_two_workers_updates_driver_and_metrics(ray_preloaded, tmp_path):
    from raylite.plugins import RayStrategy

    torch.manual_seed(0)
    model = Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = _trainer(RayStrategy(num_workers=2), tmp_path)
    trainer.fit(model, _loader(), _loader(seed=1))

    # the driver's module holds the trained weights
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    m = trainer.callback_metrics
    assert {"train_loss", "val_loss", "world", "rank_sum"} <= set(m)
    assert m["world"].item() == 2 and m["rank_sum"].item() == 1          # ranks 0 and 1 took part
    assert m["batches_per_epoch"].item() == 4                            # 64 samples / 8 / 2 ranks
    assert m["worker_cpus"].item() == 1                                  # num_cpus_per_worker held
    assert "train_loss" in trainer.logged_metrics
    assert trainer.state.finished and trainer.state.fn == "fit"
    best = trainer.checkpoint_callback.best_model_path
    assert best and os.path.isfile(best) and best.startswith(str(tmp_path))
    assert trainer.strategy.worker_results["global_step"] == 12
    # the weights rank 0 checkpointed are the ones the driver got
    ckpt = torch.load(best, weights_only=False)["state_dict"]
    assert all(torch.equal(ckpt[k], v) for k, v in model.state_dict().items())


class PidProbe(pl.Callback):
    """Rank 0's process id (its state comes back to the driver)."""

    def __init__(self):
        self.pid = None

    def on_train_start(self, trainer, pl_module):
        self.pid = os.getpid()

    def state_dict(self):
        return {"pid": self.pid}

    def load_state_dict(self, state_dict):
        self.pid = state_dict["pid"]


def test_second_fit_reuses_warm_workers_and_a_new_config_gets_fresh_ones(ray_preloaded, tmp_path):
    from raylite.plugins import RayStrategy

    def fit(**kwargs):
        probe = PidProbe()
        trainer = _trainer(RayStrategy(num_workers=2, **kwargs), tmp_path, max_steps=4, callbacks=[probe])
        trainer.fit(Net(), _loader())
        assert trainer.state.finished
        return probe.pid, trainer.strategy.worker_results["phases"]

    first, _ = fit()   # warm (or warms up)
    again, phases = fit()   # a new Trainer and an equal strategy: the same group, no worker started
    assert again == first and "worker_up" not in phases
    assert phases["process_group"] - phases["setup_environment"] < 0.5   # the process group stayed up
    other, phases = fit(num_cpus_per_worker=0.5)   # another config: another group
    assert other != first and "worker_up" in phases and "imported" in phases


def test_validate_and_test_return_metrics(ray_preloaded, tmp_path):
    from raylite.plugins import RayStrategy

    model = Net()
    trainer = _trainer(RayStrategy(num_workers=2), tmp_path)
    val = trainer.validate(model, _loader(seed=2), verbose=False)
    test = trainer.test(model, _loader(seed=3), verbose=False)
    assert len(val) == 1 and set(val[0]) == {"val_loss"} and val[0]["val_loss"] > 0
    assert len(test) == 1 and set(test[0]) == {"test_loss"} and test[0]["test_loss"] > 0
    # the same numbers in one process (sync_dist averages the two ranks' halves)
    x, y = _data(64, seed=3)
    expected = torch.nn.functional.mse_loss(model(x), y).item()
    assert test[0]["test_loss"] == pytest.approx(expected, rel=1e-4)
    assert trainer.callback_metrics["test_loss"].item() == pytest.approx(expected, rel=1e-4)


def test_predict_returns_every_sample_in_order(ray_preloaded, tmp_path):
    from raylite.plugins import RayStrategy

    torch.manual_seed(1)
    model = Net()
    x, _ = _data(37, seed=4)   # uneven: ranks get 19 and 18 samples
    trainer = _trainer(RayStrategy(num_workers=2), tmp_path)
    preds = trainer.predict(model, DataLoader(TensorDataset(x), batch_size=8))
    assert [len(p["y"]) for p in preds] == [8, 8, 8, 8, 5]               # the loader's own batches
    assert torch.equal(torch.cat([p["first"] for p in preds]), x[:, 0])   # in the loader's order
    with torch.no_grad():
        assert torch.allclose(torch.cat([p["y"] for p in preds]), model(x), atol=1e-6)


def test_sharded_strategy_fits_on_cpu(ray_preloaded, tmp_path):
    from raylite.plugins import RayShardedPlugin, RayShardedStrategy

    assert RayShardedPlugin is RayShardedStrategy
    torch.manual_seed(0)
    model = Wide()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = _trainer(RayShardedStrategy(num_workers=2), tmp_path, max_steps=16)
    trainer.fit(model, _loader(), _loader(seed=1))
    after = model.state_dict()
    assert set(after) == set(before)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert trainer.callback_metrics["rank_sum"].item() == 1
    x, y = _data(64, seed=1)
    with torch.no_grad():   # the full (unsharded) weights came back: the driver's model predicts
        loss = torch.nn.functional.mse_loss(model(x), y).item()
    assert loss == pytest.approx(trainer.callback_metrics["val_loss"].item(), rel=1e-3)
    ckpt = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=False)
    assert set(ckpt["state_dict"]) == set(before) and ckpt["optimizer_states"]


def test_error_in_one_rank_raises_its_type_and_recovers(ray_preloaded, tmp_path):
    from raylite.plugins import RayStrategy

    trainer = _trainer(RayStrategy(num_workers=2), tmp_path)
    t0 = time.perf_counter()
    with pytest.raises(KeyError, match="boom on rank 1"):
        trainer.fit(FailsOnRank1(), _loader())
    assert time.perf_counter() - t0 < 30          # rank 0 waits in a collective: it is killed
    assert trainer.state.status == "interrupted"
    # a new group replaces the killed one
    trainer = _trainer(RayStrategy(num_workers=2), tmp_path, max_steps=2)
    trainer.fit(Net(), _loader())
    assert trainer.state.finished


class KilledOnRank1(Net):
    """Rank 1's process dies mid-fit, as from the out-of-memory killer."""

    def training_step(self, batch, batch_idx):
        if self.global_rank == 1 and self.trainer.global_step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().training_step(batch, batch_idx)


def test_a_dead_worker_is_named_by_rank_and_pid(ray_preloaded, tmp_path, wait_pids_gone):
    """A fit whose worker died said only "cannot run _Worker.run: the actor is dead": not which
    rank, nor which process (to look for in the kernel log after an out-of-memory kill)."""
    from raylite.plugins import RayStrategy

    trainer = _trainer(RayStrategy(num_workers=2), tmp_path, max_steps=10_000)
    with pytest.raises(ray.exceptions.ActorDiedError) as exc:
        trainer.fit(KilledOnRank1(), _loader())
    match = re.search(r"RayStrategy worker rank 1 of 2 \(pid (\d+)\) died: ", str(exc.value))
    assert match, str(exc.value)
    wait_pids_gone([int(match.group(1))])
    trainer = _trainer(RayStrategy(num_workers=2), tmp_path, max_steps=2)
    trainer.fit(Net(), _loader())
    assert trainer.state.finished


class TerminatedOnRank1(Net):
    """Rank 1 gets a SIGTERM mid-fit, as from a scheduler: every rank has to stop, none may hang."""

    def training_step(self, batch, batch_idx):
        if self.global_rank == 1 and self.trainer.global_step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().training_step(batch, batch_idx)


class FastPathProbe(pl.Callback):
    """Whether rank 0 ran with the same-host fast path (its state comes back to the driver)."""

    def __init__(self):
        self.local = None

    def on_train_start(self, trainer, pl_module):
        self.local = trainer.strategy._raylite_local is not None

    def state_dict(self):
        return {"local": self.local}

    def load_state_dict(self, state_dict):
        self.local = state_dict["local"]


def test_sigterm_to_one_rank_stops_every_rank(ray_preloaded, tmp_path):
    from pytorch_lightning.utilities.exceptions import SIGTERMException

    from raylite.plugins import RayStrategy

    trainer = _trainer(RayStrategy(num_workers=2), tmp_path, max_steps=10_000)
    t0 = time.perf_counter()
    with pytest.raises(SIGTERMException):
        trainer.fit(TerminatedOnRank1(), _loader())
    assert time.perf_counter() - t0 < 30
    trainer = _trainer(RayStrategy(num_workers=2), tmp_path, max_steps=2)
    trainer.fit(Net(), _loader())
    assert trainer.state.finished


def test_same_host_fast_path_matches_gloo(ray_preloaded, tmp_path, monkeypatch):
    from raylite.plugins import RayStrategy

    weights, losses = {}, {}
    for flag in ("1", "0"):   # shared-memory allreduce + SIGTERM check, then gloo's
        monkeypatch.setenv("RAYLITE_LIGHTNING_FASTPATH", flag)
        torch.manual_seed(0)
        model, probe = Wide(), FastPathProbe()
        trainer = _trainer(RayStrategy(num_workers=2), tmp_path, max_steps=10, callbacks=[probe])
        trainer.fit(model, _loader())
        assert probe.local is (flag == "1")
        weights[flag] = {k: v.clone() for k, v in model.state_dict().items()}
        losses[flag] = trainer.callback_metrics["train_loss"].item()
    for key, value in weights["1"].items():
        assert torch.equal(value, weights["0"][key]), key   # same sums, same order: bit for bit
    assert losses["1"] == losses["0"]


def test_tune_callbacks_relay_rank0_reports(ray_preloaded, tmp_path, monkeypatch):
    from raylite.plugins import RayStrategy, TuneReportCallback, TuneReportCheckpointCallback
    from raylite.plugins import callbacks

    reports = []
    monkeypatch.setattr(callbacks, "_report", lambda metrics, ckpt, cleanup=False: reports.append((metrics, ckpt)))
    trainer = _trainer(RayStrategy(num_workers=2), tmp_path, max_steps=12,
                       callbacks=[TuneReportCallback({"loss": "val_loss"}, on="validation_end"),
                                  TuneReportCheckpointCallback(["train_loss"], filename="ckpt",
                                                               on="train_epoch_end", dirpath=str(tmp_path / "c"))])
    trainer.fit(Net(), _loader(), _loader(seed=1))   # 4 steps per epoch and rank -> 3 epochs
    val = [m for m, c in reports if "loss" in m]
    epochs = [(m, c) for m, c in reports if "train_loss" in m]
    assert len(val) == 3 and all(isinstance(m["loss"], float) for m in val)      # no sanity-check report
    assert val[-1]["loss"] == pytest.approx(trainer.callback_metrics["val_loss"].item())
    assert len(epochs) == 3 and all(set(m) == {"train_loss"} for m, _ in epochs)
    for _, ckpt_dir in epochs:
        assert os.path.isfile(os.path.join(ckpt_dir, "ckpt"))
        assert "state_dict" in torch.load(os.path.join(ckpt_dir, "ckpt"), weights_only=False)


def test_init_hook_and_a_second_worker_group(ray_preloaded, tmp_path):
    from raylite.plugins import RayStrategy

    marker = tmp_path / "hook"
    marker.mkdir()

    def hook():
        (marker / str(os.getpid())).write_text(os.environ.get("CUDA_VISIBLE_DEVICES", ""))

    # The idle 2-worker group holds both CPUs; this group (different hook) must displace it.
    trainer = _trainer(RayStrategy(num_workers=1, num_cpus_per_worker=2, init_hook=hook), tmp_path, max_steps=2)
    trainer.fit(Net(), _loader())
    assert len(list(marker.iterdir())) == 1
    assert trainer.callback_metrics["world"].item() == 1
    assert trainer.callback_metrics["worker_cpus"].item() == 2


def test_waiting_for_resources_says_what_is_missing(ray_preloaded, tmp_path, monkeypatch):
    import threading

    from raylite.plugins import RayStrategy, launcher, release_workers

    release_workers()
    monkeypatch.setattr(launcher, "PENDING_WARN_S", 0.5)

    @ray.remote(num_cpus=2)
    class Hog:
        def ping(self):
            return 1

    hog = Hog.remote()
    ray.get(hog.ping.remote())
    timer = threading.Timer(2.0, ray.kill, args=(hog,))   # frees the CPUs a little later
    timer.start()
    try:
        trainer = _trainer(RayStrategy(num_workers=2), tmp_path, max_steps=2)
        with pytest.warns(RuntimeWarning, match=r"2 of 2 workers have not started .* needs num_cpus=1"):
            trainer.fit(Net(), _loader())
    finally:
        timer.cancel()
    assert trainer.state.finished


def test_interactive_compatible(ray_preloaded, monkeypatch):
    from pytorch_lightning.trainer.connectors import accelerator_connector
    from pytorch_lightning.utilities.exceptions import MisconfigurationException
    from raylite.plugins import RayPlugin, RayStrategy

    assert RayPlugin is RayStrategy
    monkeypatch.setattr(accelerator_connector, "_IS_INTERACTIVE", True)
    pl.Trainer(strategy=RayStrategy(num_workers=2), logger=False)   # accepted in a notebook
    with pytest.raises(MisconfigurationException):
        pl.Trainer(strategy="ddp_spawn", accelerator="cpu", devices=2, logger=False)


MAIN_SCRIPT = """
from raylite.plugins import init_with_preload
init_with_preload(num_cpus=2)   # before importing Lightning: the zygote imports it meanwhile
import torch, pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset
from raylite.plugins import RayStrategy

class MainNet(pl.LightningModule):   # lives in __main__: the workers get it by value
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss)
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

if __name__ == "__main__":
    x = torch.randn(64, 4)
    model = MainNet()
    w = model.layer.weight.detach().clone()
    trainer = pl.Trainer(strategy=RayStrategy(num_workers=2), max_steps=5, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8))
    print("RESULT", type(model).__module__, not torch.equal(w, model.layer.weight), "loss" in trainer.callback_metrics)
"""


def test_module_defined_in_main_script(tmp_path):
    script = tmp_path / "main_script.py"
    script.write_text(MAIN_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=110, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RESULT __main__ True True" in out.stdout, out.stdout[-2000:]


def test_worker_start_runs_the_init_hook_once(tmp_path):
    """What an actor does when it starts (in-process here): imports, then the hook, once."""
    from raylite.plugins._worker import _Worker

    calls = []
    w = _Worker(init_hook=lambda: calls.append(os.getpid()))
    _node, address, port, sees = w.ready(str(tmp_path))   # where its TCP rendezvous would be, were it rank 0
    assert address == "127.0.0.1" and 0 < port < 65536 and sees
    assert w.ready(str(tmp_path / "elsewhere"))[3] is False   # another machine's rendezvous directory
    w.warm()
    w.warm()
    assert calls == [os.getpid()]


def test_bad_arguments():
    from raylite.plugins import RayStrategy

    with pytest.raises(ValueError, match="num_workers"):
        RayStrategy(num_workers=0)
    with pytest.raises(TypeError, match="parallel_devices"):
        RayStrategy(num_workers=2, parallel_devices=[torch.device("cpu")])
    s = RayStrategy(num_workers=3, resources_per_worker={"CPU": 2, "accel": 0.5})
    assert s._raylite_actor_options() == {"num_cpus": 2, "resources": {"accel": 0.5}}
    assert s.num_processes == 3 and s.root_device == torch.device("cpu")


def test_importing_plugins_does_not_import_lightning():
    code = ("import sys, raylite.plugins as p; assert 'pytorch_lightning' not in sys.modules; "
            "assert 'RayStrategy' in dir(p); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
