"""A worker process: one loop that runs tasks or hosts one actor, and the client its user code
uses for nested `.remote()`, `get`, `wait` and `put` calls (all through the driver)."""
from __future__ import annotations

import _signal
import atexit
import itertools
import os
import socket
import sys
import threading
import time
import traceback
import types
from collections import deque

from raylite import exceptions
from raylite.core import concurrency, context, objects, remote, runtime_env, serialization, streams
from raylite.core.segments import mappings
from raylite.core.protocol import (ACTOR_REPR, ADDREF, CANCEL, CANCEL_CALL, CREATE_NAMED, DONE, EXIT, EXIT_ACTOR, FORGET, GET,
    GET_ACTOR, GROUP, HELLO, INTERRUPT_MISSED, ITEM, KILL, METRICS, NAMED_ACTORS, PIN, PUT, REFS, RELEASE, RELEASED, REPLY,
    RESOURCES, RUN, STATE, STREAM_NEXT, SUBMIT, UNPREFETCH, UNPREFETCHED, WAIT, Channel, TaskSpec, spec_from_wire, spin_for)
from raylite.core.resources import NodeResources


class WorkerClient:
    """The runtime as seen from inside a worker: requests over the control socket."""

    def __init__(self, chan: Channel, shm_prefix: str, resources_model: NodeResources):
        self.chan = chan
        self.shm_prefix = shm_prefix
        self.resources_model = resources_model   # the node's totals, for feasibility warnings
        self.inbox: deque = deque()       # driver messages that arrived while waiting for a reply
        self.lock = threading.RLock()
        self.refops: list = []            # (op, object id) from pickling and GC, sent in order
        self.sent_functions: set[str] = set()
        self.req_ids = itertools.count(1)
        self.replies: dict[int, _Reply] | None = None   # set once calls run concurrently
        self.last_wait: float | None = None   # how long the last wait for a message took (s)

    # -- plumbing --
    def send(self, msg) -> None:
        with self.lock:
            self._flush_refops()
            self.chan.send(msg)

    def _flush_refops(self) -> None:
        if self.refops:
            ops, self.refops = self.refops, []
            self.chan.send((REFS, ops))

    def request(self, msg_kind: str, *args):
        reply = None if self.replies is None else _Reply()   # concurrent calls: the main loop reads, each waits
        with self.lock:
            req = next(self.req_ids)
            if reply is not None:
                self.replies[req] = reply
            self._flush_refops()
            self.chan.send((msg_kind, req) + args)
            while reply is None:
                msg = _incoming(self.chan.recv())
                if msg is None:
                    os._exit(1)  # the driver is gone
                if msg[0] == REPLY and msg[1] == req:
                    return msg[2]
                if msg[0] == UNPREFETCH:
                    self._give_back(msg[1])
                else:
                    self.inbox.append(msg)
        return reply.wait()

    def deliver(self, req: int, payload) -> None:
        self.replies.pop(req).set(payload)

    def _give_back(self, task_id: int) -> None:
        """The driver wants a task sent ahead of time back (this worker is blocked)."""
        for msg in self.inbox:
            if msg[0] == RUN and msg[1].task_id == task_id:
                self.inbox.remove(msg)
                self.chan.send((UNPREFETCHED, task_id, True))
                return
        self.chan.send((UNPREFETCHED, task_id, False))

    def next_message(self):
        if self.inbox:
            return self.inbox.popleft()
        with self.lock:
            self._flush_refops()
        # a single-threaded worker waits for its next task polling first, for as long as its last
        # wait suggests (see protocol.spin_for); with more threads, the polling one would compete
        # for the GIL
        spin = spin_for(self.last_wait) if threading.active_count() == 1 else 0.0
        started = time.monotonic()
        msg = self.chan.recv(spin)
        self.last_wait = time.monotonic() - started
        return _incoming(msg)

    # -- the client interface shared with the driver --
    def submit(self, spec: TaskSpec, fn_bytes: bytes | None) -> None:
        if fn_bytes is not None and spec.fn_id in self.sent_functions:
            fn_bytes = None
        self.send((SUBMIT, spec, fn_bytes, context.running_task_id()))   # the call that submits it
        self.sent_functions.add(spec.fn_id)

    def put(self, object_id: int, ser) -> None:
        self.send((PUT, object_id, ser))

    def get(self, ids: list[int], timeout: float | None) -> list:
        ok, payload = self.request(GET, ids, timeout)
        if not ok:
            raise payload
        return payload

    def wait(self, ids: list[int], num_returns: int, timeout: float | None) -> set[int]:
        return self.request(WAIT, ids, num_returns, timeout)

    def stream_next(self, completion_id: int, index: int) -> tuple:
        return self.request(STREAM_NEXT, completion_id, index)

    def pin(self, object_id: int) -> None:
        self.refops.append((PIN, object_id))

    def release(self, object_id: int) -> None:
        self.refops.append((RELEASE, object_id))

    def addref(self, object_id: int) -> None:
        self.refops.append((ADDREF, object_id))

    def kill(self, actor_id: int, no_restart: bool) -> None:
        self.send((KILL, actor_id, no_restart))

    def cancel(self, object_id: int, force: bool, recursive: bool) -> None:
        self.send((CANCEL, object_id, force, recursive))

    def create_named(self, spec: TaskSpec, fn_bytes: bytes | None, get_if_exists: bool):
        if spec.fn_id in self.sent_functions:
            fn_bytes = None
        payload = self.request(CREATE_NAMED, spec, fn_bytes, get_if_exists)
        self.sent_functions.add(spec.fn_id)
        if isinstance(payload, ValueError):
            raise payload
        return payload

    def get_actor(self, name: str, namespace: str | None):
        payload = self.request(GET_ACTOR, name, namespace)
        if isinstance(payload, ValueError):
            raise payload
        return payload

    def named_actors(self) -> list[tuple[str, str]]:
        return self.request(NAMED_ACTORS)

    def resources(self) -> tuple[dict, dict]:
        return self.request(RESOURCES)

    def state(self, what: str, detail: bool) -> tuple[list, int]:
        return self.request(STATE, what, detail)

    def group(self, op: str, *args):
        payload = self.request(GROUP, op, args)
        if isinstance(payload, ValueError):
            raise payload
        return payload


