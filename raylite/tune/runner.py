"""The experiment loop behind `tune.run`: trials as raylite tasks, searched and pruned by one Optuna study.

Its parts: records.py (the experiment on disk, resume), placement.py (resources, the trial
task), stopping.py (stop criteria, cancelling, the end), restarts.py (trials a scheduler
restarts: PBT).

- One trial = one raylite task running the function trainable (or a tune.Trainable's loop), with the trial's resources
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

import os
import shutil
import time
import traceback
from collections import deque

import optuna
from optuna.distributions import distribution_to_json
from optuna.trial import TrialState

import raylite as ray
from raylite.train.config import CheckpointConfig
from raylite.tune import placement, records, restarts, session, stopping
from raylite.tune.analysis import ExperimentAnalysis
from raylite.tune.metrics import check_metrics, flat_result
from raylite.tune.progress import ProgressReporter
from raylite.tune.schedulers import EXPLOIT, PAUSE, PRUNE, STOP, FIFOScheduler, as_scheduler
from raylite.tune.search import BasicVariantGenerator
from raylite.tune.search_space import path_name
from raylite.tune.storage import ExperimentStorage
from raylite.tune.trial import ERROR, PENDING, RUNNING, TERMINATED, Trial
from raylite.tune.trial_env import chdir_enabled, log_files

DRAIN_MIN_S, DRAIN_MAX_S = 0.02, 0.2
YIELD_S = 0.002      # how long the loop lets the node thread run when a queued trial takes a slot

_HubActor = ray.remote(num_cpus=0)(session.Hub)


class TrialRunner:
    """One experiment: `tune.run` validates its arguments, then builds this and calls `run()`."""

    def __init__(self, trainable, config, num_samples, resources_per_trial, metric, mode, search_alg, scheduler,
                 stop, time_budget_s, max_concurrent_trials, storage_path, name, resume, max_failures, verbose,
                 callbacks, checkpoint_config: CheckpointConfig | None = None, fail_fast: bool | str = False,
                 errored: str | None = None, trial_name_creator=None, trial_dirname_creator=None,
                 log_to_file: bool | str | tuple = False, reuse_actors: bool = False, resource_fn=None):
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
        self.reuse_actors = bool(reuse_actors)
        self.resource_fn = resource_fn   # config -> the trial's resources (with_resources(fn)), or None
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
        self.name = name or records.default_name(self, storage_path, resume)
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
        self.paused: list[Trial] = []      # stopped by a synchronous scheduler until it releases them
        self.drain_ref, self.drain_covers = None, []
        self.result_batch: dict[str, list] = {}   # trial dir -> results of this drain, written together
        self.held: dict[str, int] = {}
        self.stopping: str | None = None
        self.iteration = 0
        self.drain_interval, self.next_drain = DRAIN_MIN_S, 0.0
        self.new_stops: list[tuple[str, int]] = []   # (trial id, attempt): a restarted trial runs on
        self.started_at = time.monotonic()

    # ------------------------------------------------------------------ setup
    # ------------------------------------------------------------------ the run
    def run(self) -> ExperimentAnalysis:
        if not ray.is_initialized():
            ray.init()
        placement.check_feasible(self)
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.hub = None
        outcome = "finished"
        try:
            records.open_experiment(self)
            self.scheduler.setup_experiment(self.storage.path)
            self.storage.start_io()
            trainable = self.trainable._put() if isinstance(self.trainable, session.with_parameters) else self.trainable
            self.trainable_ref = ray.put(trainable)
            self.hub = _HubActor.remote()
            # what every trial gets alike, stored once: each launch then pickles only its own fields
            self.static_ref = ray.put({"hub": self.hub, "resources": dict(self.resources), "stop_at": self.stop_at,
                                       "may_stop": self.may_stop, "chdir": chdir_enabled(),
                                       "log_files": self.log_files,
                                       "checkpoint_dir_arg": session.wants_checkpoint_dir(self.trainable),
                                       **placement.class_options(self)})
            self.started_at = time.monotonic()
            self._fire("setup", stop=self.stop, num_samples=self.num_samples, total_num_samples=self.num_samples)
            self._loop()
            restarts.end_held(self)
            if self.fail_error is not None:
                raise self.fail_error
        except KeyboardInterrupt:
            outcome = "interrupted"   # resumable as it is: the cleanup says how
            raise
        except BaseException:
            outcome = "failed"   # an error (the trainable's results, a callback): resuming would repeat it
            raise
        finally:
            stopping.cleanup(self, outcome)
            optuna.logging.set_verbosity(verbosity)
        self.reporter.summary(self)
        self._fire("on_experiment_end", trials=self.trials)
        return ExperimentAnalysis(self.trials, self.metric, self.mode, experiment_path=self.storage.path,
                                  objectives=self.searcher.objectives,
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
                trial.task_ended_at = time.time()
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
            stopping.enforce(self, time.monotonic())
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
                deadlines.append(t.stop_requested_at + stopping.STOP_GRACE_S * (1 + 2 * t.cancel_stage))
        return min(1.0, max(0.001, min(deadlines) - now))

    # ------------------------------------------------------------------ trials
    def _can_create(self) -> bool:
        return not self.stopping and (self.total_trials is None or len(self.trials) < self.total_trials)

    def _fits(self, trial: Trial | None = None) -> bool:
        """Whether one more trial (this one, when resources differ per config) fits now."""
        if self.max_concurrent is not None and len(self.running) >= self.max_concurrent:
            return False
        need = placement.units_of(self, trial) if trial is not None else self.req_units
        return all(self.held.get(k, 0) + v <= self.total_units.get(k, 0) for k, v in need.items())

    def _create_trial(self) -> Trial:
        index = len(self.trials)
        config, ot = self.searcher.suggest(self.study, index)
        tid = f"{self.exp_tag}_{index:05d}"
        if "trial_id" not in ot.user_attrs:   # a later repeat (Repeater) shares its group's first trial
            ot.set_user_attr("trial_id", tid)
        resources = placement.config_resources(self, config) if self.resource_fn else self.resources
        trial = Trial(tid, index, config, "", resources, self.trainable_name)
        self.scheduler.on_trial_add(trial)
        trial.experiment_tag = records.experiment_tag(self, trial)
        if self.trial_name_creator is not None:
            trial.custom_trial_name = str(self.trial_name_creator(trial))
        trial.path = self.storage.trial_dir(records.dirname(self, trial))
        trial.optuna = {"params": dict(ot.params), "number": ot.number,
                        "distributions": {k: distribution_to_json(v) for k, v in ot.distributions.items()}}
        group = self.searcher.group(index, self.total_trials)
        if group is not None:
            trial.optuna["group"] = list(group)
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
            if self.resource_fn is not None and not self._fits(self.pending[0]):
                return   # its own resources are not free yet
            self._launch(self.pending.popleft())

    def _may_ask(self) -> bool:
        """An adaptive searcher asks only once every ended trial is told: the same history gives
        the same configs (a seeded TPE run repeats), and no ask misses a result it could have had."""
        return not (self.searcher.needs_metric and self.finishing)

    def _launch(self, trial: Trial, gate: list | None = None) -> None:
        trial.attempt += 1
        ckpt = None
        if trial.resume_from is not None:   # a scheduler restarted it (PBT), from this checkpoint
            ckpt, trial.resume_from = session.Checkpoint(trial.resume_from), None
        elif trial.attempt > 1 or trial.restored:   # a retried or resumed trial restarts from its checkpoint
            self.storage.flush()
            ckpt = records.rewind(self, trial)
        info = {"trial_id": trial.trial_id, "trial_name": str(trial), "trial_dir": trial.path,
                "attempt": trial.attempt, "checkpoint": ckpt.path if ckpt else None,
                "experiment_tag": trial.experiment_tag or records.experiment_tag(self, trial)}
        if gate:
            info["gate"] = gate
        task = self.task
        if self.resource_fn is not None:   # this trial's own resources
            task, info["resources"] = placement.task_for(self, trial), dict(trial.resources)
        trial.ref = task.remote(self.trainable_ref, trial.config, info, self.static_ref)
        trial.stop_requested_at, trial.cancel_stage, trial.stop_reason = None, 0, None
        if gate:
            self.queued = trial
        else:
            self._started(trial)

    def _started(self, trial: Trial, callbacks: bool = True) -> None:
        """The trial holds its resources from now on (launched, or its gate opened)."""
        self.running[trial.ref] = trial
        for k, v in placement.units_of(self, trial).items():
            self.held[k] = self.held.get(k, 0) + v
        trial.launched, trial.launched_at = True, time.monotonic()
        if not callbacks:
            return
        if trial.start_time is None:
            trial.start_time = time.time()
        self._fire("on_trial_start", iteration=self.iteration, trials=self.trials, trial=trial)

    def _release(self, trial: Trial) -> None:
        for k, v in placement.units_of(self, trial).items():
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
        if self.scheduler.mutates_config:   # PBT: the config each result came from (Ray's results carry it)
            result["config"] = trial.config
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
            return stopping.request_stop(self, trial, "done")
        decision = self.scheduler.on_result(trial, flat)
        if decision == PRUNE:
            return stopping.request_stop(self, trial, "pruned")
        if decision == STOP:
            return stopping.request_stop(self, trial, "max_t")
        if stopping.stop_criteria(self, trial, result, flat):
            trial.restart = None   # it ends here: nothing to start again
            return stopping.request_stop(self, trial, "stop criteria")
        if decision in (EXPLOIT, PAUSE):   # ends at its next report, then starts again (_restart_later)
            stopping.request_stop(self, trial, decision)

    def _discard(self, trial: Trial) -> None:
        if trial in self.pending:
            self.pending.remove(trial)
        self.trials.remove(trial)
        del self.by_id[trial.trial_id]
        records.discard(self, trial)
        shutil.rmtree(trial.path, ignore_errors=True)

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
        if trial.stop_reason in (EXPLOIT, PAUSE) and not self.stopping and \
                (kind == "cancelled" or kind == "ok" and value.get("stopped")):
            return restarts.restart_later(self, trial)
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
                stopping.stop_experiment(self, f"fail_fast: trial {trial.trial_id} errored")
        # the trial ended with its task, not when its last results were drained: the next trial may
        # already hold its slot by then
        trial.end_time, trial.task_ended_at = trial.task_ended_at or time.time(), None
        records.tell(self, trial, state)
        trial.compact()
        self.storage.save_trial(trial)
        self.reporter.trial_line(trial, what)
        hook = "on_trial_error" if trial.status == ERROR else "on_trial_complete"
        if self.callbacks:
            self.storage.flush()   # the trial's files are on disk before its callbacks run
        self._fire(hook, iteration=self.iteration, trials=self.trials, trial=trial)
        self.scheduler.on_trial_complete(trial)
        restarts.release_paused(self)

    # ------------------------------------------------------------------ schedulers that restart trials
