"""Ray's `Repeater(searcher, repeat, set_index)`: each config the searcher suggests runs `repeat`
times (noisy objectives); with `set_index` each repeat gets `config["__trial_index__"]` = 0..repeat-1.

Each repeat is a Tune trial of its own (results, directory, checkpoints), but as in Ray the searcher
hears of the config once: the repeats share one Optuna trial, told when the group's last repeat
ends (records.tell), with the mean of the repeats' last metric values. A repeat without a finite
value (it errored before reporting) is left out of the mean, as Ray's nanmean leaves it; with no
value at all the Optuna trial fails. An experiment that stops (time budget, a stopper) tells a
group of what its repeats that ran gave; a resumed one recomputes the told groups from the
repeats' own records (each trial.json keeps its repeat's value) and lets the unfinished ones share
one Optuna trial again. A pruner (ASHA) judges the shared trial on its first repeat's value at
each step, so a config's repeats go on or stop alike (Ray's schedulers judge each repeat).
"""
from __future__ import annotations

import copy

from raylite.tune.search.searcher import Searcher, check_searcher

TRIAL_INDEX = "__trial_index__"


class Repeater(Searcher):
    def __init__(self, searcher: Searcher, repeat: int = 1, set_index: bool = True):
        check_searcher(searcher, "Repeater(searcher=...)")
        if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
            raise ValueError(f"Repeater(repeat={repeat!r}) must be an integer >= 1")
        self.searcher, self.repeat, self.set_index = searcher, repeat, set_index
        self.metric, self.mode = searcher.metric, searcher.mode
        self.needs_metric, self.allows_grid = searcher.needs_metric, searcher.allows_grid
        self.objectives = searcher.objectives
        self._group: tuple = (-1, None, None)   # (group number, config, shared Optuna trial) of the last suggestion

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
            self._group = (group, config, trial)
        _, config, trial = self._group   # later repeats share the first's Optuna trial
        config = copy.deepcopy(config)
        if self.set_index:
            config[TRIAL_INDEX] = i
        return config, trial

    def group(self, index: int, total: int | None) -> tuple[int, int] | None:
        """(first index, size) of the index-th trial's group; the last is short if `total` cuts it."""
        if self.repeat == 1:
            return None
        first = index - index % self.repeat
        return first, self.repeat if total is None else min(self.repeat, total - first)

    def resume_group(self, first: int, config: dict, trial) -> None:
        """A resumed experiment's last group lacks repeats: they join it (its config, its Optuna trial)."""
        config = {k: v for k, v in config.items() if k != TRIAL_INDEX}
        self._group = (first // self.repeat, config, trial)

    def restore(self, study, params: dict, distributions: dict):
        return self.searcher.restore(study, params, distributions)

    def study_args(self, name: str) -> dict:
        return self.searcher.study_args(name)

    def setup_study(self, study) -> None:
        self.searcher.setup_study(study)

    def describe(self) -> str:
        return f"{self.searcher.describe()}, each config {self.repeat} times"
