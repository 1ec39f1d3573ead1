"""TensorFlow in a raylite GPU task: the framework sees only the devices the task was given.

The task asks for ``num_gpus=1``; raylite puts the device it assigned into ``CUDA_VISIBLE_DEVICES``
(or the variable of the GPU vendor in use) before the task's code runs, and TensorFlow, imported
inside the task, enumerates only that device. TensorFlow is never imported in the driver: a
framework that touched a GPU in the driver would hold device memory for the whole program.

On a machine without a GPU the GPU is logical (``init(num_gpus=1)``): scheduling and the variable
behave the same, and tensorflow-cpu lists just the CPU. A variable set before ``init`` restricts
which ids are handed out, e.g. ``CUDA_VISIBLE_DEVICES=2 python examples/tensorflow_devices.py``
gives the task GPU 2.

    python examples/tensorflow_devices.py [--num-gpus N] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import raylite as ray


@ray.remote(num_gpus=1)
def tensorflow_devices() -> dict:
    """Runs in a fresh worker holding one GPU: what TensorFlow sees there."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # before the import: keep TF's start-up quiet
    import tensorflow as tf

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = [{"name": d.name, "device_type": d.device_type} for d in tf.config.list_physical_devices()]
    print(f"CUDA_VISIBLE_DEVICES={visible}")
    print(f"ray.get_gpu_ids()={ray.get_gpu_ids()}")
    print(f"tf.config.list_physical_devices() -> {[(d['name'], d['device_type']) for d in devices]}")
    return {"CUDA_VISIBLE_DEVICES": visible, "gpu_ids": ray.get_gpu_ids(), "tensorflow": tf.__version__,
            "devices": devices, "pid": os.getpid()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-gpus", type=int, default=1,
                        help="GPUs to advertise (logical on a CPU machine; default 1)")
    parser.add_argument("--json", action="store_true", help="also print the result as one JSON line")
    args = parser.parse_args(argv)

    ray.init(num_cpus=1, num_gpus=args.num_gpus)
    try:
        result = ray.get(tensorflow_devices.remote())
    finally:
        ray.shutdown()
    result["driver_imported_tensorflow"] = "tensorflow" in sys.modules
    print(f"worker pid {result['pid']}: CUDA_VISIBLE_DEVICES={result['CUDA_VISIBLE_DEVICES']!r}, "
          f"TensorFlow {result['tensorflow']} devices: {[d['name'] for d in result['devices']]}")
    if args.json:
        print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
