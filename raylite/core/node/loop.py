"""The node's loop: how code comes to run under the node lock, and how its errors flow.

A user thread's command (`call`) runs at once in that thread when the lock is free, else it is
queued for the node thread, which serves the workers' sockets and the timers. Each command runs
under its own guard; an error in the node's own work marks the runtime broken (raylite.core.node.failures).
"""
from __future__ import annotations

import selectors
import signal
import socket
import threading

from typing import Protocol

from raylite.core.node.failures import command_failed
from raylite.core.node.records import WorkerProc
from raylite.core.node.state import SETTLED, NodeState


def _earliest(*timeouts: float | None) -> float | None:
    return min((t for t in timeouts if t is not None), default=None)


class Schedules(Protocol):
    def schedule(self) -> None: ...


class WakesReaders(Protocol):
    def wake_readers(self) -> None: ...
    def watch_returned(self) -> None: ...
    def catch_up(self) -> None: ...


class Loop:
    """The node thread, the commands of the callers, and the bytes waiting for the workers' sockets.
    Built first (every part sends); `connect` gives it the two parts it runs after each step."""

    def __init__(self, state: NodeState):
        self.s = state
        self.scheduler: Schedules | None = None
        self.borrowers: WakesReaders | None = None

    def connect(self, scheduler: Schedules, borrowers: WakesReaders) -> None:
        self.scheduler, self.borrowers = scheduler, borrowers

    def call(self, fn, *args) -> None:
        """Run fn(*args) under the node lock, from any thread: at once in the calling thread when
        the node thread is not busy (fn's error is raised here), else queued for it. Running at
        once spares the node thread a wake-up per submit and get, which costs 0.1-0.4 ms on a VM
        whose idle vCPUs halt. Refused once the runtime is broken (raylite.core.node.failures)."""
        s = self.s
        s.failure.check()
        if s.stopping or not s.lock.acquire(False):
            s.commands.append((fn, args))
            if s.stopping or not s.node_busy:   # else it looks at the commands before it sleeps
                self.wake()
            return
        self.run_locked(fn, args)

    def call_waiting(self, fn, *args) -> None:
        """`call` from a thread that waits for what fn starts anyway (get, wait): when the node
        thread holds the lock (serving the very result awaited, often), wait for the lock and
        run fn here rather than queue it, wake the node thread and sleep until it ran fn; that
        cost a get two thread wake-ups. (Queued as `call` does from inside node code.)"""
        s = self.s
        s.failure.check()
        if s.stopping or s.inline_thread == threading.get_ident():
            return self.call(fn, *args)
        s.lock.acquire()
        self.run_locked(fn, args)

    def run_locked(self, fn, args: tuple) -> None:
        """`call`'s work in the calling thread, which holds the lock (released here)."""
        s = self.s
        first_timer = s.table.timers[0] if s.table.timers else None
        first_due = s.pool.due
        s.inline_thread = threading.get_ident()
        try:
            error = self.step(fn, args)
        finally:
            s.inline_thread = None
            s.lock.release()
        if (s.table.timers and s.table.timers[0] is not first_timer) or s.pool.due < first_due:
            self.wake()   # the node thread's select() must wake for a new timeout or pool expiry
        if s.held_interrupt is not None and threading.get_ident() == threading.main_thread().ident:
            handler, s.held_interrupt = s.held_interrupt, None
            handler(signal.SIGINT, None)
        if error is not None:
            raise error

    def wake(self) -> None:
        s = self.s
        if not s.woken:
            s.woken = True
            try:
                s.wake_w.send(b"x")
            except OSError:
                pass

    def broken(self) -> None:
        """Under the lock, once the runtime broke: the node thread stops, and every worker sees its
        driver gone (its socket ends) and exits, so a task blocked in a nested get fails rather
        than waits for a node that no longer answers."""
        s = self.s
        self.wake()
        for w in s.workers.values():
            try:
                w.chan.sock.shutdown(socket.SHUT_RDWR)
            except OSError:   # closed already
                pass

    def hold_interrupts(self) -> None:
        """Ctrl-C while the main thread runs node commands (see `call`) is held until they are
        done, so it never leaves the node half-updated (say, a task's resources taken and the
        task never started). Wraps the handler in place (Python's, or a notebook kernel's)."""
        s = self.s
        previous = signal.getsignal(signal.SIGINT)
        if threading.current_thread() is not threading.main_thread() or not callable(previous):
            return

        def on_sigint(signum, frame):
            if s.inline_thread == threading.get_ident():
                s.held_interrupt = previous
            else:
                previous(signum, frame)

        signal.signal(signal.SIGINT, on_sigint)
        s.sigint = (on_sigint, previous)

    def release_interrupts(self) -> None:
        s = self.s
        if s.sigint is not None and threading.current_thread() is threading.main_thread():
            ours, previous = s.sigint
            if signal.getsignal(signal.SIGINT) is ours:
                signal.signal(signal.SIGINT, previous)
            s.sigint = None

    def call_sync(self, fn, *args):
        """fn(*args) run under the node lock; its value, or its error raised here."""
        s = self.s
        def run(gate):
            try:
                s.table.release_dropped()   # what it observes counts every ref dropped before
                self.catch_up()   # and every task ended before
                gate.open((True, fn(*args)))
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller
                gate.open((False, e))

        ok, value = s.failure.ask(lambda gate: self.call(run, gate), s.thread.is_alive)
        if not ok:
            raise value
        return value

    def on_wake(self, _events=None) -> None:
        s = self.s
        try:
            s.wake_r.recv(4096)
        except BlockingIOError:
            pass

    def run(self) -> None:
        """The node thread. Everything in it runs under one guard: an error here is a bug in the
        node, which marks the runtime broken and ends this thread (raylite.core.node.failures)."""
        s = self.s
        try:
            while s.failure.cause is None:
                timeout = 0 if s.commands else _earliest(s.table.next_timeout(), s.pool.next_expiry())
                ready = s.sel.select(timeout)
                with s.lock:
                    if s.failure.cause is not None:   # it broke in a caller's thread meanwhile
                        return
                    s.node_busy = True
                    try:
                        for key, events in ready:
                            key.data(events)
                        s.woken = False
                        self.step()
                        s.pool.expire()   # here only: this thread wakes when the oldest pooled segment is due
                    finally:
                        s.node_busy = False
                if s.stopping and not s.commands:
                    return
        except Exception as e:  # noqa: BLE001 - the node's own bug: every waiter hears of it
            with s.lock:
                s.failure.fail(e)

    def step(self, fn=None, args: tuple = ()) -> BaseException | None:
        """Under the lock: the commands queued so far (in order), then fn, then what became due,
        runnable or sendable. Each command runs under its own guard, so one's error never skips
        another's; fn's error is returned for its caller to raise. An error in the rest is the
        node's own: the runtime is broken."""
        s = self.s
        ran_commands = bool(s.commands)
        while s.commands:
            queued, queued_args = s.commands.popleft()
            try:
                queued(*queued_args)
            except Exception:  # noqa: BLE001 - its caller did not wait for a reply
                command_failed()
        error = result = None
        if fn is not None:
            try:
                result = fn(*args)
            except Exception as e:  # noqa: BLE001 - raised in the caller (see run_locked)
                error = e
        if s.failure.cause is not None:   # its state is unknown: leave it be until shutdown
            return error
        # every locked section ends with a scheduling pass: after fn alone, which changed nothing
        # the pass reads (SETTLED: see raylite.core.node.state), it would find nothing to do
        settled = result is SETTLED and not ran_commands and not s.table.timers
        try:
            if s.table.timers:
                s.table.fire_timers()
            if (s.queues or s.groups.pending) and not settled:   # else nothing could start
                self.scheduler.schedule()
            if s.dirty_channels:
                self.flush()
            if s.table.dropped:   # (after the flush: not ahead of the task this section sent)
                s.table.release_dropped()
            if s.task_events.ending.due or s.task_events.ending.fresh:
                s.task_events.age()
            if s.readers:
                self.borrowers.wake_readers()
            if s.returned.due or s.returned.fresh or s.unwatched:
                self.borrowers.watch_returned()
        except Exception as e:  # noqa: BLE001 - the node's own bug
            s.failure.fail(e)
        return error

    def as_node(self, fn, *args) -> None:
        """Under the lock, in a caller's thread: fn is the node's own work (serving a worker's
        messages), so its error breaks the runtime rather than going back to that caller."""
        s = self.s
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - the node's own bug
            s.failure.fail(e)

    def catch_up(self) -> None:
        """Under the lock: what the workers left unwatched until the next section have sent is
        read now (raylite.core.node.reader: ProducerReading.catch_up)."""
        self.as_node(self.borrowers.catch_up)

    def flush(self) -> None:
        s = self.s
        for chan in s.dirty_channels:
            chan.flush()
            if bool(chan.wbuf) != chan.watch_write:   # the socket filled up, or has drained
                try:
                    key = s.sel.get_key(chan.sock)
                    s.sel.modify(chan.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if chan.wbuf else 0),
                                    key.data)
                    chan.watch_write = bool(chan.wbuf)
                except (KeyError, ValueError):   # closed
                    pass
        s.dirty_channels = {c for c in s.dirty_channels if c.wbuf}

    def send(self, w: WorkerProc, msg) -> None:
        s = self.s
        w.chan.queue(msg)
        s.dirty_channels.add(w.chan)
