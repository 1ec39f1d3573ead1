"""The node manager, in the driver: one state object (raylite.core.node.state) and the parts that
act on it, each a class given the state and the few other parts it calls (each declares what it
needs of them as a small Protocol): the loop and its commands (loop), scheduling (scheduler),
dispatch to workers and results (dispatch), the workers' lifecycle (worker_lifecycle), the actors'
(actors), the tiny tasks sent ahead to busy workers (lines), cancel (cancellation), placement
groups (group_lifecycle), streams (stream_serving), runtime_env setups (env_setup), the workers'
output (output), a waiting caller reading its producer (reader) and the workers' messages
(task_messages, worker_messages); beside them the object table (object_table), the failure state
(failures) and the event records (events). `Node` builds and wires them, and is what the client
layer calls. One lock guards all of it."""
from __future__ import annotations

import selectors
import time

from raylite.core.node.actors import ActorLifecycle
from raylite.core.node.cancellation import Cancellation
from raylite.core.node.dispatch import Dispatch
from raylite.core.node.env_setup import EnvSetup
from raylite.core.node.failures import NodeFailure
from raylite.core.node.group_lifecycle import GroupLifecycle
from raylite.core.node.lines import TaskLines
from raylite.core.node.loop import Loop
from raylite.core.node.object_table import ObjectTable
from raylite.core.node.output import WorkerOutput
from raylite.core.node.reader import ProducerReading
from raylite.core.node.scheduler import Scheduler
from raylite.core.node.segment_pool import SegmentPool
from raylite.core.node.state import NodeState
from raylite.core.node.stream_serving import Streams
from raylite.core.node.task_messages import TaskMessages
from raylite.core.node.worker_lifecycle import WorkerLifecycle, oom_kills
from raylite.core.node.worker_messages import WorkerMessages, handler_table
from raylite.core.wire import protocol as P
from raylite.core.wire import segments
from raylite.core.wire.polling import start_sleeper
from raylite.core.wire.protocol import TaskSpec
from raylite.core.wire.resources import SCALE, from_fixed
from raylite.core.worker.zygote import Zygote


