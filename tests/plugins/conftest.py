"""tests/plugins: Lightning strategies on raylite's workers.

``ray_preloaded`` is this folder's runtime: one per module, its workers forked with torch and
Lightning already imported (``raylite.plugins.init_with_preload``), so a module's tests share warm
worker groups; the root's ``ray_module`` is the plain one.
"""
from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def ray_preloaded():
    """One 2-CPU runtime for the module whose zygote imports torch + Lightning; idle workers released
    and the runtime shut down after the module."""
    import raylite as ray
    from raylite.plugins import init_with_preload, release_workers
    if ray.is_initialized():
        ray.shutdown()
    before = os.environ.get("RAYLITE_PRELOAD")
    init_with_preload(num_cpus=2)
    assert os.environ.get("RAYLITE_PRELOAD") == before   # set for the zygote only
    try:
        yield ray
    finally:
        release_workers()
        ray.shutdown()
