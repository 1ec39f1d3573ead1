"""The engine: Trainer (Ray Train 1.x's life cycle), and DataParallelTrainer / TorchTrainer (Ray
2.x's ``fit``) over one worker group, with report collection, checkpoint persistence and restarts
after worker deaths."""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time

import raylite as ray
from raylite import exceptions
from raylite.train import session
from raylite.train._validate import check_loop_config, check_trainer_arguments
from raylite.train.checkpoint import Checkpoint
from raylite.train.config import (BackendConfig, CheckpointConfig, FailureConfig, RunConfig,
                                  ScalingConfig, TorchConfig, backend_config_from, check_dataset_config,
                                  check_max_failures, check_num_workers, default_storage_path)
from raylite.train._placement import check_fits, resolve_use_gpu
from raylite.train.progress import RunProgress
from raylite.train.result import Result, RunRecorder
from raylite.train.session import SessionInfo
from raylite.train.worker_group import ReporterActor, WorkerGroup, is_death, takes_config

logger = logging.getLogger("raylite.train")

POLL_S = 0.2            # how often the driver drains reports while workers run
DEATH_GRACE_S = 2.0     # after a worker's error, how long to look for a peer's death behind it
RESTORE_DEPRECATION = ("The `restore` and `can_restore` APIs are deprecated and will be removed in a future release. "
                       "See this issue for more context and migration options: "
                       "https://github.com/ray-project/ray/issues/49454. To resume a run, run the trainer again "
                       "with the same RunConfig(storage_path, name): it picks up that run's latest checkpoint.")


class TrainingFailedError(RuntimeError):
    """Training could not finish: train_func raised (TorchTrainer.fit), or workers kept dying after
    ``max_failures`` restarts. The original error is ``__cause__``; ``result`` is the partial Result."""

    def __init__(self, message: str, result: Result | None = None):
        super().__init__(message)
        self.result = result


class WorkerGroupError(TrainingFailedError):
    """Ray Train 2.x's TrainingFailedError for a failed worker group: ``worker_failures`` maps each
    failed worker's rank to its error (the one that raised, or the one that died)."""

    def __init__(self, message: str, worker_failures: dict[int, BaseException], result: Result | None = None):
        super().__init__(message, result)
        self.worker_failures = worker_failures


class _GroupDied(Exception):
    def __init__(self, rank: int, error: BaseException):
        super().__init__(f"worker rank {rank} died: {error}")
        self.rank, self.error = rank, error


class _TrainFuncError(Exception):
    """train_func raised on a worker (``error`` is the annotated exception); the group is torn down."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class _ReporterDied(Exception):
    """The reporter actor died with the reports it held, so the attempt cannot be completed: like a
    worker's death, the group restarts (with a new reporter) from the latest persisted checkpoint."""

    def __init__(self, error: BaseException):
        super().__init__(f"the reporter actor died: {error}")
        self.error = error


def _annotate(err: BaseException, rank: int, world_size: int, fn_name: str) -> BaseException:
    """Name the failing rank in the error's message (a RayTaskError keeps its type and traceback)."""
    if isinstance(err, exceptions.RayTaskError):
        err.function_name = f"worker rank {rank} of {world_size}: {fn_name}"
        err.args = (str(err),)
    try:
        err.world_rank = rank
    except AttributeError:
        pass
    return err


