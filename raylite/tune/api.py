"""`tune.run`: argument checks, then one TrialRunner (runner.py) for the experiment."""
from __future__ import annotations

from typing import Callable

from raylite.train.config import CheckpointConfig, check_name
from raylite.tune import _validate, panel
from raylite.tune.analysis import ExperimentAnalysis
from raylite.train.config import check_fail_fast, check_max_failures
from raylite.tune.search import BasicVariantGenerator, Searcher, unwrap_limiter
from raylite.tune.search.searcher import check_searcher
from raylite.tune.schedulers import OptunaPruner, as_scheduler
from raylite.tune.resources import normalize_resources, per_config_resources, split_resources
from raylite.tune.session import inner_trainable
from raylite.tune.trainable import is_trainable_class
from raylite.tune.trial import ERROR
from raylite.tune.trial_env import log_files


class TuneError(Exception):
    """Raised by `tune.run` when trials failed (with `raise_on_failed_trial=True`)."""


class Callback:
    """Ray Tune's experiment callbacks; override the hooks you need. They run in the driver;
    on_trial_complete / on_trial_error run once the trial's final state is on disk. `setup` comes
    before the first trial, `on_step_begin`/`on_step_end` around each pass of the experiment loop,
    `on_checkpoint` after a result that carried one, `on_trial_recover` when a failed trial is
    retried, `on_trial_restore` when a scheduler (PBT, HyperBand) starts a trial again from a
    checkpoint. `on_trial_save` is never called: checkpoints come with results (`on_checkpoint`)."""

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info): ...
    def on_step_begin(self, iteration, trials, **info): ...
    def on_step_end(self, iteration, trials, **info): ...
    def on_trial_start(self, iteration, trials, trial, **info): ...
    def on_trial_result(self, iteration, trials, trial, result, **info): ...
    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info): ...
    def on_trial_recover(self, iteration, trials, trial, **info): ...
    def on_trial_save(self, iteration, trials, trial, **info): ...
    def on_trial_restore(self, iteration, trials, trial, **info): ...
    def on_trial_complete(self, iteration, trials, trial, **info): ...
    def on_trial_error(self, iteration, trials, trial, **info): ...
    def on_experiment_end(self, trials, **info): ...


