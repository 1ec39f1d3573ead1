"""Ray Tune's current entry point, `Tuner(...).fit()` -> `ResultGrid`, as a thin layer over `tune.run`.

    tuner = tune.Tuner(tune.with_resources(trainable, {"cpu": 2}),
                       param_space={"lr": tune.loguniform(1e-4, 1e-1)},
                       tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=20),
                       run_config=tune.RunConfig(name="exp", failure_config=tune.FailureConfig(max_failures=2)))
    best = tuner.fit().get_best_result()

The Tuner only maps its configs onto `tune.run`'s arguments (one runner, one storage layout), with
Ray's Tuner semantics on top: failed trials do not raise (they are in `ResultGrid.errors`), and the
settings are saved as `tuner.pkl` in the experiment directory so `Tuner.restore(path, trainable)`
can continue an interrupted experiment (`tune.run(..., resume=True)` underneath). The trainable
may also be a raylite.train `TorchTrainer`, with `param_space={"train_loop_config": {...},
"scaling_config": ScalingConfig(...)}`: one Train run per trial (trainer_trial.py).
`FailureConfig` and `CheckpointConfig` are raylite.train's classes; `RunConfig` is raylite.train's
plus Tune's `log_to_file`, as Ray's `tune.RunConfig` extends its AIR one.
"""
from __future__ import annotations

import datetime
import os
import pickle
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable

import raylite as ray
from raylite.train.config import CheckpointConfig, FailureConfig
from raylite.train.config import RunConfig as _TrainRunConfig
from raylite.train.result import Result as _TrainResult
from raylite.train.trainer import DataParallelTrainer
from raylite.tune import _validate
from raylite.tune.analysis import ExperimentAnalysis
from raylite.tune.api import TuneError, _check_arguments, run
from raylite.tune.schedulers import as_scheduler
from raylite.tune.search.searcher import Searcher, check_searcher
from raylite.tune.resources import split_resources, with_resources
from raylite.tune.session import Checkpoint
from raylite.tune.metrics import flatten
from raylite.tune.storage import ExperimentStorage
from raylite.tune.trainer_trial import TrainerTrainable, default_concurrency, prepare_param_space
from raylite.tune.trial import ERROR, TERMINATED, Trial
from raylite.tune.trial_env import CHDIR_ENV, log_files

TUNER_FILE = "tuner.pkl"
_DEPRECATED = "DEPRECATED"   # Ray's marker for a deprecated field left unset
_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")

__all__ = ["CheckpointConfig", "FailureConfig", "Result", "ResultGrid", "RunConfig", "TuneConfig", "Tuner"]


# ---------------------------------------------------------------------------- configs
@dataclass
class RunConfig(_TrainRunConfig):
    """Ray's `tune.RunConfig`: raylite.train's, plus `log_to_file` (each trial's stdout and stderr
    also go to files in its directory: True -> `stdout` and `stderr`, a name -> both in that file,
    a pair -> one file each). A Tuner takes raylite.train's RunConfig too."""

    log_to_file: bool | str | tuple = False
    progress_reporter: Any = None   # a tune.CLIReporter or ProgressReporter, as tune.run's

    def __post_init__(self):
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()
        log_files(self.log_to_file)