class ActorExit(BaseException):
    """Raised by ray.actor.exit_actor(): unwinds the method, then the process ends."""


class _Reply:
    """One pending request's answer, handed from the reading thread to the waiting one."""

    def __init__(self):
        self.lock = threading.Lock()
        self.lock.acquire()
        self.payload = None

    def set(self, payload) -> None:
        self.payload = payload
        self.lock.release()

    def wait(self):
        self.lock.acquire()
        return self.payload


class _Executor:
    """Runs the driver's "run" messages; holds the function cache and the actor instance."""

    def __init__(self, client: WorkerClient):
        self.client = client
        self.functions: dict[str, object] = {}
        self.actor = None
        self.init_error = ""   # the constructor's exception, if it raised
        self.placement = None  # the actor's placement group, which its calls run in (as in Ray)
        self.loop = None
        self.running = False
        self.calls = None   # a concurrency runner for threaded and async actors
        self.missed_interrupt = False   # a cancel's SIGINT came while no task ran (see execute)
        self.interrupted = False        # the running task got its KeyboardInterrupt (only one)
        self.log_files = False          # stdout and stderr are this worker's log files (see _log_to_files)
        self.log_start: tuple | None = None   # (task id, stdout's size, stderr's) when that task started
        self.setup_error: str | None = None   # why the runtime_env's setup hook failed in this process

    def run(self, spec: TaskSpec, fn_bytes: bytes | None, deps: dict, assigned: dict, accel: dict):
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
                self.client.send((ACTOR_REPR, _safe_repr(self.actor)))
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
        try:
            self.interrupted = False
            self.running = True
            if self.missed_interrupt:   # perhaps meant for this task, which had not started yet: ask
                self.missed_interrupt = False   # the driver to interrupt it again if so
                self.client.send((INTERRUPT_MISSED, spec.task_id))
            value = self._call(spec, deps)
            self.running = False
            results = self.pack(spec, value)
        except KeyboardInterrupt:
            self.running = False
            results = self.cancelled(spec)
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the caller
            self.running = False
            results = self.failure(spec, e)
            if self.retryable(spec, e):
                return self.finish(spec, results, retry=True)
        self.finish(spec, results)

    def retryable(self, spec: TaskSpec, e: BaseException) -> bool:
        return _retryable(spec, e)

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
        if os.environ.get("RAY_DEBUG_POST_MORTEM") == "1" and isinstance(e, Exception):   # as Ray's
            from raylite.util import rpdb
            rpdb.post_mortem(e.__traceback__)
        return [_error(spec.name, e)] * max(1, len(spec.return_ids))

    def _exit(self, code: int, why: str | None) -> None:
        """End this worker now (from any thread); `why`: the actor ends for good, for this reason."""
        if code == 0 and why is not None:   # exit_actor() or __ray_terminate__: a graceful end
            self.end_gracefully()
        if why is not None:
            self.client.send((EXIT_ACTOR, why))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def finish(self, spec: TaskSpec, results: list, retry: bool = False) -> None:
        """Send the results; `retry`: the task raised an exception it may be retried for."""
        context.forget_cancelled(spec.task_id)
        sys.stdout.flush()
        sys.stderr.flush()
        wired = [r.wire() for r in results]   # plain data: see protocol.spec_to_wire
        _report_metrics(self.client)
        start, self.log_start = self.log_start, None
        if start is not None and start[0] == spec.task_id and (sizes := _log_sizes()) is not None:
            # where its output is in the log files (Ray's task_log_info)
            self.client.send((DONE, spec.task_id, wired, retry, (start[1], sizes[0], start[2], sizes[1])))
        else:
            self.client.send((DONE, spec.task_id, wired, True) if retry else (DONE, spec.task_id, wired))

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
            refs.append(self.send_item(spec, len(refs), None, _error(spec.name, e)))
        return _streamed(spec, refs)

    async def stream_async(self, spec: TaskSpec, values) -> streams.DynamicObjectRefGenerator | int:
        refs = []
        async for value in values:
            refs.append(self.send_item(spec, len(refs), value))
        return _streamed(spec, refs)

    def send_item(self, spec: TaskSpec, index: int, value, ser=None) -> objects.ObjectRef:
        completion = spec.return_ids[0]
        oid = streams.item_id(completion, index)
        ser = ser if ser is not None else serialization.dumps(value, self.client.shm_prefix)
        self.client.send((ITEM, completion, index, ser))
        return objects.ObjectRef(oid)   # for "dynamic", pickled into the task's result, which then holds it

    def arguments(self, spec: TaskSpec, deps: dict) -> tuple[list, dict]:
        return serialization.loads_args(spec.args, {oid: _value(ser) for oid, ser in deps.items()} if deps else {})

    def invoke(self, spec: TaskSpec, args, kwargs):
        if spec.kind == "task":
            result = self.functions[spec.fn_id](*args, **kwargs)
        elif spec.kind == "actor_create":
            cls = self.functions[spec.fn_id]
            try:
                if remote.is_coroutine_function(getattr(cls, "__init__", None)):   # Ray awaits an async
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
                return out + [_error(spec.name, e)] * (n - len(out))
        if len(out) != n:
            raise ValueError(f"{spec.name} declared num_returns={n} but its generator yielded "
                             f"{'more' if len(out) > n else len(out)} values")
        return out


