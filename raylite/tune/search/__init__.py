"""Search algorithms: Optuna samplers behind Ray Tune's names.

Both searchers ask one Optuna study (created by the runner, with the scheduler's pruner) for each
trial: `study.ask(distributions)` samples every domain of the search space; grid axes are fixed for
that trial with `study.enqueue_trial`, so they are recorded as Optuna params too.

- `BasicVariantGenerator` (the default): Optuna's RandomSampler plus grids, like Ray's default.
- `OptunaSearch(sampler=None, seed=None)`: TPE by default, or any Optuna sampler.
- `ConcurrencyLimiter(searcher, max_concurrent)`: the searcher, with at most that many trials
  running at once (`tune.run`/`Tuner` take it as their `max_concurrent_trials` bound).
- `Repeater(searcher, repeat, set_index)` (repeater.py): each suggested config `repeat` times.

The `Searcher` base, which all of them and Repeater build on, is searcher.py (Ray's
`ray.tune.search.searcher.Searcher`).

A package so that Ray's import paths work: `ray.tune.search.optuna.OptunaSearch`,
`ray.tune.search.basic_variant.BasicVariantGenerator`, `ray.tune.search.ConcurrencyLimiter`.
"""
from __future__ import annotations

from typing import Callable

from optuna import distributions as od
from optuna import samplers
from optuna.storages import BaseStorage

from raylite.tune._validate import check_mode
from raylite.tune.search.searcher import Searcher, check_searcher
from raylite.tune.search_space import Domain, SearchSpace, path_name


class BasicVariantGenerator(Searcher):
    """Ray's default search: every grid point, `num_samples` times; other domains sampled at random
    by Optuna's RandomSampler, seeded by `random_state` or, without one, from numpy's global random
    state when the experiment starts (Ray draws from it too), so `np.random.seed(...)` before
    `fit()` repeats the configs.

    Ray's arguments: `points_to_evaluate` (configs run first), `max_concurrent` (a bound on running
    trials, 0: none; folded into `max_concurrent_trials`), `constant_grid_search` (each sample's
    random values are drawn once and kept for every grid point of that sample, so grid points are
    compared on the same draws; by default every grid point draws its own)."""

    def __init__(self, points_to_evaluate: list[dict] | None = None, max_concurrent: int = 0,
                 constant_grid_search: bool = False, random_state=None):
        if points_to_evaluate is not None and not isinstance(points_to_evaluate, (list, tuple)):
            raise TypeError(f"BasicVariantGenerator(points_to_evaluate=...) must be a list of configs, got "
                            f"{points_to_evaluate!r} (as in Ray, the first argument is points_to_evaluate; "
                            f"a seed goes in random_state=)")
        if not isinstance(max_concurrent, int) or isinstance(max_concurrent, bool) or max_concurrent < 0:
            raise ValueError(f"BasicVariantGenerator(max_concurrent=...) must be an integer >= 0, got {max_concurrent!r}")
        super().__init__(points_to_evaluate=points_to_evaluate)
        self.max_concurrent, self.constant_grid_search = max_concurrent, constant_grid_search
        self.random_state = random_state
        self._drawn: tuple[int, dict] = (-1, {})   # the current sample's random values (constant_grid_search)

    def suggest(self, study, index: int):
        if not self.constant_grid_search or index < len(self.points_to_run):
            return super().suggest(study, index)
        sample = index // self.space.num_grid_points   # trials are asked for in index order
        keep = self._drawn[1] if self._drawn[0] == sample else None
        config, trial = super().suggest(study, index, keep)
        if keep is None:   # the sample's first grid point drew them
            self._drawn = (sample, {k: trial.params[k] for k in self.space.distributions()})
        return config, trial

    def make_sampler(self):
        seed = self.random_state
        if seed is None:
            import numpy as np
            seed = int(np.random.randint(0, 2**31 - 1))
        elif not isinstance(seed, int):   # a numpy Generator or RandomState, as Ray accepts
            seed = int(seed.integers(0, 2**31 - 1) if hasattr(seed, "integers") else seed.randint(0, 2**31 - 1))
        return samplers.RandomSampler(seed=seed)

    def describe(self) -> str:
        return "random search (Optuna RandomSampler)" + (" + grid" if self.space and self.space.grids else "")