@dataclass
class TuneConfig:
    """Ray's `TuneConfig`, its fields in its order. As in Ray, each trial runs in its trial
    directory unless the environment sets `RAY_CHDIR_TO_TRIAL_DIR=0`.

    Args:
        mode: `"min"` or `"max"` for `metric`.
        metric: the reported metric that ranks trials.
        search_alg: `OptunaSearch`, `BasicVariantGenerator` (the default) or a `ConcurrencyLimiter`.
        scheduler: `ASHAScheduler`, `MedianStoppingRule`, `FIFOScheduler` or an Optuna pruner.
        num_samples: configs to sample (-1: until `time_budget_s`).
        max_concurrent_trials: trials at once; 0 or None: no limit.
        time_budget_s: seconds (or a `datetime.timedelta`) after which the experiment ends.
        reuse_actors: a class trainable's object stays in its worker for the next trial (through
            `reset_config`); no effect on function trainables.
        trial_name_creator: `trial -> str`, the trial's name.
        trial_dirname_creator: `trial -> str`, the trial's directory name.
        chdir_to_trial_dir: deprecated, as in Ray: an error pointing to `RAY_CHDIR_TO_TRIAL_DIR`.
    """

    mode: str | None = None
    metric: str | None = None
    search_alg: Searcher | None = None
    scheduler: Any = None
    num_samples: int = 1
    max_concurrent_trials: int | None = None
    time_budget_s: float | datetime.timedelta | None = None
    reuse_actors: bool = False
    trial_name_creator: Callable | None = None
    trial_dirname_creator: Callable | None = None
    chdir_to_trial_dir: bool | str = _DEPRECATED

    def __post_init__(self):
        if self.chdir_to_trial_dir != _DEPRECATED:   # Ray's error since 2.8
            raise DeprecationWarning(f"`chdir_to_trial_dir` is deprecated. Use the {CHDIR_ENV} environment variable "
                                     f"instead. Set it to 0 to disable the default behavior of changing the working "
                                     f"directory.")
        _validate.check_trial_namers("TuneConfig.", trial_name_creator=self.trial_name_creator,
                                     trial_dirname_creator=self.trial_dirname_creator)
        _validate.check_mode(self.mode, "TuneConfig")
        if self.metric is not None and not isinstance(self.metric, str):
            raise TypeError(f"TuneConfig.metric must be a metric name (str), got {self.metric!r}")
        if self.search_alg is not None:
            check_searcher(self.search_alg, "TuneConfig.search_alg")
        as_scheduler(self.scheduler)   # a TypeError naming the type for anything else
        _validate.check_num_samples(self.num_samples, "TuneConfig.num_samples")
        if self.max_concurrent_trials is not None and (not _is_int(self.max_concurrent_trials)
                                                       or self.max_concurrent_trials < 0):
            raise ValueError(f"TuneConfig.max_concurrent_trials must be an integer >= 0 (0 or None: no limit), "
                             f"got {self.max_concurrent_trials!r}")
        self.time_budget_s = _validate.time_budget(self.time_budget_s, "TuneConfig.time_budget_s")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# ---------------------------------------------------------------------------- results
class Result(_TrainResult):
    """One trial's outcome (Ray's `tune.Result`): raylite.train's Result, plus `config`, which is
    also `metrics["config"]` as in Ray. `error` is a TuneError holding the trial's traceback."""

    @property
    def config(self) -> dict | None:
        return (self.metrics or {}).get("config")

    @property
    def metrics_dataframe(self):
        """The trial's results as a pandas DataFrame, nested metrics flattened to `a/b` columns
        (as Ray reads progress.csv); None without pandas."""
        try:
            import pandas as pd
        except ImportError:
            return None
        return pd.DataFrame([flatten(r) for r in self.metrics_history])


def _trial_result(trial: Trial) -> Result:
    error = None
    if trial.status == ERROR:
        text = None
        if trial.error_file:
            with open(trial.error_file) as f:
                text = f.read()
        error = TuneError(text or trial.error_msg or "trial failed")
    # metrics_history=None: read from result.json when asked for, so a ResultGrid over thousands of
    # trials does not load every trial's whole history
    return Result(metrics={**trial.last_result, "config": trial.config}, checkpoint=trial.checkpoint, error=error,
                  path=trial.path, metrics_history=None,
                  best_checkpoints=[(Checkpoint(p), r) for p, r in trial.checkpoints if os.path.isdir(p)])


