"""raylite.tune: Ray Tune's API for hyperparameter search, with Optuna as the engine.

    from raylite import tune

    def trainable(config):
        for step in range(100):
            loss = ...
            tune.report({"loss": loss})

    analysis = tune.run(trainable, config={"lr": tune.loguniform(1e-4, 1e-1)}, num_samples=20,
                        metric="loss", mode="min", scheduler=tune.ASHAScheduler(max_t=100),
                        resources_per_trial={"cpu": 1, "gpu": 0.5})
    print(analysis.best_config)

or with Ray 2's current API, a thin layer over `tune.run` (tuner.py):

    tuner = tune.Tuner(tune.with_resources(trainable, {"cpu": 1, "gpu": 0.5}),
                       param_space={"lr": tune.loguniform(1e-4, 1e-1)},
                       tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=20),
                       run_config=tune.RunConfig(name="exp", failure_config=tune.FailureConfig(max_failures=2)))
    best = tuner.fit().get_best_result()     # a ResultGrid; failed trials are in its .errors
    print(best.config, best.metrics["loss"])

Optuna does the sampling (RandomSampler by default, TPE with OptunaSearch), the pruning (ASHA is
its SuccessiveHalvingPruner; the median rule is Ray's own, schedulers.py) and the trial database
(an SQLite study in the experiment directory). raylite.tune only uses raylite's public API: each
trial is a raylite task with the trial's resources.
"""
# Only the trial-side API is imported eagerly: a trial's worker imports this package to run
# `report`, and should not pay for importing Optuna. Everything else loads on first use.
from raylite.tune.session import (Checkpoint, TuneContext, get_checkpoint, get_context, get_trial_dir, get_trial_id,
                                  get_trial_resources, report, with_parameters)

_LAZY = {
    "ExperimentAnalysis": "analysis", "Callback": "api", "TuneError": "api", "run": "api",
    "ASHAScheduler": "schedulers", "AsyncHyperBandScheduler": "schedulers", "FIFOScheduler": "schedulers",
    "MedianStoppingRule": "schedulers", "OptunaPruner": "schedulers", "TrialScheduler": "schedulers",
    "BasicVariantGenerator": "search", "ConcurrencyLimiter": "search", "OptunaSearch": "search",
    "Searcher": "search", "Stopper": "stopper", "Trainable": "trainable", "Trial": "trial",
    **{n: "reporters" for n in ("CLIReporter", "JupyterNotebookReporter", "ProgressReporter")},
    **{n: "tuner" for n in ("CheckpointConfig", "FailureConfig", "Result", "ResultGrid", "RunConfig", "TuneConfig",
                            "Tuner")},
    "PlacementGroupFactory": "resources", "with_resources": "resources",
    **{n: "search_space" for n in ("choice", "grid_search", "lograndint", "loguniform", "qlograndint",
                                   "qloguniform", "qrandint", "qrandn", "quniform", "randint", "randn",
                                   "sample_from", "uniform")},
}


# Ray's submodules, reachable as attributes (`tune.search.BasicVariantGenerator()`) as in Ray.
_SUBMODULES = ("error", "experiment", "integration", "result_grid", "schedulers", "search", "stopper", "tune_config")


def __getattr__(name: str):
    import importlib
    if name in _SUBMODULES:
        return importlib.import_module(f"raylite.tune.{name}")
    module = _LAZY.get(name)
    if module is None:
        from raylite.tune._missing import missing
        raise missing(__name__, name)
    try:
        value = getattr(importlib.import_module(f"raylite.tune.{module}"), name)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] == "optuna":
            raise ImportError(f"raylite.tune.{name} needs Optuna: pip install optuna "
                              f"(or raylite's [tune] extra)") from e
        raise
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))


__all__ = ["ASHAScheduler", "AsyncHyperBandScheduler", "BasicVariantGenerator", "CLIReporter", "Callback",
           "Checkpoint", "CheckpointConfig", "ConcurrencyLimiter", "ExperimentAnalysis", "FIFOScheduler",
           "FailureConfig", "JupyterNotebookReporter", "MedianStoppingRule", "OptunaPruner", "OptunaSearch",
           "PlacementGroupFactory", "ProgressReporter", "Result", "ResultGrid", "RunConfig", "Searcher", "Stopper",
           "Trainable", "Trial", "TrialScheduler", "TuneConfig", "TuneContext", "TuneError", "Tuner", "choice", "get_checkpoint",
           "get_context", "get_trial_dir", "get_trial_id", "get_trial_resources", "grid_search", "lograndint",
           "loguniform", "qlograndint", "qloguniform", "qrandint", "qrandn", "quniform", "randint", "randn", "report",
           "run", "sample_from", "uniform", "with_parameters", "with_resources"]
