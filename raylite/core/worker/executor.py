"""Running a call in a worker: a task, an actor's constructor, or one of its methods (one at a
time here; concurrently through raylite.core.worker.concurrency), its results or error sent back as one
DONE, and the worker's lifecycle state that a cancel's signal consults."""
from __future__ import annotations

import atexit
import enum
import os
import sys
import time
import traceback
import types

from raylite import exceptions
from raylite.core.client import context, objects, streams
from raylite.core.wire import serialization
from raylite.core.wire.signatures import is_coroutine_function
from raylite.core.wire.protocol import ACTOR_REPR, DONE, EXIT_ACTOR, INTERRUPT_MISSED, ITEM, METRICS, RUN, TaskSpec
from raylite.core.worker import concurrency
from raylite.core.worker.client import WorkerClient
from raylite.core.worker.results import arg_value, error_result, is_retryable, safe_repr, streamed


HOLD_BELOW_S = 0.001   # a result waits for the next task's (see finish) only if that one runs shorter


class State(enum.Enum):
    """Where a worker is in its life, as multiprocessing.pool names its states; the main thread
    moves it (concurrent calls leave it alone)."""

    STARTING = "starting"          # forked: the runtime_env's setup hook has not run yet
    IDLE = "idle"                  # waiting for the node's next message, or between calls
    RUNNING = "running"            # a one-at-a-time call runs: cancel's SIGINT interrupts it
    INTERRUPTED = "interrupted"    # that call got its KeyboardInterrupt (more SIGINTs are ignored)
    DRAINING = "draining"          # asked to exit: concurrent calls still running finish first
    EXITING = "exiting"            # EXIT handled: the loop reads no further message (only the main
                                   # thread sets it; a call ending the process exits it directly)


class ActorExit(BaseException):
    """Raised by ray.actor.exit_actor(): unwinds the method, then the process ends."""


