"""The zygote preloads the heavy, device-free modules the driver has imported (numpy, pandas,
torch, Lightning) when RAYLITE_AUTO_PRELOAD=1, so fresh workers fork with them loaded; unset or 0 is off."""
import json
import os
import sys

import pytest

from raylite.core.worker.zygote import AUTO_PRELOAD, preload_names

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


# --- a zygote forked from the driver -------------------------------------------------------------

class _Module:
    def __init__(self, **attrs):
        self.__dict__.update(attrs)


def _modules(**extra):
    torch = _Module(cuda=_Module(is_initialized=lambda: False))
    return {"torch": torch, "numpy": _Module(), **extra}


def test_the_zygote_is_forked_only_when_the_driver_has_the_preload_and_is_safe_to_fork():
    from raylite.core.worker.zygote_fork import fork_refusal
    assert fork_refusal("torch,numpy", "", _modules()) is None
    assert fork_refusal("torch,numpy", "1", _modules()) is None
    assert fork_refusal("torch,numpy", "0", _modules()) == "RAYLITE_ZYGOTE_FORK=0"   # switched off
    assert fork_refusal("", "", _modules()) == "nothing to preload"
    assert "not imported" in fork_refusal("torch,pandas", "", _modules())   # then the zygote imports
    cuda = _Module(cuda=_Module(is_initialized=lambda: True))
    assert fork_refusal("torch", "", _modules(torch=cuda)) == "the driver initialised CUDA"
    assert fork_refusal("torch", "", _modules(jax=_Module())) == "the driver imported jax"
    threads = _Module(active_count=lambda: 2)
    assert fork_refusal("torch", "", _modules(threading=threads)) == "the driver runs other threads"
    up = _Module(_node=object(), process=_Module(client=None))
    assert fork_refusal("torch", "", _modules(**{"raylite.core.api.runtime": up})) == "a raylite runtime is up in this process"
    with pytest.raises(ValueError, match="RAYLITE_ZYGOTE_FORK='maybe': expected 0"):
        fork_refusal("torch", "maybe", _modules())


_FORK_DRIVER = r"""
import json, logging, os, signal, subprocess, sys
import numpy
cat = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)   # ends when its stdin closes
MARKER = "driver's"
if sys.argv[1] == "omp":   # torch's OpenMP pool running: a forked child would hang in its next parallel op
    import torch
    torch.set_num_threads(2)
    torch.randn(512, 512) @ torch.randn(512, 512)
signal.signal(signal.SIGTERM, lambda *a: None)
logging.basicConfig(filename=os.devnull)
print("unflushed", end=" ")   # block-buffered (a pipe): must come out once, not once per copy
import raylite as ray
os.environ["RAYLITE_PRELOAD"] = "numpy"
ray.init(num_cpus=2)

@ray.remote
def state(case):
    import logging, os, signal, sys
    zygote = os.getppid()
    out = {"driver_main": getattr(sys.modules["__main__"], "MARKER", None), "numpy": "numpy" in sys.modules,
           "zygote_threads": len(os.listdir(f"/proc/{zygote}/task")), "zygote_sid": os.getsid(zygote) == zygote,
           "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, "root_handlers": len(logging.root.handlers)}
    if case == "omp":
        import torch
        torch.set_num_threads(2)
        out["omp"] = float((torch.ones(256, 256) @ torch.ones(256, 256)).sum())
    return out

out = ray.get(state.remote(sys.argv[1]))
cat.stdin.close()   # the driver's is the only write end: none was copied into the zygote or a worker
out["cat"] = cat.wait(timeout=30)
print(json.dumps(out))
ray.shutdown()
"""


@pytest.mark.parametrize("case, switch, forked", [("plain", "", True), ("plain", "0", False), ("omp", "", False)])
def test_a_forked_zygote_has_the_drivers_modules_and_nothing_else_of_its_state(tmp_path, case, switch, forked):
    """Forked from the driver, the zygote comes with numpy (RAYLITE_PRELOAD) imported at no cost,
    but as its own session, single-threaded, with default signal handlers, no logging handler
    and no open pipe end of the driver's; RAYLITE_ZYGOTE_FORK=0, or torch's OpenMP pool running,
    starts it as before."""
    import subprocess
    from helpers import REPO_ROOT
    env = {**os.environ, "RAYLITE_ZYGOTE_FORK": switch,   # this checkout's raylite
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("RAYLITE_AUTO_PRELOAD", None)
    script = tmp_path / "driver.py"
    script.write_text(_FORK_DRIVER)
    out = subprocess.run([sys.executable, str(script), case], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("unflushed") == 1, out.stdout
    state = json.loads(out.stdout.split("unflushed", 1)[1].strip().splitlines()[-1])
    assert state["driver_main"] == ("driver's" if forked else None)
    assert state["numpy"] is True   # imported by the spawned zygote when not forked
    assert state["zygote_threads"] == 1 and state["zygote_sid"] is True
    assert state["sigterm"] is True and state["root_handlers"] == 0 and state["cat"] == 0
    if case == "omp":
        assert state["omp"] == 256.0 ** 3   # a worker's parallel op ran (no hang)