class OptunaSearch(Searcher):
    """Optuna's ask/tell with TPE by default (`seed` seeds it), or any Optuna `sampler`.

    `space` may be a dict of Optuna distributions (`{"lr": optuna.distributions.FloatDistribution(...)}`)
    instead of tune domains in `config`, or Ray's define-by-run function: `space(trial)` calls
    `trial.suggest_*` (names with "/" nest, "model/h1") and may return a dict of constants to add.
    `points_to_evaluate` lists configs to try first; with `evaluated_rewards` (their metric values,
    one each) they are told to the sampler as finished trials instead of being run, as in Ray.
    `storage` (an Optuna storage or its URL) and `study_name` (default "optuna" there) put the
    experiment's study there, loaded if it exists, so its earlier trials inform the sampler; the
    study then runs at that storage's speed. Without them the study is in memory (study.db gets a
    copy).

    Args:
        space: Optuna distributions, or a define-by-run function `space(trial)` (default: `config`'s domains).
        metric: the metric to optimise (default: the experiment's).
        mode: `"min"` or `"max"` (default: the experiment's).
        points_to_evaluate: configs to try first.
        sampler: an Optuna sampler (default TPE).
        study_name: the study's name in `storage` (default "optuna").
        storage: an Optuna storage or its URL, to keep the study there.
        seed: seeds the default TPE sampler.
        evaluated_rewards: metric values of `points_to_evaluate`, told to the sampler instead of run.
    """

    allows_grid = False
    needs_metric = True

    def __init__(self, space: dict | Callable | None = None, metric: str | None = None, mode: str | None = None,
                 points_to_evaluate=None, sampler: samplers.BaseSampler | None = None, study_name: str | None = None,
                 storage=None, seed: int | None = None, evaluated_rewards: list | None = None):
        objectives = None
        if isinstance(metric, (list, tuple)) or isinstance(mode, (list, tuple)):
            objectives = _objectives(metric, mode)
            if evaluated_rewards is not None:
                raise ValueError("OptunaSearch: evaluated_rewards takes one value per point, so it cannot be used "
                                 f"with several objectives (metric={metric!r})")
            metric = mode = None   # the experiment's metric, if any, only ranks results
        super().__init__(metric, mode, points_to_evaluate)
        if objectives:
            self.objectives, self.needs_metric = objectives, False
        if sampler is not None and not isinstance(sampler, samplers.BaseSampler):
            raise TypeError(f"sampler must be an Optuna sampler, got {type(sampler).__name__}")
        if space is not None and not isinstance(space, dict) and not callable(space):
            raise TypeError(f"OptunaSearch(space=...) must be a dict of Optuna distributions or a define-by-run "
                            f"function of an Optuna trial, got {type(space).__name__}")
        if storage is not None and not isinstance(storage, (str, BaseStorage)):
            raise TypeError(f"OptunaSearch(storage=...) must be an optuna.storages.BaseStorage or a database URL, "
                            f"got {type(storage).__name__}")
        self.define_by_run = space if callable(space) and not isinstance(space, dict) else None
        if evaluated_rewards is not None:
            if self.define_by_run is not None:
                raise TypeError("Define-by-run function passed in `space` argument is not yet supported when using "
                                "`evaluated_rewards`. Please provide an `OptunaDistribution` dict or pass a Ray Tune "
                                "search space to `tune.Tuner()`.")
            if len(evaluated_rewards) != len(self.points_to_evaluate):
                raise ValueError(f"OptunaSearch: evaluated_rewards has {len(evaluated_rewards)} values for "
                                 f"{len(self.points_to_evaluate)} points_to_evaluate; give one per point")
        self.optuna_space = None if self.define_by_run else space
        self.user_sampler, self.seed = sampler, seed
        self.study_name, self.storage, self.evaluated_rewards = study_name, storage, evaluated_rewards

    def make_sampler(self):
        return self.user_sampler or samplers.TPESampler(seed=self.seed)

    def study_args(self, name: str) -> dict:
        if self.storage is None:
            return {"study_name": self.study_name or name}
        return {"study_name": self.study_name or "optuna", "storage": self.storage, "load_if_exists": True}

    def setup_study(self, study) -> None:
        """Tell the sampler the points already evaluated (Ray's `add_evaluated_point`), once per study."""
        if not self.evaluated_rewards:
            return
        import optuna
        dists = self.space.distributions()
        known = {(tuple(sorted(t.params.items())), t.value) for t in study.get_trials(deepcopy=False)}
        for point, reward in zip(self.points_to_evaluate, self.evaluated_rewards):
            params = self._encode_point(point)
            if (tuple(sorted(params.items())), reward) in known:   # a resumed experiment, or a persistent study
                continue
            study.add_trial(optuna.trial.create_trial(value=reward, params=params,
                                                      distributions={k: dists[k] for k in params}))

    @property
    def points_to_run(self) -> list:
        return [] if self.evaluated_rewards else self.points_to_evaluate   # with rewards: told, not run

    def set_search_space(self, config: dict | None) -> SearchSpace:
        if self.optuna_space:
            config = dict(config or {})
            for name, dist in self.optuna_space.items():
                if not isinstance(dist, od.BaseDistribution):
                    raise TypeError(f"OptunaSearch(space=...) values must be Optuna distributions; "
                                    f"{name!r} is {type(dist).__name__}")
                config[name] = _OptunaDomain(dist)
        space = super().set_search_space(config)
        if self.define_by_run is not None and space.domains:
            names = ", ".join(path_name(p) for p, _ in space.domains)
            raise ValueError(f"OptunaSearch(space=<define-by-run function>) samples every parameter itself, but "
                             f"the config also has search spaces ({names}); keep those in the function")
        return space

    def suggest(self, study, index: int):
        if self.define_by_run is None:
            return super().suggest(study, index)
        from raylite.tune.metrics import flatten
        if index < len(self.points_to_evaluate):
            study.enqueue_trial(flatten(self.points_to_evaluate[index]))
        trial = study.ask()
        extra = self.define_by_run(trial)
        if extra is not None and not isinstance(extra, dict):
            raise TypeError(f"the define-by-run function given as OptunaSearch(space=...) must return None or a "
                            f"dict of constants, got {type(extra).__name__}")
        config = self.space.resolve({}, {})
        for name, value in trial.params.items():
            node = config
            *parents, leaf = name.split("/")
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = value
        config.update(extra or {})
        return config, trial

    def describe(self) -> str:
        return f"OptunaSearch ({type(self.sampler).__name__})"