class Executor:
    """Runs the node's RUN messages; holds the function cache, the actor instance and the
    worker's lifecycle state."""

    def __init__(self, client: WorkerClient):
        self.client = client
        self.functions: dict[str, object] = {}
        self.actor = None
        self.init_error = ""   # the constructor's exception, if it raised
        self.placement = None  # the actor's placement group, which its calls run in (as in Ray)
        self.loop = None
        self.state = State.STARTING
        self.calls = None   # a concurrency runner for threaded and async actors
        self.missed_interrupt = False   # a cancel's SIGINT came while no task ran (see execute)
        self.log_files = False          # stdout and stderr are this worker's log files (see worker._log_to_files)
        self.log_start: tuple | None = None   # (task id, stdout's size, stderr's) when that task started
        self.setup_error: str | None = None   # why the runtime_env's setup hook failed in this process
        self.post_mortem = None   # called with a failed call's traceback (worker._post_mortem)
        self.took: dict[str, float] = {}   # function id -> how long its last call took here (s)
        self.ran: float | None = None      # how long the task just done took (sent with its DONE)
        self.progress = None      # [0]: tasks begun here, which the node reads if this process dies
                                  # (raylite.core.wire.protocol.Progress); without it no result is held back

    def run(self, spec: TaskSpec, fn_bytes: bytes | None, deps: dict, assigned: dict, accel: dict):
        if self.progress is not None and spec.kind == "task":
            self.progress[0] += 1
        if self.setup_error is not None:   # nothing runs here: a task fails, an actor dies (as in Ray)
            if spec.kind == "actor_create":
                self._exit(1, f"RuntimeEnvSetupError: {self.setup_error}")
            error = serialization.error_value(exceptions.RuntimeEnvSetupError(self.setup_error))
            return self.finish(spec, [error] * max(1, len(spec.return_ids)))
        if fn_bytes is not None:
            self.functions[spec.fn_id] = serialization.loads(serialization.Serialized(fn_bytes))
        if self.calls is not None and spec.kind == "actor_call":
            return self.calls.submit(spec, deps, assigned, accel)
        if spec.kind == "actor_create":   # before the constructor, which may ask for its own handle
            context.set_actor(spec.class_meta, spec.actor_name[1] if spec.actor_name else None)
            self.placement = spec.placement
        if self.log_files and spec.kind == "task":
            sizes = _log_sizes()
            self.log_start = None if sizes is None else (spec.task_id, *sizes)
        self.execute(spec, deps, assigned, accel)
        if spec.kind == "actor_create" and self.actor is not None:
            if type(self.actor).__repr__ is not object.__repr__:   # Ray prefixes its output with it
                self.client.send((ACTOR_REPR, safe_repr(self.actor)))
            if self.calls is None:   # (an async constructor made it already)
                self.calls = concurrency.runner_for(self, spec.max_concurrency, spec.concurrency_groups or {})
            if self.calls is not None:
                self.client.replies = {}

    def drain(self) -> None:
        """Wait for calls still running concurrently (the driver asked this actor to exit)."""
        if self.calls is not None:
            self.calls.drain()

    def end_gracefully(self) -> None:
        """An actor ending without being killed (its handles gone, __ray_terminate__, exit_actor)
        runs its ``__ray_shutdown__`` and then its atexit handlers, as in Ray; their errors are
        printed, not raised."""
        actor, self.actor = self.actor, None   # once
        if actor is None:
            return
        hook = getattr(actor, "__ray_shutdown__", None)
        try:
            if hook is not None:
                hook()
        except Exception:  # noqa: BLE001 - cleanup failing must not keep the actor alive
            traceback.print_exc()
        atexit._run_exitfuncs()

    def begin(self, spec: TaskSpec, assigned: dict, accel: dict) -> None:
        """Make the call's identity and resources what get_runtime_context() reports."""
        context.set_current(task_id=spec.task_id, actor_id=spec.actor_id or None, name=spec.name,
                            assigned=assigned, accelerator_ids=accel,
                            placement=self.placement if spec.kind == "actor_call" else spec.placement,
                            function=self.functions.get(spec.fn_id) if spec.kind == "task" else
                            (type(self.actor), spec.method) if spec.kind == "actor_call" else
                            (self.functions.get(spec.fn_id), "__init__"))

    def execute(self, spec: TaskSpec, deps: dict, assigned: dict, accel: dict) -> None:
        if spec.kind == "actor_call" and self.actor is None and self.init_error:
            # as Ray: ActorDiedError itself, with the constructor's traceback (not this call's frames)
            err = exceptions.ActorDiedError(f"cannot run {spec.name}: the actor is dead (its constructor raised)"
                                            f"\n\n{self.init_error}", actor_id=f"{spec.actor_id:028x}")
            return self.finish(spec, [serialization.dumps(err, None, is_error=True)] * max(1, len(spec.return_ids)))
        self.begin(spec, assigned, accel)
        main = self.calls is None   # a one-at-a-time call, which the state follows (not concurrent ones)
        try:
            if main:
                self.state = State.RUNNING
            if self.missed_interrupt:   # perhaps meant for this task, which had not started yet: ask
                self.missed_interrupt = False   # the driver to interrupt it again if so
                self.client.send((INTERRUPT_MISSED, spec.task_id))
            began = time.perf_counter()
            value = self._call(spec, deps)
            self._ran(main)
            results = self.pack(spec, value)
            if spec.kind == "task":
                self.took[spec.fn_id] = self.ran = time.perf_counter() - began
        except KeyboardInterrupt:
            self._ran(main)
            results = self.cancelled(spec)
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the caller
            self._ran(main)
            results = self.failure(spec, e)
            if self.retryable(spec, e):
                return self.finish(spec, results, retry=True)
        self.finish(spec, results)

    def _ran(self, main: bool) -> None:
        """The user's code returned or raised: a cancel's SIGINT no longer interrupts it."""
        if main:
            self.state = State.IDLE

    def retryable(self, spec: TaskSpec, e: BaseException) -> bool:
        return is_retryable(spec, e)

    def cancel_error(self, spec: TaskSpec) -> exceptions.TaskCancelledError:
        return exceptions.TaskCancelledError(f"task {spec.name} was cancelled")

    def cancelled(self, spec: TaskSpec) -> list:
        return [serialization.dumps(self.cancel_error(spec), None, is_error=True)] * max(1, len(spec.return_ids))

    def cancel_call(self, task_id: int) -> None:
        """The driver cancelled a call this actor already has: is_canceled() says so; an async
        call is also stopped (a one-at-a-time call is flagged by SIGUSR1 instead, see run())."""
        context.mark_cancelled(task_id)
        if self.calls is not None:
            self.calls.cancel(task_id)

    def reject(self, spec: TaskSpec, error: Exception) -> None:
        """Fail a call without running it (its error carries a traceback like any other)."""
        try:
            raise error
        except Exception as e:   # noqa: BLE001 - sent back to the caller
            self.finish(spec, self.failure(spec, e))

    def failure(self, spec: TaskSpec, e: BaseException) -> list:
        if isinstance(e, ActorExit):   # from any thread or the event loop: the driver fails the calls
            self._exit(0, str(e))
        if type(e) is SystemExit:   # sys.exit() in user code ends this process, as in Ray (subclasses,
            # such as Lightning's SIGTERMException, travel back to the caller like any other error)
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
            # exit code 0 ends an actor for good (as exit_actor); any other is a crash: restarts apply
            self._exit(code, f"{spec.name} called sys.exit()" if code == 0 and self.actor is not None else None)
        if self.post_mortem is not None and isinstance(e, Exception):
            self.post_mortem(e.__traceback__)
        return [error_result(spec.name, e)] * max(1, len(spec.return_ids))

    def _exit(self, code: int, why: str | None) -> None:
        """End this worker now (from any thread); `why`: the actor ends for good, for this reason."""
        if code == 0 and why is not None:   # exit_actor() or __ray_terminate__: a graceful end
            self.end_gracefully()
        if why is not None:
            self.client.send((EXIT_ACTOR, why))
        self.client.flush()   # results held back go first
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def finish(self, spec: TaskSpec, results: list, retry: bool = False) -> None:
        """Send the results; `retry`: the task raised an exception it may be retried for."""
        context.forget_cancelled(spec.task_id)
        sys.stdout.flush()
        sys.stderr.flush()
        wired = serialization.results_to_wire(results)
        report_metrics(self.client)
        start, self.log_start = self.log_start, None
        ran, self.ran = self.ran, None
        span = None
        if start is not None and start[0] == spec.task_id and (sizes := _log_sizes()) is not None:
            span = (start[1], sizes[0], start[2], sizes[1])   # where its output is in the log files
        msg = (DONE, spec.task_id, wired, retry, span, ran) if span or ran is not None else \
            (DONE, spec.task_id, wired, True) if retry else (DONE, spec.task_id, wired)
        if retry or span or spec.kind != "task" or results[0].is_error or not spec.max_retries or self.progress is None:
            self.client.send(msg)
        else:
            # held back while the next task is here already (WorkerClient.send_result); only for a
            # task that may run again: if this process dies before it is sent, the task is retried
            self.client.send_result(msg, self._next_is_short())

    def _next_is_short(self) -> bool:
        """Whether the next message is here and is a task whose function ran shortly here before."""
        nxt = self.client.peek()
        return (nxt is not None and nxt[0] == RUN and nxt[1].kind == "task"
                and self.took.get(nxt[1].fn_id, 1.0) < HOLD_BELOW_S)

    def _call(self, spec: TaskSpec, deps: dict):
        args, kwargs = self.arguments(spec, deps)
        result = self.invoke(spec, args, kwargs)
        if hasattr(result, "__await__") and type(result).__name__ == "coroutine":   # an async def task
            result = self._run_async(result)
        if spec.stream and hasattr(result, "__aiter__"):   # an async generator task
            return self._run_async(self.stream_async(spec, result))
        return self.stream(spec, result) if spec.stream else result

    def _run_async(self, coroutine):
        """Run an async def task (or its async generator) on this worker's own event loop."""
        import asyncio
        self.loop = self.loop or asyncio.new_event_loop()
        return self.loop.run_until_complete(coroutine)

    def stream(self, spec: TaskSpec, values) -> streams.DynamicObjectRefGenerator | int:
        """Send each value a generator task yields as its own object, as soon as it is yielded."""
        if not hasattr(values, "__next__"):
            raise TypeError(f"{spec.name} has num_returns={spec.stream!r} but returned "
                            f"{type(values).__name__}, not a generator")
        refs: list = []
        try:
            for value in values:
                refs.append(self.send_item(spec, len(refs), value))
        except Exception as e:  # noqa: BLE001 - "dynamic", as Ray: the error is the last ref's value
            if spec.stream != "dynamic":
                raise
            refs.append(self.send_item(spec, len(refs), None, error_result(spec.name, e)))
        return streamed(spec, refs)

    async def stream_async(self, spec: TaskSpec, values) -> streams.DynamicObjectRefGenerator | int:
        refs = []
        async for value in values:
            refs.append(self.send_item(spec, len(refs), value))
        return streamed(spec, refs)

    def send_item(self, spec: TaskSpec, index: int, value, ser=None) -> objects.ObjectRef:
        completion = spec.return_ids[0]
        oid = streams.item_id(completion, index)
        ser = ser if ser is not None else serialization.dumps(value, self.client.shm_prefix)
        self.client.send((ITEM, completion, index, ser))
        return objects.ObjectRef(oid)   # for "dynamic", pickled into the task's result, which then holds it

    def arguments(self, spec: TaskSpec, deps: dict) -> tuple[list, dict]:
        return serialization.loads_args(spec.args, {oid: arg_value(ser) for oid, ser in deps.items()} if deps else {})

    def invoke(self, spec: TaskSpec, args, kwargs):
        if spec.kind == "task":
            result = self.functions[spec.fn_id](*args, **kwargs)
        elif spec.kind == "actor_create":
            cls = self.functions[spec.fn_id]
            try:
                if is_coroutine_function(getattr(cls, "__init__", None)):   # Ray awaits an async
                    self.actor = cls.__new__(cls)                           # constructor, on the actor's loop
                    self.calls = concurrency.runner_for(self, spec.max_concurrency, spec.concurrency_groups or {})
                    self.calls.run_until_done(cls.__init__(self.actor, *args, **kwargs))
                else:
                    self.actor = cls(*args, **kwargs)
            except Exception as e:
                self.actor = None   # the calls already sent here fail with its traceback (see execute)
                self.init_error = "".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next)).rstrip()
                raise
            return None
        else:
            if self.actor is None:
                raise exceptions.ActorDiedError(f"actor of {spec.name} is not running"
                                                + (f": its constructor raised {self.init_error}" if self.init_error else ""))
            if spec.method == "__ray_terminate__":
                raise ActorExit("it was terminated by __ray_terminate__")
            if spec.method == "__ray_ready__":   # the constructor has run (a call waits for it)
                return True
            result = actor_method(self.actor, spec.method)(*args, **kwargs)
        return result

    def pack(self, spec: TaskSpec, value) -> list:
        n = len(spec.return_ids)
        if n <= 1:
            return [serialization.dumps(value, self.client.shm_prefix)]
        if isinstance(value, types.GeneratorType):   # num_returns=N on a generator function
            return self._pack_yielded(spec, value, n)
        if not isinstance(value, (tuple, list)) or len(value) != n:
            raise ValueError(f"{spec.name} declared num_returns={n} but returned {type(value).__name__}"
                             f" of length {len(value) if hasattr(value, '__len__') else 'n/a'}")
        return [serialization.dumps(v, self.client.shm_prefix) for v in value]

    def _pack_yielded(self, spec: TaskSpec, gen, n: int) -> list:
        """A generator's n values, one per return ref; if it raises after k of them, the other refs
        carry the error (as in Ray)."""
        out = []
        try:
            for v in gen:
                out.append(serialization.dumps(v, self.client.shm_prefix))
                if len(out) > n:
                    break
        except Exception as e:  # noqa: BLE001 - the refs not yet filled raise it
            if len(out) < n:
                return out + [error_result(spec.name, e)] * (n - len(out))
        if len(out) != n:
            raise ValueError(f"{spec.name} declared num_returns={n} but its generator yielded "
                             f"{'more' if len(out) > n else len(out)} values")
        return out


def actor_method(actor, name: str):
    """The method `name` of an actor, looked up on its class as Ray does: an instance attribute
    of the same name (`self.value = 0` beside `def value(self)`) does not hide it."""
    for klass in type(actor).__mro__:
        if name in klass.__dict__:
            attr = klass.__dict__[name]
            return attr.__get__(actor, type(actor)) if hasattr(attr, "__get__") else attr
    return getattr(actor, name)   # (a method __getattr__ makes)


def report_metrics(client: WorkerClient) -> None:
    """Send the driver what ray.util.metrics recorded here since the last report, in the write of
    the result that follows (so the driver has them once get returns it). The module is imported
    only by a worker whose user code records metrics."""
    metrics = sys.modules.get("raylite.core.client.metrics")
    if metrics is not None and metrics.store.pending:
        client.send_ahead((METRICS, metrics.store.take()))


def _log_sizes() -> tuple[int, int] | None:
    """The log files' sizes, once what Python buffers is written."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        return os.fstat(1).st_size, os.fstat(2).st_size
    except (OSError, ValueError):
        return None
