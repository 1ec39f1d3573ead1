"""What a trial asks for: Ray's resource forms (`{"cpu": 1, "gpu": 0.5}`, `PlacementGroupFactory`,
a `ScalingConfig`, a function of the config) as raylite's one dict, and `with_resources`, the
wrapper that carries them. Below `tune.run` (api.py), the Tuner (tuner.py) and the runner's
placement (placement.py), which all read requests through it."""
from __future__ import annotations

import math
from typing import Callable

from raylite.train.config import PLACEMENT_STRATEGIES, ScalingConfig
from raylite.tune import _validate
from raylite.tune.session import inner_trainable, with_parameters
from raylite.tune.trainable import Trainable, is_trainable_class


class PlacementGroupFactory:
    """Ray's per-trial resource request as bundles, e.g. `[{"CPU": 1, "GPU": 1}, {"CPU": 2}]`.

    raylite runs each trial as one task on one machine, so a factory asks for the sum of its
    bundles (`required_resources`), held by the trial's task; `strategy` is accepted and has no
    effect. A trial's nested tasks and actors then share what the trial holds only insofar as the
    trial blocks in `get` (which gives its CPU back): the bundles are not reserved for them.
    """

    def __init__(self, bundles: list[dict], strategy: str = "PACK"):
        if not isinstance(bundles, (list, tuple)) or not bundles:
            raise ValueError(f"PlacementGroupFactory(bundles=...) must be a non-empty list of dicts such as "
                             f"[{{'CPU': 1, 'GPU': 1}}, {{'CPU': 2}}], got {bundles!r}")
        if strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(f"PlacementGroupFactory(strategy=...) must be one of {PLACEMENT_STRATEGIES}, got {strategy!r}")
        self.bundles, self.strategy = [], strategy
        total: dict[str, float] = {}
        for i, bundle in enumerate(bundles):
            if not isinstance(bundle, dict):
                raise TypeError(f"PlacementGroupFactory bundle {i} must be a dict such as {{'CPU': 1}}, got {bundle!r}")
            self.bundles.append(dict(bundle))
            for key, value in normalize_resources(bundle, f"PlacementGroupFactory bundle {i}").items():
                total[key] = total.get(key, 0.0) + value
        self.required_resources = total

    def __eq__(self, other) -> bool:
        return (isinstance(other, PlacementGroupFactory) and self.bundles == other.bundles
                and self.strategy == other.strategy)

    def __repr__(self) -> str:
        return f"PlacementGroupFactory({self.bundles!r}, strategy={self.strategy!r})"


class _WithResources:
    """What `with_resources` returns: the trainable plus its normalized resources."""

    def __init__(self, trainable, resources: dict[str, float]):
        self.trainable, self.resources = trainable, resources
        self.__name__ = getattr(trainable, "__name__", "trainable")

    def __call__(self, config, **kwargs):
        return self.trainable(config, **kwargs)


def with_resources(trainable: Callable, resources: dict | PlacementGroupFactory | ScalingConfig | Callable
                   ) -> Callable:
    """Ray's `tune.with_resources`: the resources every trial of `trainable` holds, as a dict
    (`{"cpu": 2, "gpu": 0.5, "custom": 1}`, the form of `tune.run(resources_per_trial=...)`), a
    `PlacementGroupFactory` (the sum of its bundles) or a `ScalingConfig` (its trainer's bundle plus
    its workers', as Ray's `as_placement_group_factory`); or a function `config -> ` one of those,
    called for each trial's config (a trial that can never fit is an error when it is created).
    Works with `Tuner` and `tune.run`, around or inside `with_parameters`."""
    if isinstance(resources, ScalingConfig):
        resources = _scaling_bundles(resources)
    if callable(resources) and not isinstance(resources, (dict, PlacementGroupFactory)):
        return _WithResources(trainable, resources)   # per config: called as each trial is created
    if not isinstance(resources, (dict, PlacementGroupFactory)):
        raise TypeError(f"with_resources(resources=...) must be a dict like {{'cpu': 2, 'gpu': 0.5}}, a "
                        f"tune.PlacementGroupFactory or a ScalingConfig, got {type(resources).__name__}")
    _validate.check_resource_grid(resources, "with_resources(resources=...)")
    return _WithResources(trainable, normalize_resources(resources, "with_resources(resources=...)"))


