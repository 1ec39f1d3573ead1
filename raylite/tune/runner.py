"""The experiment loop behind `tune.run`: trials as raylite tasks, searched and pruned by one Optuna study.

- One trial = one raylite task running the function trainable, with the trial's resources
  (`num_cpus`/`num_gpus`/custom), so it gets its device variables and a worker sized for it. A task
  blocked in `get` gives its CPU back, so a trial may start its own raylite workers.
- `tune.report` posts each result to the experiment's hub actor (session.py); the driver drains the
  hub asynchronously (at once when a trial ends, else every 20-200 ms), feeds each result to the
  stop criteria and the scheduler (an Optuna pruner) and posts stop decisions back. A stopped trial
  ends at its next `report`; one that does not report within STOP_GRACE_S is cancelled (SIGINT,
  then SIGKILL).
- Concurrency: a trial is launched only when the resources of the running trials plus its own fit
  `ray.cluster_resources()` and `max_concurrent_trials` allows. A random search keeps one trial per
  slot asked for and on disk as PENDING (its note says what it waits for, in numbers); an adaptive
  searcher asks only when a slot is free and every ended trial is told.
- With every slot taken, a random search also submits the next trial ahead, gated on the running
  ones (`_prequeue`): the node starts it the moment one of them ends, without waiting for this loop.
- The loop only blocks in `ray.wait`, and launches replacements before any bookkeeping (and asks
  Optuna for the next configs only after that launch went out: the node thread that dispatches it
  shares this process's GIL); file writes go to the storage's I/O thread, the SQLite copy of the
  study to a writer actor (storage.py), each finished trial as soon as it is told.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
import traceback
import warnings
from collections import deque
from datetime import datetime

import optuna
from optuna.distributions import distribution_to_json
from optuna.trial import TrialState

import raylite as ray
from raylite.train.config import CheckpointConfig
from raylite.tune import session
from raylite.tune.analysis import ExperimentAnalysis
from raylite.tune.metrics import check_metrics, flat_result, is_finite, lookup
from raylite.tune.progress import ProgressReporter, resources_str, units
from raylite.tune.schedulers import PRUNE, STOP, FIFOScheduler, as_scheduler
from raylite.tune.search import BasicVariantGenerator
from raylite.tune.search_space import path_name
from raylite.tune.storage import ExperimentStorage, StudyMirror, read_results, rewrite_results
from raylite.tune.trial import ERROR, PENDING, RUNNING, TERMINATED, Trial
from raylite.tune.trial_env import chdir_enabled, log_files

STOP_GRACE_S = float(os.environ.get("RAYLITE_TUNE_STOP_GRACE_S", "2.0"))
DRAIN_MIN_S, DRAIN_MAX_S = 0.02, 0.2
QUEUE_AHEAD = True   # submit the next trial before a slot frees (see _prequeue)
YIELD_S = 0.002      # how long the loop lets the node thread run when a queued trial takes a slot
DIRNAME_MAX = int(os.environ.get("TUNE_MAX_LEN_IDENTIFIER", "130"))   # Ray's bound on a trial dirname's name part

_trial_task = ray.remote(session.run_trial)
_HubActor = ray.remote(num_cpus=0)(session.Hub)


class TrialRunner:
    """One experiment: `tune.run` validates its arguments, then builds this and calls `run()`."""

    def __init__(self, trainable, config, num_samples, resources_per_trial, metric, mode, search_alg, scheduler,
                 stop, time_budget_s, max_concurrent_trials, storage_path, name, resume, max_failures, verbose,
                 callbacks, checkpoint_config: CheckpointConfig | None = None, fail_fast: bool | str = False,
                 errored: str | None = None, trial_name_creator=None, trial_dirname_creator=None,
                 log_to_file: bool | str | tuple = False):
        self.trainable, self.trainable_name = trainable, getattr(trainable, "__name__", "trainable")
        self.searcher = search_alg if search_alg is not None else BasicVariantGenerator()
        self.scheduler = as_scheduler(scheduler)
        self.metric, self.mode = metric, mode
        strict = metric and metric != "_metric" and os.environ.get("TUNE_DISABLE_STRICT_METRIC_CHECKING", "0") != "1"
        self.expected_metrics = [(metric, "tune.TuneConfig()")] if strict else []   # Ray's DEFAULT_METRIC is exempt
        self.space = self.searcher.set_search_space(config)
        self.num_samples = num_samples
        self.total_trials = None if num_samples == -1 else self.space.num_grid_points * num_samples
        self.resources = resources_per_trial
        self.stop, self.time_budget_s = stop, time_budget_s
        self.max_concurrent, self.max_failures = max_concurrent_trials, max_failures
        self.callbacks = list(callbacks or [])
        self.trial_name_creator, self.trial_dirname_creator = trial_name_creator, trial_dirname_creator
        self.log_files = log_files(log_to_file)
        self.checkpoint_config = checkpoint_config
        self.fail_fast = fail_fast.upper() if isinstance(fail_fast, str) else fail_fast
        self.fail_error: BaseException | None = None   # fail_fast="raise": the first trial error, raised at the end
        self.dropped: list[str] = []   # checkpoints it no longer keeps: deleted after this drain's results
        self.stop_at = dict(stop) if isinstance(stop, dict) else {}
        self.warned_stop_keys: set = set()
        self.may_stop = (not isinstance(self.scheduler, FIFOScheduler) or time_budget_s is not None
                         or (stop is not None and not isinstance(stop, dict)))
        max_t = getattr(self.scheduler, "max_t", None)
        if max_t is not None:
            t_attr = self.scheduler.time_attr
            self.stop_at[t_attr] = min(max_t, self.stop_at.get(t_attr, max_t))
        self.name = name or self._default_name(storage_path, resume)
        self.storage = ExperimentStorage(storage_path, self.name)
        self.resume = resume
        self.errored = errored   # on resume, errored trials: None (kept), "resume" (from a checkpoint), "restart"
        self.reporter = ProgressReporter(verbose, self.metric, self.mode,
                                         sorted(path_name(p) for p, _ in self.space.grids + self.space.domains))
        self.trials: list[Trial] = []
        self.by_id: dict[str, Trial] = {}
        self.pending: deque[Trial] = deque()
        self.running: dict = {}            # ref -> trial
        self.queued: Trial | None = None   # submitted ahead, starts when a running trial ends (_prequeue)
        self.finishing: list[Trial] = []   # ended; finalized once a drain issued after that returns
        self.drain_ref, self.drain_covers = None, []
        self.result_batch: dict[str, list] = {}   # trial dir -> results of this drain, written together
        self.held: dict[str, int] = {}
        self.stopping: str | None = None
        self.iteration = 0
        self.drain_interval, self.next_drain = DRAIN_MIN_S, 0.0
        self.new_stops: list[str] = []
        self.started_at = time.monotonic()

    # ------------------------------------------------------------------ setup
    def _default_name(self, storage_path, resume: bool) -> str:
        """`<trainable>_<timestamp>`; with resume=True, the latest such experiment, if any."""
        root = ExperimentStorage(storage_path, "x").root
        prefix = f"{self.trainable_name}_"
        if resume and os.path.isdir(root):
            mine = [n for n in os.listdir(root) if n.startswith(prefix) and ExperimentStorage(root, n).exists()]
            if mine:
                return max(mine, key=lambda n: os.path.getmtime(os.path.join(root, n)))
        base = f"{prefix}{datetime.now():%Y-%m-%d_%H-%M-%S}"
        name, i = base, 1
        while os.path.exists(os.path.join(root, name)):
            name, i = f"{base}_{i}", i + 1
        return name

    def _check_feasible(self) -> None:
        """A trial must fit on one node (a Ray cluster's nodes each count; the local runtime is one):
        otherwise it is an error before any trial starts. Concurrency: what fits on every node."""
        total = ray.cluster_resources()
        self.total_units = {k: units(v) for k, v in total.items()}
        self.req_units = {k: units(v) for k, v in self.resources.items() if v}
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive", True)] or [total]
        per_node = [min((units(node.get(k, 0)) // v for k, v in self.req_units.items()), default=1)
                    for node in nodes]
        if not any(per_node):
            biggest = max(nodes, key=lambda n: sum(units(n.get(k, 0)) >= v for k, v in self.req_units.items()))
            where = ("this machine has" if len(nodes) == 1
                     else f"none of the {len(nodes)} nodes has it all; the closest has")
            short = [f"{k}: asks {v:g}, {where} {biggest.get(k, 0):g}" for k, v in self.resources.items()
                     if units(v) > units(biggest.get(k, 0))]
            raise ValueError(f"resources_per_trial={resources_str(self.resources)} can never be satisfied "
                             f"({'; '.join(short)}; see ray.cluster_resources()). Ask for less, or start "
                             f"raylite with more (ray.init(num_cpus=..., num_gpus=..., resources={{...}})).")
        limits = [sum(per_node)] if self.req_units else []
        if self.max_concurrent:
            limits.append(self.max_concurrent)
        self.slots = min(limits) if limits else 1   # how many trials can run at once
        # Submit the next trial ahead only where the resources are what limits concurrency (so the
        # node holds it back) and its config cannot depend on the trials still running.
        self.may_queue = (bool(self.req_units) and not self.searcher.needs_metric
                          and (not self.max_concurrent or self.max_concurrent >= self.slots) and QUEUE_AHEAD)
        custom = {k: v for k, v in self.resources.items() if k not in ("CPU", "GPU", "memory")}
        self.task = _trial_task.options(num_cpus=self.resources.get("CPU", 0), num_gpus=self.resources.get("GPU", 0),
                                        memory=self.resources.get("memory") or None, resources=custom or None,
                                        max_retries=0)

    def _open_experiment(self) -> None:
        st = self.storage
        existing = st.exists()
        if existing and not self.resume:
            raise ValueError(f"experiment {self.name!r} already exists at {st.path}: pass resume=True to continue "
                             f"it, or another name (or storage_path)")
        direction = "maximize" if self.mode == "max" else "minimize"
        self.study = optuna.create_study(sampler=self.searcher.sampler, pruner=self.scheduler.make_pruner(),
                                         direction=direction, **self.searcher.study_args(self.name))
        # a study in the user's storage (OptunaSearch(storage=...)) may hold this experiment's trials already
        self.told = {t.user_attrs.get("trial_id") for t in self.study.get_trials(deepcopy=False)}
        self.searcher.setup_study(self.study)
        self.mirror = StudyMirror(st.study_url, self.name, direction)   # its writer starts with a trial
        meta = st.load_meta() if existing else {}
        self.exp_tag = meta.get("exp_tag") or os.urandom(3).hex()[:5]
        self.meta = {"name": self.name, "trainable": self.trainable_name, "exp_tag": self.exp_tag,
                     "metric": self.metric, "mode": self.mode, "num_samples": self.num_samples,
                     "total_trials": self.total_trials, "resources_per_trial": self.resources,
                     "search_alg": self.searcher.describe(), "scheduler": type(self.scheduler).__name__,
                     "created": meta.get("created", time.time()), "status": "running"}
        st.save_meta(self.meta)
        if not existing:
            return
        for t in st.load_trials():
            self.trials.append(t)
            self.by_id[t.trial_id] = t
            if t.status == ERROR and self.errored:
                self._reopen_errored(t)
            if t.is_finished:
                self._restore_finished(t)
            else:
                self._restore_unfinished(t)
        if self.reporter.verbose:
            done = sum(t.is_finished for t in self.trials)
            self.reporter._print(f"Resuming {self.name}: {done} finished trials kept, {len(self.pending)} to "
                                 f"(re)start from their latest checkpoint if any")

    def _restore_finished(self, t: Trial) -> None:
        o = t.optuna
        if not o.get("params") and not o.get("distributions"):
            return
        state = TrialState[o.get("state", "FAIL")]
        value = o.get("value")
        if state == TrialState.COMPLETE and value is None:
            state = TrialState.FAIL
        frozen = optuna.trial.create_trial(
            state=state, value=value if state != TrialState.FAIL else None, params=o.get("params", {}),
            distributions={k: optuna.distributions.json_to_distribution(v) for k, v in o["distributions"].items()},
            intermediate_values={int(k): v for k, v in (o.get("intermediate") or {}).items()},
            system_attrs=o.get("system_attrs") or {}, user_attrs={"trial_id": t.trial_id})
        if t.trial_id not in self.told:
            self.study.add_trial(frozen)
        self.mirror.add(frozen)

    def _reopen_errored(self, t: Trial) -> None:
        """An errored trial runs again (resume="AUTO+ERRORED" / Tuner.restore(resume_errored=True)):
        from its latest checkpoint, or, with "restart", from scratch (its checkpoints and results
        are deleted)."""
        t.status, t.error_msg, t.num_failures, t.end_time = PENDING, None, 0, None
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(t.path, "error.txt"))
        if self.errored == "restart":
            for name in os.listdir(t.path):
                if name.startswith("checkpoint_"):
                    shutil.rmtree(os.path.join(t.path, name), ignore_errors=True)
            rewrite_results(t.path, [])
            t.rewind([])
            for key in ("intermediate", "last_step", "next_rung"):   # the pruner sees it from step one again
                t.optuna.pop(key, None)

    def _restore_unfinished(self, t: Trial) -> None:
        ot = self.searcher.restore(self.study, t.optuna.get("params", {}), t.optuna.get("distributions", {}))
        ot.set_user_attr("trial_id", t.trial_id)
        for step, value in sorted((int(k), v) for k, v in (t.optuna.get("intermediate") or {}).items()):
            ot.report(value, step)
        t.optuna_trial = ot
        t.status, t.restored = PENDING, True
        self.pending.append(t)

    # ------------------------------------------------------------------ the run
    def run(self) -> ExperimentAnalysis:
        if not ray.is_initialized():
            ray.init()
        self._check_feasible()
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.hub = None
        outcome = "finished"
        try:
            self._open_experiment()
            self.storage.start_io()
            trainable = self.trainable._put() if isinstance(self.trainable, session.with_parameters) else self.trainable
            self.trainable_ref = ray.put(trainable)
            self.hub = _HubActor.remote()
            # what every trial gets alike, stored once: each launch then pickles only its own fields
            self.static_ref = ray.put({"hub": self.hub, "resources": dict(self.resources), "stop_at": self.stop_at,
                                       "may_stop": self.may_stop, "chdir": chdir_enabled(),
                                       "log_files": self.log_files,
                                       "checkpoint_dir_arg": session.wants_checkpoint_dir(self.trainable)})
            self.started_at = time.monotonic()
            self._fire("setup", stop=self.stop, num_samples=self.num_samples, total_num_samples=self.num_samples)
            self._loop()
            if self.fail_error is not None:
                raise self.fail_error
        except KeyboardInterrupt:
            outcome = "interrupted"   # resumable as it is: the cleanup says how
            raise
        except BaseException:
            outcome = "failed"   # an error (the trainable's results, a callback): resuming would repeat it
            raise
        finally:
            self._cleanup(outcome)
            optuna.logging.set_verbosity(verbosity)
        self.reporter.summary(self)
        self._fire("on_experiment_end", trials=self.trials)
        return ExperimentAnalysis(self.trials, self.metric, self.mode, experiment_path=self.storage.path,
                                  study=self.study)

    def _loop(self) -> None:
        # Never blocks on anything but ray.wait: the hub is drained asynchronously (its ref is waited
        # on with the trials'), so a trial ending mid-drain still gets its slot refilled at once.
        while True:
            self.iteration += 1
            self._fire("on_step_begin", iteration=self.iteration, trials=self.trials)
            self._launch_ready()
            if not self.running and not self.finishing and self.drain_ref is None and \
                    (self.stopping or (not self.pending and not self._can_create())):
                break
            if self.drain_ref is None and (self.finishing or time.monotonic() >= self.next_drain):
                self.drain_ref, self.drain_covers = self.hub.drain.remote(), list(self.finishing)
            refs = [*self.running, self.drain_ref] if self.drain_ref is not None else list(self.running)
            ready, _ = ray.wait(refs, num_returns=1, timeout=self._timeout())
            if ready and len(refs) > 1:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            ended = [ref for ref in ready if ref is not self.drain_ref]
            if (self.queued is not None and len(ended) == 1
                    and time.monotonic() - self.running[ended[0]].launched_at > 25 * YIELD_S):
                # One trial ended and the node is starting the queued one in its place: give the
                # node thread the GIL (its dispatch, the trial's gate) before this loop's bookkeeping
                # (not after short trials, where the loop's own pace is what counts).
                time.sleep(YIELD_S)
            drained = False
            for ref in ready:
                if ref is self.drain_ref:
                    drained = True
                    continue
                trial = self.running.pop(ref)
                self._release(trial)
                self.finishing.append(trial)
            refilled = len(ready) > drained
            if refilled:
                self._refill()
            if drained:
                self._drain(ray.get(self.drain_ref))
                self.drain_ref = None
                for trial in self.drain_covers:   # every result it sent before ending is processed
                    self.finishing.remove(trial)
                    self._finalize(trial, trial.outcome)
            self.mirror.send()
            self._enforce(time.monotonic())
            if not refilled:
                # Not right after a launch: the node thread (in this process) is dispatching it and
                # needs the GIL; Optuna's ask and the trial's files would delay its start by ~1 ms.
                self._precreate()
                if self._prequeue():
                    self._precreate()
            self.reporter.maybe_status(self)
            self._fire("on_step_end", iteration=self.iteration, trials=self.trials)

    def _fire(self, hook: str, **info) -> None:
        """Call Ray's tune.Callback hook on every callback that has it."""
        for cb in self.callbacks:
            method = getattr(cb, hook, None)
            if method is not None:
                method(**info)

    def _refill(self) -> None:
        """Launch into the slots that trials just left, then learn how they ended."""
        self._launch_ready()
        for trial in self.finishing:
            if trial.outcome is None:
                trial.outcome = self._outcome(trial.ref)

    def _precreate(self) -> None:
        """For a random search, keep one trial per slot ready as PENDING (shown with the reason it
        waits), so refilling a slot never waits for Optuna or the file system. An adaptive searcher
        (OptunaSearch) asks only when a slot is free and every ended trial is told instead: each
        config then uses every result there is, and a seeded sequential search repeats exactly."""
        if self.searcher.needs_metric:
            return
        while len(self.pending) < max(1, self.slots) and self._can_create():
            self._create_trial()

    def _prequeue(self) -> bool:
        """With every slot taken, submit the next trial ahead, gated on the running trials: the node
        starts it the moment one of them ends and frees its resources, with no round trip through
        this loop. It waits (in `run_trial`, on `ray.wait` of that gate, which gives its CPU back)
        if the node frees a CPU otherwise, e.g. a trial blocked in `get`. A trial that restarts
        from a checkpoint, or one the running trials' results could change, is launched as usual."""
        if (not self.may_queue or self.queued is not None or self.stopping or not self.running
                or not self.pending or self._fits()):
            return False
        trial = self.pending[0]
        if trial.attempt or trial.restored or trial.num_failures:
            return False
        self.pending.popleft()
        self._launch(trial, gate=list(self.running))
        return True

    def _timeout(self) -> float:
        now = time.monotonic()
        deadlines = [self.reporter.last_print + self.reporter.interval]
        if self.drain_ref is None:
            deadlines.append(self.next_drain)
        if self.time_budget_s is not None and not self.stopping:
            deadlines.append(self.started_at + self.time_budget_s)
        for t in self.running.values():
            if t.stop_requested_at is not None:
                deadlines.append(t.stop_requested_at + STOP_GRACE_S * (1 + 2 * t.cancel_stage))
        return min(1.0, max(0.001, min(deadlines) - now))

    # ------------------------------------------------------------------ trials
    def _can_create(self) -> bool:
        return not self.stopping and (self.total_trials is None or len(self.trials) < self.total_trials)

    def _fits(self) -> bool:
        if self.max_concurrent is not None and len(self.running) >= self.max_concurrent:
            return False
        return all(self.held.get(k, 0) + v <= self.total_units.get(k, 0) for k, v in self.req_units.items())

    def _create_trial(self) -> Trial:
        index = len(self.trials)
        config, ot = self.searcher.suggest(self.study, index)
        tid = f"{self.exp_tag}_{index:05d}"
        ot.set_user_attr("trial_id", tid)
        trial = Trial(tid, index, config, "", self.resources, self.trainable_name)
        trial.experiment_tag = self._experiment_tag(trial)
        if self.trial_name_creator is not None:
            trial.custom_trial_name = str(self.trial_name_creator(trial))
        trial.path = self.storage.trial_dir(self._dirname(trial))
        trial.optuna = {"params": dict(ot.params), "number": ot.number,
                        "distributions": {k: distribution_to_json(v) for k, v in ot.distributions.items()}}
        trial.optuna_trial = ot
        self.storage.create_trial(trial)
        self.trials.append(trial)
        self.by_id[tid] = trial
        self.pending.append(trial)
        return trial

    def _launch_ready(self) -> None:
        while self._fits() and not self.stopping:
            if self.queued is not None:   # a running trial ended: the node has already started it
                trial, self.queued = self.queued, None
                self._started(trial)
                continue
            if not self.pending:
                if not self._can_create() or not self._may_ask():
                    return
                self._create_trial()
            self._launch(self.pending.popleft())

    def _may_ask(self) -> bool:
        """An adaptive searcher asks only once every ended trial is told: the same history gives
        the same configs (a seeded TPE run repeats), and no ask misses a result it could have had."""
        return not (self.searcher.needs_metric and self.finishing)

    def _launch(self, trial: Trial, gate: list | None = None) -> None:
        trial.attempt += 1
        ckpt = None
        if trial.attempt > 1 or trial.restored:   # a retried or resumed trial restarts from its checkpoint
            self.storage.flush()
            ckpt = self._rewind(trial)
        info = {"trial_id": trial.trial_id, "trial_name": str(trial), "trial_dir": trial.path,
                "attempt": trial.attempt, "checkpoint": ckpt.path if ckpt else None,
                "experiment_tag": trial.experiment_tag or self._experiment_tag(trial)}
        if gate:
            info["gate"] = gate
        trial.ref = self.task.remote(self.trainable_ref, trial.config, info, self.static_ref)
        trial.stop_requested_at, trial.cancel_stage, trial.stop_reason = None, 0, None
        if gate:
            self.queued = trial
        else:
            self._started(trial)

    def _experiment_tag(self, trial: Trial) -> str:
        """Ray's `experiment_tag`: the trial's index and its searched values, "3_lr=0.01,h=64"."""
        parts = []
        for path, _ in sorted(self.space.grids + self.space.domains, key=lambda pd: path_name(pd[0])):
            node = trial.config
            for key in path:
                node = node[key] if isinstance(node, (dict, list)) else None
            parts.append(f"{path[-1]}={node:.4g}" if isinstance(node, float) else f"{path[-1]}={node}")
        return f"{trial.index}_{','.join(parts)}" if parts else str(trial.index)

    def _dirname(self, trial: Trial) -> str:
        """Ray's trial directory name, `<trial name>_<experiment tag>_<date>` (or the
        trial_dirname_creator's, which must be a name, not a path), unique in the experiment."""
        if self.trial_dirname_creator is None:   # unique: the trial id is in it
            name = f"{trial}_{trial.experiment_tag}"[:DIRNAME_MAX] + f"_{datetime.now():%Y-%m-%d_%H-%M-%S}"
            return re.sub(r'[/()<>:"\\|?*]', "_", name)
        name = str(self.trial_dirname_creator(trial))
        if os.sep in name or name in ("", ".", ".."):
            raise ValueError(f"trial_dirname_creator returned {name!r}: a trial directory name must not be "
                             f"empty or contain {os.sep!r}")
        name = re.sub(r'[/()<>:"\\|?*]', "_", name)
        taken = {t.path for t in self.trials}   # trials sharing a directory would overwrite each other's records
        base, i = name, 1
        while self.storage.trial_dir(name) in taken:
            name, i = f"{base}_{i}", i + 1
        return name

    def _started(self, trial: Trial, callbacks: bool = True) -> None:
        """The trial holds its resources from now on (launched, or its gate opened)."""
        self.running[trial.ref] = trial
        for k, v in self.req_units.items():
            self.held[k] = self.held.get(k, 0) + v
        trial.launched, trial.launched_at = True, time.monotonic()
        if not callbacks:
            return
        if trial.start_time is None:
            trial.start_time = time.time()
        self._fire("on_trial_start", iteration=self.iteration, trials=self.trials, trial=trial)

    def _rewind(self, trial: Trial) -> session.Checkpoint | None:
        """The checkpoint to restart from: the newest with every earlier result on disk (a driver
        killed mid-drain may have missed the last few results, not the checkpoints the trial wrote
        after them), else none. Results and checkpoints after it are dropped: the trial redoes them;
        so are the partial copies of a trial killed while it wrote a checkpoint."""
        results = read_results(trial.path)
        recorded = results[-1].get("training_iteration", 0) if results else 0
        upto, ckpt, stale = session.restart_point(trial.path, recorded)
        stale += [os.path.join(trial.path, n) for n in os.listdir(trial.path) if n.startswith("checkpoint_")
                  and ".tmp" in n]
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
        meta = ckpt.metadata if ckpt else {}
        keep = [r for r in results if r.get("training_iteration", 0) <= upto]
        if upto and meta.get("result") and (not keep or keep[-1].get("training_iteration") != upto):
            keep.append(meta["result"])   # the driver died before it saw the checkpoint's result
        rewrite_results(trial.path, keep)
        trial.rewind(keep)
        trial.restored = False
        return ckpt

    def _release(self, trial: Trial) -> None:
        for k, v in self.req_units.items():
            self.held[k] -= v

    def _outcome(self, ref):
        try:
            return "ok", ray.get(ref)
        except ray.exceptions.TaskCancelledError as e:
            return "cancelled", e
        except Exception as e:  # noqa: BLE001 - the trial's error, recorded on the trial
            return "error", e

    # ------------------------------------------------------------------ results and decisions
    def _drain(self, events: list) -> None:
        touched = set()
        for kind, tid, attempt, payload in events:
            trial = self.by_id.get(tid)
            if trial is None or attempt != trial.attempt:
                continue
            if kind == "start":
                self.mirror.start()   # not before: its start-up (a second of CPU) would delay the first trials'
                if not trial.is_finished:
                    trial.status = RUNNING
                trial.runtime = payload
            else:
                self._on_result(trial, payload)
                touched.add(tid)
        self._write_results()
        if self.new_stops:
            self.hub.stop.remote(self.new_stops)
            self.new_stops = []
        self.drain_interval = DRAIN_MIN_S if touched else min(DRAIN_MAX_S, self.drain_interval * 2)
        self.next_drain = time.monotonic() + self.drain_interval

    def _write_results(self) -> None:
        """Queue the drained results, then the deletion of the checkpoints they made obsolete."""
        for path, results in self.result_batch.items():
            self.storage.append_results(path, results)
        self.result_batch = {}
        self.storage.remove_checkpoints(self.dropped)
        self.dropped = []

    def _on_result(self, trial: Trial, result: dict) -> None:
        if trial.stop_reason is not None:
            # A trial learns of a stop at a later report than the one that decided it (Ray's waits at
            # each report instead): what it reported since is dropped, so its record ends where the
            # stopper, scheduler or budget stopped it, as in Ray.
            name = result.get("checkpoint_dir_name")
            if name:
                self.dropped.append(os.path.join(trial.path, name))
            return
        flat = flat_result(result)   # what the checks, scheduler and `stop=` bounds see, as in Ray
        if self.expected_metrics:
            check_metrics(flat, self.expected_metrics)
        trial.add_result(result)
        if self.checkpoint_config is not None and result.get("checkpoint_dir_name"):
            self.dropped += trial.drop_checkpoints(self.checkpoint_config)
        self.result_batch.setdefault(trial.path, []).append(result)
        self.reporter.result_line(trial, result)
        self._fire("on_trial_result", iteration=self.iteration, trials=self.trials, trial=trial, result=result)
        if result.get("checkpoint_dir_name") and self.callbacks:
            self._fire("on_checkpoint", iteration=self.iteration, trials=self.trials, trial=trial,
                       checkpoint=session.Checkpoint(os.path.join(trial.path, result["checkpoint_dir_name"])))
        if result.get("done"):   # Ray's Trial.should_stop; the trial ends itself at this report (session.report)
            return self._request_stop(trial, "done")
        decision = self.scheduler.on_result(trial, flat)
        if decision == PRUNE:
            return self._request_stop(trial, "pruned")
        if decision == STOP:
            return self._request_stop(trial, "max_t")
        if self._stop_criteria(trial, result, flat):
            self._request_stop(trial, "stop criteria")

    def _stop_criteria(self, trial: Trial, result: dict, flat: dict) -> bool:
        """A `stop=` dict reads the flattened result ("a/b" keys); a stopper the result as reported."""
        stop = self.stop
        if stop is None:
            return False
        if isinstance(stop, dict):
            for key, bound in stop.items():
                v = flat.get(key)
                if v is None and key not in self.warned_stop_keys:
                    self.warned_stop_keys.add(key)   # as Ray: a warning, once; the trial runs to its end
                    warnings.warn(f"stop criterion {key!r} is not in trial {trial.trial_id}'s result (keys: "
                                  f"{sorted(flat)}); if it is never reported, trials run until they end",
                                  stacklevel=2)
                if v is not None and v >= bound:
                    return True
            return False
        if bool(stop(trial.trial_id, result)):
            return True
        stop_all = getattr(stop, "stop_all", None)
        if stop_all is not None and stop_all():
            self._stop_experiment("the stopper's stop_all()")
        return False

    def _request_stop(self, trial: Trial, reason: str) -> None:
        if trial.stop_reason is None:
            trial.stop_reason = reason
            trial.stop_requested_at = time.monotonic()
            self.new_stops.append(trial.trial_id)

    def _stop_experiment(self, why: str) -> None:
        if self.stopping:
            return
        self.stopping = why
        for trial in self.running.values():
            self._request_stop(trial, why)
        if self.queued is not None:   # withdrawn: cancelled while it waits, discarded if it never began
            trial, self.queued = self.queued, None
            ray.cancel(trial.ref)
            trial.withdrawn = True
            self._started(trial, callbacks=False)
            self._request_stop(trial, why)
        for trial in [t for t in self.pending if t.attempt == 0 and not t.restored and not t.num_failures]:
            self._discard(trial)   # asked for but never started: not a trial of this experiment after all
        if self.new_stops:
            self.hub.stop.remote(self.new_stops)
            self.new_stops = []

    def _discard(self, trial: Trial) -> None:
        if trial in self.pending:
            self.pending.remove(trial)
        self.trials.remove(trial)
        del self.by_id[trial.trial_id]
        self.study.tell(trial.optuna_trial, state=TrialState.FAIL)
        shutil.rmtree(trial.path, ignore_errors=True)

    def _enforce(self, now: float) -> None:
        if self.time_budget_s is not None and not self.stopping and now - self.started_at >= self.time_budget_s:
            self._stop_experiment(f"time_budget_s={self.time_budget_s:g}")
        stop_all = getattr(self.stop, "stop_all", None)   # also between results, as Ray checks it (TimeoutStopper)
        if stop_all is not None and not self.stopping and stop_all():
            self._stop_experiment("the stopper's stop_all()")
        for ref, trial in self.running.items():
            if trial.stop_requested_at is None:
                continue
            waited = now - trial.stop_requested_at
            if trial.cancel_stage == 0 and waited >= STOP_GRACE_S:
                trial.cancel_stage = 1
                ray.cancel(ref)                # the trial did not report: interrupt it
            elif trial.cancel_stage == 1 and waited >= 3 * STOP_GRACE_S:
                trial.cancel_stage = 2
                ray.cancel(ref, force=True)    # nor did it stop: end its process

    def _finalize(self, trial: Trial, outcome) -> None:
        kind, value = outcome
        trial.launched, trial.ref, trial.outcome = False, None, None
        if trial.withdrawn:
            trial.withdrawn = False
            if trial.status == PENDING:   # submitted ahead, withdrawn before it began
                self.storage.flush()
                return self._discard(trial)
            trial.start_time = trial.start_time or time.time()   # it had begun: a trial stopped at once
            self._fire("on_trial_start", iteration=self.iteration, trials=self.trials, trial=trial)
        self.storage.close_results(trial.path)
        if kind == "ok" or trial.stop_reason is not None:
            trial.status = TERMINATED
            trial.early_stopped = trial.stop_reason == "pruned"
            if trial.last_result:   # a copy: the I/O thread may still be writing the original
                trial.last_result = {**trial.last_result, "done": True}
            state = TrialState.PRUNED if trial.early_stopped else TrialState.COMPLETE
            what = "stopped early (pruned)" if trial.early_stopped else \
                f"stopped ({trial.stop_reason})" if trial.stop_reason else "completed"
        else:
            trial.num_failures += 1
            text = getattr(value, "traceback_str", None) or "".join(traceback.format_exception(value))
            trial.error_msg = f"{type(value).__name__}: {value}"
            self.storage.write_error(trial, text)
            if not self.stopping and (self.max_failures < 0 or trial.num_failures <= self.max_failures):
                trial.status = PENDING
                self.pending.appendleft(trial)
                self.storage.save_trial(trial)
                self.reporter.trial_line(trial, f"failed ({trial.num_failures}/{self.max_failures}), retrying")
                self._fire("on_trial_recover", iteration=self.iteration, trials=self.trials, trial=trial)
                return
            trial.status, state, what = ERROR, TrialState.FAIL, "errored"
            if self.fail_fast and not self.stopping:
                if self.fail_fast == "RAISE":
                    self.fail_error = value
                self._stop_experiment(f"fail_fast: trial {trial.trial_id} errored")
        trial.end_time = time.time()
        self._tell(trial, state)
        trial.compact()
        self.storage.save_trial(trial)
        self.reporter.trial_line(trial, what)
        hook = "on_trial_error" if trial.status == ERROR else "on_trial_complete"
        if self.callbacks:
            self.storage.flush()   # the trial's files are on disk before its callbacks run
        self._fire(hook, iteration=self.iteration, trials=self.trials, trial=trial)

    def _tell(self, trial: Trial, state: TrialState) -> None:
        value = lookup(trial.last_result, self.metric) if self.metric else None
        finite = is_finite(value)
        if state == TrialState.COMPLETE and not finite:
            state = TrialState.FAIL   # Optuna needs a value for a complete trial
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            frozen = self.study.tell(trial.optuna_trial, float(value) if state == TrialState.COMPLETE else None,
                                     state=state)
        # system_attrs hold the pruner's records (ASHA's rung values), which trials after a resume compete with
        trial.optuna.update(state=frozen.state.name, value=frozen.value, system_attrs=dict(frozen.system_attrs))
        self.mirror.add(frozen)

    # ------------------------------------------------------------------ end
    def _cleanup(self, outcome: str) -> None:
        if self.queued is not None:
            try:
                ray.cancel(self.queued.ref, force=True)
            except Exception:  # noqa: BLE001
                pass
        for ref in list(self.running):
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001
                pass
        for trial in self.running.values():
            self.storage.save_trial(trial)
        self._write_results()
        self.storage.close()
        if self.hub is not None:
            try:
                ray.kill(self.hub)
            except Exception:  # noqa: BLE001
                pass
        mirror = getattr(self, "mirror", None)
        if mirror is not None:
            mirror.close(timeout=120.0 if outcome == "finished" else 10.0)
        if hasattr(self, "meta"):
            self.meta["status"] = outcome if outcome != "finished" or not self.stopping else \
                f"stopped: {self.stopping}"
            self.meta["end"] = time.time()
            self.storage.save_meta(self.meta)
        if outcome == "interrupted" and self.reporter.verbose and hasattr(self, "meta"):
            self.reporter._print(f"Experiment {self.name} interrupted; continue it with "
                                 f"tune.run(..., name={self.name!r}, storage_path={self.storage.root!r}, resume=True)")
