"""Ray's `Repeater(searcher, repeat, set_index)`: each config the searcher suggests runs `repeat`
times (noisy objectives); with `set_index` each repeat gets `config["__trial_index__"]` = 0..repeat-1.

Each repeat is a trial of its own, with an Optuna trial of its own holding the same parameters, so
the sampler sees every repeat's value where Ray's Repeater tells its searcher their mean (for
TPE this weighs that config `repeat` times, at the spread of its values).
"""
from __future__ import annotations

import copy

from raylite.tune.search import Searcher

TRIAL_INDEX = "__trial_index__"


class Repeater(Searcher):
    def __init__(self, searcher: Searcher, repeat: int = 1, set_index: bool = True):
        if not isinstance(searcher, Searcher):
            raise TypeError(f"Repeater(searcher=...) must be a tune searcher (OptunaSearch, BasicVariantGenerator), "
                            f"got {type(searcher).__name__}")
        if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
            raise ValueError(f"Repeater(repeat={repeat!r}) must be an integer >= 1")
        self.searcher, self.repeat, self.set_index = searcher, repeat, set_index
        self.metric, self.mode = searcher.metric, searcher.mode
        self.needs_metric, self.allows_grid = searcher.needs_metric, searcher.allows_grid
        self.objectives = searcher.objectives
        self._group: tuple = (-1, None, None, None)   # (index, params, distributions, config) of the last suggestion

    @property
    def sampler(self):
        return self.searcher.sampler

    def set_search_space(self, config):
        self.space = self.searcher.set_search_space(config)
        return self.space

    def suggest(self, study, index: int):
        group, i = divmod(index, self.repeat)
        if self._group[0] != group:
            config, trial = self.searcher.suggest(study, group)
            self._group = (group, dict(trial.params), dict(trial.distributions), config)
        else:   # the same parameters again, as a trial of their own
            _, params, dists, config = self._group
            study.enqueue_trial(params)
            trial = study.ask(dists)
        config = copy.deepcopy(config)
        if self.set_index:
            config[TRIAL_INDEX] = i
        return config, trial

    def restore(self, study, params: dict, distributions: dict):
        return self.searcher.restore(study, params, distributions)

    def study_args(self, name: str) -> dict:
        return self.searcher.study_args(name)

    def setup_study(self, study) -> None:
        self.searcher.setup_study(study)

    def describe(self) -> str:
        return f"{self.searcher.describe()}, each config {self.repeat} times"
