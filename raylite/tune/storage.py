"""What an experiment leaves on disk, and the Optuna study's SQLite copy.

    <storage_path>/<name>/
        experiment_state.json     experiment settings (metric, mode, planned trials, search, ...)
        study.db                  the Optuna study (optuna.storages.RDBStorage, sqlite:///...)
        <trial_id>/
            params.json, params.pkl   the trial's config (readable; exact, when JSON is not)
            trial.json                status, last result, metric statistics, failures, Optuna record
            result.json               one JSON line per reported result
            progress.csv              the same, flattened, one row per result
            checkpoint_000000/        checkpoints, numbered per trial (complete once renamed into place)
            error.txt                 the last error's traceback

Every file is written by the driver (by one I/O thread, in order, so a slow disk never delays the
driver loop) except checkpoints, which the trial writes before it reports. Files are replaced
atomically, so a driver killed at any moment leaves a resumable experiment.

Why the study is mirrored: Optuna's RDB storage costs ~20-100 ms per ask/report/tell here (SQLAlchemy
ORM round trips, ~13 queries per trial), which would put seconds on the path between one trial
ending and the next starting, and delay every pruning decision. The driver runs the study in
Optuna's in-memory storage (sampler and pruner decisions in ~1 ms), and a writer actor (its own
process, so it never holds the driver's GIL) copies each finished trial into study.db with Optuna's
own `Study.add_trial`, as soon as the driver has told it (one transaction per trial, so a killed
writer leaves no half trial). `tune.run` returns once the writer has caught up, which is then a
matter of the last few trials. On resume the in-memory study is rebuilt from the trial.json
records, and study.db gets any trial it missed.
"""
from __future__ import annotations

import csv
import json
import os
import queue
import shutil
import threading
import warnings

from raylite.train.config import local_storage_path
from raylite.tune.metrics import flatten, json_default
from raylite.tune.trial import Trial
from raylite.util.jsonl import read_json_lines

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
    return json.dumps(obj, default=json_default, **kw)


class _IOThread:
    """Runs the experiment's file writes in order, off the driver loop: on a busy disk an open()
    can take milliseconds, which would otherwise delay refilling a slot."""

    def __init__(self):
        self.queue: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="raylite-tune-io", daemon=True)
        self.thread.start()

    def put(self, fn, *args) -> None:
        self.queue.put((fn, args))

    def _run(self) -> None:
        while True:
            fn, args = self.queue.get()
            try:
                if fn is None:
                    return
                fn(*args)
            except Exception as e:  # noqa: BLE001 - reported by flush()
                if self.error is None:
                    self.error = e
            finally:
                self.queue.task_done()

    def flush(self) -> None:
        self.queue.join()
        if self.error is not None:
            e, self.error = self.error, None
            warnings.warn(f"raylite.tune could not write to the experiment directory: {e}", stacklevel=3)

    def close(self) -> None:
        self.put(None)
        self.flush()
        self.thread.join(10)


