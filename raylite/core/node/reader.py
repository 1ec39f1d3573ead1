"""A driver thread blocked in get() or wait() reads the worker that produces its result itself.

The node thread owns the workers' sockets. Left to it, a result costs two thread wake-ups in the
driver, the node thread's and then the waiting thread's; on a VM whose idle vCPUs halt, each costs
0.1-0.3 ms, as much as the rest of a task's round trip. So when all that a waiter still lacks comes
from one worker (the task it runs, or calls on the actor it hosts), the waiting thread parks that
worker's socket in the node's selector (raylite.core.node.selector) and serves it itself, under
the node lock like any node code, until the waiter fires; then it hands the socket back. It watches the worker's stdout and
stderr pipes as well (the node thread still does too: output is rare, and whichever thread is first
serves it, under the lock), and serves what came on them after the socket's messages, in their
order (an actor's `__repr__` names the output after it; what a task prints before it returns is
printed before the get returns). Whoever else fires the waiter (the node thread: a timeout, a result from
elsewhere; another thread), ends the worker, leaves bytes for it unsent, or gives its task to
another worker before it started (Scheduler.take_unsent: the reader then follows the task), wakes the
reading thread through the reader's own socket pair. The first wait polls before it sleeps (see
polling.spin_for).
"""
from __future__ import annotations

import select
import selectors
import socket
import threading
import time
from typing import Protocol

from raylite.core.node.records import WorkerProc
from raylite.core.node.state import NodeState
from raylite.core.wire.polling import alone, poll_spinning, spin_for


class Reader:
    """A worker's socket on loan to the thread `thread` (which watches its output pipes too), until
    `waiter` fires."""

    __slots__ = ("worker", "waiter", "key", "pipes", "thread", "wake_r", "wake_w", "moved", "signalled", "returned")

    def __init__(self, worker, waiter, key, pipes: dict, thread: int, wake: tuple):
        self.worker, self.waiter, self.key, self.pipes, self.thread = worker, waiter, key, pipes, thread
        self.wake_r, self.wake_w = wake
        self.moved = False   # the task went to another worker before this one started (see Scheduler.take_unsent)
        # a byte may wait in wake_r: drain it before the pair is reused (an empty socket's drain
        # raises, which on the path of every get costs ~10 us). A byte missed in a race only wakes
        # the pair's next reader once for nothing.
        self.signalled = False
        self.returned = False   # given back (see _give_back)

    def needs_reader(self, stopping: bool, workers: dict) -> bool:
        w = self.worker
        return self.waiter.done or stopping or self.moved or w.index not in workers or bool(w.chan.wbuf)


class RunsLocked(Protocol):
    def run_locked(self, fn, args: tuple) -> None: ...
    def as_node(self, fn, *args) -> None: ...


class ServesWorkers(Protocol):
    def on_worker(self, w: WorkerProc, events: int) -> None: ...