class ResultGrid:
    """What `Tuner.fit()` returns: one `Result` per trial, in trial order, over the experiment's
    `ExperimentAnalysis` (which ranks the trials)."""

    def __init__(self, experiment_analysis: ExperimentAnalysis):
        self._analysis = experiment_analysis
        self._results = [_trial_result(t) for t in experiment_analysis.trials]

    @property
    def experiment_path(self) -> str | None:
        return self._analysis.experiment_path

    @property
    def filesystem(self):
        """None: results are on the local filesystem (Ray gives a pyarrow filesystem)."""
        return None

    def get_best_result(self, metric: str | None = None, mode: str | None = None, scope: str = "last",
                        filter_nan_and_inf: bool = True) -> Result:
        """The best trial's Result by `metric`/`mode` (default: the TuneConfig's); `scope` as in
        `ExperimentAnalysis.get_best_trial`. A single trial is returned as is (as in Ray)."""
        if len(self._results) == 1:
            return self._results[0]
        for name, value in (("metric", metric), ("mode", mode)):
            if not value and not getattr(self._analysis, f"default_{name}") and self._analysis.objectives:
                self._analysis.get_best_trial(metric, mode)   # Ray's refusal, naming the objectives
            if not value and not getattr(self._analysis, f"default_{name}"):
                raise ValueError(f"no {name}: pass get_best_result({name}=...) or set TuneConfig({name}=...)")
        best = self._analysis.get_best_trial(metric, mode, scope, filter_nan_and_inf)
        if best is None:
            raise RuntimeError(f"no best trial for metric {metric or self._analysis.default_metric!r}: no trial "
                               f"reported it" + (", or every value was NaN or infinite (filter_nan_and_inf=False "
                                                 "keeps those)" if filter_nan_and_inf else ""))
        return self._results[self._analysis.trials.index(best)]

    def pareto_front(self) -> list[Result]:
        """The Results of a multi-objective search's Pareto-optimal trials (ExperimentAnalysis.pareto_front)."""
        return [self._results[self._analysis.trials.index(t)] for t in self._analysis.pareto_front()]

    def get_dataframe(self, filter_metric: str | None = None, filter_mode: str | None = None):
        """One row per trial (its last result, or its best by `filter_metric`/`filter_mode`), with
        config/* columns; pandas."""
        if filter_metric:
            _validate.check_mode(filter_mode, "ResultGrid.get_dataframe", "filter_mode", required=True,
                                 when=" with filter_metric")
        return self._analysis.dataframe(metric=filter_metric, mode=filter_mode)

    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, i: int) -> Result:
        return self._results[i]

    def __iter__(self):
        return iter(self._results)

    @property
    def errors(self) -> list[TuneError]:
        return [r.error for r in self._results if r.error]

    @property
    def num_errors(self) -> int:
        return sum(t.status == ERROR for t in self._analysis.trials)

    @property
    def num_terminated(self) -> int:
        return sum(t.status == TERMINATED for t in self._analysis.trials)

    def __repr__(self) -> str:
        return f"ResultGrid<{len(self)} results at {self.experiment_path}, {self.num_errors} errored>"


# ---------------------------------------------------------------------------- the Tuner
def _name_of(trainable) -> str:
    if isinstance(trainable, DataParallelTrainer):
        return type(trainable).__name__
    return getattr(trainable, "__name__", "trainable")


def _check_type(name: str, value, cls: type) -> None:
    if not isinstance(value, cls):
        raise TypeError(f"Tuner: {name} must be a tune.{cls.__name__}, got {type(value).__name__}")