def _streamed(spec: TaskSpec, refs: list) -> streams.DynamicObjectRefGenerator | int:
    """A generator task's own result: with "dynamic", the refs of what it yielded (held by that
    value); with "streaming", how many values (the caller took each ref as it came, and holding
    them here too would keep every value until the generator is dropped)."""
    return streams.DynamicObjectRefGenerator(refs) if spec.stream == "dynamic" else len(refs)


def actor_method(actor, name: str):
    """The method `name` of an actor, looked up on its class as Ray does: an instance attribute
    of the same name (`self.value = 0` beside `def value(self)`) does not hide it."""
    for klass in type(actor).__mro__:
        if name in klass.__dict__:
            attr = klass.__dict__[name]
            return attr.__get__(actor, type(actor)) if hasattr(attr, "__get__") else attr
    return getattr(actor, name)   # (a method __getattr__ makes)


def _breakpoint(*args, **kwargs) -> None:
    """breakpoint() in a task or actor: a pdb session that a terminal attaches to (raylite.util.rpdb)."""
    from raylite.util import rpdb
    rpdb.set_trace(sys._getframe(1))


def _report_metrics(client: WorkerClient) -> None:
    """Send the driver what ray.util.metrics recorded here since the last report (ahead of the
    result that follows, so the driver has them once get returns it). The module is imported only
    by a worker whose user code records metrics."""
    metrics = sys.modules.get("raylite.core.metrics")
    if metrics is not None and metrics.store.pending:
        client.send((METRICS, metrics.store.take()))