class ProducerReading:
    def __init__(self, state: NodeState, loop: RunsLocked, procs: ServesWorkers):
        self.s, self.loop, self.procs = state, loop, procs

    def wait_reading(self, waiter, ids, timeout: float | None) -> None:
        """Register `waiter` on ids and serve the one worker that produces what it lacks, from the
        calling thread, until the waiter fires; return at once when there is no such worker (or
        the registration had to be queued), and the caller blocks as before. The socket is
        borrowed in the locked section that registers the waiter (one locked section less a get)."""
        me, lent = threading.get_ident(), []

        def register():
            self.s.table.add_waiter(waiter, ids, timeout)
            if self.s.inline_thread == me and not lent:   # run here, not queued (then it is too late)
                reader = self._borrow(waiter, ids)
                lent.append(reader)
                if reader is not None and time_left(self.s.fn_time, reader.worker) == 0.0:
                    # its task is past its usual run time: its result is most often here already,
                    # and read in this section, the get needs no other
                    self.loop.as_node(self._serve_borrowed, reader, {reader.worker.chan.sock.fileno(): select.POLLIN})
        self.loop.call_waiting(register)
        lent.append(None)
        if lent[0] is not None and self._serve(lent[0]):
            while self._read_producer_once(waiter, ids):
                pass   # the task moved to another worker: read that one

    def _read_producer_once(self, waiter, ids) -> bool:
        s = self.s
        if waiter.done:
            return False
        s.lock.acquire()   # (held by the node thread: briefly, and this thread would wait anyway)
        try:
            reader = self._borrow(waiter, ids)
        finally:
            s.lock.release()
        return reader is not None and self._serve(reader)

    def _serve(self, reader: Reader) -> bool:
        """Serve a borrowed worker until its reader's waiter fires (or it must stop); whether the
        task moved to another worker, which the waiter still waits for."""
        s, waiter = self.s, reader.waiter
        if reader.returned:   # served and given back in the section that borrowed it (see wait_reading)
            return False
        w, sock = reader.worker, reader.worker.chan.sock
        poller = select.poll()   # not select(): no limit on descriptor numbers
        poller.register(reader.wake_r, select.POLLIN)
        for fd in reader.pipes:
            poller.register(fd, select.POLLIN)
        try:
            poller.register(sock, select.POLLIN)
            watching_out = False
            # the first wait polls, as long as the task's function usually takes to run (see
            # polling.spin_for), unless user threads would compete for the GIL
            spin = spin_for(time_left(s.fn_time, w)) if alone() else 0.0
            while (not waiter.done and not s.stopping and not reader.moved and w.index in s.workers
                   and s.failure.cause is None):
                if bool(w.chan.wbuf) != watching_out:
                    watching_out = not watching_out
                    poller.modify(sock, select.POLLIN | (select.POLLOUT if watching_out else 0))
                events = dict(_poll(poller, spin))
                spin = 0.0
                if events.pop(reader.wake_r.fileno(), 0):
                    reader.signalled = False
                    _drain(reader.wake_r)
                if events:   # the worker's socket or pipes: readable, writable, or closed
                    s.lock.acquire()
                    self.loop.run_locked(self.loop.as_node, (self._serve_borrowed, reader, events))
                    for fd in [fd for fd in events if fd in reader.pipes and fd not in (w.out_fd, w.err_fd)]:
                        poller.unregister(fd)   # it reached its end and is closed
                        del reader.pipes[fd]
        except (OSError, ValueError):   # the node closed the socket: the worker is gone
            pass
        finally:
            if not reader.returned:
                s.lock.acquire()
                self.loop.run_locked(self._give_back, (reader,))
        return reader.moved and not waiter.done

    def _borrow(self, waiter, ids) -> Reader | None:
        s = self.s
        if not waiter.armed or waiter.done:   # its registration is still queued for the node thread
            return None
        w = self._producer(ids)
        if w is None or w.index in s.readers:
            return None
        try:
            key = s.sel.park(w.chan.sock)
        except (KeyError, ValueError):   # closed: the worker is gone
            return None
        s.returned.discard(w)   # (parked already if it was there: no system call either way)
        if s.unwatched:
            s.unwatched = [item for item in s.unwatched if item[0] is not w]
        pipes = {}   # watched by the node too (output comes rarely): two system calls less a get
        for fd in (w.out_fd, w.err_fd):
            if fd >= 0:
                try:
                    pipes[fd] = s.sel.get_key(fd)
                except KeyError:   # not watched (the selector is closing)
                    pass
        if s.spare_wakes:
            pair = s.spare_wakes.pop()
        else:
            pair = socket.socketpair()
            for end in pair:
                end.setblocking(False)
        reader = s.readers[w.index] = Reader(w, waiter, key, pipes, threading.get_ident(), pair)
        return reader

    def _producer(self, ids):
        """The worker producing every id not ready yet, if it is one worker."""
        s = self.s
        found = None
        for oid in ids:
            entry = s.table.objects.get(oid) if oid >= 0 else None
            if entry is not None and entry.value is not None:
                continue
            spec = s.producers.get(oid)
            w = self._worker_of(spec) if spec is not None else None
            if w is None or (found is not None and w is not found):
                return None
            found = w
        return found

    def _worker_of(self, spec):
        s = self.s
        if spec.kind == "actor_call":
            actor = s.actors.get(spec.actor_id)
            return actor.worker if actor is not None and actor.state == "ALIVE" else None
        return next((w for w in s.workers.values() if w.task is spec or spec in w.ahead), None)

    def _serve_borrowed(self, reader: Reader, events: dict) -> None:
        """The socket first (an actor's `__repr__`, sent before the output, names it), then the
        pipes; both before the get that waits returns, so output printed before a result is out
        before the caller goes on."""
        s = self.s
        w = reader.worker
        if w.index in s.workers and w.chan.sock.fileno() in events:
            s.dirty_channels.add(w.chan)   # flushed by the step that runs this
            self.procs.on_worker(w, selectors.EVENT_READ)
        for fd, key in reader.pipes.items():
            if fd in events and fd in (w.out_fd, w.err_fd):
                key.data(selectors.EVENT_READ)
        if reader.waiter.done:   # what it waited for came: the socket goes back now, in this step
            self._give_back(reader)

    def _give_back(self, reader: Reader) -> None:
        s = self.s
        reader.returned = True
        w = reader.worker
        if s.readers.get(w.index) is reader:
            del s.readers[w.index]
        if s.stopping:
            reader.wake_r.close()
            reader.wake_w.close()
        else:
            if reader.signalled:
                _drain(reader.wake_r)
            s.spare_wakes.append((reader.wake_r, reader.wake_w))
        if _live(s, w):
            w.chan.watch_write = bool(w.chan.wbuf)
            if w.task is None and not w.ahead and w.actor is None and not w.retiring and not w.chan.wbuf:
                s.returned.add((w, reader.key))   # idle: see watch_returned
            else:
                _watch(s, w, reader.key)

    def watch_returned(self) -> None:
        """At the end of each locked section: the node thread watches again the workers given back
        before this section, and those given back in it that have work again (this section's
        scheduling pass sent them a task); the others, still idle, at the end of the next. An idle
        worker sends nothing that must be read at once (a hang-up is reported parked too), and
        the next section is most often the submit of the next task, which may go to it: there
        the system call comes after the task went out, while it runs, not between a result and
        its get's return. A worker borrowed again meanwhile is no longer held (see _borrow).

        A worker this section gave a task stays parked one section more where nothing but this
        thread's next call can want its result (may_hold), and the task's function is known to
        send nothing before it (_quiet): that call is most often the get that
        borrows it, which then reads the result in its own section (wait_reading), with no
        system call to watch and park it again, and no wake-up of the node thread for it."""
        s = self.s
        due, held = s.returned.age(), s.returned.due
        busy = [item for item in held if _busy(item[0])]
        if busy:
            s.returned.due = [item for item in held if item not in busy]
        late, s.unwatched = s.unwatched, []
        for w, key in late:   # left parked by the section before: watched now
            if _live(s, w) and w.index not in s.readers:
                _watch(s, w, key)
        hold = None
        for w, key in due + busy:
            if not _live(s, w) or w.index in s.readers:
                continue
            if _quiet(s, w):
                if hold is None:
                    hold = self.may_hold()
                if hold and not _waited_on(s, w.task):
                    s.unwatched.append((w, key))
                    continue
            _watch(s, w, key)

    def catch_up(self) -> None:
        """Under the lock, before anything reads the node's state (call_sync, a wait that does not
        block): read what the workers left unwatched (may_hold) have sent, and watch them again,
        so a task that has ended reads as ended."""
        s = self.s
        late, s.unwatched = s.unwatched, []
        for w, key in late:
            if _live(s, w) and w.index not in s.readers:
                _watch(s, w, key)
                self.procs.on_worker(w, selectors.EVENT_READ)

    def may_hold(self) -> bool:
        """Whether a busy worker may stay unwatched until the next locked section: this one runs
        in the driver's only user thread (so no other thread of it waits on the node thread), and
        nothing queued or placing could start once its task ends. Whatever that thread does next
        in raylite is a section (or nudges one: DriverClient.wait)."""
        s = self.s
        return s.inline_thread is not None and not s.queues and not s.groups.pending and alone()

    def wake_readers(self) -> None:
        """After node code ran: wake the borrowers (in other threads) that have something to do."""
        s = self.s
        me = threading.get_ident()
        for reader in list(s.readers.values()):
            if reader.thread != me and reader.needs_reader(s.stopping, s.workers):
                reader.signalled = True
                try:
                    reader.wake_w.send(b"x")
                except OSError:   # full: it is awake already
                    pass

    def close(self) -> None:
        s = self.s
        for pair in s.spare_wakes:
            for end in pair:
                end.close()
        s.spare_wakes.clear()


