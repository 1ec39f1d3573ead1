"""RayStrategy on CPU without DDP's wrapper (raylite.util.shm_collectives.FlatGradients): the same
training as DDP, and DDP itself wherever the module or the options ask for what only DDP does.

Each fit runs once on the wrapper-free path and once with ``RAYLITE_LIGHTNING_FASTPATH=ddp`` (DDP,
its gradient buckets averaged through the same shared memory); with two ranks both sum the same
two numbers and halve them, so the weights agree bit for bit. ``Probe`` records on every rank
which path ran, the gradients ``on_after_backward`` saw and the final weights, and rank 0 hands
back every rank's (all_gather at the end of the fit).
"""
from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("pytorch_lightning")
cloudpickle = pytest.importorskip("cloudpickle")

from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

pytestmark = pytest.mark.timeout(120)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.body(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


class PartlyUnused(Net):
    """``rank0_only`` gets a gradient on rank 0 alone; ``never`` on no rank."""

    def __init__(self):
        super().__init__()
        self.rank0_only = torch.nn.Linear(4, 1)
        self.never = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.global_rank == 0:
            loss = loss + 0.1 * self.rank0_only(batch[0]).pow(2).mean()
        return loss


class WithBatchNorm(Net):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))


class Probe(pl.Callback):
    def __init__(self):
        self.flat = self.grads = self.weights = None
        self._grads: list = []

    def on_train_start(self, trainer, pl_module):
        self._flat = trainer.strategy._raylite_flat is not None

    def on_after_backward(self, trainer, pl_module):
        self._grads.append(torch.cat([p.grad.reshape(-1) for p in pl_module.body.parameters()]))

    def on_train_end(self, trainer, pl_module):
        weights = torch.cat([p.detach().reshape(-1) for p in pl_module.parameters()])
        grads = torch.stack(self._grads)
        everyone = trainer.strategy.all_gather
        self.flat = everyone(torch.tensor(float(self._flat))).tolist()
        self.grads, self.weights = everyone(grads), everyone(weights)

    def state_dict(self):
        return {"flat": self.flat, "grads": self.grads, "weights": self.weights}

    def load_state_dict(self, state_dict):
        self.flat, self.grads, self.weights = state_dict["flat"], state_dict["grads"], state_dict["weights"]


def _fit(module_cls, tmp_path, monkeypatch, fastpath: str, strategy_kwargs=None, probe=None, **trainer_kwargs):
    from raylite.plugins import RayStrategy
    monkeypatch.setenv("RAYLITE_LIGHTNING_FASTPATH", fastpath)   # read by RayStrategy() in the driver
    torch.manual_seed(0)
    model, probe = module_cls(), probe or Probe()
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)
    trainer = pl.Trainer(strategy=RayStrategy(**{"num_workers": 2, **(strategy_kwargs or {})}), max_steps=8, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=str(tmp_path), callbacks=[probe], **trainer_kwargs)
    trainer.fit(model, loader)
    assert trainer.state.finished
    return model, probe


@pytest.mark.parametrize("trainer_kwargs", [{}, {"accumulate_grad_batches": 2}, {"gradient_clip_val": 0.05}],
                         ids=["plain", "accumulate", "clip"])
def test_without_ddp_trains_as_ddp_does(ray_preloaded, tmp_path, monkeypatch, trainer_kwargs):
    flat_model, flat = _fit(Net, tmp_path, monkeypatch, "1", **trainer_kwargs)
    ddp_model, ddp = _fit(Net, tmp_path, monkeypatch, "ddp", **trainer_kwargs)
    assert flat.flat == [1.0, 1.0] and ddp.flat == [0.0, 0.0]
    for probe in (flat, ddp):
        assert torch.equal(probe.weights[0], probe.weights[1])   # the ranks agree
        if "accumulate_grad_batches" not in trainer_kwargs:      # (there every other backward stays local)
            assert torch.equal(probe.grads[0], probe.grads[1])   # on_after_backward saw averaged gradients
    assert torch.equal(flat.grads, ddp.grads)
    assert torch.equal(flat.weights, ddp.weights)
    for key, value in flat_model.state_dict().items():           # and the driver got them
        assert torch.equal(value, ddp_model.state_dict()[key]), key


def test_a_gradient_only_some_ranks_have_is_averaged_and_one_nobody_has_stays_none(ray_preloaded, tmp_path,
                                                                                   monkeypatch):
    torch.manual_seed(0)
    start = PartlyUnused().state_dict()
    flat_model, flat = _fit(PartlyUnused, tmp_path, monkeypatch, "1")
    ddp_model, ddp = _fit(PartlyUnused, tmp_path, monkeypatch, "ddp", {"find_unused_parameters": True})
    assert flat.flat == [1.0, 1.0]
    assert torch.equal(flat.weights[0], flat.weights[1])
    assert torch.equal(flat.weights, ddp.weights)
    trained, untouched = flat_model.state_dict(), ddp_model.state_dict()
    assert not torch.equal(trained["rank0_only.weight"], start["rank0_only.weight"])
    for key in ("never.weight", "never.bias"):   # no gradient anywhere: Adam never moved it
        assert torch.equal(trained[key], start[key]) and torch.equal(untouched[key], start[key])


@pytest.mark.parametrize(("module_cls", "strategy_kwargs"), [(WithBatchNorm, {}), (Net, {"static_graph": True})],
                         ids=["buffers", "ddp-option"])
def test_buffers_or_a_ddp_option_keep_ddp(ray_preloaded, tmp_path, monkeypatch, module_cls, strategy_kwargs):
    _, probe = _fit(module_cls, tmp_path, monkeypatch, "1", strategy_kwargs)
    assert probe.flat == [0.0, 0.0]
    assert torch.equal(probe.weights[0], probe.weights[1])


def test_rank0_weights_reach_every_rank_before_the_first_step(ray_preloaded, tmp_path, monkeypatch):
    """As DDP broadcasts rank 0's module when it wraps it: here each rank draws its own weights."""

    class RankSeeded(Net):
        def configure_model(self):
            torch.manual_seed(100 + self.global_rank)
            self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    _, flat = _fit(RankSeeded, tmp_path, monkeypatch, "1")
    _, ddp = _fit(RankSeeded, tmp_path, monkeypatch, "ddp")
    assert flat.flat == [1.0, 1.0]
    assert torch.equal(flat.weights[0], flat.weights[1])
    assert torch.equal(flat.weights, ddp.weights)


class Wrapped(pl.Callback):
    """Whether the fit's model was wrapped in DDP."""

    def __init__(self):
        self.ddp = None

    def on_train_start(self, trainer, pl_module):
        self.ddp = isinstance(trainer.strategy.model, torch.nn.parallel.DistributedDataParallel)

    def state_dict(self):
        return {"ddp": self.ddp}

    def load_state_dict(self, state_dict):
        self.ddp = state_dict["ddp"]


def test_one_worker_trains_without_ddp_as_ddp_does(ray_preloaded, tmp_path, monkeypatch):
    """A single process has nothing to average: no DDP wrapper, whose every step allreduced the
    gradients with itself through gloo, unless asked for (RAYLITE_LIGHTNING_FASTPATH=ddp); the
    training is the same."""
    one, wrapped = _fit(Net, tmp_path, monkeypatch, "1", {"num_workers": 1}, Wrapped())
    kept, kept_wrapped = _fit(Net, tmp_path, monkeypatch, "ddp", {"num_workers": 1}, Wrapped())
    assert wrapped.ddp is False and kept_wrapped.ddp is True
    for key, value in kept.state_dict().items():
        assert torch.equal(value, one.state_dict()[key]), key
