"""Ray Tune names raylite.tune does not support fail with a hint, also under `from ... import`
(where Python would otherwise say only "cannot import name"); the ones it gained import."""
import pytest

from raylite import tune


@pytest.mark.parametrize("module, name, hint", [
    ("raylite.tune.schedulers", "PB2", "PopulationBasedTraining"),
    ("raylite.tune.schedulers", "HyperBandForBOHB", "TuneBOHB"),
    ("raylite.tune.schedulers", "ResourceChangingScheduler", "fixed for the whole experiment"),
    ("raylite.tune", "SyncConfig", "nothing to sync"),
])
def test_from_import_keeps_the_hint(module, name, hint):
    with pytest.raises(ImportError, match=hint):
        exec(f"from {module} import {name}", {})


def test_attribute_access_stays_an_attribute_error():
    with pytest.raises(AttributeError, match="PopulationBasedTraining"):
        tune.schedulers.PB2   # noqa: B018
    assert not hasattr(tune.schedulers, "HyperBandForBOHB")
    with pytest.raises(ImportError, match="cannot import name 'nothing_like_this'"):
        exec("from raylite.tune import nothing_like_this", {})


def test_names_once_refused_now_import():
    exec("from raylite.tune import Trainable", {})
    assert issubclass(tune.Trainable, object)