class Node:
    """The facade the client layer (raylite.core.node.driver, the API) calls. The methods it
    passes on to a part are that part's bound methods, set per instance: no extra call per task."""

    def __init__(self, totals: dict[str, int], device_ids: dict[str, list[str]], session: str,
                 node_id: str, job_id: str, zygote: Zygote, job_env: tuple | None = None, namespace: str = "",
                 log_dir: str | None = None, logging: dict | None = None, labels: dict | None = None):
        store = totals.get("object_store_memory", 0) // SCALE
        pool = segments.pool = SegmentPool(min(store // 4, 4 << 30))
        s = self.shared = NodeState(totals, device_ids, session, node_id, job_id, zygote, job_env, namespace, log_dir,
                                    logging, labels, segments.session_prefix(session), pool, oom_kills())
        # the parts, each built on those it calls (the loop first: every part sends through it)
        self.loop = loop = Loop(s)
        s.failure = NodeFailure(loop.broken)
        self.streams = Streams(s)
        self.dispatch = dispatch = Dispatch(s, loop, self.streams)
        self.output = WorkerOutput(s)
        self.lines = TaskLines(s, dispatch, loop)
        self.actor_ops = ActorLifecycle(s, dispatch)
        s.table = ObjectTable(s.actors, self.actor_ops.release_actor, s.workers,
                              lambda index, names: loop.send(s.workers[index], (P.FORGET, names)))
        self.placement = GroupLifecycle(s, self.actor_ops, dispatch)
        self.envs = EnvSetup(s, loop, dispatch, self.actor_ops)
        self.procs = WorkerLifecycle(s, self.output, dispatch, self.actor_ops, self.placement)
        self.scheduler = Scheduler(s, dispatch, self.procs, self.actor_ops, self.envs, self.placement, self.lines)
        self.cancels = Cancellation(s, dispatch, loop, self.scheduler, self.lines)
        self.borrowers = ProducerReading(s, loop, self.procs)
        self.task_msgs = TaskMessages(s, self.output, dispatch, self.actor_ops, self.scheduler, self.lines, self.procs)
        self.worker_msgs = WorkerMessages(s, loop, self, self.task_msgs, self.procs)
        loop.connect(self.scheduler, self.borrowers)   # the loop's one way back: it runs them each step
        s.handlers = handler_table(self.worker_msgs, self.task_msgs, self.streams, self.lines, self.cancels)
        # what the client layer calls, straight to the part that does it
        self.call, self.call_sync, self.call_waiting = loop.call, loop.call_sync, loop.call_waiting
        self.submit, self.cancel = self.scheduler.submit, self.cancels.cancel
        self.kill, self.get_actor, self.named_actors = (self.actor_ops.kill, self.actor_ops.get_actor,
                                                        self.actor_ops.named_actors)
        self.group, self.stream_next = self.placement.group, self.streams.stream_next
        self.wait_reading, self.catch_up = self.borrowers.wait_reading, loop.catch_up
        # and what it reads (objects that live as long as the node)
        self.table, self.failure, self.res, self.workers, self.actors = s.table, s.failure, s.res, s.workers, s.actors
        self.session, self.node_id, self.job_id, self.namespace = session, node_id, job_id, namespace
        self.job_env, self.log_dir, self.shm_prefix = job_env, log_dir, s.shm_prefix
        self.recent_output = self.output.recent_output
        s.sel.register(s.wake_r, selectors.EVENT_READ, loop.on_wake)
        loop.hold_interrupts()
        s.thread = start_sleeper(loop.run, "raylite-node")   # (a driver thread waiting on a worker still polls)

    @property
    def zygote(self) -> Zygote:
        """The worker factory now (replaced if the first one died: WorkerLifecycle.fork)."""
        return self.shared.zygote

    def create_named(self, spec: TaskSpec, fn_bytes: bytes | None, get_if_exists: bool):
        """Create a named actor in its namespace (the job's unless given) and return None, or,
        when the name is taken by a live actor, return that one (get_if_exists) or raise."""
        existing = self.actor_ops.claim_name(spec, fn_bytes, get_if_exists)
        if existing is None:
            self.scheduler.submit(spec, fn_bytes)
        return existing

    def state(self, what: str, detail: bool) -> tuple[list, int]:
        """Rows of the state API (raylite.core.node.snapshot), and how many task records were dropped."""
        from raylite.core.node import snapshot  # only when someone asks
        return snapshot.view(self.shared, what, detail)

    def resource_view(self) -> tuple[dict, dict]:
        res = self.shared.res
        avail = res.available()
        return ({k: from_fixed(v) for k, v in res.total.items()},
                {k: from_fixed(v) for k, v in avail.items() if v > 0})

    def shutdown(self) -> None:
        s = self.shared

        def begin():
            s.stopping = True
            for w in list(s.workers.values()):
                if w.task is None and w.actor is None:
                    self.dispatch.retire(w)
        broken = s.failure.cause is not None   # then the node thread has ended: nothing to ask it
        if not broken:
            try:
                self.call_sync(begin)
            except Exception:  # noqa: BLE001 - shutting down regardless
                pass
        self.envs.cancel_installs()
        s.zygote.close()            # kills every worker still running, removes segments
        if not broken and s.failure.cause is None:
            self.call(lambda: None)
        s.thread.join(5)
        self.loop.release_interrupts()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and self.output.drain():
            pass
        if self.output.dedup is not None:   # the repeats still held, counted
            self.output.release_held(time.monotonic(), everything=True)
        segments.remove_session_segments(s.session)
        segments.pool = None
        for w in list(s.workers.values()):
            w.chan.close()
        s.sel.close()
        self.borrowers.close()
        s.wake_r.close()
        s.wake_w.close()


__all__ = ["Node", "SCALE"]