class Trainer:
    """``Trainer(backend="torch", num_workers=1, use_gpu=False, resources_per_worker=None, logdir=None,
    max_failures=0)``; ``start()``, ``run(train_func, config=None)``, ``shutdown()`` or ``with``.

    Workers stay warm between ``run`` calls; a failed run tears them down and the next one starts a
    new group. Each run writes ``logdir/run_NNN/``; ``last_result`` is its Result.

    Args:
        backend: ``"torch"``, a ``TorchConfig``, or a ``BackendConfig`` (no process group).
        num_workers: training processes (at least 1).
        use_gpu: True (a GPU each, NCCL), False (CPU, gloo) or ``"auto"``.
        resources_per_worker: Ray's keys, ``{"CPU": 2, "GPU": 1, "custom": 1}``.
        logdir: where runs are written (default under ``$RAYLITE_RESULTS_DIR`` or ``~/raylite_results``).
        max_failures: restarts after a worker's death (-1: no limit); errors in train_func are not retried.
    """

    def __init__(self, backend="torch", num_workers: int = 1, use_gpu=False, resources_per_worker: dict | None = None,
                 logdir: str | os.PathLike | None = None, max_failures: int = 0):
        self._backend_config: BackendConfig = backend_config_from(backend)
        check_num_workers(num_workers, "Trainer", why=" (local mode, num_workers=0, is for Ray 2.x trainers' fit)")
        self._scaling = ScalingConfig(num_workers, use_gpu, resources_per_worker)
        check_max_failures(max_failures, "max_failures")
        self.max_failures = max_failures
        self._retry_errors = False   # TorchTrainer: an error in train_func also uses up max_failures, as in Ray 2.x
        self.logdir = os.path.abspath(os.path.expanduser(os.fspath(logdir))) if logdir is not None else None
        self.use_gpu: bool | None = None        # resolved at start()
        self._group: WorkerGroup | None = None
        self._reporter = None
        self._init_hook = None
        self._lock = threading.Lock()
        self.latest_run_dir: str | None = None
        self.last_result: Result | None = None
        self.worker_infos: list[dict] = []
        self.verbose = 1   # driver-side progress (raylite.train.progress); 0: quiet

    # -- life cycle --
    def start(self, initialization_hook=None) -> None:
        """Start the workers and join them in a process group (``initialization_hook`` runs on each)."""
        self._init_hook = initialization_hook
        self._ensure_group()

    def _ensure_group(self) -> None:
        if self._group is not None:
            return
        request = self._preflight()
        sc = self._scaling
        if self._reporter is None:
            self._reporter = ReporterActor.remote()
        torch_config = self._backend_config if isinstance(self._backend_config, TorchConfig) else None
        group = WorkerGroup(sc.num_workers, request, self.use_gpu, torch_config)
        try:
            self.worker_infos = group.start(self._init_hook)
        except BaseException:
            group.kill()
            raise
        self._group = group

    def _preflight(self) -> dict:
        """Resolve use_gpu and check the workers fit the runtime; returns the per-worker request."""
        if not ray.is_initialized():
            ray.init()
        sc = self._scaling
        if self.use_gpu is None:
            asked = sc.worker_request(use_gpu=sc.use_gpu is not False)
            self.use_gpu = resolve_use_gpu(sc.use_gpu, sc.num_workers, asked["num_gpus"] or 1, asked["num_cpus"],
                                           torch=isinstance(self._backend_config, TorchConfig))
        request = sc.worker_request(self.use_gpu)
        check_fits(sc.num_workers, request)
        return request

    def shutdown(self) -> None:
        """Stop the workers (and the reporter)."""
        if self._group is not None:
            self._group.kill()
            self._group = None
        reporter, self._reporter = self._reporter, None
        if reporter is not None and ray.is_initialized():
            try:
                ray.kill(reporter)
            except Exception:
                pass

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()

    # -- runs --
    def run(self, train_func, config: dict | None = None, callbacks: list | None = None,
            checkpoint: Checkpoint | None = None, checkpoint_strategy: CheckpointConfig | None = None) -> list:
        """Run ``train_func`` (or ``train_func(config)``) on every worker; returns their return values
        in rank order.

        Args:
            train_func: the training function, taking ``config`` or nothing.
            config: passed to ``train_func``.
            callbacks: 1.x ``TrainingCallback``-like objects: ``handle_result(results)`` per report round.
            checkpoint: what ``train.get_checkpoint()`` returns at first.
            checkpoint_strategy: which checkpoints to keep (a ``CheckpointConfig``).
        """
        run_dir = self._next_run_dir()
        returns, _ = self._execute(train_func, config, run_dir, checkpoint, checkpoint_strategy, callbacks)
        return returns

    def _next_run_dir(self) -> str:
        if self.logdir is None:
            self.logdir = os.path.join(default_storage_path(), time.strftime("train_%Y-%m-%d_%H-%M-%S"))
        os.makedirs(self.logdir, exist_ok=True)
        k = 1
        while os.path.exists(os.path.join(self.logdir, f"run_{k:03d}")):
            k += 1
        return os.path.join(self.logdir, f"run_{k:03d}")

    @property
    def latest_checkpoint(self) -> Checkpoint | None:
        return self.last_result.checkpoint if self.last_result else None

    @property
    def latest_checkpoint_dir(self) -> str | None:
        ckpt = self.latest_checkpoint
        return ckpt.path if ckpt else None

    @property
    def best_checkpoint_path(self) -> str | None:
        if not self.last_result or not self.last_result.best_checkpoints:
            return None
        return self.last_result.best_checkpoints[-1][0].path

    def _execute(self, train_func, config, run_dir: str, checkpoint, checkpoint_config, callbacks,
                 experiment_name: str | None = None, resume: bool = False) -> tuple[list, Result]:
        if not callable(train_func):
            raise TypeError(f"train_func must be callable, got {type(train_func).__name__}")
        check_loop_config(config, "config")
        if config and not takes_config(train_func):
            raise TypeError(f"{getattr(train_func, '__name__', 'train_func')} takes no arguments, but a config "
                            f"was given; define it as train_func(config)")
        with self._lock:
            self.latest_run_dir = run_dir
            shown = RunProgress(self, experiment_name, self.verbose)
            recorder = RunRecorder(run_dir, self._scaling.num_workers, checkpoint_config, callbacks, config, resume)
            error: BaseException | None = None
            shown.start(recorder)
            try:
                returns = self._attempts(train_func, config, recorder, checkpoint, experiment_name)
            except BaseException as e:
                error = e
                raise
            finally:
                shown.close(error)
                self.last_result = recorder.finish(error)
            return returns, self.last_result

    def _attempts(self, train_func, config, recorder: RunRecorder, checkpoint, experiment_name) -> list:
        failures = 0
        while True:
            try:
                self._ensure_group()
                recorder.begin_attempt(failures)
                return self._attempt(train_func, config, recorder, recorder.latest_checkpoint or checkpoint,
                                     failures, experiment_name)
            except _GroupDied as died:
                err, who, ranks = died.error, f"worker rank {died.rank} of {self._scaling.num_workers} died", \
                    [died.rank]
            except _ReporterDied as died:
                err, who, ranks = died.error, "the reporter actor died", []
            except exceptions.RayActorError as e:   # died while the group was starting
                err, who, ranks = e, "a worker died (while starting the group)", []
            except _TrainFuncError as failed:
                if not self._retry_errors or 0 <= self.max_failures <= failures:
                    fatal = failed.error   # raised below, outside this handler: no chained context
                    break
                rank = getattr(failed.error, "world_rank", None)
                err, who, ranks = failed.error, f"train_func on worker rank {rank} raised", [rank]
            failures += 1
            self._teardown([], recorder)
            recorder.remove_orphans()
            if 0 <= self.max_failures < failures:
                latest = recorder.latest_checkpoint
                raise WorkerGroupError(
                    f"raylite.train: {who} ({type(err).__name__}: {err}); the worker group was restarted "
                    f"{failures - 1} time(s) and max_failures={self.max_failures}, so training stops. Latest "
                    f"checkpoint: {latest.path if latest else None}", {r: err for r in ranks}) from err
            latest = recorder.latest_checkpoint or checkpoint
            logger.warning("raylite.train: %s (%s); restarting the worker group (failure %d of %s), "
                           "resuming from %s", who, type(err).__name__, failures,
                           "unlimited" if self.max_failures < 0 else self.max_failures,
                           latest.path if latest else "the start (no checkpoint)")
        raise fatal

    def _attempt(self, train_func, config, recorder: RunRecorder, checkpoint, attempt: int,
                 experiment_name) -> list:
        group, n = self._group, self._scaling.num_workers
        infos = [SessionInfo(world_rank=r, local_rank=lay.local_rank, world_size=n,
                             local_world_size=lay.local_world_size, node_rank=lay.node_rank,
                             run_dir=recorder.run_dir, experiment_name=experiment_name,
                             trial_name=os.path.basename(recorder.run_dir), checkpoint=checkpoint,
                             attempt=attempt, use_gpu=self.use_gpu,
                             reporter=self._reporter) for r, lay in enumerate(group.layouts)]
        try:   # the reporter names this attempt's checkpoints and forgets earlier attempts' collectives
            ray.get(self._reporter.begin.remote(attempt, n, recorder.next_index))
        except exceptions.RayActorError as e:
            self._reporter = None
            raise _ReporterDied(e) from e
        refs = group.run(train_func, config, infos)
        rank_of = {r: i for i, r in enumerate(refs)}
        results: list = [None] * n
        deaths: dict[int, BaseException] = {}
        errors: list[tuple[int, BaseException]] = []

        def collect(ready):
            for ref in ready:
                rank = rank_of[ref]
                try:
                    results[rank] = ray.get(ref)
                except Exception as e:   # noqa: BLE001 - classified below
                    if is_death(e):
                        deaths[rank] = e
                    else:
                        errors.append((rank, e))

        pending = list(refs)
        try:
            while pending and not deaths and not errors:
                ready, pending = ray.wait(pending, num_returns=1, timeout=POLL_S)
                self._drain(recorder)
                collect(ready)
            if errors and not deaths and pending:
                # A peer's death usually shows first as a collective error in the survivors: look for it.
                deadline = time.monotonic() + DEATH_GRACE_S
                while pending and not deaths and time.monotonic() < deadline:
                    ready, pending = ray.wait(pending, num_returns=1,
                                              timeout=max(0.0, deadline - time.monotonic()))
                    collect(ready)
        except BaseException:   # Ctrl-C in the driver: do not leave the workers training
            try:
                self._teardown([], recorder)
            except Exception:   # noqa: BLE001 - the original error matters more
                pass
            raise
        if deaths or errors:
            self._teardown(pending, recorder)
            recorder.after_exception({**dict(errors), **deaths})
            if deaths:
                rank = min(deaths)
                raise _GroupDied(rank, deaths[rank])
            rank, err = errors[0]
            raise _TrainFuncError(_annotate(err, rank, n, getattr(train_func, "__name__", "train_func")))
        self._drain(recorder)
        return results

    def _drain(self, recorder: RunRecorder) -> None:
        try:
            items = ray.get(self._reporter.drain.remote())
        except exceptions.RayActorError as e:
            self._reporter = None   # the next group start makes a new one
            raise _ReporterDied(e) from e
        recorder.add(items)

    def _teardown(self, pending: list, recorder: RunRecorder) -> None:
        """Kill the group (peers of a failed worker may be stuck in a collective), wait until their
        calls have ended, then take the last reports they sent."""
        if self._group is not None:
            self._group.kill()
            self._group = None
        if pending:
            ray.wait(pending, num_returns=len(pending), timeout=10.0)
        if self._reporter is not None:
            with contextlib.suppress(_ReporterDied):   # the error being handled says more
                self._drain(recorder)