class ExperimentStorage:
    def __init__(self, storage_path: str | os.PathLike | None, name: str):
        root = (local_storage_path(storage_path) if storage_path is not None
                else os.environ.get("RAYLITE_RESULTS_DIR") or DEFAULT_STORAGE)
        self.root = os.path.abspath(os.path.expanduser(root))
        self.name = name
        self.path = os.path.join(self.root, name)
        self._io: _IOThread | None = None
        self._writers: dict[str, ResultWriter] = {}   # used by the I/O thread only

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

    # -- writes: queued to the I/O thread once start_io() ran, else done at once
    def start_io(self) -> None:
        self._io = _IOThread()

    def _do(self, fn, *args) -> None:
        if self._io is not None:
            self._io.put(fn, *args)
        else:
            fn(*args)

    def flush(self) -> None:
        """Wait until every queued write is on disk (before reading a trial's files back)."""
        if self._io is not None:
            self._io.flush()

    def close(self) -> None:
        if self._io is not None:
            self._io.put(self._close_all_results)
            self._io.close()
            self._io = None
        else:
            self._close_all_results()

    def create_trial(self, trial: Trial) -> None:
        """params.json (+ params.pkl when JSON cannot hold the config exactly), then trial.json: a
        trial directory without trial.json is not a trial yet (resume recreates that index)."""
        text, data = _params(trial.config)
        self._do(_write_new_trial, trial.path, text, data, _json(trial.to_state()))

    def save_config(self, trial: Trial) -> None:
        """params.json (+ params.pkl) again: a scheduler (PBT) gave the trial a new config."""
        text, data = _params(trial.config)
        self._do(_write_config, trial.path, text, data)

    def save_trial(self, trial: Trial) -> None:
        self._do(atomic_write, os.path.join(trial.path, TRIAL_FILE), _json(trial.to_state()))

    def write_error(self, trial: Trial, text: str) -> None:
        self._do(atomic_write, os.path.join(trial.path, "error.txt"), text)

    def append_results(self, trial_dir: str, results: list[dict]) -> None:
        self._do(self._append, trial_dir, results)

    def remove_checkpoints(self, paths: list[str]) -> None:
        """Delete checkpoints the CheckpointConfig no longer keeps, after the results that made them
        obsolete: a driver killed in between still leaves a checkpoint a resume can restart from."""
        for path in paths:
            self._do(shutil.rmtree, path, True)

    def close_results(self, trial_dir: str) -> None:
        self._do(self._close_results, trial_dir)

    def _append(self, trial_dir: str, results: list[dict]) -> None:
        w = self._writers.get(trial_dir)
        if w is None:
            w = self._writers[trial_dir] = ResultWriter(trial_dir)
        for r in results:
            w.write(r)
        w.flush()

    def _close_results(self, trial_dir: str) -> None:
        w = self._writers.pop(trial_dir, None)
        if w is not None:
            w.close()

    def _close_all_results(self) -> None:
        for d in list(self._writers):
            self._close_results(d)

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


def _params(config: dict) -> tuple[str, bytes | None]:
    """params.json's text, and params.pkl's bytes when JSON cannot hold the config exactly."""
    text = _json(config, indent=1)
    try:
        exact = json.loads(text) == config
    except ValueError:
        exact = False
    if exact:
        return text, None
    import cloudpickle
    try:
        return text, cloudpickle.dumps(config)
    except Exception:  # noqa: BLE001 - params.json still records it
        return text, None


def _write_config(path: str, params_text: str, params_pkl: bytes | None) -> None:
    atomic_write(os.path.join(path, "params.json"), params_text)
    pkl = os.path.join(path, "params.pkl")
    if params_pkl is not None:
        with open(pkl + ".tmp", "wb") as f:
            f.write(params_pkl)
        os.replace(pkl + ".tmp", pkl)
    elif os.path.exists(pkl):
        os.remove(pkl)


def _write_new_trial(path: str, params_text: str, params_pkl: bytes | None, state_text: str) -> None:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "params.json"), "w") as f:
        f.write(params_text)
    if params_pkl is not None:
        with open(os.path.join(path, "params.pkl"), "wb") as f:
            f.write(params_pkl)
    atomic_write(os.path.join(path, TRIAL_FILE), state_text)


def load_config(trial_dir: str) -> dict:
    pkl = os.path.join(trial_dir, "params.pkl")
    if os.path.exists(pkl):
        try:
            import pickle

            import cloudpickle  # noqa: F401 - params.pkl may hold functions pickled by value
            with open(pkl, "rb") as f:
                return pickle.load(f)
        except Exception:  # noqa: BLE001 - fall back to the readable copy
            pass
    with open(os.path.join(trial_dir, "params.json")) as f:
        return json.load(f)


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


