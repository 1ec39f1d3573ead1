"""The searchers' base, `Searcher` (Ray's `ray.tune.search.searcher.Searcher`): what the runner
asks every search algorithm for. Below the concrete searchers (search/__init__.py) and Repeater
(repeater.py), which build on it."""
from __future__ import annotations

from optuna import distributions as od
from optuna import samplers

from raylite.tune._validate import check_mode
from raylite.tune.metrics import flatten
from raylite.tune.search_space import SearchSpace, path_name


class Searcher:
    """Base: subclasses provide the Optuna sampler; `suggest` turns an Optuna trial into a config."""

    allows_grid = True
    needs_metric = False
    objectives: list | None = None   # [(metric, mode), ...] for a multi-objective search

    def __init__(self, metric: str | None = None, mode: str | None = None, points_to_evaluate=None):
        check_mode(mode, type(self).__name__)
        self.metric, self.mode = metric, mode
        self.points_to_evaluate = list(points_to_evaluate or [])
        self.space: SearchSpace | None = None
        self._sampler = None

    def make_sampler(self) -> samplers.BaseSampler:
        raise NotImplementedError

    @property
    def sampler(self) -> samplers.BaseSampler:
        if self._sampler is None:
            self._sampler = self.make_sampler()
        return self._sampler

    def set_search_space(self, config: dict | None) -> SearchSpace:
        space = SearchSpace(config)
        if space.grids and not self.allows_grid:
            names = ", ".join(path_name(p) for p, _ in space.grids)
            raise ValueError(
                f"{type(self).__name__} cannot combine grid_search ({names}) with its sampler. Use "
                f"tune.choice([...]) for those parameters (with "
                f"sampler=optuna.samplers.GridSampler({{...}}) every combination is tried), or leave "
                f"search_alg unset: the default search runs every grid point num_samples times with "
                f"random sampling for the rest.")
        self.space = space
        return space

    def suggest(self, study, index: int, keep: dict | None = None):
        """(config, optuna trial) for the index-th trial of the experiment; `keep`: sampled
        values (Optuna params) to reuse rather than draw."""
        space = self.space
        dists = space.distributions()
        fixed: dict = dict(keep or {})
        grid = space.grid_point(index % space.num_grid_points) if space.grids else {}
        for path, value in grid.items():
            name, stored, dist = space.grid_param(path, value)
            fixed[name], dists[name] = stored, dist
        if index < len(self.points_to_run):
            fixed.update(self._encode_point(self.points_to_run[index]))
        if fixed:
            study.enqueue_trial(fixed)
        trial = study.ask(dists)
        sampled = {name: trial.params[name] for name in dists}
        return space.resolve(grid, sampled), trial

    @property
    def points_to_run(self) -> list:
        """The configs the first trials run (points_to_evaluate, in order)."""
        return self.points_to_evaluate

    def restore(self, study, params: dict, distributions: dict):
        """An Optuna trial with the given params again (a resumed trial keeps its config)."""
        dists = {k: od.json_to_distribution(v) for k, v in distributions.items()}
        if params:
            study.enqueue_trial(params)
        return study.ask(dists)

    def group(self, index: int, total: int | None) -> tuple[int, int] | None:
        """(first index, size) of the trials that share the index-th one's Optuna trial and are
        told as one (Repeater); None: it has its own."""
        return None

    def resume_group(self, first: int, config: dict, trial) -> None:
        """A resumed experiment's last group, short of repeats, goes on with this config and trial."""

    def _encode_point(self, point: dict) -> dict:
        domains = {path_name(p): d for p, d in self.space.domains}
        out = {}
        for name, value in flatten(point).items():
            if name not in domains:
                raise ValueError(f"points_to_evaluate names {name!r}, which is not a sampled parameter "
                                 f"of the search space ({sorted(domains)})")
            out[name] = domains[name].encode(value)
        return out

    def study_args(self, name: str) -> dict:
        """`optuna.create_study` arguments besides sampler, pruner and direction."""
        return {"study_name": name}

    def setup_study(self, study) -> None:
        """Called once the experiment's study exists, before the first trial is asked for."""

    def describe(self) -> str:
        return type(self).__name__


def check_searcher(searcher, what: str) -> None:
    if not isinstance(searcher, Searcher):
        raise TypeError(f"{what} must be a tune searcher (OptunaSearch, BasicVariantGenerator), "
                        f"got {type(searcher).__name__}")
