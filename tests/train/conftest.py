"""tests/train: Train's trainers on raylite's workers.

Besides the root's fixtures (``ray_module`` shared by a module, ``ray_init`` per test),
``ray_torch_preloaded``: a module's runtime whose workers fork with torch, its compiler
(``torch._dynamo``) and Lightning imported, for tests that look at what a worker group opens.
"""
from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def ray_torch_preloaded():
    """One 2-CPU runtime for the module, its zygote importing torch, torch._dynamo and
    pytorch_lightning; idle workers released and the runtime shut down after the module."""
    import raylite as ray
    from raylite.plugins import release_workers
    if ray.is_initialized():
        ray.shutdown()
    os.environ["RAYLITE_PRELOAD"] = "torch,torch._dynamo,pytorch_lightning"   # for this init's zygote
    try:
        ray.init(num_cpus=2)
    finally:
        del os.environ["RAYLITE_PRELOAD"]
    try:
        yield ray
    finally:
        release_workers()
        ray.shutdown()
