"""What a task's and an actor's submission share: options into a resource request, placement,
runtime env, pickled arguments and definitions, return ids and refs, the local client (started
if need be), ``.options(...)`` and ``.bind(...)``. Below raylite.core.api.remote (functions) and
raylite.core.api.actor_class (classes, handles, methods), which both import it."""
from __future__ import annotations

import warnings

from raylite import exceptions
from raylite.core.client import context, link, streams
from raylite.core.client.objects import ObjectRef
from raylite.core.client.link import process, return_id
from raylite.core.envs import runtime_env
from raylite.core.wire import serialization
from raylite.core.wire.protocol import TaskSpec
from raylite.core.wire.resources import normalize_request

_PLACEMENT_KEYS = {"scheduling_strategy", "placement_group", "placement_group_bundle_index",
                   "placement_group_capture_child_tasks"}   # see placement and unschedulable


def placement_free(options: dict) -> bool:
    """Whether the options name no placement group, scheduling strategy or label selector."""
    return _PLACEMENT_KEYS.isdisjoint(options) and not options.get("label_selector")


def placement(options: dict, request: dict, name: str):
    if _PLACEMENT_KEYS.isdisjoint(options) and context.current_placement() is None:
        return None   # the common case, without importing placement groups
    from raylite.core.api.scheduling import placement_of
    return placement_of(options, request, name)


def env_of(options: dict, name: str, holder) -> tuple | None:
    """The runtime_env a submission runs in on the local runtime: its own over the submitter's
    (inherited). Checked at the first local submission, not at decoration (a Ray cluster accepts
    more: URIs, containers), and kept on `holder`, whose options never change."""
    own = holder.__dict__.get("_own_env", _UNCHECKED)
    if own is _UNCHECKED:
        raw = options.get("runtime_env")
        own = holder._own_env = runtime_env.normalize(raw, name) if raw is not None else None
    return runtime_env.merge(process.runtime_env, own)


_UNCHECKED = object()


def request_of(options: dict, default_cpus: float) -> dict:
    return normalize_request(num_cpus=options.get("num_cpus"), num_gpus=options.get("num_gpus"),
                             resources=options.get("resources"), memory=options.get("memory"),
                             accelerator_type=options.get("accelerator_type"), default_cpus=default_cpus)


def unschedulable(options: dict, name: str) -> str | None:
    """Why this node can never run a task or actor with these options (its label selector, a
    NodeLabelSchedulingStrategy, or a hard NodeAffinitySchedulingStrategy naming another node);
    warned at submission, as for a request larger than the node."""
    selector, strategy = options.get("label_selector"), options.get("scheduling_strategy")
    if not selector and strategy is None:
        return None
    from raylite.core.wire import labels
    node = context.node_labels()
    why = labels.unmet(labels.selector(selector), node) if selector else None
    if why is None and isinstance(strategy, labels.NodeLabelSchedulingStrategy):
        why = labels.unmet(strategy.constraints(), node)
    if why is None and type(strategy).__name__ == "NodeAffinitySchedulingStrategy" and not strategy.soft:
        wanted = strategy.node_id.hex() if hasattr(strategy.node_id, "hex") else strategy.node_id
        if wanted != node[labels.NODE_ID_KEY]:
            why = (f"its NodeAffinitySchedulingStrategy asks for node {wanted!r} (soft=False), but this node is "
                   f"{node[labels.NODE_ID_KEY]!r}")
    if why is None:
        return None
    message = f"{name} can never be scheduled: {why}"
    warnings.warn(f"{message}; get() on it raises InfeasibleTaskError.", UserWarning, stacklevel=4)
    return message


def client():
    """The local runtime's client (started with defaults if need be, as Ray does), or None when
    the Ray backend runs: then ``process.ray`` takes the call."""
    return link.local_or_start()


def pack_args(name: str, args: tuple, kwargs: dict, prefix: str):
    """Serialized arguments and the ids of the top-level refs among them, which the worker resolves."""
    try:
        return serialization.dumps_args(args, kwargs, prefix)
    except exceptions.ObjectStoreFullError:
        raise
    except Exception as e:
        raise TypeError(f"Could not serialize the arguments of {name}: {e}") from e


LARGE_FUNCTION_BYTES = 10 << 20   # Ray warns above the same size


def pickled(obj, name: str) -> bytes:
    try:
        data = serialization.dumps_function(obj)
    except Exception as e:
        raise TypeError(f"Could not serialize {name} to send it to a worker: {e}") from e
    if len(data) > LARGE_FUNCTION_BYTES:   # every worker that runs it gets its own copy
        warnings.warn(f"{name} is very large when pickled ({len(data) / (1 << 20):.1f} MiB): its definition "
                      "probably captures a large array or other object in scope. Pass it with ray.put() and "
                      "an argument instead.", stacklevel=4)
    return data


def warn_if_infeasible(client, name: str, request: dict, holder=None) -> None:
    """Warn at submission, as Ray does; `holder` (a remote function submitting with its own
    options, whose request never changes) remembers the model it was found feasible on."""
    model = client.resources_model
    if holder is not None and holder.__dict__.get("_feasible_on") is model:
        return
    if model.feasible(request):
        if holder is not None:
            holder._feasible_on = model
    else:
        warnings.warn(f"{name} asks for {model.describe(request)} but this node only has "
                      f"{model.describe(model.total)}; it will never be scheduled and get() on it "
                      f"raises InfeasibleTaskError.", UserWarning, stacklevel=4)


def returns(task_id: int, num_returns) -> tuple[tuple, str | None]:
    """The task's return ids for num_returns, and the generator mode if it names one."""
    if num_returns == 1:
        return (return_id(task_id, 0),), None
    if num_returns in streams.MODES:
        return (return_id(task_id, 0),), num_returns
    return tuple(return_id(task_id, i) for i in range(num_returns)), None


def refs(spec: TaskSpec):
    """What `.remote()` returns: one ref, a list for num_returns > 1, None for num_returns=0, an
    ObjectRefGenerator for a streaming generator."""
    if spec.stream == "streaming":
        return streams.ObjectRefGenerator(ObjectRef(spec.return_ids[0], True))
    ids = spec.return_ids
    if len(ids) == 1:
        return ObjectRef(ids[0], True)
    return [ObjectRef(i, True) for i in ids] or None


def bind(self, *args, **kwargs):
    """`.bind(...)`: a node of a lazy graph (Ray's DAG API, raylite.dag) instead of a submission;
    the graph's `execute()` submits it. raylite.dag builds the node: a hook its package registers."""
    return link.hook("bind")(self, args, kwargs)


class Options:
    """What `.options(...)` returns: the same callable with overridden options."""

    bind = bind

    def __init__(self, target, options: dict):
        self._target, self._options = target, options

    def remote(self, *args, **kwargs):
        return self._target._remote(args, kwargs, self._options, self)