def run(trainable, config: dict | None = None, num_samples: int = 1, resources_per_trial: dict | None = None,
        metric: str | None = None, mode: str | None = None, search_alg: Searcher | None = None, scheduler=None,
        stop=None, time_budget_s: float | None = None, max_concurrent_trials: int | None = None,
        storage_path: str | None = None, name: str | None = None, resume: bool | str = False, max_failures: int = 0,
        raise_on_failed_trial: bool = True, verbose: int = 1, callbacks: list | None = None,
        local_dir: str | None = None, checkpoint_config: CheckpointConfig | None = None,
        fail_fast: bool | str = False, log_to_file: bool | str | tuple = False,
        trial_name_creator: Callable | None = None, trial_dirname_creator: Callable | None = None,
        reuse_actors: bool | None = None, progress_reporter=None) -> ExperimentAnalysis:
    """Run `trainable(config)` for every sampled config; returns an ExperimentAnalysis.

    The trainable calls `tune.report({...})` once per iteration (and may pass `checkpoint=`).
    docs/tune.md has the whole story (search, schedulers, files, resume).

    Args:
        trainable: a function of `config`, or a `tune.Trainable` subclass (or a `with_resources` /
            `with_parameters` wrapper of either).
        config: the search space: values, `tune.uniform(...)`-style domains, `grid_search`, nested dicts.
        num_samples: configs to sample (each grid point that many times; -1: until `time_budget_s`).
        resources_per_trial: what each trial holds, `{"cpu": 1, "gpu": 0.5, "custom": 1}` or a
            `PlacementGroupFactory` (summed); default one CPU.
        metric: the reported metric that ranks trials (`"a/b"` reaches a nested one).
        mode: `"min"` or `"max"` for `metric`.
        search_alg: `OptunaSearch`, `BasicVariantGenerator` (the default) or a `ConcurrencyLimiter`.
        scheduler: `FIFOScheduler` (default), `ASHAScheduler`, `MedianStoppingRule`, or an Optuna pruner.
        stop: `{"metric": bound}`, a function `(trial_id, result) -> bool`, or a `Stopper`.
        time_budget_s: seconds after which the experiment ends (running trials stop).
        max_concurrent_trials: trials running at once (None: as many as resources allow).
        storage_path: the experiments' root (default `$RAYLITE_RESULTS_DIR` or `~/raylite_results`).
        name: the experiment's directory under `storage_path`.
        resume: True/`"AUTO"` continues the named experiment; `"AUTO+ERRORED"` also retries errored
            trials, `"AUTO+RESTART_ERRORED"` restarts them.
        max_failures: retries of a failing trial from its latest checkpoint (-1: always).
        raise_on_failed_trial: raise `TuneError` at the end if a trial ended in ERROR.
        verbose: 0 silent, 1 status table, 2 a line per finished trial, 3 a line per result.
        callbacks: `tune.Callback` subclasses, called with Ray's hooks.
        local_dir: Ray's old name for `storage_path`.
        checkpoint_config: how many checkpoints each trial keeps (`tune.CheckpointConfig`).
        fail_fast: True stops the experiment at the first trial error; `"raise"` also raises it.
        log_to_file: also write each trial's stdout/stderr into its directory (Ray's forms).
        trial_name_creator: `trial -> str`, the trial's name, as in Ray.
        trial_dirname_creator: `trial -> str`, the trial's directory name, as in Ray.
        reuse_actors: a class trainable's object stays in its worker for the next trial, which takes
            it through `reset_config` when that returns True (function trainables: no effect).
        progress_reporter: a `tune.CLIReporter` shapes the status table; a `ProgressReporter` subclass replaces it.
    """
    from raylite.tune import reporters
    from raylite.tune.runner import TrialRunner
    trainable, resources_per_trial = split_resources(trainable, resources_per_trial)
    _check_arguments(trainable, num_samples, max_concurrent_trials, max_failures, stop)
    _validate.check_verbose(verbose)
    _validate.check_resource_grid(resources_per_trial)
    time_budget_s = _validate.time_budget(time_budget_s)
    check_name(name, "name")
    if checkpoint_config is not None and not isinstance(checkpoint_config, CheckpointConfig):
        raise TypeError(f"checkpoint_config must be a tune.CheckpointConfig, got {type(checkpoint_config).__name__}")
    if checkpoint_config is not None and not is_trainable_class(inner_trainable(trainable)):
        checkpoint_config.check_function_trainable("a function trainable")
    check_fail_fast(fail_fast, max_failures)
    reporters.check(progress_reporter)
    log_files(log_to_file)   # a ValueError for anything but Ray's forms, before any trial starts
    _validate.check_trial_namers(trial_name_creator=trial_name_creator, trial_dirname_creator=trial_dirname_creator)
    resume, errored = parse_resume(resume)
    search_alg, max_concurrent_trials = unwrap_limiter(search_alg, max_concurrent_trials)
    search_alg = search_alg if search_alg is not None else BasicVariantGenerator()
    check_searcher(search_alg, "search_alg")
    scheduler = as_scheduler(scheduler)
    metric, mode = _resolve_metric(search_alg, scheduler, metric, mode)
    resource_fn = per_config_resources(trainable, resources_per_trial)
    if resource_fn is not None:
        resources_per_trial = {"cpu": 0}   # what the experiment holds besides each trial's own
    runner = TrialRunner(trainable, config, num_samples, normalize_resources(resources_per_trial), metric, mode,
                         search_alg, scheduler, stop, time_budget_s, max_concurrent_trials,
                         storage_path or local_dir, name, resume, max_failures, verbose, callbacks, checkpoint_config,
                         fail_fast, errored, trial_name_creator, trial_dirname_creator, log_to_file,
                         reuse_actors=bool(reuse_actors), resource_fn=resource_fn)
    runner.reporter = reporters.configure(runner.reporter, progress_reporter)
    with panel.published(runner):   # to the raylite CLI and dashboard
        analysis = runner.run()
    failed = [t for t in analysis.trials if t.status == ERROR]
    if failed and raise_on_failed_trial:
        raise TuneError(f"Trials did not complete: {failed} (see each trial's error.txt under "
                        f"{runner.storage.path}; raise_on_failed_trial=False returns the analysis instead)")
    return analysis