def _live(s: NodeState, w) -> bool:
    return w.index in s.workers and w.chan.sock.fileno() >= 0 and not s.stopping


def _watch(s: NodeState, w, key) -> None:
    """The node thread watches a parked worker's socket again (for writing too while bytes wait)."""
    s.sel.resume(key, selectors.EVENT_READ | (selectors.EVENT_WRITE if w.chan.wbuf else 0))


def _busy(w) -> bool:
    return w.task is not None or bool(w.ahead) or bool(w.chan.wbuf)


def _quiet(s: NodeState, w) -> bool:
    """Whether w runs one task of a function that, as far as its runs so far tell, sends nothing
    before its result (no nested submit, get, put or stream item that others would wait on)."""
    spec = w.task
    return (spec is not None and spec.kind == "task" and spec.stream is None and not w.ahead and not w.chan.wbuf
            and spec.fn_id in s.fn_time and spec.fn_id not in s.fn_asks)


def _waited_on(s: NodeState, spec) -> bool:
    """Whether anyone (another process's get, a dependent task, a callback) waits on its results."""
    objects = s.table.objects
    return any(entry is not None and entry.waiters for entry in map(objects.get, spec.return_ids))


def time_left(fn_time: dict, w) -> float | None:
    """How long the task w runs has still to go, going by its function's usual run time
    (None for actor calls and functions not run yet)."""
    spec = w.task
    typical = fn_time.get(spec.fn_id) if spec is not None and spec.kind == "task" else None
    return None if typical is None else max(0.0, typical - (time.monotonic() - w.started))


def _poll(poller, spin: float) -> list:
    """poller.poll(), first polling for `spin` seconds."""
    return (spin and poll_spinning(poller, spin)) or poller.poll()


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(4096):
            pass
    except OSError:
        pass