class ConcurrencyLimiter(Searcher):
    """Ray's `ConcurrencyLimiter(searcher, max_concurrent)`: at most `max_concurrent` trials of the
    wrapped searcher run at once. `tune.run` and `Tuner` unwrap it into their
    `max_concurrent_trials` bound (the smaller one wins), so trials are held back, not skipped."""

    @property
    def objectives(self):
        return self.searcher.objectives

    def __init__(self, searcher: Searcher, max_concurrent: int, batch: bool = False):
        check_searcher(searcher, "ConcurrencyLimiter(searcher=...)")
        if not isinstance(max_concurrent, int) or isinstance(max_concurrent, bool) or max_concurrent < 1:
            raise ValueError(f"ConcurrencyLimiter(max_concurrent=...) must be an integer >= 1, got {max_concurrent!r}")
        if batch:
            raise NotImplementedError("ConcurrencyLimiter(batch=True) (wait for a whole batch before suggesting "
                                      "more) is not supported by raylite.tune; use batch=False")
        self.searcher, self.max_concurrent, self.batch = searcher, max_concurrent, batch

    @property
    def metric(self):
        return self.searcher.metric

    @property
    def mode(self):
        return self.searcher.mode


def _objectives(metric, mode) -> list[tuple[str, str]]:
    """Ray's multi-objective form, metric=["loss", "latency"], mode=["min", "min"], as pairs."""
    if not isinstance(metric, (list, tuple)) or not isinstance(mode, (list, tuple)) or len(metric) != len(mode) \
            or not metric:
        raise ValueError(f"OptunaSearch: for several objectives give metric and mode as lists of the same length, "
                         f"got metric={metric!r}, mode={mode!r}")
    for i, (m, d) in enumerate(zip(metric, mode)):
        if not isinstance(m, str):
            raise ValueError(f"OptunaSearch(metric[{i}]={m!r}): each objective's metric is a result name (str)")
        check_mode(d, "OptunaSearch", f"mode[{i}]", required=True)
    return list(zip(metric, mode))


def unwrap_limiter(search_alg, max_concurrent_trials: int | None) -> tuple:
    """(searcher, max_concurrent_trials) with a ConcurrencyLimiter's or BasicVariantGenerator's
    `max_concurrent` folded into the bound (the smallest wins)."""
    bounds = [max_concurrent_trials]
    while True:
        bounds.append(getattr(search_alg, "max_concurrent", None))
        if not isinstance(search_alg, ConcurrencyLimiter):
            break
        search_alg = search_alg.searcher
    bounds = [b for b in bounds if b]
    return search_alg, min(bounds) if bounds else None


class _OptunaDomain(Domain):
    """A raw Optuna distribution used as a domain."""

    def __init__(self, dist):
        self.dist = dist

    def to_optuna(self):
        return self.dist

    def encode(self, value):
        return value

    def decode(self, value):
        return value


def __getattr__(name: str):
    """`tune.search.Repeater` (repeater.py), loaded on first use as Ray's module is."""
    if name == "Repeater":
        from raylite.tune.search.repeater import Repeater
        return Repeater
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