def _incoming(msg):
    """A message as read; a "run" comes as plain data (protocol.spec_to_wire): rebuild it."""
    if msg is not None and msg[0] == RUN:
        deps = msg[3]
        return (RUN, spec_from_wire(msg[1], serialization.Serialized), msg[2],
                {d: serialization.Serialized(*v) for d, v in deps.items()} if deps else deps, msg[4], msg[5])
    return msg


def _safe_repr(obj, limit: int = 200) -> str:
    try:
        text = repr(obj)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not break the actor
        return type(obj).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def _retryable(spec: TaskSpec, e: BaseException) -> bool:
    """retry_exceptions=True retries any Exception; a list, those types and their subclasses."""
    wanted = spec.retry_exceptions
    if not wanted or not isinstance(e, Exception) or spec.kind == "actor_create":
        return False
    return wanted is True or any(f"{c.__module__}.{c.__name__}" in wanted for c in type(e).__mro__)


def _value(ser):
    value = serialization.loads(ser)
    if ser.is_error:
        raise _raisable(value)
    return value


def _raisable(err: BaseException) -> BaseException:
    return err.as_instanceof_cause() if isinstance(err, exceptions.RayTaskError) else err


_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))


def _user_traceback(e: BaseException) -> str:
    """The exception's traceback from the user's code on: the runtime's own frames that called it
    (execute, _call, invoke, ...) say nothing to the reader, and Ray shows none either."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_RUNTIME_DIR):
        if tb.tb_next is None:   # raised by the runtime itself: a failed argument, as Ray words it
            if isinstance(e, exceptions.RayTaskError):
                return ("At least one of the input arguments for this task could not be computed:\n"
                        + "".join(traceback.format_exception_only(type(e), e)))
            break
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb))


def _error(name: str, e: BaseException):
    if isinstance(e, exceptions.RayTaskError) and type(e) is not exceptions.RayTaskError:
        cause = e.cause  # a nested task's error: keep the original cause, add this frame's trace
    else:
        cause = e
    text = _user_traceback(e)
    try:
        ser = serialization.dumps(exceptions.RayTaskError(name, text, cause, os.getpid()), None, is_error=True)
    except Exception as why:  # as Ray: the cause becomes a RayError that says so, with the text
        kind = f"{type(cause).__module__}.{type(cause).__name__}"
        print(f"The original cause of the RayTaskError ({kind}) isn't serializable.", file=sys.stderr)
        cause = exceptions.RayError(f"Exception {kind} isn't serializable: {why}.\nOriginal exception details:\n{text}")
        return serialization.dumps(exceptions.RayTaskError(name, text, cause, os.getpid()), None, is_error=True)
    try:
        serialization.loads(ser)   # one whose __init__ takes other arguments than its args cannot be rebuilt
        return ser
    except Exception:  # Ray's UnserializableException, with its text and traceback
        cause = exceptions.UnserializableException(text)
        return serialization.dumps(exceptions.RayTaskError(name, text, cause, os.getpid()), None, is_error=True)


def _log_to_files(log_dir: str) -> bool:
    """init(log_to_driver=False): stdout and stderr go straight to worker-<pid>.out and .err, as
    Ray's workers write theirs, so a task's lines are found by offset (see _log_sizes)."""
    try:
        os.makedirs(log_dir, mode=0o700, exist_ok=True)
        for fd, suffix in ((1, "out"), (2, "err")):
            f = os.open(os.path.join(log_dir, f"worker-{os.getpid()}.{suffix}"),
                        os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(f, fd)
            os.close(f)
        return True
    except OSError:   # then the pipes, and the node writes the files
        return False


def _log_sizes() -> tuple[int, int] | None:
    """The log files' sizes, once what Python buffers is written."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        return os.fstat(1).st_size, os.fstat(2).st_size
    except (OSError, ValueError):
        return None


