"""What a trial holds and what its task is told, for the runner (runner.py): checking that a
trial's resources fit a node before anything starts, how many trials run at once, the task's
options, and a class trainable's loop settings."""
from __future__ import annotations

import raylite as ray
from raylite.tune import session
from raylite.tune.progress import resources_str, units
from raylite.tune.resources import normalize_resources

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
    if r.resource_fn is not None:   # per config: each trial is checked as it is created
        per_node = [max(1, units(node.get("CPU", 0)) // 10_000) for node in nodes]
    limits = [sum(per_node)] if r.req_units or r.resource_fn else []
    if r.max_concurrent:
        limits.append(r.max_concurrent)
    r.slots = min(limits) if limits else 1   # how many trials can run at once
    # Submit the next trial ahead only where the resources are what limits concurrency (so the
    # node holds it back) and its config cannot depend on the trials still running.
    r.may_queue = (bool(r.req_units) and not r.searcher.needs_metric and r.resource_fn is None
                      and (not r.max_concurrent or r.max_concurrent >= r.slots) and QUEUE_AHEAD)
    custom = {k: v for k, v in r.resources.items() if k not in ("CPU", "GPU", "memory")}
    r.task = _trial_task.options(num_cpus=r.resources.get("CPU", 0), num_gpus=r.resources.get("GPU", 0),
                                    memory=r.resources.get("memory") or None, resources=custom or None,
                                    max_retries=0)


def config_resources(r, config: dict) -> dict[str, float]:
    """A trial's own resources (`with_resources(trainable, fn)`): `fn(config)`, checked against
    the nodes as tune.run checks a fixed request."""
    from raylite.tune import _validate
    asked = r.resource_fn(config)
    what = f"the resources function's value for config {config!r}"
    _validate.check_resource_grid(asked, what)
    resources = normalize_resources(asked, what)
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive", True)] or [ray.cluster_resources()]
    if not any(all(units(node.get(k, 0)) >= units(v) for k, v in resources.items()) for node in nodes):
        raise ValueError(f"{what} is {resources_str(resources)}, which no node can ever hold (see "
                         f"ray.cluster_resources()); ask for less")
    return resources


def units_of(r, trial) -> dict[str, int]:
    """What the trial holds, in resource units: its own request, else the experiment's."""
    if r.resource_fn is None:
        return r.req_units
    if getattr(trial, "req_units", None) is None:
        trial.req_units = {k: units(v) for k, v in trial.resources.items() if v}
    return trial.req_units


def task_for(r, trial):
    """The trial task with this trial's own resources (one options() per distinct request)."""
    key = tuple(sorted(trial.resources.items()))
    cache = r.__dict__.setdefault("_tasks", {})
    if key not in cache:
        res = trial.resources
        custom = {k: v for k, v in res.items() if k not in ("CPU", "GPU", "memory")}
        cache[key] = _trial_task.options(num_cpus=res.get("CPU", 0), num_gpus=res.get("GPU", 0),
                                         memory=res.get("memory") or None, resources=custom or None, max_retries=0)
    return cache[key]


def class_options(r) -> dict:
    """What a class trainable's loop needs (trainable.py): when to checkpoint, whether to keep
    its object for the next trial."""
    cc = r.checkpoint_config
    return {"checkpoint_frequency": cc.checkpoint_frequency if cc else 0,
            "checkpoint_at_end": bool(cc and cc.checkpoint_at_end), "reuse_actors": r.reuse_actors,
            "pbt": r.scheduler.checkpoint_points() if hasattr(r.scheduler, "checkpoint_points") else None}
