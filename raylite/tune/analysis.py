"""ExperimentAnalysis: what `tune.run` returns, or `ExperimentAnalysis(path)` for a stored experiment."""
from __future__ import annotations

import math
import os
import warnings

from raylite.tune._validate import check_mode
from raylite.tune.metrics import flatten, is_finite, lookup
from raylite.tune.storage import ExperimentStorage, read_results
from raylite.tune.trial import SUMMARY_KEYS, Trial, _number

_SCOPES = ("last", "all", "avg", "last-5-avg", "last-10-avg")


def _need_pandas(what: str):
    try:
        import pandas
    except ImportError:
        raise ImportError(f"{what} needs pandas: pip install pandas (or raylite's [tune] extra)") from None
    return pandas


class ExperimentAnalysis:
    def __init__(self, trials_or_path, default_metric: str | None = None, default_mode: str | None = None, *,
                 experiment_path: str | None = None, study=None, objectives: list | None = None):
        if isinstance(trials_or_path, (str, os.PathLike)):
            path = os.path.abspath(os.path.expanduser(os.fspath(trials_or_path)))
            storage = ExperimentStorage(os.path.dirname(path), os.path.basename(path))
            if not storage.exists():
                raise FileNotFoundError(f"no experiment at {path} (experiment_state.json is missing)")
            meta = storage.load_meta()
            self.trials: list[Trial] = storage.load_trials()
            default_metric = default_metric or meta.get("metric")
            default_mode = default_mode or meta.get("mode")
            experiment_path, self._study, self._study_name = path, None, meta.get("name")
            objectives = objectives or meta.get("objectives")
        else:
            self.trials = list(trials_or_path)
            self._study, self._study_name = study, getattr(study, "study_name", None)
        check_mode(default_mode, "ExperimentAnalysis", "default_mode")
        self.default_metric, self.default_mode = default_metric, default_mode
        self.experiment_path = experiment_path
        self.objectives = [tuple(o) for o in objectives] if objectives else None

    # ------------------------------------------------------------------ best trial
    def _metric_mode(self, metric, mode, what: str):
        metric, mode = metric or self.default_metric, mode or self.default_mode
        if (not metric or not mode) and self.objectives:
            raise ValueError(f"{what}: this experiment searched {len(self.objectives)} objectives "
                             f"({', '.join(m for m, _ in self.objectives)}), so no trial is the single best; pass "
                             f"metric= and mode= to rank by one, or take the Pareto front: pareto_front()")
        if not metric or not mode:
            raise ValueError(f"{what} needs a metric and mode: pass them to tune.run(metric=..., mode=...) "
                             f"or use get_best_trial(metric, mode)")
        check_mode(mode, what, required=True)
        return metric, mode

    def get_best_trial(self, metric: str | None = None, mode: str | None = None, scope: str = "last",
                       filter_nan_and_inf: bool = True) -> Trial | None:
        """The trial whose `metric` is best: its last value (`scope="last"`), its best ever ("all"),
        its average ("avg") or the average of its last 5 / 10 ("last-5-avg", "last-10-avg")."""
        metric, mode = self._metric_mode(metric, mode, "ExperimentAnalysis.get_best_trial")
        if scope not in _SCOPES:
            raise ValueError(f"scope must be one of {_SCOPES}, got {scope!r}")
        i = SUMMARY_KEYS.index(("max" if mode == "max" else "min") if scope == "all" else scope)
        best, best_value = None, None
        for t in self.trials:
            summary = t.metric_summary(metric)
            if summary is None:
                continue
            value = summary[i]
            if filter_nan_and_inf and not math.isfinite(value):
                continue
            if best is None or (value > best_value if mode == "max" else value < best_value):
                best, best_value = t, value
        return best

    def get_best_config(self, metric=None, mode=None, scope="last") -> dict | None:
        t = self.get_best_trial(metric, mode, scope)
        return t.config if t else None

    def get_best_checkpoint(self, trial: Trial, metric: str | None = None, mode: str | None = None):
        """The trial's checkpoint reported with the best `metric` (its latest if none has it)."""
        from raylite.tune.session import Checkpoint
        metric, mode = metric or self.default_metric, mode or self.default_mode
        scored = [(v, p) for p, r in trial.checkpoints
                  if metric and _number(v := lookup(r, metric)) and os.path.isdir(p)]
        if scored and mode:
            return Checkpoint((max if mode == "max" else min)(scored, key=lambda x: x[0])[1])
        existing = [p for p, _ in trial.checkpoints if os.path.isdir(p)]
        return Checkpoint(existing[-1]) if existing else None

    @property
    def best_trial(self) -> Trial | None:
        return self.get_best_trial()

    @property
    def best_config(self) -> dict | None:
        t = self.best_trial
        return t.config if t else None

    @property
    def best_result(self) -> dict | None:
        t = self.best_trial
        return t.last_result if t else None

    @property
    def best_checkpoint(self):
        t = self.best_trial
        return self.get_best_checkpoint(t) if t else None

    @property
    def best_logdir(self) -> str | None:
        t = self.best_trial
        return t.path if t else None

    best_path = best_logdir

    def get_last_checkpoint(self, trial: Trial | None = None, metric: str = "training_iteration",
                            mode: str = "max"):
        """The newest checkpoint of `trial` (default: the best trial by `metric`/`mode`)."""
        trial = trial or self.get_best_trial(metric, mode)
        return self.get_best_checkpoint(trial, "training_iteration", "max") if trial else None

    def get_all_configs(self, prefix: bool = False) -> dict[str, dict]:
        """trial id -> config; with `prefix`, flattened with "config/" keys, as in dataframes."""
        if prefix:
            return {t.trial_id: {f"config/{k}": v for k, v in flatten(t.config).items()} for t in self.trials}
        return {t.trial_id: t.config for t in self.trials}

    # ------------------------------------------------------------------ results
    @property
    def results(self) -> dict[str, dict]:
        return {t.trial_id: t.last_result for t in self.trials}

    def _row(self, t: Trial, result: dict) -> dict:
        row = flatten(result)
        row.update({f"config/{k}": v for k, v in flatten(t.config).items()})
        row.update(trial_id=t.trial_id, status=t.status, logdir=t.path)
        return row

    def dataframe(self, metric: str | None = None, mode: str | None = None):
        """One row per trial: its last result, or with metric and mode its best one; plus config/*."""
        pd = _need_pandas("dataframe()")
        rows = []
        for t in self.trials:
            result = t.last_result
            if metric and mode:
                rs = [(v, r) for r in read_results(t.path) if _number(v := lookup(r, metric))]
                if rs:
                    result = (max if mode == "max" else min)(rs, key=lambda vr: vr[0])[1]
            rows.append(self._row(t, result))
        return pd.DataFrame(rows)

    @property
    def results_df(self):
        return self.dataframe().set_index("trial_id") if self.trials else _need_pandas("results_df").DataFrame()

    @property
    def best_result_df(self):
        pd = _need_pandas("best_result_df")
        t = self.best_trial
        return pd.DataFrame([self._row(t, t.last_result)]).set_index("trial_id") if t else pd.DataFrame()

    @property
    def best_dataframe(self):
        """Every result of the best trial (by the experiment's metric and mode), pandas."""
        pd = _need_pandas("best_dataframe")
        t = self.get_best_trial()
        return pd.DataFrame([flatten(r) for r in read_results(t.path)]) if t else pd.DataFrame()

    @property
    def trial_dataframes(self) -> dict:
        pd = _need_pandas("trial_dataframes")
        return {t.trial_id: pd.DataFrame([flatten(r) for r in read_results(t.path)]) for t in self.trials}

    # ------------------------------------------------------------------ Optuna
    @property
    def study(self):
        """The experiment's Optuna study (from its SQLite file when loaded from disk)."""
        if self._study is None and self.experiment_path:
            import optuna
            url = ExperimentStorage(os.path.dirname(self.experiment_path),
                                    os.path.basename(self.experiment_path)).study_url
            self._study = optuna.load_study(study_name=self._study_name, storage=url)
        return self._study

    def _plot_study(self):
        """An in-memory study with one complete trial per tune trial, valued by its last result.

        Optuna's own plots skip pruned trials; with ASHA most trials are pruned, so the stored
        study alone would plot a handful of points. This one ranks trials as `best_trial` does."""
        import optuna
        from optuna.distributions import json_to_distribution
        metric, mode = self._metric_mode(None, None, "ExperimentAnalysis.plot")
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)   # no "A new study created" line
        try:
            study = optuna.create_study(direction="maximize" if mode == "max" else "minimize")
        finally:
            optuna.logging.set_verbosity(verbosity)
        for t in sorted(self.trials, key=lambda t: t.index):
            value, o = lookup(t.last_result, metric), t.optuna
            if not is_finite(value) or "distributions" not in o:
                continue
            study.add_trial(optuna.trial.create_trial(
                value=float(value), params=o.get("params", {}),
                distributions={k: json_to_distribution(v) for k, v in o["distributions"].items()},
                user_attrs={"trial_id": t.trial_id}))
        if not study.trials:
            raise ValueError(f"nothing to plot: no trial reported {metric!r}")
        return study

    def pareto_front(self) -> list[Trial]:
        """The trials no other trial beats on every objective (Optuna's `study.best_trials`), for a
        multi-objective search (OptunaSearch(metric=[...], mode=[...]))."""
        if not self.objectives:
            raise ValueError("pareto_front() is for a multi-objective search (OptunaSearch(metric=[...], "
                             "mode=[...])); this one has one objective: use get_best_trial()")
        ids = {t.user_attrs.get("trial_id") for t in self.study.best_trials}
        return [t for t in self.trials if t.trial_id in ids]

    def plot_pareto_front(self, path: str | os.PathLike | None = None) -> str:
        """Optuna's Pareto-front plot of a multi-objective search as a PNG (default:
        pareto_front.png in the experiment directory); returns the file."""
        self.pareto_front()   # the error for a single objective
        import matplotlib.pyplot as plt
        from optuna.visualization import matplotlib as ovm
        path = os.fspath(path) if path is not None else os.path.join(self.experiment_path, "pareto_front.png")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # optuna.visualization.matplotlib is "experimental"
            ax = ovm.plot_pareto_front(self.study, target_names=[m for m, _ in self.objectives])
        ax.figure.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(ax.figure)
        return path

    def plot(self, path: str | os.PathLike | None = None) -> list[str]:
        """Write the optimisation history and the parameter importances as PNGs (Optuna's
        matplotlib plots; every trial counts with its last result, pruned ones included).

        `path`: a directory (files optimization_history.png, param_importances.png), or a name
        ending in .png used as a prefix (x.png -> x_history.png, x_importances.png). Default: the
        experiment directory. Returns the files written.
        """
        try:
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError("analysis.plot() needs matplotlib: pip install matplotlib (or raylite's [plot] "
                              "extra)") from None
        from optuna.visualization import matplotlib as ovm
        path = os.fspath(path) if path is not None else self.experiment_path
        if path.endswith(".png"):
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            files = {"history": path[:-4] + "_history.png", "importances": path[:-4] + "_importances.png"}
        else:
            os.makedirs(path, exist_ok=True)
            files = {"history": os.path.join(path, "optimization_history.png"),
                     "importances": os.path.join(path, "param_importances.png")}
        study = self._plot_study()
        written, skipped = [], None
        name = f"{self.default_metric} (last result)"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # optuna.visualization.matplotlib is "experimental"
            ax = ovm.plot_optimization_history(study, target_name=name)
            ax.figure.savefig(files["history"], dpi=100, bbox_inches="tight")
            plt.close(ax.figure)
            written.append(files["history"])
            try:
                ax = ovm.plot_param_importances(study, target_name=name)
                ax.figure.savefig(files["importances"], dpi=100, bbox_inches="tight")
                plt.close(ax.figure)
                written.append(files["importances"])
            except (RuntimeError, ValueError) as e:   # e.g. one trial, or no parameter varies
                plt.close("all")
                skipped = e
        if skipped is not None:
            warnings.warn(f"parameter importances not plotted: {skipped}", stacklevel=2)
        return written

    def __repr__(self) -> str:
        return f"ExperimentAnalysis({len(self.trials)} trials at {self.experiment_path})"