class DataParallelTrainer:
    """Ray Train 2.x: ``DataParallelTrainer(train_loop_per_worker, *, train_loop_config=None,
    backend_config=None, scaling_config, run_config, resume_from_checkpoint).fit() -> Result``:
    ``train_loop_per_worker`` on every worker, with reports, checkpoints and restarts. The default
    ``BackendConfig()`` sets up no process group (each worker is on its own, for any framework);
    a ``TorchConfig`` joins them in torch.distributed, as ``TorchTrainer`` does.

    Args:
        train_loop_per_worker: the training function, taking ``config`` or nothing.
        train_loop_config: passed to it on every worker.
        backend_config: the workers' framework set-up (default ``BackendConfig()``: none).
        scaling_config: how many workers and what each holds (a ``ScalingConfig``).
        run_config: name, storage, checkpoints, failures and callbacks (a ``RunConfig``).
        resume_from_checkpoint: what ``train.get_checkpoint()`` returns at first (Ray V2 deprecates it).
        datasets: Ray Data is not supported: a ``NotImplementedError`` saying how to feed data.
        dataset_config: a ``train.DataConfig`` (its fields are about Ray Data: checked, no effect), as
            ``metadata`` is accepted for Ray's sake.
    """

    def __init__(self, train_loop_per_worker, *, train_loop_config: dict | None = None,
                 backend_config: BackendConfig | None = None, scaling_config: ScalingConfig | None = None,
                 run_config: RunConfig | None = None, resume_from_checkpoint: Checkpoint | None = None,
                 datasets: dict | None = None, dataset_config=None, metadata: dict | None = None):
        if not callable(train_loop_per_worker):
            raise TypeError("train_loop_per_worker must be callable")
        check_trainer_arguments(train_loop_config, backend_config, scaling_config, run_config, resume_from_checkpoint)
        check_dataset_config(dataset_config)
        if datasets:
            raise NotImplementedError("datasets= (Ray Data) is not supported by raylite.train; load or pass the "
                                      "data inside train_loop_per_worker (e.g. through train_loop_config)")
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.backend_config = backend_config or BackendConfig()
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()
        self.resume_from_checkpoint = resume_from_checkpoint

    @classmethod
    def restore(cls, *args, **kwargs):
        """Deprecated in Ray V2 (raises, as Ray does): rerun with the same RunConfig name instead."""
        raise DeprecationWarning(RESTORE_DEPRECATION)

    @classmethod
    def can_restore(cls, *args, **kwargs):
        """Deprecated in Ray V2 (raises, as Ray does): rerun with the same RunConfig name instead."""
        raise DeprecationWarning(RESTORE_DEPRECATION)

    def fit(self) -> Result:
        """Train to the end and return the ``Result``; ``TrainingFailedError`` once ``max_failures`` is spent."""
        rc, sc = self.run_config, self.scaling_config
        if sc.num_workers == 0:
            return self._fit_local()
        what = type(self).__name__
        failure = rc.failure_config or FailureConfig()
        if rc.checkpoint_config is not None:
            rc.checkpoint_config.check_function_trainable(f"a {what}")
        name = rc.name or time.strftime(f"{what}_%Y-%m-%d_%H-%M-%S")
        run_dir = os.path.join(os.path.expanduser(rc.storage_path or default_storage_path()), name)
        trainer = Trainer(self.backend_config, sc.num_workers, sc.use_gpu, sc.resources_per_worker,
                          max_failures=failure.max_failures)
        trainer._retry_errors = True
        trainer.verbose = rc.verbose
        trainer._scaling = sc   # all of it (accelerator_type too), not only what Trainer's arguments carry
        trainer._preflight()   # configuration errors (no GPU, too many workers) raise as they are
        try:
            returns, result = trainer._execute(self.train_loop_per_worker, self.train_loop_config, run_dir,
                                               self.resume_from_checkpoint, rc.checkpoint_config, rc.callbacks,
                                               experiment_name=name, resume=True)
            result.return_value = returns[0] if returns else None   # rank 0's, as Ray's Result has it
        except TrainingFailedError as e:
            e.result = e.result or trainer.last_result
            raise
        except Exception as e:
            rank = getattr(e, "world_rank", None)
            if rank is None:
                raise TrainingFailedError(f"raylite.train: training failed: {type(e).__name__}: {e}",
                                          trainer.last_result) from e
            raise WorkerGroupError(f"raylite.train: training failed: {type(e).__name__}: {e}", {rank: e},
                                   trainer.last_result) from e
        finally:
            trainer.shutdown()
        return result

    def _fit_local(self) -> Result:
        """Ray V2's local mode: the loop runs here, as rank 0 of 1, without workers, process group,
        run directory or retries; errors propagate as they are. The Result holds the last report's
        metrics and checkpoint (as reported, not copied), ``path`` None and the return value."""
        fn, config = self.train_loop_per_worker, self.train_loop_config
        local = session._start(SessionInfo(experiment_name=self.run_config.name,
                                           checkpoint=self.resume_from_checkpoint), local=True,
                               callbacks=self.run_config.callbacks)
        try:
            value = fn({} if config is None else config) if takes_config(fn) else fn()
        finally:
            session._end()
        return Result(local.last_metrics, local.info.checkpoint, path=None, return_value=value)


