"""Population Based Training (Ray's `PopulationBasedTraining`) and its replay.

At each perturbation point of a trial (`result[time_attr]` at least `perturbation_interval` past
its previous one, and past `burn_in_period`), the trials are ranked by their last score there:
- a trial in the top `quantile_fraction` keeps going; its latest checkpoint is what others clone;
- a trial in the bottom one exploits: it takes a random top trial's checkpoint and that trial's
  config, explored (each of `hyperparam_mutations` resampled with `resample_probability`, else
  perturbed: numbers times 0.8 or 1.2, list values moved to a neighbour; then `custom_explore_fn`).

The runner (runner.py) stops an exploiting trial and starts it again from the copied checkpoint
with the new config (EXPLOIT); with `synch=True` every trial stops at its point (PAUSE) until all
have reached it, then they are ranked together and all start again. A class trainable checkpoints
at these points by itself (`checkpoint_points`); a function trainable must report a checkpoint
at them (as in Ray). Each exploit is logged as Ray logs it: `pbt_global.txt` and
`pbt_policy_<trial_id>.txt` (the trial's lineage) in the experiment directory, which
`PopulationBasedTrainingReplay` replays; each result carries the trial's config at that point.
"""
from __future__ import annotations

import copy
import json
import math
import os
import random
from typing import Callable

from raylite.tune._validate import check_mode
from raylite.tune.metrics import is_finite
from raylite.tune.schedulers import CONTINUE, EXPLOIT, PAUSE, TrialScheduler
from raylite.tune.search_space import Domain


class _State:
    __slots__ = ("last_time", "last_score", "last_checkpoint", "last_result", "orig_tag", "finished")

    def __init__(self, tag: str):
        self.last_time, self.last_score, self.last_checkpoint, self.finished = 0.0, None, None, False
        self.last_result: dict = {}
        self.orig_tag = tag


def explore(config: dict, mutations: dict, resample_probability: float, perturbation_factors=(1.2, 0.8),
            custom_explore_fn: Callable | None = None) -> dict:
    """Ray's explore step: a copy of `config` with every key of `mutations` resampled or perturbed."""
    new = copy.deepcopy(config)
    for key, spec in mutations.items():
        if isinstance(spec, dict):
            new[key] = explore(config.get(key, {}), spec, resample_probability, perturbation_factors)
        elif isinstance(spec, (list, tuple)):
            if random.random() < resample_probability or config.get(key) not in spec:
                new[key] = random.choice(spec)
            else:
                i = list(spec).index(config[key]) + random.choice([-1, 1])
                new[key] = spec[min(max(i, 0), len(spec) - 1)]
        elif random.random() < resample_probability or key not in config:
            new[key] = _sample(spec)
        else:
            value = config[key] * random.choice(perturbation_factors)
            new[key] = int(value) if isinstance(config[key], int) else value
    if custom_explore_fn is not None:
        new = custom_explore_fn(new)
        if not isinstance(new, dict):
            raise TypeError(f"custom_explore_fn must return the new config (a dict), got {type(new).__name__}")
    return new


def _sample(spec):
    return spec.sample(random_state=random.randint(0, 2**31 - 1)) if isinstance(spec, Domain) else spec()


def _fill(config: dict, mutations: dict) -> None:
    """Ray's `_fill_config`: a mutated key the config lacks gets a first value from its mutation."""
    for key, spec in mutations.items():
        if isinstance(spec, dict):
            _fill(config.setdefault(key, {}), spec)
        elif key not in config:
            config[key] = random.choice(spec) if isinstance(spec, (list, tuple)) else _sample(spec)


def _check_mutations(mutations: dict, where: str = "hyperparam_mutations") -> None:
    for key, spec in mutations.items():
        if isinstance(spec, dict):
            _check_mutations(spec, f"{where}[{key!r}]")
        elif isinstance(spec, (list, tuple)):
            if not spec:
                raise ValueError(f"PopulationBasedTraining({where}[{key!r}]=[]): give at least one value")
        elif not isinstance(spec, Domain) and not callable(spec):
            raise TypeError(f"PopulationBasedTraining({where}[{key!r}]={spec!r}): each mutation must be a list of "
                            f"values, a tune search space (tune.uniform(...)), a function returning a value, or "
                            f"a dict of those")


