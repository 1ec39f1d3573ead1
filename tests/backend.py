"""Which backend the core tests' init fixtures start: ``RAYLITE_TEST_BACKEND=ray`` runs them on
a real Ray (``init(backend="ray")`` semantics), unset or ``local`` on the local runtime.

On Ray, starting a node per test would cost 5-15 s; instead one ``ray.cluster_utils.Cluster``
with the test's node arguments (CPUs, GPUs, resources, labels, ...) is started and kept while
the next tests ask for the same node, and each test connects to it as a job of its own: its
disconnect (``shutdown()``) ends the job's tasks and actors, as a fresh ``init`` would. The
cluster is stopped at the end of each test module.
"""
from __future__ import annotations

import os
from pathlib import Path

BACKEND = os.environ.get("RAYLITE_TEST_BACKEND", "local")
if BACKEND not in ("local", "ray"):
    raise ValueError(f"RAYLITE_TEST_BACKEND must be 'local' or 'ray', got RAYLITE_TEST_BACKEND={BACKEND!r}")
ON_RAY = BACKEND == "ray"

# what describes the node (ray.init refuses these when it joins a cluster): they pick the cluster
NODE_ARGS = ("num_cpus", "num_gpus", "resources", "object_store_memory", "labels", "_system_config", "_memory",
             "_temp_dir")
_NODE_PARAMS = {"_temp_dir": "temp_dir", "_memory": "memory"}   # init's names -> a node's
_ROOT = Path(__file__).resolve().parent.parent
_cluster = None
_cluster_key = None


def init(**kwargs):
    """``raylite.init(**kwargs)`` on the selected backend."""
    import raylite
    if not ON_RAY:
        return raylite.init(**kwargs)
    node = {k: kwargs.pop(k) for k in NODE_ARGS if kwargs.get(k) is not None}
    return raylite.init(address=_cluster_for(node).address, **kwargs)


def _cluster_for(node: dict):
    """The running cluster if it has this node, else a new one (the old one stopped first)."""
    global _cluster, _cluster_key
    key = repr(sorted(node.items()))
    if _cluster is not None and key == _cluster_key:
        return _cluster
    close()
    from ray.cluster_utils import Cluster
    # Ray's workers import raylite from this checkout (not an installed copy), and the test
    # modules (what their remote code pickled by reference), as the driver does
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), str(_ROOT / "tests"), path]))
    try:
        args = {_NODE_PARAMS.get(k, k): v for k, v in node.items()}
        _cluster = Cluster(initialize_head=True, head_node_args={"include_dashboard": False, **args})
    finally:
        if path is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = path
    _cluster_key = key
    return _cluster


def close() -> None:
    """Stop the cluster started for the tests, if any."""
    global _cluster, _cluster_key
    cluster, _cluster, _cluster_key = _cluster, None, None
    if cluster is not None:
        import raylite
        if raylite.is_initialized():
            raylite.shutdown()
        cluster.shutdown()
