"""CPU fallback (issue 3): raylite.util.probe_gpu_resources and the hand-written probe pattern.

Ray has no CPU fallback, so a program asks first. Three cases through the real runtime: no GPU
(answered at once, nothing submitted), a free GPU, and every GPU held by an actor (CPU answer
after the timeout, and the cancelled probe neither holds nor later takes the device).
"""

import os
import time
import warnings

import pytest

import raylite as ray
import raylite.util
from raylite.util import probe as probe_module
from raylite.util import probe_gpu_resources
from helpers import wait_until as _wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    monkeypatch.setenv("RAYLITE_GPU_VENDOR", "nvidia")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    if ray.is_initialized():
        ray.shutdown()
    yield monkeypatch
    if ray.is_initialized():
        ray.shutdown()




def _gpu_holder():
    @ray.remote(num_gpus=1)
    class Holder:
        def ping(self):
            return ray.get_gpu_ids()

    return Holder


def test_exported_from_util():
    assert raylite.util.probe_gpu_resources is probe_gpu_resources
    assert "no CPU fallback" in probe_gpu_resources.__doc__


def test_no_gpu_answers_at_once_without_submitting():
    ray.init(num_cpus=1, num_gpus=0)
    assert ray.cluster_resources().get("GPU", 0) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no "infeasible" warning: nothing was submitted
        start = time.monotonic()
        got = probe_gpu_resources(timeout=60.0)
        took = time.monotonic() - start
    assert got == {"num_cpus": 1}
    assert took < 30   # far below the 60 s timeout: it did not wait for a GPU that cannot come


def test_too_few_gpus_answers_at_once():
    ray.init(num_cpus=1, num_gpus=1)
    start = time.monotonic()
    assert probe_gpu_resources(timeout=60.0, num_gpus=2, num_cpus=2) == {"num_cpus": 2}
    assert time.monotonic() - start < 30


def test_free_gpu_gives_the_gpu_options():
    ray.init(num_cpus=1, num_gpus=1)
    assert probe_gpu_resources(timeout=60.0) == {"num_cpus": 1, "num_gpus": 1}
    assert probe_gpu_resources(timeout=60.0, num_gpus=0.5, num_cpus=2) == {"num_cpus": 2, "num_gpus": 0.5}
    _wait_until(lambda: ray.available_resources().get("GPU", 0) == 1.0, what="probe released the GPU")

    opts = probe_gpu_resources(timeout=60.0)
    assert ray.get(ray.remote(**opts)(lambda: ray.get_gpu_ids()).remote()) == [0]


def test_free_gpu_even_when_every_cpu_is_busy(tmp_path):
    """The probe asks for the GPU only: busy CPUs are needed either way and must not decide."""
    ray.init(num_cpus=1, num_gpus=1)
    flag = str(tmp_path / "go")

    @ray.remote(num_cpus=1)
    def busy():
        while not os.path.exists(flag):
            time.sleep(0.01)

    ref = busy.remote()
    try:
        _wait_until(lambda: ray.available_resources().get("CPU", 0) == 0, what="CPU taken")
        assert probe_gpu_resources(timeout=60.0) == {"num_cpus": 1, "num_gpus": 1}
    finally:
        open(flag, "w").close()
    ray.get(ref, timeout=30)


def test_all_gpus_busy_gives_cpu_after_timeout_and_leaves_nothing_reserved(clean, tmp_path):
    ray.init(num_cpus=2, num_gpus=1)
    ran = str(tmp_path / "probe-ran")

    def recording_probe():   # shipped by value: the same probe, but it leaves a trace if it runs
        open(ran, "a").close()
        return True

    clean.setattr(probe_module, "_gpu_probe", recording_probe)
    holder = _gpu_holder().remote()
    assert ray.get(holder.ping.remote()) == [0]

    start = time.monotonic()
    got = probe_gpu_resources(timeout=1.0)
    took = time.monotonic() - start
    assert got == {"num_cpus": 1}
    assert took >= 0.95                    # it did wait for the GPU, up to the timeout
    assert ray.available_resources().get("GPU", 0) == 0

    ray.kill(holder)
    _wait_until(lambda: ray.available_resources().get("GPU", 0) == ray.cluster_resources()["GPU"],
                what="GPU back to the total after the actor was killed")

    # Had the probe stayed queued, it would run now, ahead of this task of the same shape.
    @ray.remote(num_cpus=0, num_gpus=1)
    def after():
        return ray.get_gpu_ids()

    assert ray.get(after.remote(), timeout=30) == [0]
    assert not os.path.exists(ran), "the cancelled probe ran after the GPU came free"
    assert ray.available_resources().get("GPU", 0) == 1.0


def test_hand_written_probe_on_busy_gpu_is_not_ready_and_raises_nothing():
    ray.init(num_cpus=2, num_gpus=1)
    holder = _gpu_holder().remote()
    ray.get(holder.ping.remote())

    @ray.remote(num_gpus=1)
    def probe():
        return True

    ref = probe.remote()
    ready, not_ready = ray.wait([ref], timeout=0.5)   # the seed's pattern
    assert ready == [] and not_ready == [ref]
    ray.cancel(ref)
    ray.kill(holder)


def test_auto_init_like_ray():
    assert not ray.is_initialized()
    got = probe_gpu_resources(timeout=5.0)
    assert ray.is_initialized()
    expected_gpu = ray.cluster_resources().get("GPU", 0) >= 1
    assert got == ({"num_cpus": 1, "num_gpus": 1} if expected_gpu else {"num_cpus": 1})


@pytest.mark.parametrize("kwargs, word", [
    ({"num_gpus": 0}, "num_gpus"),
    ({"num_gpus": -1}, "num_gpus"),
    ({"num_gpus": 1.5}, "1.5"),
    ({"num_gpus": float("nan")}, "num_gpus"),
    ({"num_cpus": -1}, "num_cpus"),
    ({"timeout": -1}, "timeout"),
])
def test_invalid_arguments(kwargs, word):
    with pytest.raises(ValueError, match=word):
        probe_gpu_resources(**kwargs)
    assert not ray.is_initialized()