class PopulationBasedTraining(TrialScheduler):
    """Ray's PBT scheduler (see the module docstring). `log_config=False` skips the policy files."""

    needs_metric = True
    mutates_config = True

    def __init__(self, time_attr: str = "time_total_s", metric: str | None = None, mode: str | None = None,
                 perturbation_interval: float = 60.0, burn_in_period: float = 0.0,
                 hyperparam_mutations: dict | None = None, quantile_fraction: float = 0.25,
                 resample_probability: float = 0.25, perturbation_factors: tuple = (1.2, 0.8),
                 custom_explore_fn: Callable | None = None, log_config: bool = True,
                 require_attrs: bool = True, synch: bool = False):
        hyperparam_mutations = hyperparam_mutations or {}
        if not isinstance(hyperparam_mutations, dict):
            raise TypeError(f"PopulationBasedTraining(hyperparam_mutations=...) must be a dict, "
                            f"got {type(hyperparam_mutations).__name__}")
        if not hyperparam_mutations and custom_explore_fn is None:
            raise ValueError("PopulationBasedTraining: give hyperparam_mutations, custom_explore_fn or both "
                             "(what explore changes)")
        if custom_explore_fn is not None and not callable(custom_explore_fn):
            raise TypeError(f"PopulationBasedTraining(custom_explore_fn=...) must be a function config -> config, "
                            f"got {type(custom_explore_fn).__name__}")
        _check_mutations(hyperparam_mutations)
        if not is_finite(perturbation_interval) or perturbation_interval <= 0:
            raise ValueError(f"PopulationBasedTraining(perturbation_interval={perturbation_interval!r}) must be > 0")
        if not is_finite(burn_in_period) or burn_in_period < 0:
            raise ValueError(f"PopulationBasedTraining(burn_in_period={burn_in_period!r}) must be >= 0")
        if not is_finite(quantile_fraction) or not 0 <= quantile_fraction <= 0.5:
            raise ValueError(f"PopulationBasedTraining(quantile_fraction={quantile_fraction!r}) must be "
                             f"between 0 and 0.5")
        if not is_finite(resample_probability) or not 0 <= resample_probability <= 1:
            raise ValueError(f"PopulationBasedTraining(resample_probability={resample_probability!r}) must be "
                             f"between 0 and 1")
        check_mode(mode, type(self).__name__)
        if not isinstance(time_attr, str):
            raise TypeError(f"PopulationBasedTraining(time_attr={time_attr!r}) must be a result key")
        self.time_attr, self.metric, self.mode = time_attr, metric, mode
        self.interval, self.burn_in = float(perturbation_interval), float(burn_in_period)
        self.mutations, self.quantile_fraction = hyperparam_mutations, quantile_fraction
        self.resample_probability, self.perturbation_factors = resample_probability, tuple(perturbation_factors)
        self.custom_explore_fn, self.log_config = custom_explore_fn, log_config
        self.require_attrs, self.synch = require_attrs, synch
        self.states: dict[str, _State] = {}
        self.trials: dict = {}   # trial id -> trial
        self.experiment_dir: str | None = None
        self.num_perturbations = 0
        self.num_checkpoints = 0

    # ------------------------------------------------------------------ hooks the runner calls
    def checkpoint_points(self) -> dict:
        """When a class trainable saves a checkpoint by itself (trainable.py): at these points."""
        return {"time_attr": self.time_attr, "interval": self.interval, "burn_in": self.burn_in}

    def setup_experiment(self, path: str) -> None:
        self.experiment_dir = path

    def on_trial_add(self, trial) -> None:
        _fill(trial.config, self.mutations)
        self.states[trial.trial_id] = _State(trial.experiment_tag)
        self.trials[trial.trial_id] = trial

    def on_trial_complete(self, trial) -> None:
        if trial.trial_id in self.states:
            self.states[trial.trial_id].finished = True

    def on_result(self, trial, result: dict) -> str:
        t, score = result.get(self.time_attr), result.get(self.metric)
        if not is_finite(t) or not is_finite(score):
            if self.require_attrs and (self.time_attr not in result or self.metric not in result):
                raise RuntimeError(f"PopulationBasedTraining: trial {trial.trial_id}'s result has no "
                                   f"{self.time_attr if self.time_attr not in result else self.metric!r} "
                                   f"(keys: {sorted(result)}); report it, or pass require_attrs=False")
            return CONTINUE
        state = self.states.setdefault(trial.trial_id, _State(trial.experiment_tag))
        self.trials.setdefault(trial.trial_id, trial)
        if t < self.burn_in or t - state.last_time < self.interval:
            return CONTINUE
        state.last_time, state.last_result = t, result
        state.last_score = score if self.mode == "max" else -score
        if self.synch:
            state.last_checkpoint = trial.checkpoint_path
            return PAUSE
        lower, upper = self._quantiles({tid: s for tid, s in self.states.items()
                                        if s.last_score is not None and not s.finished})
        if trial.trial_id in upper:
            state.last_checkpoint = trial.checkpoint_path
            self.num_checkpoints += 1
            return CONTINUE
        if trial.trial_id in lower and self._exploit(trial, self.trials[random.choice(upper)]):
            return EXPLOIT
        return CONTINUE

    def release(self, paused: list, trials: list, more_coming: bool) -> tuple[list, list]:
        """Synch mode: once every unfinished trial is paused at its point (and none is still to be
        created), rank them together, set each bottom one's exploit, and let them all go on."""
        if not self.synch or not paused or more_coming:
            return [], []
        if any(not t.is_finished and t not in paused for t in trials):
            return [], []
        lower, upper = self._quantiles({t.trial_id: self.states[t.trial_id] for t in paused})
        by_id = {t.trial_id: t for t in paused}
        for tid in lower:
            self._exploit(by_id[tid], by_id[random.choice(upper)])
        return list(paused), []

    # ------------------------------------------------------------------ ranking and exploiting
    def _quantiles(self, states: dict) -> tuple[list, list]:
        """(bottom, top) trial ids by last score, `quantile_fraction` of them each, at most half."""
        ranked = sorted(states, key=lambda tid: states[tid].last_score)
        if len(ranked) <= 1:
            return [], []
        n = int(math.ceil(len(ranked) * self.quantile_fraction))
        n = min(n, len(ranked) // 2)
        return (ranked[:n], ranked[-n:]) if n else ([], [])

    def _exploit(self, trial, clone) -> bool:
        """Set `trial.restart` to the clone's checkpoint and its explored config; False when the clone
        has no checkpoint to give (then the trial goes on as it is, as in Ray)."""
        source = self.states[clone.trial_id].last_checkpoint if clone is not trial else trial.checkpoint_path
        if clone is trial or not source or not os.path.isdir(source):
            return False
        new_config = explore(clone.config, self.mutations, self.resample_probability, self.perturbation_factors,
                             self.custom_explore_fn)
        trial.restart = (new_config, source)
        self.num_perturbations += 1
        if self.log_config and self.experiment_dir:
            self._log(trial, clone, new_config)
        return True

    def _log(self, trial, clone, new_config: dict) -> None:
        """Ray's policy records: [tag, clone's tag, iteration, clone's iteration, clone's config, new
        config], in pbt_global.txt and, after the clone's lineage, in the trial's own file."""
        from raylite.tune.metrics import json_default
        mine, theirs = self.states[trial.trial_id], self.states[clone.trial_id]
        for t, st in ((trial, mine), (clone, theirs)):
            st.orig_tag = st.orig_tag or t.experiment_tag   # set once the runner tagged the trial
        line = json.dumps([mine.orig_tag, theirs.orig_tag, trial.last_result.get("training_iteration", 0),
                           theirs.last_result.get("training_iteration", clone.last_result.get("training_iteration", 0)),
                           clone.config, new_config], default=json_default)
        with open(os.path.join(self.experiment_dir, "pbt_global.txt"), "a") as f:
            f.write(line + "\n")
        source = os.path.join(self.experiment_dir, f"pbt_policy_{clone.trial_id}.txt")
        lineage = open(source).read() if os.path.exists(source) else ""
        with open(os.path.join(self.experiment_dir, f"pbt_policy_{trial.trial_id}.txt"), "w") as f:
            f.write(lineage + line + "\n")

    def describe(self) -> str:
        return (f"PopulationBasedTraining{' (synch)' if self.synch else ''}: {self.num_perturbations} "
                f"perturbations")


class PopulationBasedTrainingReplay(TrialScheduler):
    """Ray's replay of one PBT trial's schedule from its `pbt_policy_<trial_id>.txt`: the trial starts
    with the lineage's first config and changes to each later one at the iteration PBT changed it,
    restarting from its own latest checkpoint. Run it with one trial (num_samples=1)."""

    mutates_config = True

    def __init__(self, policy_file: str):
        if not os.path.exists(policy_file):
            raise ValueError(f"PopulationBasedTrainingReplay(policy_file={policy_file!r}): no such file")
        with open(policy_file) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        if not lines:
            raise ValueError(f"PopulationBasedTrainingReplay: {policy_file} holds no policy")
        policy, last_new_tag, config = [], None, None
        for old_tag, new_tag, _old_step, new_step, old_conf, new_conf in reversed(lines):
            if last_new_tag is not None and old_tag != last_new_tag:
                break   # another trial took over the lineage before this: replay from here
            last_new_tag, config = new_tag, old_conf
            policy.append((new_step, new_conf))
        self.config, self.policy = config, list(reversed(policy))
        self.time_attr = "training_iteration"

    def checkpoint_points(self) -> dict:
        return {"time_attr": self.time_attr, "at": [step for step, _ in self.policy]}

    def on_trial_add(self, trial) -> None:
        trial.config.clear()
        trial.config.update(copy.deepcopy(self.config))

    def on_result(self, trial, result: dict) -> str:
        step = result.get(self.time_attr)
        if not self.policy or not is_finite(step) or step < self.policy[0][0]:
            return CONTINUE
        _, new_config = self.policy.pop(0)
        if not trial.checkpoint_path:
            raise RuntimeError(f"PopulationBasedTrainingReplay: trial {trial.trial_id} changes its config at "
                               f"{self.time_attr}={step:g} but has no checkpoint to restart from")
        trial.restart = (copy.deepcopy(new_config), trial.checkpoint_path)
        return EXPLOIT

    def describe(self) -> str:
        return f"PopulationBasedTrainingReplay: {len(self.policy)} config changes to go"
