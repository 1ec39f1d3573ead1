"""How the node manager fails: loudly, once, and never leaving a caller waiting.

A command's own error goes back to the caller that queued it. An unexpected error in the node's
loop (a handler, a timer, the scheduler) leaves its state unknown, so the runtime is marked broken:
every driver thread blocked on the node wakes with the traceback as the cause, stderr hears of it
once, and new work is refused until shutdown() (the broken-executor pattern of loky).
"""
from __future__ import annotations

import _thread
import sys
import traceback
from collections.abc import Callable

from raylite import exceptions

BROKEN = ("the raylite runtime is broken: its node manager failed unexpectedly (the cause is "
          "below); call ray.shutdown() and ray.init() again")


class Gate:
    """One driver thread's wait for the node: opened once, by the node's reply or by its failure.
    Opened only under the node lock, so a reply and a failure never both open it."""

    __slots__ = ("_lock", "_open", "value")

    def __init__(self):
        self._lock = _thread.allocate_lock()   # a bare lock: an Event's Condition costs ~10 us a get
        self._lock.acquire()
        self._open = False
        self.value = None

    def open(self, value=None) -> None:
        if not self._open:
            self._open, self.value = True, value
            self._lock.release()

    def wait(self, timeout: float = -1) -> bool:
        return self._lock.acquire(True, timeout)


class NodeFailure:
    """The node's broken state and the gates of the driver threads waiting on it."""

    def __init__(self, on_break: Callable[[], None]):
        self.cause: BaseException | None = None
        self._gates: set[Gate] = set()
        self._on_break = on_break   # the node's part: stop its thread, let its workers go

    def ask(self, send: Callable[[Gate], None], alive: Callable[[], bool] | None = None):
        """From a driver thread: send(gate) asks the node for something whose answer opens gate;
        wait for it and return the value it was opened with. Raise instead if the node is broken
        (before, or while waiting), or with alive, once the node thread is gone."""
        gate = Gate()
        self._gates.add(gate)
        try:
            self.check()   # after the add: a failure from now on sees this gate
            send(gate)
            if alive is None:
                gate.wait()
            else:
                while not gate.wait(0.5):
                    if not alive():
                        raise exceptions.RaySystemError("the raylite node manager is not running")
        finally:
            self._gates.discard(gate)
        self.check()
        return gate.value

    def check(self) -> None:
        """Raise the runtime's error if it is broken (new work is refused until shutdown)."""
        if self.cause is not None:
            raise exceptions.RaySystemError(BROKEN) from self.cause

    def fail(self, cause: BaseException) -> None:
        """Under the node lock: mark the runtime broken (the first cause wins), say so once and
        wake every waiting driver thread."""
        if self.cause is not None:
            return
        self.cause = cause
        sys.stderr.write("raylite: internal error in the node manager; the runtime is broken until "
                         "ray.shutdown():\n" + "".join(traceback.format_exception(cause)))
        for gate in list(self._gates):
            gate.open()
        self._on_break()


def command_failed() -> None:
    """A queued command raised after its caller moved on (it did not wait for a reply): report it;
    the commands after it still run."""
    sys.stderr.write("raylite: a node command failed:\n" + traceback.format_exc())