def _reset_preloaded(threads: str | None) -> None:
    """Undo what a fork copies from the zygote into modules it preloaded: every worker would
    otherwise draw the same "random" numbers as its siblings (Python's `random` reseeds itself
    at fork; numpy's and torch's global generators do not), and torch keeps the thread count it
    read before the fork."""
    numpy_random = sys.modules.get("numpy.random")   # numpy imports it lazily: not imported, not copied
    if numpy_random is not None:
        numpy_random.seed()   # from OS entropy, as a fresh import would
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()
        if threads:
            torch.set_num_threads(int(threads))


def run(config: dict, ctrl_fd: int, out_fd: int, err_fd: int) -> None:
    """Entry point in a freshly forked worker (called by the zygote)."""
    log_files = config["log_dir"] is not None and _log_to_files(config["log_dir"])
    if not log_files:
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
    os.close(out_fd)
    os.close(err_fd)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)
    for key, value in config["env"].items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _reset_preloaded(config["env"].get("OMP_NUM_THREADS"))
    if "PYTHONBREAKPOINT" not in os.environ:   # (else Python's own hook follows it)
        sys.breakpointhook = _breakpoint
    sys.path[:] = config["sys_path"]
    for directory in config["site_dirs"]:   # runtime_env pip packages: their .pth files too
        import site
        site.addsitedir(directory)
    try:
        os.chdir(config["cwd"])
    except OSError:
        pass
    chan = Channel(socket.socket(fileno=ctrl_fd))
    client = WorkerClient(chan, config["shm_prefix"], NodeResources(config["totals"], config["device_ids"]))
    objects.process.client = client
    objects.process.index = config["index"]
    objects.process.runtime_env = config["runtime_env"]
    context.set_process(job_id=config["job_id"], node_id=config["node_id"], worker_id=config["index"],
                        restarted=config["restarted"], namespace=config["namespace"], labels=config["labels"])
    if config["logging"] is not None:
        from raylite.core.logging_config import LoggingConfig
        LoggingConfig(**config["logging"])._apply()
    atexit._clear()   # the zygote's handlers: only what this worker registers runs at a graceful end
    executor = _Executor(client)
    executor.log_files = log_files

    def interrupt(signum, frame):  # cancel(): only interrupts a running task (not concurrent calls)
        if executor.running and executor.calls is None:
            if not executor.interrupted:   # the node may send it more than once (see node.RESIGNAL_S)
                executor.interrupted = True
                raise KeyboardInterrupt
        else:
            executor.missed_interrupt = True

    def flag_cancelled(signum, frame):   # ray.cancel() of the call a one-at-a-time actor runs now
        if executor.running and executor.calls is None:
            context.mark_cancelled(context.running_task_id())

    _signal.signal(_signal.SIGINT, interrupt)   # the C function: no enum conversions to copy pages
    _signal.signal(_signal.SIGUSR1, flag_cancelled)
    chan.send((HELLO, os.getpid()))
    executor.setup_error = runtime_env.run_setup_hook(config["runtime_env"])   # once, before any task
    unmapped: set[str] = set()
    while True:
        msg = client.next_message()
        if msg is None:
            break
        if msg[0] == EXIT:
            executor.drain()
            executor.end_gracefully()
            _report_metrics(client)
            break
        kind = msg[0]
        if kind == RUN:
            executor.run(*msg[1:])
        elif kind == REPLY:   # to a concurrent call's get/wait (see WorkerClient.request)
            client.deliver(msg[1], msg[2])
        elif kind == CANCEL_CALL:
            executor.cancel_call(msg[1])
        elif kind == FORGET:
            unmapped.update(msg[1])
        if unmapped:   # segments of freed objects: tell the driver once nothing here maps them
            released = [name for name in unmapped if mappings.release(name)]
            if released:
                unmapped.difference_update(released)
                client.send((RELEASED, released))
        elif kind == UNPREFETCH:
            client.send((UNPREFETCHED, msg[1], False))   # it already ran
    sys.stdout.flush()
    sys.stderr.flush()
