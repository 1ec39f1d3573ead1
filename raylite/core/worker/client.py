"""The runtime as a worker's user code sees it: nested `.remote()`, `get`, `wait`, `put` and the
rest go to the driver's node as requests over the worker's control socket (raylite.core.wire.protocol)."""
from __future__ import annotations

import itertools
import os
import threading
import time
from collections import deque

from raylite.core.client import context

from raylite.core.wire import serialization
from raylite.core.wire.protocol import (CANCEL, CREATE_NAMED, DONES, GET, GET_ACTOR, GROUP, KILL, NAMED_ACTORS, PUT, REFS, REPLY,
                                        RESOURCES, RUN, RUN_LINE, STATE, STREAM_NEXT, SUBMIT, UNPREFETCH, UNPREFETCHED, WAIT, ADDREF,
                                        PIN, RELEASE, Channel, TaskSpec, spec_from_wire, specs_from_line)
from raylite.core.wire.polling import alone, spin_for, start_sleeper
from raylite.core.wire.resources import NodeResources


HOLD_MAX = 64        # results held back at most (see WorkerClient.send_result)
HOLD_MAX_S = 0.002   # and for at most this long
LATE_CHECK_S = 0.01  # while some are held, how often a thread sends them if the next task runs long


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
        self.held: list = []       # DONE messages held back (see send_result), since held_since
        self.held_since = 0.0
        self.holding = threading.Event()   # set when results start to be held (see _send_late)
        self.late_sender: threading.Thread | None = None

    # -- plumbing --
    def send(self, msg) -> None:
        with self.lock:
            self._defer_pending()
            self.chan.send(msg)

    def send_ahead(self, msg) -> None:
        """Queue msg to go out in the same write as whatever this worker sends next (a task's
        METRICS with its DONE); waiting for the next message sends it too (next_message)."""
        with self.lock:
            self._defer_pending()
            self.chan.defer(msg)

    def _defer_pending(self) -> None:
        """What waits to go out ahead of the next message: held results, then reference ops."""
        self._defer_held()
        self._defer_refops()

    def _defer_refops(self) -> None:
        """Reference ops go ahead of the message that follows, in its write (a system call and,
        for a node that sleeps, a wake-up less than a write of their own); results held back
        were recorded before them, and go first."""
        if self.refops:
            self._defer_held()
            ops, self.refops = self.refops, []
            self.chan.defer((REFS, ops))

    def _defer_held(self) -> None:
        """The results held back, into the next write: as one DONES message if several (one
        pickle and one message for the node to read and dispatch, not one each)."""
        held = self.held
        if held:
            self.held = []
            self.chan.defer(held[0] if len(held) == 1 else (DONES, [msg[1:] for msg in held]))

    def send_result(self, msg, defer: bool) -> None:
        """A task's DONE, or with `defer` (another short task is here already to run next) held
        back to go out with the next ones in one write: up to HOLD_MAX of them, for up to
        HOLD_MAX_S. Whatever this worker sends next, or waiting for its next message, sends
        them first (send), so a single task's result never waits."""
        with self.lock:
            self._defer_refops()
            now = time.perf_counter()
            held = self.held
            if not held:
                self.held_since = now
            held.append(msg)
            if defer and len(held) < HOLD_MAX and now - self.held_since < HOLD_MAX_S:
                if self.late_sender is None:
                    self.late_sender = start_sleeper(self._send_late, "raylite-held-results")   # (the main thread still polls)
                if not self.holding.is_set():
                    self.holding.set()
            else:
                self._flush_locked()

    def _send_late(self) -> None:
        """Send results held back HOLD_MAX_S old or more: the next task, taken as short from its
        function's past runs, may run long (or block), and they must not wait for it. While some
        are held it looks every LATE_CHECK_S (waking every HOLD_MAX_S, or once per batch, cost
        the batch throughput of tiny tasks up to a fifth)."""
        while True:
            self.holding.wait()
            while True:
                time.sleep(LATE_CHECK_S)
                with self.lock:
                    if self.held and time.perf_counter() - self.held_since >= HOLD_MAX_S:
                        self._flush_locked()
                    if not self.held:
                        self.holding.clear()
                        break

    def flush(self) -> None:
        """Send what is held back (before this process ends)."""
        with self.lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        self._defer_pending()
        self.chan.flush_deferred()

    def peek(self):
        """The next message from the node if it is here already (read, not taken), else None."""
        if not self.inbox and self.chan.has_message():
            self._take(self.chan.recv())
        return self.inbox[0] if self.inbox else None

    def _take(self, msg) -> None:
        """Into the inbox, as RUNs if it is a RUN_LINE (so each of its calls can be given back)."""
        if msg[0] == RUN_LINE:
            _, shared, fn_bytes, assigned, accel, entries = msg
            for spec in specs_from_line(shared, entries, serialization.Serialized):
                self.inbox.append((RUN, spec, fn_bytes, {}, assigned, accel))
                fn_bytes = None
        else:
            self.inbox.append(incoming(msg))

    def request(self, msg_kind: str, *args):
        reply = None if self.replies is None else _Reply()   # concurrent calls: the main loop reads, each waits
        with self.lock:
            req = next(self.req_ids)
            if reply is not None:
                self.replies[req] = reply
            self._defer_pending()   # (what was held goes out first)
            self.chan.send((msg_kind, req) + args)
            while reply is None:
                msg = self.chan.recv()
                if msg is None:
                    os._exit(1)  # the driver is gone
                if msg[0] == REPLY and msg[1] == req:
                    return msg[2]
                if msg[0] == UNPREFETCH:
                    self.give_back(msg[1])
                else:
                    self._take(msg)
        return reply.wait()

    def deliver(self, req: int, payload) -> None:
        self.replies.pop(req).set(payload)

    def give_back(self, task_id: int) -> None:
        """Answer UNPREFETCH: the driver wants a task sent ahead of time back (this worker blocked
        before it started); not found, it has run already."""
        for msg in self.inbox:
            if msg[0] == RUN and msg[1].task_id == task_id:
                self.inbox.remove(msg)
                return self.send((UNPREFETCHED, task_id, True))
        self.send((UNPREFETCHED, task_id, False))

    def next_message(self):
        if self.inbox:
            return self.inbox.popleft()
        if self.chan.has_message():
            return self._next(self.chan.recv())
        if self.refops or self.held or self.chan.deferred:   # (a sync task's DONE went out already: nothing to lock)
            self.flush()
        # a single-threaded worker waits for its next task polling first, for as long as its last
        # wait suggests (see polling.spin_for); with more threads, the polling one would compete
        # for the GIL
        spin = spin_for(self.last_wait) if alone() else 0.0
        started = time.monotonic()
        msg = self.chan.recv(spin)
        self.last_wait = time.monotonic() - started
        return self._next(msg)

    def _next(self, msg):
        if msg is None or msg[0] != RUN_LINE:
            return incoming(msg)
        self._take(msg)
        return self.inbox.popleft()

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


def incoming(msg):
    """A message as read; a "run" comes as plain data (protocol.spec_to_wire): rebuild it."""
    if msg is not None and msg[0] == RUN:
        deps = msg[3]
        return (RUN, spec_from_wire(msg[1], serialization.Serialized), msg[2],
                {d: serialization.Serialized(*v) for d, v in deps.items()} if deps else deps, msg[4], msg[5])
    return msg
