"""The zygote preloads the heavy, device-free modules the driver has imported (numpy, pandas,
torch, Lightning) when RAYLITE_AUTO_PRELOAD=1, so fresh workers fork with them loaded; unset or 0 is off."""
import os
import sys

import pytest

from raylite.core.zygote import AUTO_PRELOAD, preload_names

ZYGOTE = "the zygote and RAYLITE_AUTO_PRELOAD are the local runtime's: Ray starts its own workers"


def test_names_are_the_explicit_ones_then_the_imported_allowlisted_ones():
    modules = {"torch": 1, "numpy": 1, "scipy": 1, "lightning.pytorch": 1}
    assert preload_names("", "1", modules) == "numpy,torch,lightning.pytorch"
    assert preload_names("", "", modules) == ""   # off unless asked
    assert preload_names(" mylib, torch ", "1", modules) == "mylib,torch,numpy,lightning.pytorch"
    assert preload_names("mylib", "0", modules) == preload_names("mylib", "off", modules) == "mylib"
    assert preload_names("", "1", {"scipy": 1, "json": 1}) == ""   # only the allowlist
    assert "scipy" not in AUTO_PRELOAD


@pytest.mark.local_only(ZYGOTE)
def test_a_bad_switch_value_is_refused_before_anything_starts(ray_init, monkeypatch):
    monkeypatch.setenv("RAYLITE_AUTO_PRELOAD", "maybe")
    import raylite as ray
    with pytest.raises(ValueError, match="RAYLITE_AUTO_PRELOAD='maybe': expected 1 or 0"):
        ray_init(num_cpus=1)
    assert not ray.is_initialized()


def _worker_state():
    """In a fresh worker: whether numpy came loaded from the zygote, and the zygote's threads."""
    parent = os.getppid()
    return "numpy" in sys.modules, len(os.listdir(f"/proc/{parent}/task"))


@pytest.mark.local_only(ZYGOTE)
@pytest.mark.parametrize("switch, preloaded", [("1", True), ("0", False)])
def test_workers_fork_with_the_drivers_numpy_loaded_and_the_zygote_single_threaded(ray_init, monkeypatch,
                                                                                  switch, preloaded):
    import numpy  # noqa: F401  (the driver's import is what the runtime notices)
    import raylite as ray
    monkeypatch.setenv("RAYLITE_AUTO_PRELOAD", switch)
    ray_init(num_cpus=1)
    loaded, zygote_threads = ray.get(ray.remote(_worker_state).remote())
    assert loaded is preloaded
    # numpy's OpenBLAS starts a thread at import and stops it before each fork: none runs in the
    # zygote once it forked a worker
    assert zygote_threads == 1
