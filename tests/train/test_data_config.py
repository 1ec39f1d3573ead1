"""Ray's train.DataConfig (accepted, checked; Ray Data itself is absent) and Ray 1.x's
prepare_optimizer. No workers are started: the checks happen when a trainer is built."""
import pytest

torch = pytest.importorskip("torch")

from raylite import train  # noqa: E402
from raylite.train.torch import TorchTrainer, prepare_optimizer  # noqa: E402


def test_data_config_is_accepted_and_checked():
    cfg = train.DataConfig(datasets_to_split=["train"])
    TorchTrainer(lambda: None, dataset_config=cfg)
    TorchTrainer(lambda: None, dataset_config=train.DataConfig())
    with pytest.raises(TypeError, match="datasets_to_split=5"):
        train.DataConfig(datasets_to_split=5)
    with pytest.raises(TypeError, match="dataset_config must be a train.DataConfig, got str"):
        TorchTrainer(lambda: None, dataset_config="all")
    with pytest.raises(NotImplementedError, match="Ray Data"):
        TorchTrainer(lambda: None, datasets={"train": [1, 2]}, dataset_config=cfg)


def test_prepare_optimizer_returns_the_optimizer():
    opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    assert prepare_optimizer(opt) is opt
    assert train.prepare_optimizer is prepare_optimizer
    with pytest.raises(TypeError, match="torch.optim.Optimizer, got Linear"):
        prepare_optimizer(torch.nn.Linear(2, 1))
