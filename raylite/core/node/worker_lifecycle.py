"""The worker processes' lifecycle, as the node sees it: forking one through the zygote, its
signals, its socket's events, retiring it, and what its end means for its task or actor (a
crash, the kernel's out-of-memory killer, a retry)."""
from __future__ import annotations

import errno
import os
import selectors
import signal
import socket
import sys
import time
from collections import deque
from typing import Protocol

from raylite import exceptions
from raylite.core.envs import runtime_env
from raylite.core.hardware import accelerators
from raylite.core.node.records import Actor, WorkerProc
from raylite.core.node.state import NodeState
from raylite.core.wire import segments
from raylite.core.wire.protocol import DONE, DONES, HELLO, METRICS, REFS, RELEASED, Channel, Progress, TaskSpec
from raylite.core.wire.serialization import error_value
from raylite.core.worker.zygote import Zygote, end_group

# what a worker running a plain task sends: nothing anyone waits on before the task's end
_QUIET = frozenset((HELLO, DONE, DONES, REFS, RELEASED, METRICS))

OOM_KILLED = "the kernel's out-of-memory killer (the machine or container ran out of memory)"


def oom_kills() -> int | None:
    """How many processes the kernel's out-of-memory killer has ended (any cgroup's), if known."""
    try:
        with open("/proc/vmstat", "rb") as f:
            for line in f:
                if line.startswith(b"oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def cannot_start(e: OSError) -> str:
    """Why a worker could not start, with the limit to raise when it is the open-files one."""
    if e.errno == errno.EMFILE:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return (f"{e.strerror}: this process may open {soft} files and each worker takes 3; "
                f"raise the limit with `ulimit -n` before starting Python")
    return str(e)


def send_signal(w: WorkerProc, signum: int) -> None:
    if w.pid is None:   # its hello is not read yet (a caller's command can run first): send it then
        if w.signal_on_hello != signal.SIGKILL:
            w.signal_on_hello = signum
        return
    try:
        os.kill(w.pid, signum)
    except OSError:
        pass


class Outputs(Protocol):
    def on_output(self, w: WorkerProc, fd: int, stream: str) -> None: ...
    def emit_early_output(self, w: WorkerProc) -> None: ...


class Requeues(Protocol):
    def finish(self, spec: TaskSpec, results) -> None: ...
    def enqueue(self, spec: TaskSpec) -> None: ...
    def requeue(self, spec: TaskSpec) -> None: ...


class EndsActors(Protocol):
    def actor_gone(self, actor: Actor) -> None: ...
    def owner_died(self, w: WorkerProc) -> None: ...


class EndsGroupWork(Protocol):
    def group_gone(self, spec: TaskSpec) -> None: ...


class WorkerLifecycle:
    def __init__(self, state: NodeState, output: Outputs, dispatch: Requeues, actor_ops: EndsActors,
                 placement: EndsGroupWork):
        self.s, self.output, self.dispatch, self.actor_ops, self.placement = state, output, dispatch, actor_ops, placement

    def _worker_env(self, device_ids: dict, threads: int) -> dict:
        s = self.s
        env = accelerators.worker_env(device_ids, resources=s.accel_resources)
        if "OMP_NUM_THREADS" not in os.environ:   # as Ray: math libraries use the CPUs held, not all
            env["OMP_NUM_THREADS"] = str(threads)
        return env

    def spawn(self, device_ids: dict, key: tuple, env: tuple | None, restarted: bool = False) -> WorkerProc:
        s = self.s
        index = next(s.worker_index)
        opened = []   # closed again if this fails part way (out of descriptors, say)
        try:
            ours, theirs = socket.socketpair()
            opened += [ours, theirs]
            out_r, out_w = os.pipe()
            opened += [out_r, out_w]
            err_r, err_w = os.pipe()
            opened += [err_r, err_w]
            progress = Progress.create()
        except OSError:
            for end in opened:
                if isinstance(end, socket.socket):
                    end.close()
                else:
                    os.close(end)
            raise
        env_vars, sys_path, cwd = runtime_env.worker_settings(env, list(sys.path), os.getcwd())
        if env is not None:
            s.runtime_envs.setdefault(env, [time.time(), None])
        config = {"index": index, "shm_prefix": s.shm_prefix, "sys_path": sys_path,
                  "cwd": cwd, "job_id": s.job_id, "node_id": s.node_id, "namespace": s.namespace, "labels": s.labels,
                  "logging": s.logging, "log_dir": s.log_dir, "shm_dir": segments.SHM_DIR,
                  "spill_dir": segments.SPILL_DIR,
                  "env": {**self._worker_env(device_ids, key[1]), **env_vars}, "runtime_env": env,
                  "site_dirs": runtime_env.site_dirs(env),
                  "totals": s.res.total, "device_ids": s.res.device_ids, "restarted": restarted}
        try:
            self._fork(config, [theirs.fileno(), out_w, err_w] + ([progress.fd] if progress else []))
        except OSError:
            ours.close()
            os.close(out_r)
            os.close(err_r)
            if progress:
                progress.close()
            raise
        finally:
            theirs.close()
            os.close(out_w)
            os.close(err_w)
            if progress:
                progress.handed_over()
        ours.setblocking(False)
        w = WorkerProc(index, Channel(ours), key, out_r, err_r)
        w.progress = progress
        s.workers[index] = w
        s.sel.register(ours, selectors.EVENT_READ, lambda ev, w=w: self.on_worker(w, ev))
        for fd, stream in ((out_r, "stdout"), (err_r, "stderr")):
            os.set_blocking(fd, False)
            s.sel.register(fd, selectors.EVENT_READ, lambda ev, w=w, fd=fd, s=stream: self.output.on_output(w, fd, s))
        return w

    def _fork(self, config: dict, fds: list[int]) -> None:
        """Ask the zygote for a worker. One that died (killed, or by the out-of-memory killer) is
        restarted once, in the same session, so the work goes on; after a second death every start
        fails saying so (it was "[Errno 32] Broken pipe")."""
        s = self.s
        try:
            return s.zygote.fork(config, fds)
        except (BrokenPipeError, ConnectionResetError) as e:
            died = s.zygote.pid
            if s.zygote_restarted:
                raise OSError(f"raylite's worker factory (the zygote process, pid {died}) died again after "
                              f"its restart, so no worker can start; shut down and init() again") from e
        s.zygote_restarted = True
        s.zygote_since = time.time()   # workers launched before lost their zygote (_worker_gone)
        s.zygote.close(0)   # (reaps it)
        s.zygote = Zygote(s.zygote.imports, s.session)
        s.zygote.wait_ready()
        why = f"raylite's worker factory (the zygote process, pid {died}) died; restarted it (pid {s.zygote.pid})"
        s.cluster_events.add("ERROR", "RAYLET", why)
        sys.stderr.write(f"raylite: {why}; its workers died with it\n")
        s.zygote.fork(config, fds)

    def on_worker(self, w: WorkerProc, events: int) -> None:
        s = self.s
        if s.workers.get(w.index) is not w:   # an event select() gave before a reading thread
            return                               # (raylite.core.node.reader) found the worker gone
        if events & selectors.EVENT_WRITE:
            s.dirty_channels.add(w.chan)
        if not events & selectors.EVENT_READ:
            return
        msgs = w.chan.feed()
        if msgs is None:
            return self._worker_gone(w)
        for msg in msgs:
            handler = s.handlers.get(msg[0])
            if handler is None:
                raise exceptions.RaySystemError(f"worker {w.pid} sent a message of unknown kind {msg[0]!r}")
            if w.task is not None and msg[0] not in _QUIET:   # (a request, a submit: see ProducerReading.may_hold)
                s.fn_asks.add(w.task.fn_id)
            handler(w, *msg[1:])

    def _worker_gone(self, w: WorkerProc) -> None:
        s = self.s
        if w.early_output:   # it died before its hello was read: print what it wrote all the same
            self.output.emit_early_output(w)
        oom = False
        if not s.stopping:
            if w.exit_cause is None:   # unexpected: did the kernel's out-of-memory killer just act?
                before, s.oom_kills = s.oom_kills, oom_kills()
                oom = before is not None and s.oom_kills is not None and s.oom_kills > before
            kind, why = w.exit_cause or ("SYSTEM_ERROR", OOM_KILLED if oom else "the worker process died unexpectedly")
            s.dead_workers.append((w.index, w.pid, kind, why, w.launched, time.time()))
            if kind == "SYSTEM_ERROR":
                running = w.actor.spec.name if w.actor is not None else w.task.name if w.task is not None else None
                s.cluster_events.add("ERROR" if oom else "WARNING", "RAYLET",
                                        f"worker {w.pid} died" + (f" running {running}" if running else "") + f": {why}",
                                        pid=w.pid, worker_id=f"{w.index:016x}", name=running)
            if oom and w.actor is not None:
                w.actor.error = w.actor.error or OOM_KILLED
        if not w.retiring and not s.stopping:
            self.actor_ops.owner_died(w)
            if w.pid is not None:   # killed while it wrote a large value: what it wrote is no object
                segments.remove_unfinished(s.shm_prefix, w.pid)
        if not s.stopping and w.pid is not None and (w.launched < s.zygote_since or s.zygote.exited()):
            end_group(w.pid)   # its zygote, which ends what a dead worker started, is gone
        s.sel.unregister(w.chan.sock)   # (parked, if a thread has it on loan: raylite.core.node.reader)
        w.chan.close()
        s.dirty_channels.discard(w.chan)
        s.workers.pop(w.index, None)
        s.starting.discard(w.index)
        s.unsent.pop(w.index, None)
        s.table.reader_gone(w.index)
        pool = s.idle.get(w.key)
        if pool and w in pool:
            pool.remove(w)
        begun = w.progress.begun() - w.calls if w.progress else 1   # of the tasks it has (see Progress)
        if w.progress:
            w.progress.close()
        if w.actor is not None:
            s.blocked_actors.discard(w.index)
            return self.actor_ops.actor_gone(w.actor)
        spec, w.task = w.task, None
        ahead, w.ahead = list(w.ahead), deque()
        for later in reversed(ahead[max(0, begun - 1):]):   # never begun: to the front of their queue, in order
            if later.task_id in s.cancelled:
                self.dispatch.finish(later, [])
            else:
                self.dispatch.requeue(later)
        if spec is None:
            return
        self.unblock(w)
        w.alloc.pool.release(w.alloc)
        for ran in [spec] + ahead[:max(0, begun - 1)]:   # the one it ran, and any whose result it held back
            self._crashed(w, ran, oom)

    def _crashed(self, w: WorkerProc, spec, oom: bool) -> None:
        """A task whose worker died: it ran there (perhaps it ended it), so it is retried, or fails."""
        s = self.s
        if spec.task_id in s.cancelled:
            self.dispatch.finish(spec, error_value(exceptions.TaskCancelledError(f"task {spec.name} was cancelled")))
        elif spec.placement is not None and s.groups.pools_for(spec.placement) == []:
            self.placement.group_gone(spec)
        elif spec.max_retries != 0:
            spec.max_retries -= 1
            self.dispatch.enqueue(spec)
        elif oom:
            self.dispatch.finish(spec, error_value(exceptions.OutOfMemoryError(
                f"the worker running {spec.name} (pid={w.pid}) was ended by {OOM_KILLED}: use less memory "
                f"per task, or run fewer at once (ask for more num_cpus or memory= per task)")))
        else:
            self.dispatch.finish(spec, error_value(exceptions.WorkerCrashedError(
                f"the worker running {spec.name} (pid={w.pid}) died unexpectedly")))

    def unblock(self, w: WorkerProc) -> None:
        s = self.s
        if s.blocked_actors:
            s.blocked_actors.discard(w.index)
        if w.blocked:
            w.alloc.pool.adjust("CPU", -w.blocked)
            w.blocked = 0
