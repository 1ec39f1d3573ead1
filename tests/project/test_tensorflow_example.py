"""examples/tensorflow_devices.py (issue 3): TensorFlow inside a GPU task sees the task's device.

The example runs as its own program (as a user would run it), with a visible-devices variable set
before init, on a logical GPU. Checked inside the worker: the variable raylite set, the GPU ids,
and TensorFlow's device list (tensorflow-cpu: the CPU). TensorFlow stays out of the driver.
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from helpers import REPO_ROOT

REPO = REPO_ROOT
EXAMPLE = REPO / "examples" / "tensorflow_devices.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(320),
    pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                       reason="tensorflow is not installed (the [tensorflow] or [dev] extra)"),
]


def test_tensorflow_example_sees_the_assigned_device(tmp_path):
    env = dict(os.environ)
    env.update({"RAYLITE_GPU_VENDOR": "nvidia", "CUDA_VISIBLE_DEVICES": "2", "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)})
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--json"], cwd=tmp_path, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{out}\nstderr:\n{proc.stderr}"
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, out
    result = json.loads(lines[0][len("RESULT "):])

    # Inside the worker: the device it was given, in the variable, before TensorFlow was imported.
    assert result["CUDA_VISIBLE_DEVICES"] == "2"
    assert result["gpu_ids"] == [2]
    assert f"(tensorflow_devices pid={result['pid']}) CUDA_VISIBLE_DEVICES=2" in out

    devices = result["devices"]
    assert isinstance(devices, list) and devices
    assert any(d["device_type"] == "CPU" for d in devices), devices
    # A GPU build of TensorFlow on a real GPU would list at most the one visible device.
    assert sum(d["device_type"] == "GPU" for d in devices) <= 1
    assert result["tensorflow"]
    assert result["driver_imported_tensorflow"] is False