class TorchTrainer(DataParallelTrainer):
    """Ray Train 2.x: ``TorchTrainer(train_loop_per_worker, train_loop_config=None, *, scaling_config,
    run_config, torch_config, resume_from_checkpoint).fit() -> Result``: a DataParallelTrainer whose
    workers share a torch process group.

    Args:
        train_loop_per_worker: the training function, taking ``config`` or nothing.
        train_loop_config: passed to it on every worker.
        torch_config: the process group (a ``TorchConfig``: backend, timeout).
        scaling_config: how many workers and what each holds (a ``ScalingConfig``).
        run_config: name, storage, checkpoints, failures and callbacks (a ``RunConfig``).
        resume_from_checkpoint: what ``train.get_checkpoint()`` returns at first (Ray V2 deprecates it).
        datasets: Ray Data is not supported: a ``NotImplementedError`` saying how to feed data.
        dataset_config: a ``train.DataConfig`` (its fields are about Ray Data: checked, no effect), as
            ``metadata`` is accepted for Ray's sake.
    """

    def __init__(self, train_loop_per_worker, train_loop_config: dict | None = None, *,
                 torch_config: TorchConfig | None = None, scaling_config: ScalingConfig | None = None,
                 run_config: RunConfig | None = None, resume_from_checkpoint: Checkpoint | None = None,
                 datasets: dict | None = None, dataset_config=None, metadata: dict | None = None):
        if torch_config is not None and not isinstance(torch_config, TorchConfig):
            raise ValueError(f"torch_config must be a raylite.train.torch.TorchConfig, got {torch_config!r}")
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config,
                         backend_config=torch_config or TorchConfig(), scaling_config=scaling_config,
                         run_config=run_config, resume_from_checkpoint=resume_from_checkpoint, datasets=datasets,
                         dataset_config=dataset_config)

    @property
    def torch_config(self) -> TorchConfig:
        return self.backend_config
