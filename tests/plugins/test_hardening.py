"""raylite.plugins on input that used to hang or fail with Lightning's generic message: a worker
group larger than the runtime, and the seed's ray_lightning line `plugins=[RayPlugin(...)]`."""
from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("pytorch_lightning")

import raylite as ray  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

pytestmark = pytest.mark.timeout(120)


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _loader():
    x = torch.randn(32, 4)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)


@pytest.mark.filterwarnings("error:RayStrategy.*have not started:RuntimeWarning")
@pytest.mark.parametrize("name", ["RayStrategy", "RayPlugin"])
def test_a_group_larger_than_the_runtime_is_an_error_at_once(ray_module, tmp_path, name, monkeypatch):
    import raylite.plugins as plugins
    from raylite.plugins import launcher

    # a wait for the workers would say "have not started" at its first look (an error here), not after 30 s
    monkeypatch.setattr(launcher, "PENDING_WARN_S", 0.0)
    strategy = getattr(plugins, name)(num_workers=6)
    trainer = pl.Trainer(strategy=strategy, max_steps=2, default_root_dir=str(tmp_path), logger=False,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    with pytest.raises(ValueError) as info:
        trainer.fit(Net(), _loader())
    message = str(info.value)
    assert "num_workers=6" in message and "6 CPU" in message and "has 2 CPU" in message, message
    assert "num_cpus_per_worker=0.3333" in message, message   # a share that fits, on the 1e-4 grid
    assert ray.available_resources().get("CPU") == 2   # no worker was started (or each is gone)


def test_the_seeds_plugins_line_names_the_one_line_fix(ray_module):
    from raylite.plugins import RayPlugin, RayStrategy

    # ray_lightning's README, as the seed has it: Lightning 2.x takes strategies only as strategy=
    with pytest.raises(Exception, match=r"plugins=\[\.\.\.\]") as info:
        pl.Trainer(max_steps=1000, plugins=[RayPlugin(num_workers=6)])
    assert "pl.Trainer(strategy=RayStrategy(num_workers=6))" in str(info.value)
    trainer = pl.Trainer(max_steps=1000, strategy=RayStrategy(num_workers=6), logger=False)   # the fix
    assert trainer.strategy.num_workers == 6 and repr(trainer.strategy) == "RayStrategy(num_workers=6)"


@pytest.mark.parametrize("kwargs, error, field", [
    ({"num_cpus_per_worker": "x"}, ValueError, "num_cpus_per_worker"),
    ({"num_cpus_per_worker": -1}, ValueError, "num_cpus_per_worker"),
    ({"resources_per_worker": [1]}, TypeError, "resources_per_worker"),
    ({"resources_per_worker": {"accel": float("nan")}}, ValueError, "resources_per_worker['accel']"),
    ({"resources_per_worker": {"GPU": "1"}}, ValueError, "resources_per_worker['GPU']"),
    ({"use_gpu": "yes"}, TypeError, "use_gpu"),
    ({"init_hook": 5}, TypeError, "init_hook"),
    ({"num_workers": 2.5}, ValueError, "num_workers"),
])
def test_bad_strategy_arguments_name_the_field(kwargs, error, field):
    from raylite.plugins import RayShardedStrategy, RayStrategy

    for cls in (RayStrategy, RayShardedStrategy):
        with pytest.raises(error) as info:
            cls(**kwargs)
        assert field in str(info.value), info.value
