"""The node manager's shared state: one plain object that every part of the node (raylite.core.node.manager
wires them) reads and changes under `lock`. No behaviour lives here; what each field means is said
beside it, and which part changes it is the part named for it."""
from __future__ import annotations

import itertools
import socket
import threading
from collections import deque

from raylite.core.node.events import ClusterEvents, TaskEvents
from raylite.core.node.groups import Groups
from raylite.core.node.records import Actor, NextSection, WorkerProc
from raylite.core.node.segment_pool import SegmentPool
from raylite.core.node.selector import NodeSelector
from raylite.core.wire.protocol import Channel, TaskSpec
from raylite.core.wire.resources import SCALE, NodeResources
from raylite.core.worker.zygote import Zygote

# What a command run under the lock returns when it changed nothing the scheduling pass reads (it
# queued a task behind others the pass before could not start, or dropped a ref to an object): the
# pass after it would find nothing to do (Loop.step).
SETTLED = object()

DEAD_WORKERS_KEPT = 1000   # list_workers shows the last ones that ended, as Ray keeps dead workers


class NodeState:
    """Everything the node's parts share. Slots: a field read on every task costs no dict look-up."""

    __slots__ = (
        "res", "groups", "accel_resources", "max_idle", "session", "node_id", "job_id", "job_env", "namespace",
        "log_dir", "logging", "labels", "shm_prefix", "pool", "sel", "commands", "wake_r", "wake_w", "woken",
        "failure", "handlers", "functions", "workers", "idle", "queues", "feasible_seen", "starting", "unsent",
        "producers", "arg_holders", "cancelled", "fn_time", "fn_asks", "children", "actors", "table", "named",
        "task_events", "cluster_events", "runtime_envs", "dirty_channels", "dead_workers", "oom_kills",
        "blocked_actors", "starved_check", "starved_warned", "readers", "spare_wakes", "returned", "unwatched",
        "installs", "installers", "worker_index", "stopping", "lock", "node_busy", "inline_thread", "held_interrupt",
        "sigint", "zygote", "zygote_restarted", "zygote_since", "thread",
    )

    def __init__(self, totals: dict[str, int], device_ids: dict[str, list[str]], session: str, node_id: str,
                 job_id: str, zygote: Zygote, job_env: tuple | None, namespace: str, log_dir: str | None,
                 logging: dict | None, labels: dict | None, shm_prefix: str, pool: SegmentPool, oom_kills: int | None):
        self.res = NodeResources(totals, device_ids)
        self.groups = Groups(self.res, node_id)
        self.accel_resources = [r for r in device_ids if totals.get(r, 0) > 0]
        self.max_idle = max(1, -(-totals.get("CPU", 0) // SCALE))   # idle workers kept per device set
        self.session, self.node_id, self.job_id = session, node_id, job_id
        self.job_env = job_env       # init(runtime_env=...), under every task's and actor's own
        self.namespace = namespace   # the job's: named actors without one of their own live here
        self.log_dir = log_dir       # init(log_to_driver=False): worker output goes to files here
        self.logging = logging       # init(logging_config=...), as a dict each worker applies at start
        self.labels = labels or {"ray.io/node-id": node_id}   # (raylite.core.wire.labels)
        self.shm_prefix = shm_prefix
        self.pool = pool
        # the loop (raylite.core.node.loop)
        self.sel = NodeSelector()
        self.commands: deque = deque()
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.woken = False
        self.failure = None               # its NodeFailure (raylite.core.node.failures), set by Node
        self.handlers: dict = {}          # worker -> node messages, by kind (raylite.core.node.worker_messages)
        self.dirty_channels: set[Channel] = set()
        self.stopping = False
        self.lock = threading.Lock()      # held by whoever runs node code: the node thread or a caller
        self.node_busy = False            # the node thread holds the lock (and checks `commands` after)
        self.inline_thread: int | None = None   # the caller running node code now, if any
        self.held_interrupt = None              # Ctrl-C's handler, to run once that caller is done
        self.sigint = None
        self.thread: threading.Thread | None = None
        # tasks and workers
        self.functions: dict[str, bytes] = {}
        self.workers: dict[int, WorkerProc] = {}
        self.idle: dict[tuple, list[WorkerProc]] = {}
        self.queues: dict[tuple, deque[TaskSpec]] = {}
        self.feasible_seen: dict[int, tuple[dict, bool]] = {}   # see Scheduler.feasible
        self.starting: set[int] = set()             # task workers forked, their hello not read yet
        self.unsent: dict[int, WorkerProc] = {}     # of those, whose task is not sent yet (Scheduler.take_unsent)
        self.producers: dict[int, TaskSpec] = {}    # first return id -> pending or running task
        self.arg_holders: set[int] = set()          # tasks whose arguments still hold their refs
        self.cancelled: set[int] = set()
        self.fn_time: dict[str, float] = {}         # function id -> typical run time (s)
        self.fn_asks: set[str] = set()              # functions whose runs sent the node more than results
        self.children: dict[int, list[TaskSpec]] = {}   # task id -> tasks it submitted (for cancel)
        self.worker_index = itertools.count(1)
        self.dead_workers: deque = deque(maxlen=DEAD_WORKERS_KEPT)   # (index, pid, exit type, detail,
                                                                      #  launched, ended)
        self.oom_kills = oom_kills   # the kernel's count, to tell an out-of-memory kill (Workers.worker_gone)
        self.zygote = zygote
        self.zygote_restarted = False   # see Workers.fork
        self.zygote_since = 0.0
        self.readers: dict = {}         # worker index -> its socket's borrower (raylite.core.node.reader)
        self.spare_wakes: list[tuple] = []   # socket pairs of readers gone, for the next ones
        self.returned = NextSection()   # (worker, key) of idle workers given back, watched again later (reader)
        self.unwatched: list[tuple] = []   # (worker, key) of busy ones left parked until the next section's end (reader)
        # actors and objects
        self.actors: dict[int, Actor] = {}
        self.table = None                # the ObjectTable (raylite.core.node.object_table), set by Node
        self.named: dict[tuple[str, str], int] = {}   # (namespace, name) -> actor id
        self.blocked_actors: set[int] = set()   # actor workers waiting in get with CPUs held
        self.starved_check = None               # its pending timer, if any (raylite.core.node.actors)
        self.starved_warned = False
        # what happened, for the state API
        self.task_events = TaskEvents()         # what tasks did, for the state API and timeline()
        self.cluster_events = ClusterEvents()   # what a user should hear of (list_cluster_events)
        self.runtime_envs: dict[tuple, list] = {}   # env -> [first used, setup error] (list_runtime_envs)
        # runtime_env setups (raylite.core.node.env_setup): a setup -> waiting [(spec, then)], True or
        # its error; and the installers running now
        self.installs: dict[tuple, object] = {}
        self.installers: dict[tuple, object] = {}
