"""A worker process: set up from the node's config (run), then one loop that hands each of the
node's messages to its handler, with the housekeeping after every message (Loop). Running calls is
raylite.core.worker.executor's job; the client user code calls through, raylite.core.worker.client;
what arguments, results and errors become, raylite.core.worker.results."""
from __future__ import annotations

import _signal
import atexit
import os
import socket
import sys

from raylite.core.client import context
from raylite.core.client.link import process

from raylite.core.envs import runtime_env
from raylite.core.wire.protocol import (CANCEL_CALL, EXIT, FORGET, HELLO, REPLY, RELEASED, RUN, UNPREFETCH, Channel,
                                        progress_counter)
from raylite.core.wire.resources import NodeResources
from raylite.core.wire.segments import mappings
from raylite.core.worker.client import WorkerClient
from raylite.core.worker.executor import Executor, State, report_metrics


class Loop:
    """The node's messages to a worker, each to its handler (one table: protocol.TO_WORKER), as a
    process pool's worker loop reads one item at a time. Housekeeping runs after every message,
    whatever its kind, so no message it might have to answer is skipped."""

    def __init__(self, client: WorkerClient, executor: Executor):
        self.client, self.executor = client, executor
        self.unmapped: set[str] = set()   # segments the node freed that a value here may still map
        self.handlers = {RUN: executor.run, REPLY: client.deliver,   # (REPLY: to a concurrent call's request)
                         CANCEL_CALL: executor.cancel_call, FORGET: self.unmapped.update,
                         UNPREFETCH: client.give_back, EXIT: self.exit}

    def run(self) -> None:
        """Until EXIT, or the node is gone."""
        handlers, executor = self.handlers, self.executor
        executor.state = State.IDLE
        while executor.state is not State.EXITING:
            msg = self.client.next_message()
            if msg is None:
                break
            try:
                handler = handlers[msg[0]]
            except KeyError:
                raise ValueError(f"message kind {msg[0]!r} from the node: expected one of {sorted(handlers)}") from None
            handler(*msg[1:])
            if self.unmapped:
                self.release_unmapped()

    def release_unmapped(self) -> None:
        """Tell the node which freed segments nothing here maps any more (it may reuse them)."""
        released = [name for name in self.unmapped if mappings.release(name)]
        if released:
            self.unmapped.difference_update(released)
            self.client.send((RELEASED, released))

    def exit(self) -> None:
        """End gracefully: calls still running concurrently first, then the actor's shutdown hooks."""
        self.executor.state = State.DRAINING
        self.executor.drain()
        self.executor.end_gracefully()
        report_metrics(self.client)
        self.executor.state = State.EXITING


def _breakpoint(*args, **kwargs) -> None:
    """breakpoint() in a task or actor: a pdb session that a terminal attaches to (raylite.util.rpdb)."""
    from raylite.core.worker import debugger
    debugger.set_trace(sys._getframe(1))


def _post_mortem(tb) -> None:
    """RAY_DEBUG_POST_MORTEM=1, as Ray's: a failed call's traceback in a pdb session that a
    terminal attaches to (raylite.util.rpdb)."""
    if os.environ.get("RAY_DEBUG_POST_MORTEM") == "1":
        from raylite.core.worker import debugger
        debugger.post_mortem(tb)


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


def run(config: dict, ctrl_fd: int, out_fd: int, err_fd: int, progress_fd: int = -1) -> None:
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
    process.client = client
    process.index = config["index"]
    process.runtime_env = config["runtime_env"]
    context.set_process(job_id=config["job_id"], node_id=config["node_id"], worker_id=config["index"],
                        restarted=config["restarted"], namespace=config["namespace"], labels=config["labels"])
    if config["logging"] is not None:
        from raylite.core.client.logging_config import LoggingConfig
        LoggingConfig(**config["logging"])._apply()
    atexit._clear()   # the zygote's handlers: only what this worker registers runs at a graceful end
    executor = Executor(client)
    if progress_fd >= 0:
        executor.progress = progress_counter(progress_fd)
    executor.log_files = log_files
    executor.post_mortem = _post_mortem

    def interrupt(signum, frame):  # cancel(): only interrupts a running task (not concurrent calls)
        if executor.state is State.RUNNING and executor.calls is None:
            executor.state = State.INTERRUPTED   # once: the node may send more (see node.RESIGNAL_S)
            raise KeyboardInterrupt
        if executor.state is not State.INTERRUPTED:
            executor.missed_interrupt = True

    def flag_cancelled(signum, frame):   # ray.cancel() of the call a one-at-a-time actor runs now
        if executor.state in (State.RUNNING, State.INTERRUPTED) and executor.calls is None:
            context.mark_cancelled(context.running_task_id())

    _signal.signal(_signal.SIGINT, interrupt)   # the C function: no enum conversions to copy pages
    _signal.signal(_signal.SIGUSR1, flag_cancelled)
    chan.send((HELLO, os.getpid()))
    executor.setup_error = runtime_env.run_setup_hook(config["runtime_env"])   # once, before any task
    Loop(client, executor).run()
    client.flush()
    sys.stdout.flush()
    sys.stderr.flush()