class Tuner:
    """Ray's `Tuner`: configure with `param_space`, `TuneConfig` and `RunConfig`, run with `fit()`.

    Args:
        trainable: a function of `config`, or a `TorchTrainer`/`DataParallelTrainer` (a Train run per trial).
        param_space: the search space (for a trainer: `{"train_loop_config": {...}, "scaling_config": ...}`).
        tune_config: search, scheduler and sampling (a `TuneConfig`).
        run_config: name, storage, stop, failures, checkpoints and callbacks (a `tune.RunConfig`).
    """

    def __init__(self, trainable: Callable | DataParallelTrainer, *, param_space: dict | None = None,
                 tune_config: TuneConfig | None = None, run_config: RunConfig | None = None):
        if param_space is not None and not isinstance(param_space, dict):
            raise ValueError(f"Tuner(param_space=...) must be a dict of values and search spaces "
                             f"(tune.uniform(...), tune.grid_search([...]), ...), got {param_space!r}")
        tune_config = TuneConfig() if tune_config is None else tune_config
        self._trainer = trainable if isinstance(trainable, DataParallelTrainer) else None
        if self._trainer is not None:   # one Train run per trial (trainer_trial.py)
            param_space = prepare_param_space(self._trainer, param_space)
            if run_config is None:   # as in Ray, the trainer's RunConfig, unless the Tuner has one
                run_config = replace(self._trainer.run_config, callbacks=None)
            trainable = with_resources(TrainerTrainable(self._trainer), {"cpu": 0})
        run_config = RunConfig() if run_config is None else run_config
        _check_type("tune_config", tune_config, TuneConfig)
        _check_type("run_config", run_config, _TrainRunConfig)
        failure_config = run_config.failure_config or FailureConfig()
        checkpoint_config = run_config.checkpoint_config or CheckpointConfig()
        _check_type("run_config.failure_config", failure_config, FailureConfig)
        _check_type("run_config.checkpoint_config", checkpoint_config, CheckpointConfig)
        self._trainable, self._resources = split_resources(trainable, None)
        self._max_failures, self._fail_fast = failure_config.max_failures, failure_config.fail_fast
        _check_arguments(self._trainable, tune_config.num_samples, tune_config.max_concurrent_trials or None,
                         self._max_failures, run_config.stop)
        self._trainable_name = _name_of(trainable)
        self._param_space, self._tune_config = param_space, tune_config
        self._run_config = replace(run_config)   # fit() fills in the name; the caller's object stays as it was
        self._resume = False

    def _storage(self) -> ExperimentStorage:
        rc = self._run_config
        if rc.name is None:   # Ray's default, `<trainable>_<time>`, made unique under the storage path
            root = ExperimentStorage(rc.storage_path, "x").root
            base = f"{self._trainable_name}_{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}"
            name, i = base, 1
            while os.path.exists(os.path.join(root, name)):
                name, i = f"{base}_{i}", i + 1
            rc.name = name
        return ExperimentStorage(rc.storage_path, rc.name)

    def fit(self) -> ResultGrid:
        """Run the experiment. Failed trials do not raise: see `ResultGrid.errors`; errors of the
        experiment itself (e.g. resources no machine has) do."""
        storage = self._storage()
        if storage.exists() and not self._resume:
            raise ValueError(f"an experiment already exists at {storage.path}: continue it with "
                             f"tune.Tuner.restore({storage.path!r}, trainable), or choose another "
                             f"RunConfig(name=...) or storage_path")
        self._save(storage)
        tc, rc = self._tune_config, self._run_config
        max_concurrent = tc.max_concurrent_trials or None
        if self._trainer is not None and max_concurrent is None:   # trial tasks hold no CPU: bound them here
            if not ray.is_initialized():
                ray.init()
            max_concurrent = default_concurrency(self._trainer, ray.cluster_resources())
        analysis = run(self._trainable, config=self._param_space, num_samples=tc.num_samples,
                       resources_per_trial=self._resources, metric=tc.metric, mode=tc.mode,
                       search_alg=tc.search_alg, scheduler=tc.scheduler, stop=rc.stop,
                       time_budget_s=tc.time_budget_s, max_concurrent_trials=max_concurrent,
                       storage_path=storage.root, name=storage.name, resume=self._resume,
                       max_failures=self._max_failures, raise_on_failed_trial=False, verbose=rc.verbose,
                       callbacks=rc.callbacks, checkpoint_config=rc.checkpoint_config,
                       fail_fast=self._fail_fast, log_to_file=getattr(rc, "log_to_file", False),
                       trial_name_creator=tc.trial_name_creator, trial_dirname_creator=tc.trial_dirname_creator,
                       progress_reporter=getattr(rc, "progress_reporter", None), reuse_actors=tc.reuse_actors)
        return ResultGrid(analysis)

    def get_results(self) -> ResultGrid:
        """The ResultGrid of this Tuner's experiment as stored (e.g. after `restore`, without fitting)."""
        if self._run_config.name is None:
            raise RuntimeError("this Tuner has no experiment yet: call fit() first")
        return ResultGrid(ExperimentAnalysis(self._storage().path))

    def _save(self, storage: ExperimentStorage) -> None:
        """Write tuner.pkl: what `restore` needs besides the trainable (pickled by value, as the
        search space and searcher may be defined in the script)."""
        import cloudpickle
        state = {"trainable_name": self._trainable_name, "param_space": self._param_space,
                 "tune_config": self._tune_config, "run_config": self._run_config}
        try:
            data = cloudpickle.dumps(state)
        except Exception as e:  # noqa: BLE001 - the run itself does not need it
            warnings.warn(f"Tuner.restore will not work for {storage.path}: its settings cannot be pickled "
                          f"({type(e).__name__}: {e})", stacklevel=3)
            return
        os.makedirs(storage.path, exist_ok=True)
        path = os.path.join(storage.path, TUNER_FILE)
        with open(f"{path}.tmp{os.getpid()}", "wb") as f:
            f.write(data)
        os.replace(f"{path}.tmp{os.getpid()}", path)

    @classmethod
    def can_restore(cls, path: str | os.PathLike) -> bool:
        """Whether `path` is an experiment directory a Tuner wrote (it has tuner.pkl)."""
        return os.path.isfile(os.path.join(os.path.expanduser(os.fspath(path)), TUNER_FILE))

    @classmethod
    def restore(cls, path: str | os.PathLike, trainable: Callable, resume_unfinished: bool = True,
                resume_errored: bool = False, restart_errored: bool = False,
                param_space: dict | None = None) -> Tuner:
        """Continue the experiment at `path` (moved there or not) with the same `trainable`:
        finished trials are kept, unfinished ones restart from their latest checkpoint, and the rest
        of `num_samples` is run (`tune.run(..., resume=True)`). Errored trials are kept as they are,
        or run again from their latest checkpoint (`resume_errored=True`) or from scratch
        (`restart_errored=True`). `param_space` may be given again (e.g. for fresh object refs),
        not changed. Skipping unfinished trials (`resume_unfinished=False`) is not supported."""
        if not resume_unfinished:
            raise NotImplementedError("Tuner.restore(resume_unfinished=False): raylite.tune always continues "
                                      "unfinished trials")
        if resume_errored and restart_errored:
            raise ValueError("Tuner.restore: resume_errored=True and restart_errored=True exclude each other")
        path = os.path.abspath(os.path.expanduser(os.fspath(path)))
        if not cls.can_restore(path):
            raise FileNotFoundError(f"no Tuner experiment at {path} ({TUNER_FILE} is missing)")
        with open(os.path.join(path, TUNER_FILE), "rb") as f:
            state = pickle.load(f)
        name = _name_of(trainable)
        if name != state["trainable_name"]:
            raise ValueError(f"Tuner.restore: the experiment at {path} ran trainable {state['trainable_name']!r}, "
                             f"got {name!r}; pass the same trainable")
        run_config = replace(state["run_config"], name=os.path.basename(path), storage_path=os.path.dirname(path))
        tuner = cls(trainable, param_space=state["param_space"] if param_space is None else param_space,
                    tune_config=state["tune_config"], run_config=run_config)
        tuner._resume = "AUTO+RESTART_ERRORED" if restart_errored else "AUTO+ERRORED" if resume_errored else True
        return tuner
