"""Helpers on top of the public API, as in ``ray.util``.

- ``raylite.util.accelerators``: accelerator type names for ``accelerator_type=``.
- ``raylite.util.probe_gpu_resources``: pick GPU or CPU resource options at run time.
"""
from raylite.util import accelerators
from raylite.util.probe import probe_gpu_resources

__all__ = ["accelerators", "probe_gpu_resources"]