def parse_resume(resume: bool | str) -> tuple[bool, str | None]:
    """Ray's `resume`: True/"AUTO" continue unfinished trials; "AUTO+ERRORED" also resumes errored
    ones from their latest checkpoint, "AUTO+RESTART_ERRORED" reruns them from scratch.
    Returns (resume, what to do with errored trials: None, "resume" or "restart")."""
    if isinstance(resume, bool):
        return resume, None
    if not isinstance(resume, str):
        raise TypeError(f"resume must be a bool or a string like 'AUTO+ERRORED', got {type(resume).__name__}")
    base, *suffixes = resume.upper().split("+")
    if base not in ("AUTO", "LOCAL") or len(suffixes) > 1:
        raise ValueError(f"resume={resume!r}: expected True, 'AUTO', 'AUTO+ERRORED' or 'AUTO+RESTART_ERRORED'")
    errored = {(): None, ("ERRORED",): "resume", ("RESTART_ERRORED",): "restart"}.get(tuple(suffixes), "?")
    if errored == "?":
        raise ValueError(f"resume={resume!r}: the suffix must be +ERRORED or +RESTART_ERRORED (the *_ONLY forms, "
                         f"which skip unfinished trials, are not supported)")
    return True, errored


def _check_arguments(trainable, num_samples, max_concurrent_trials, max_failures, stop) -> None:
    inner = inner_trainable(trainable)
    if isinstance(inner, type) and not is_trainable_class(inner):
        raise TypeError(f"trainable {inner.__name__} is a class but not a tune.Trainable subclass: subclass "
                        f"tune.Trainable (setup/step/save_checkpoint/load_checkpoint), or pass a function "
                        f"trainable(config) that calls tune.report(...)")
    if not callable(trainable):
        raise TypeError(f"trainable must be a function or a tune.Trainable subclass, got {type(trainable).__name__}")
    _validate.check_num_samples(num_samples)
    if max_concurrent_trials is not None and (not isinstance(max_concurrent_trials, int)
                                              or max_concurrent_trials < 1):
        raise ValueError(f"max_concurrent_trials must be a positive integer, got {max_concurrent_trials!r}")
    check_max_failures(max_failures, "max_failures")
    if stop is not None and not (isinstance(stop, dict) or callable(stop)):
        raise TypeError(f"stop must be a dict, a function (trial_id, result) -> bool or a Stopper, "
                        f"got {type(stop).__name__}")
    _validate.check_stop(stop)


def _resolve_metric(searcher, scheduler, metric, mode):
    _validate.check_mode(mode, "tune.run")
    for part in (searcher, scheduler):
        for attr, value in (("metric", metric), ("mode", mode)):
            own = getattr(part, attr, None)
            if own is not None and value is not None and own != value:
                raise ValueError(f"{type(part).__name__} has {attr}={own!r} but tune.run got {attr}={value!r}")
        metric = metric or part.metric
        mode = mode or part.mode
    if (metric is None) != (mode is None):
        raise ValueError(f"metric and mode go together: got metric={metric!r}, mode={mode!r}")
    needs = [type(p).__name__ for p in (searcher, scheduler) if p.needs_metric]
    if needs and metric is None:
        raise ValueError(f"{' and '.join(needs)} need(s) a metric and mode: pass metric='...' and "
                         f"mode='min'|'max' to tune.run")
    if searcher.objectives and isinstance(scheduler, OptunaPruner):
        raise ValueError(f"{type(scheduler).__name__} cannot prune a multi-objective search (Optuna's pruners judge "
                         f"one value; metric={[m for m, _ in searcher.objectives]}): use FIFOScheduler, "
                         f"MedianStoppingRule or HyperBandScheduler")
    scheduler.metric, scheduler.mode = metric, mode
    return metric, mode
