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

from raylite.core.node.failures import command_failed
from raylite.core.node.records import WorkerProc


def _earliest(*timeouts: float | None) -> float | None:
    return min((t for t in timeouts if t is not None), default=None)


class NodeLoop:
    """Node mixin. Needs: lock, commands, failure, sel, thread, table, pool, queues, groups, workers,
    readers, dirty_channels, stopping, inline_thread, held_interrupt, _node_busy, _woken,
    _wake_r, _wake_w, _sigint, _schedule, _wake_readers."""

    def call(self, fn, *args) -> None:
        """Run fn(*args) under the node lock, from any thread: at once in the calling thread when
        the node thread is not busy (fn's error is raised here), else queued for it. Running at
        once spares the node thread a wake-up per submit and get, which costs 0.1-0.4 ms on a VM
        whose idle vCPUs halt. Refused once the runtime is broken (raylite.core.node.failures)."""
        self.failure.check()
        if self.stopping or not self.lock.acquire(False):
            self.commands.append((fn, args))
            if self.stopping or not self._node_busy:   # else it looks at the commands before it sleeps
                self._wake()
            return
        self._run_locked(fn, args)

    def call_waiting(self, fn, *args) -> None:
        """`call` from a thread that waits for what fn starts anyway (get, wait): when the node
        thread holds the lock (serving the very result awaited, often), wait for the lock and
        run fn here rather than queue it, wake the node thread and sleep until it ran fn; that
        cost a get two thread wake-ups. (Queued as `call` does from inside node code.)"""
        self.failure.check()
        if self.stopping or self.inline_thread == threading.get_ident():
            return self.call(fn, *args)
        self.lock.acquire()
        self._run_locked(fn, args)

    def _run_locked(self, fn, args: tuple) -> None:
        """`call`'s work in the calling thread, which holds the lock (released here)."""
        first_timer = self.table.timers[0] if self.table.timers else None
        first_due = self.pool.due
        self.inline_thread = threading.get_ident()
        try:
            error = self._step(fn, args)
        finally:
            self.inline_thread = None
            self.lock.release()
        if (self.table.timers and self.table.timers[0] is not first_timer) or self.pool.due < first_due:
            self._wake()   # the node thread's select() must wake for a new timeout or pool expiry
        if self.held_interrupt is not None and threading.get_ident() == threading.main_thread().ident:
            handler, self.held_interrupt = self.held_interrupt, None
            handler(signal.SIGINT, None)
        if error is not None:
            raise error

    def _wake(self) -> None:
        if not self._woken:
            self._woken = True
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass

    def _broken(self) -> None:
        """Under the lock, once the runtime broke: the node thread stops, and every worker sees its
        driver gone (its socket ends) and exits, so a task blocked in a nested get fails rather
        than waits for a node that no longer answers."""
        self._wake()
        for w in self.workers.values():
            try:
                w.chan.sock.shutdown(socket.SHUT_RDWR)
            except OSError:   # closed already
                pass

    def _hold_interrupts(self) -> None:
        """Ctrl-C while the main thread runs node commands (see `call`) is held until they are
        done, so it never leaves the node half-updated (say, a task's resources taken and the
        task never started). Wraps the handler in place (Python's, or a notebook kernel's)."""
        previous = signal.getsignal(signal.SIGINT)
        if threading.current_thread() is not threading.main_thread() or not callable(previous):
            return

        def on_sigint(signum, frame):
            if self.inline_thread == threading.get_ident():
                self.held_interrupt = previous
            else:
                previous(signum, frame)

        signal.signal(signal.SIGINT, on_sigint)
        self._sigint = (on_sigint, previous)

    def _release_interrupts(self) -> None:
        if self._sigint is not None and threading.current_thread() is threading.main_thread():
            ours, previous = self._sigint
            if signal.getsignal(signal.SIGINT) is ours:
                signal.signal(signal.SIGINT, previous)
            self._sigint = None

    def call_sync(self, fn, *args):
        """fn(*args) run under the node lock; its value, or its error raised here."""
        def run(gate):
            try:
                gate.open((True, fn(*args)))
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller
                gate.open((False, e))

        ok, value = self.failure.ask(lambda gate: self.call(run, gate), self.thread.is_alive)
        if not ok:
            raise value
        return value

    def _on_wake(self, _events=None) -> None:
        try:
            self._wake_r.recv(4096)
        except BlockingIOError:
            pass

    def _loop(self) -> None:
        """The node thread. Everything in it runs under one guard: an error here is a bug in the
        node, which marks the runtime broken and ends this thread (raylite.core.node.failures)."""
        try:
            while self.failure.cause is None:
                timeout = 0 if self.commands else _earliest(self.table.next_timeout(), self.pool.next_expiry())
                ready = self.sel.select(timeout)
                with self.lock:
                    if self.failure.cause is not None:   # it broke in a caller's thread meanwhile
                        return
                    self._node_busy = True
                    try:
                        for key, events in ready:
                            key.data(events)
                        self._woken = False
                        self._step()
                        self.pool.expire()   # here only: this thread wakes when the oldest pooled segment is due
                    finally:
                        self._node_busy = False
                if self.stopping and not self.commands:
                    return
        except Exception as e:  # noqa: BLE001 - the node's own bug: every waiter hears of it
            with self.lock:
                self.failure.fail(e)

    def _step(self, fn=None, args: tuple = ()) -> BaseException | None:
        """Under the lock: the commands queued so far (in order), then fn, then what became due,
        runnable or sendable. Each command runs under its own guard, so one's error never skips
        another's; fn's error is returned for its caller to raise. An error in the rest is the
        node's own: the runtime is broken."""
        while self.commands:
            queued, queued_args = self.commands.popleft()
            try:
                queued(*queued_args)
            except Exception:  # noqa: BLE001 - its caller did not wait for a reply
                command_failed()
        error = None
        if fn is not None:
            try:
                fn(*args)
            except Exception as e:  # noqa: BLE001 - raised in the caller (see _run_locked)
                error = e
        if self.failure.cause is not None:   # its state is unknown: leave it be until shutdown
            return error
        try:
            if self.table.timers:
                self.table.fire_timers()
            if self.queues or self.groups.pending:   # else nothing could start
                self._schedule()
            if self.dirty_channels:
                self._flush()
            if self.readers:
                self._wake_readers()
        except Exception as e:  # noqa: BLE001 - the node's own bug
            self.failure.fail(e)
        return error

    def as_node(self, fn, *args) -> None:
        """Under the lock, in a caller's thread: fn is the node's own work (serving a worker's
        messages), so its error breaks the runtime rather than going back to that caller."""
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - the node's own bug
            self.failure.fail(e)

    def _flush(self) -> None:
        for chan in self.dirty_channels:
            chan.flush()
            if bool(chan.wbuf) != chan.watch_write:   # the socket filled up, or has drained
                try:
                    key = self.sel.get_key(chan.sock)
                    self.sel.modify(chan.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if chan.wbuf else 0),
                                    key.data)
                    chan.watch_write = bool(chan.wbuf)
                except (KeyError, ValueError):   # closed, or lent to a reading thread (raylite.core.node.reader)
                    pass
        self.dirty_channels = {c for c in self.dirty_channels if c.wbuf}

    def _send(self, w: WorkerProc, msg) -> None:
        w.chan.queue(msg)
        self.dirty_channels.add(w.chan)
