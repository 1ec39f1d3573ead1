"""Ray Tune names raylite.tune does not support fail with a hint, also under `from ... import`
(where Python would otherwise say only "cannot import name")."""
import pytest

from raylite import tune


@pytest.mark.parametrize("module, name, hint", [
    ("raylite.tune", "Trainable", "function trainable"),
    ("raylite.tune", "PopulationBasedTraining", "mutate configs"),
    ("raylite.tune.schedulers", "PopulationBasedTraining", "mutate configs"),
    ("raylite.tune.schedulers", "PB2", "mutate configs"),
    ("raylite.tune.schedulers", "HyperBandScheduler", "ASHAScheduler"),
])
def test_from_import_keeps_the_hint(module, name, hint):
    with pytest.raises(ImportError, match=hint):
        exec(f"from {module} import {name}", {})


def test_attribute_access_stays_an_attribute_error():
    with pytest.raises(AttributeError, match="mutate configs"):
        tune.schedulers.PB2   # noqa: B018
    assert not hasattr(tune, "Trainable")
    assert not hasattr(tune.schedulers, "HyperBandScheduler")
    with pytest.raises(ImportError, match="cannot import name 'nothing_like_this'"):
        exec("from raylite.tune import nothing_like_this", {})
