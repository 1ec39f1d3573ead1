"""What an experiment leaves on disk, and the Optuna study's SQLite copy.

    <storage_path>/<name>/
        experiment_state.json     experiment settings (metric, mode, planned trials, search, ...)
        study.db                  the Optuna study (optuna.storages.RDBStorage, sqlite:///...)
        <trial_id>/
            params.json, params.pkl   the trial's config (readable / exact)
            trial.json                status, last result, metric statistics, failures, Optuna record
            result.json               one JSON line per reported result
            progress.csv              the same, flattened, one row per result
            checkpoint_000042/        checkpoints (complete once renamed into place)
            error.txt                 the last error's traceback

Every file is written by the driver except checkpoints (written by the trial before it reports).
Files are replaced atomically, so a driver killed at any moment leaves a resumable experiment.

Why the study is mirrored: Optuna's RDB storage costs ~20-100 ms per ask/report/tell here (SQLAlchemy
round trips), which would put seconds on the path between one trial ending and the next starting.
The driver runs the study in Optuna's in-memory storage (the sampler and pruners see every value at
once), and a background thread copies each finished trial into study.db with Optuna's own
`Study.add_trial`. On resume the in-memory study is rebuilt from trial.json records and study.db
gets any trial it missed.
"""
from __future__ import annotations

import csv
import json
import os
import queue
import threading
import warnings

from raylite.tune.trial import Trial

DEFAULT_STORAGE = "~/raylite_results"
STATE_FILE = "experiment_state.json"
TRIAL_FILE = "trial.json"
STUDY_FILE = "study.db"


def atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _json(obj, **kw) -> str:
    return json.dumps(obj, default=repr, **kw)


class ExperimentStorage:
    def __init__(self, storage_path: str | os.PathLike | None, name: str):
        root = os.fspath(storage_path) if storage_path is not None else DEFAULT_STORAGE
        self.root = os.path.abspath(os.path.expanduser(root))
        self.name = name
        self.path = os.path.join(self.root, name)

    @property
    def study_url(self) -> str:
        return "sqlite:///" + os.path.join(self.path, STUDY_FILE)

    def exists(self) -> bool:
        return os.path.exists(os.path.join(self.path, STATE_FILE))

    def load_meta(self) -> dict:
        with open(os.path.join(self.path, STATE_FILE)) as f:
            return json.load(f)

    def save_meta(self, meta: dict) -> None:
        os.makedirs(self.path, exist_ok=True)
        atomic_write(os.path.join(self.path, STATE_FILE), _json(meta, indent=1))

    def trial_dir(self, trial_id: str) -> str:
        return os.path.join(self.path, trial_id)

    def create_trial(self, trial: Trial) -> None:
        import cloudpickle
        os.makedirs(trial.path, exist_ok=True)
        atomic_write(os.path.join(trial.path, "params.json"), _json(trial.config, indent=1))
        try:
            data = cloudpickle.dumps(trial.config)
        except Exception:  # noqa: BLE001 - params.json still records it
            data = None
        if data is not None:
            with open(os.path.join(trial.path, "params.pkl"), "wb") as f:
                f.write(data)
        self.save_trial(trial)

    def save_trial(self, trial: Trial) -> None:
        atomic_write(os.path.join(trial.path, TRIAL_FILE), _json(trial.to_state()))

    def write_error(self, trial: Trial, text: str) -> None:
        atomic_write(os.path.join(trial.path, "error.txt"), text)

    def load_trials(self) -> list[Trial]:
        """Every trial recorded under the experiment, by index."""
        trials = []
        for entry in sorted(os.listdir(self.path)):
            d = os.path.join(self.path, entry)
            try:
                with open(os.path.join(d, TRIAL_FILE)) as f:
                    state = json.load(f)
                trials.append(Trial.from_state(state, load_config(d), d))
            except (OSError, ValueError, KeyError):
                continue
        return sorted(trials, key=lambda t: t.index)


def load_config(trial_dir: str) -> dict:
    try:
        import cloudpickle  # noqa: F401 - params.pkl may hold functions pickled by value
        import pickle
        with open(os.path.join(trial_dir, "params.pkl"), "rb") as f:
            return pickle.load(f)
    except Exception:  # noqa: BLE001 - fall back to the readable copy
        with open(os.path.join(trial_dir, "params.json")) as f:
            return json.load(f)


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "/"))
        else:
            out[key] = v
    return out


class ResultWriter:
    """Appends a trial's results to result.json (JSON lines) and progress.csv."""

    def __init__(self, trial_dir: str):
        self.json = open(os.path.join(trial_dir, "result.json"), "a")
        csv_path = os.path.join(trial_dir, "progress.csv")
        self.fields = None
        if os.path.exists(csv_path) and os.path.getsize(csv_path):
            with open(csv_path, newline="") as f:
                self.fields = next(csv.reader(f), None)
        self.csv_file = open(csv_path, "a", newline="")
        self.csv = None
        if self.fields:
            self.csv = csv.DictWriter(self.csv_file, self.fields, extrasaction="ignore")

    def write(self, result: dict) -> None:
        self.json.write(_json(result) + "\n")
        flat = flatten(result)
        if self.csv is None:
            self.fields = list(flat)
            self.csv = csv.DictWriter(self.csv_file, self.fields, extrasaction="ignore")
            self.csv.writeheader()
        self.csv.writerow(flat)

    def flush(self) -> None:
        self.json.flush()
        self.csv_file.flush()

    def close(self) -> None:
        self.json.close()
        self.csv_file.close()


def read_results(trial_dir: str) -> list[dict]:
    out = []
    try:
        with open(os.path.join(trial_dir, "result.json")) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:   # a line cut by a killed driver
                        pass
    except OSError:
        pass
    return out


class StudyMirror:
    """Copies finished Optuna trials into the experiment's SQLite study from a background thread."""

    def __init__(self, url: str, study_name: str, direction: str):
        self.url, self.study_name, self.direction = url, study_name, direction
        self.queue: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="raylite-tune-study", daemon=True)
        self.thread.start()

    def add(self, frozen_trial) -> None:
        self.queue.put(frozen_trial)

    def close(self, timeout: float = 60.0) -> None:
        self.queue.put(None)
        self.thread.join(timeout)
        if self.thread.is_alive():
            warnings.warn(f"the Optuna study copy ({self.url}) is still being written; some finished "
                          f"trials may be missing from it until the experiment is resumed", stacklevel=2)

    def _run(self) -> None:
        storage = None
        try:
            import optuna
            storage = optuna.storages.RDBStorage(self.url, engine_kwargs={"connect_args": {"timeout": 60}})
            study = optuna.create_study(storage=storage, study_name=self.study_name, direction=self.direction,
                                        load_if_exists=True)
            known = {t.user_attrs.get("trial_id") for t in study.get_trials(deepcopy=False)}
        except Exception as e:  # noqa: BLE001 - the experiment runs on; say so once
            self._fail(e)
            study = None
        while True:
            item = self.queue.get()
            if item is None:
                break
            if study is None:
                continue
            tid = item.user_attrs.get("trial_id")
            if tid in known:
                continue
            try:
                study.add_trial(item)
                known.add(tid)
            except Exception as e:  # noqa: BLE001
                self._fail(e)
        if storage is not None:
            try:
                storage.engine.dispose()
            except Exception:  # noqa: BLE001
                pass

    def _fail(self, e: BaseException) -> None:
        if self.error is None:
            self.error = e
            warnings.warn(f"could not write the Optuna study to {self.url}: {e}", stacklevel=2)
