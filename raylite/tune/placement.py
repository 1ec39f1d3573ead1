"""What a trial holds and what its task is told, for the runner (runner.py): checking that a
trial's resources fit a node before anything starts, how many trials run at once, the task's
options, and a class trainable's loop settings."""
from __future__ import annotations

import raylite as ray
from raylite.tune import session
from raylite.tune.progress import resources_str, units

QUEUE_AHEAD = True   # submit the next trial before a slot frees (see TrialRunner._prequeue)
_trial_task = ray.remote(session.run_trial)

def check_feasible(r) -> None:
    """A trial must fit on one node (a Ray cluster's nodes each count; the local runtime is one):
    otherwise it is an error before any trial starts. Concurrency: what fits on every node."""
    total = ray.cluster_resources()
    r.total_units = {k: units(v) for k, v in total.items()}
    r.req_units = {k: units(v) for k, v in r.resources.items() if v}
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive", True)] or [total]
    per_node = [min((units(node.get(k, 0)) // v for k, v in r.req_units.items()), default=1)
                for node in nodes]
    if not any(per_node):
        biggest = max(nodes, key=lambda n: sum(units(n.get(k, 0)) >= v for k, v in r.req_units.items()))
        where = ("this machine has" if len(nodes) == 1
                 else f"none of the {len(nodes)} nodes has it all; the closest has")
        short = [f"{k}: asks {v:g}, {where} {biggest.get(k, 0):g}" for k, v in r.resources.items()
                 if units(v) > units(biggest.get(k, 0))]
        raise ValueError(f"resources_per_trial={resources_str(r.resources)} can never be satisfied "
                         f"({'; '.join(short)}; see ray.cluster_resources()). Ask for less, or start "
                         f"raylite with more (ray.init(num_cpus=..., num_gpus=..., resources={{...}})).")
    limits = [sum(per_node)] if r.req_units else []
    if r.max_concurrent:
        limits.append(r.max_concurrent)
    r.slots = min(limits) if limits else 1   # how many trials can run at once
    # Submit the next trial ahead only where the resources are what limits concurrency (so the
    # node holds it back) and its config cannot depend on the trials still running.
    r.may_queue = (bool(r.req_units) and not r.searcher.needs_metric
                      and (not r.max_concurrent or r.max_concurrent >= r.slots) and QUEUE_AHEAD)
    custom = {k: v for k, v in r.resources.items() if k not in ("CPU", "GPU", "memory")}
    r.task = _trial_task.options(num_cpus=r.resources.get("CPU", 0), num_gpus=r.resources.get("GPU", 0),
                                    memory=r.resources.get("memory") or None, resources=custom or None,
                                    max_retries=0)


def class_options(r) -> dict:
    """What a class trainable's loop needs (trainable.py): when to checkpoint, whether to keep
    its object for the next trial."""
    cc = r.checkpoint_config
    return {"checkpoint_frequency": cc.checkpoint_frequency if cc else 0,
            "checkpoint_at_end": bool(cc and cc.checkpoint_at_end), "reuse_actors": r.reuse_actors,
            "pbt": r.scheduler.checkpoint_points() if hasattr(r.scheduler, "checkpoint_points") else None}