def rewrite_results(trial_dir: str, results: list[dict]) -> None:
    """Replace result.json and progress.csv with these results (a restart drops what came after
    the checkpoint it restarts from)."""
    for name in ("result.json", "progress.csv"):
        try:
            os.remove(os.path.join(trial_dir, name))
        except FileNotFoundError:
            pass
    w = ResultWriter(trial_dir)
    for r in results:
        w.write(r)
    w.close()


def read_results(trial_dir: str) -> list[dict]:
    return read_json_lines(os.path.join(trial_dir, "result.json"))


class StudyWriter:
    """An actor (its own process, so SQLAlchemy's work never holds the driver's GIL) that adds finished
    Optuna trials to the experiment's SQLite study with Optuna's `Study.add_trial`."""

    def __init__(self, url: str, study_name: str, direction: str):
        self.url, self.study_name, self.direction = url, study_name, direction
        self.study, self.known, self.errors = None, set(), []

    def _open(self):
        import optuna
        from sqlalchemy import event
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = optuna.storages.RDBStorage(self.url, engine_kwargs={"connect_args": {"timeout": 60}})

        @event.listens_for(storage.engine, "connect")
        def _pragmas(conn, _record):   # WAL + NORMAL: safe if a process dies, ~2x fewer fsync stalls
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()
        storage.engine.dispose()
        d = self.direction   # a list for several objectives
        self.study = optuna.create_study(storage=storage, study_name=self.study_name, load_if_exists=True,
                                         **({"directions": d} if isinstance(d, list) else {"direction": d}))
        self.known = {t.user_attrs.get("trial_id") for t in self.study.get_trials(deepcopy=False)}

    def add(self, frozen_trials: list) -> None:
        try:
            if self.study is None:
                self._open()
            for ft in frozen_trials:
                tid = ft.user_attrs.get("trial_id")
                if tid not in self.known:
                    self.study.add_trial(ft)
                    self.known.add(tid)
        except Exception as e:  # noqa: BLE001 - reported by flush()
            self.errors.append(f"{type(e).__name__}: {e}")

    def flush(self) -> list:
        """Returns the errors so far (once every earlier add has run: actor calls run in order)."""
        errors, self.errors = self.errors, []
        return errors


class StudyMirror:
    """The driver's side of StudyWriter: batches finished trials, one actor call per batch."""

    def __init__(self, url: str, study_name: str, direction: str):
        self.url, self.study_name, self.direction = url, study_name, direction
        self.actor = None
        self.batch: list = []

    def start(self) -> None:
        """Start the writer (the runner does once a first trial has begun: the writer's Optuna import
        and database setup take a second of CPU) and have it open the database while trials run."""
        if self.actor is None:
            import raylite as ray
            from raylite.util import get_node_ip_address
            here = {f"node:{get_node_ip_address()}": 0.001}   # the driver's node: the file is there
            self.actor = ray.remote(num_cpus=0, resources=here)(StudyWriter).remote(self.url, self.study_name,
                                                                                    self.direction)
            self.actor.add.remote([])

    def add(self, frozen_trial) -> None:
        self.batch.append(frozen_trial)

    def send(self) -> None:
        """Each finished trial goes to the writer as soon as the driver has it (one message per
        loop iteration), so it keeps up while trials run and `close` waits for the last few only.
        What a killed driver had not sent is re-added from trial.json on resume."""
        if self.batch:
            self.start()
            self.actor.add.remote(self.batch)
            self.batch = []

    def close(self, timeout: float = 120.0) -> None:
        import raylite as ray
        self.start()
        self.send()
        try:
            errors = ray.get(self.actor.flush.remote(), timeout=timeout)
        except Exception as e:  # noqa: BLE001 - the experiment's own files are complete
            errors = [f"{type(e).__name__}: {e}"]
        finally:
            try:
                ray.kill(self.actor)
            except Exception:  # noqa: BLE001
                pass
        if errors:
            warnings.warn(f"could not write every finished trial to the Optuna study {self.url}: {errors[0]} "
                          f"(resume=True retries; trial.json files hold every result)", stacklevel=3)