def _scaling_bundles(sc: ScalingConfig) -> PlacementGroupFactory:
    """Ray's `ScalingConfig.as_placement_group_factory`: the trainer (1 CPU unless
    `trainer_resources` says otherwise) with the first worker, then one bundle per other worker
    (1 CPU each by default; with `use_gpu`, 1 GPU and no CPU)."""
    use_gpu = sc.use_gpu is True
    worker = {k: v for k, v in (sc.resources_per_worker or {}).items() if v} if sc.resources_per_worker \
        else ({"GPU": 1} if use_gpu else {"CPU": 1})
    if use_gpu:
        worker.setdefault("GPU", 1)
    trainer = {k: v for k, v in sc.trainer_resources.items() if v} if sc.trainer_resources is not None \
        else {"CPU": 1}
    first = {k: trainer.get(k, 0) + worker.get(k, 0) for k in {**trainer, **worker}}
    return PlacementGroupFactory([first] + [worker] * (sc.num_workers - 1), strategy=sc.placement_strategy)


def split_resources(trainable: Callable, resources_per_trial: dict | PlacementGroupFactory | None
                    ) -> tuple[Callable, dict | PlacementGroupFactory | None]:
    """(trainable, resources_per_trial) with a `with_resources` wrapper taken off (also one under
    `with_parameters`, which stays outermost so the runner still puts its objects once)."""
    inner = inner_trainable(trainable)
    if not isinstance(inner, _WithResources):
        return trainable, resources_per_trial
    if resources_per_trial is not None:
        raise ValueError("resources given twice: by tune.with_resources(...) and by resources_per_trial; "
                         "keep one")
    if inner is trainable:
        return inner.trainable, inner.resources
    return with_parameters(inner.trainable, **trainable.kwargs), inner.resources


def per_config_resources(trainable, resources_per_trial) -> Callable | None:
    """The function config -> resources when a trial's resources depend on its config: given to
    `with_resources(trainable, resources=fn)` or as `resources_per_trial`, or a class trainable's
    `default_resource_request(config)` when nothing else is given (as in Ray)."""
    if callable(resources_per_trial) and not isinstance(resources_per_trial, dict):
        if not isinstance(resources_per_trial, PlacementGroupFactory):
            return resources_per_trial
    inner = inner_trainable(trainable)
    if resources_per_trial is None and is_trainable_class(inner) and \
            inner.default_resource_request is not Trainable.default_resource_request:
        return inner.default_resource_request
    return None


def normalize_resources(resources, what: str = "resources_per_trial") -> dict[str, float]:
    """Ray's resource keys ({"cpu": 1, "gpu": 0.5, "custom": 2}) as raylite's ({"CPU": 1.0, ...});
    a tune.PlacementGroupFactory is the sum of its bundles (a trial is one task on one machine)."""
    if resources is None:
        return {"CPU": 1.0}
    if not isinstance(resources, dict):
        if isinstance(resources, PlacementGroupFactory):
            return dict(resources.required_resources)
        raise TypeError(f"{what} must be a dict like {{'cpu': 1, 'gpu': 0.5}} or a tune.PlacementGroupFactory, "
                        f"got {type(resources).__name__}")
    out: dict[str, float] = {}
    resources = dict(resources)
    custom = resources.pop("custom_resources", None)   # Ray's nested form: {"cpu": 1, "custom_resources": {"hdd": 80}}
    if custom is not None:
        if not isinstance(custom, dict):
            raise TypeError(f"{what}['custom_resources'] must be a dict like {{'hdd': 80}}, got {custom!r}")
        for key, value in custom.items():
            if key in resources:
                raise ValueError(f"{what}: resource {key!r} given twice, in custom_resources and at the top")
        resources.update(custom)
    for key, value in resources.items():
        if not isinstance(key, str):
            raise TypeError(f"{what}: resource names must be strings, got {key!r}")
        name = {"cpu": "CPU", "gpu": "GPU", "num_cpus": "CPU", "num_gpus": "GPU"}.get(key, key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0 or math.isnan(value):
            raise ValueError(f"{what}[{key!r}] must be a non-negative number, got {value!r}")
        if value:
            out[name] = out.get(name, 0.0) + float(value)
    out.setdefault("CPU", 0.0)
    return out
