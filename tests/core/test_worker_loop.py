"""The worker's side of the protocol, driven directly: the test plays the node on the other end of
a worker process's control socket, so the order of messages is the test's, not the machine's."""
import os
import pickle
import socket
import subprocess
import sys

import cloudpickle
import pytest

from raylite.core.wire import protocol, serialization
from raylite.core.wire.protocol import Channel, TaskSpec, spec_to_wire

pytestmark = pytest.mark.local_only

_START = ("import pickle, sys; from raylite.core.worker import loop as worker; "
          "worker.run(pickle.loads(bytes.fromhex(sys.argv[1])), *map(int, sys.argv[2:]))")

HELD = []


def views(op: str, name: str = "", size: int = 0) -> None:
    """User code keeping (or dropping) values that read a segment: while kept, it stays mapped."""
    from raylite.core.wire.segments import mappings
    if op == "hold":
        HELD.append(mappings.view(name, size))
    else:
        HELD.clear()


def nothing() -> None:
    pass


class FakeNode:
    """The node's end of one worker's socket."""

    def __init__(self, tmp_path):
        ours, theirs = socket.socketpair()
        out_r, out_w = os.pipe()
        config = {"index": 1, "shm_prefix": "raylite-test-", "sys_path": list(sys.path), "cwd": os.getcwd(),
                  "job_id": "01000000", "node_id": "0" * 56, "namespace": "", "labels": None, "logging": None,
                  "log_dir": None, "env": {}, "runtime_env": None, "site_dirs": [], "totals": {"CPU": 1},
                  "device_ids": {}, "restarted": False}
        fds = [theirs.fileno(), out_w, os.dup(out_w)]   # (it closes both)
        self.proc = subprocess.Popen([sys.executable, "-c", _START, pickle.dumps(config).hex(), *map(str, fds)],
                                     pass_fds=fds, env={**os.environ, "RAYLITE_SHM_DIR": str(tmp_path)})
        theirs.close()
        os.close(fds[1])
        os.close(fds[2])
        self.out_r = out_r
        self.chan = Channel(ours)
        self.task_ids = iter(range(1, 1000))
        self.sent: set[str] = set()

    def recv(self):
        return self.chan.recv()

    def until_done(self, task_id: int) -> list:
        """The worker's messages up to and including its DONE for `task_id`."""
        seen = [self.recv()]
        while seen[-1][:2] != (protocol.DONE, task_id):
            seen.append(self.recv())
        return seen

    def run(self, fn, *args) -> int:
        task_id = next(self.task_ids)
        ser, _ = serialization.dumps_args(args, {}, None)
        spec = TaskSpec("task", task_id, fn.__name__, ser, return_ids=(task_id << 8,), fn_id=fn.__name__)
        fn_bytes = None if fn.__name__ in self.sent else cloudpickle.dumps(fn)   # once: then cached there
        self.sent.add(fn.__name__)
        self.chan.send((protocol.RUN, spec_to_wire(spec), fn_bytes, {}, {}, {}))
        return task_id

    def close(self) -> None:
        self.chan.send((protocol.EXIT,))
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.chan.close()
            os.close(self.out_r)


@pytest.fixture
def node(tmp_path):
    cloudpickle.register_pickle_by_value(sys.modules[__name__])   # the worker cannot import this module
    node = FakeNode(tmp_path)
    try:
        assert node.recv()[0] == protocol.HELLO
        yield node
    finally:
        node.close()
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def held_segment(node, tmp_path) -> str:
    """A segment that user code in the worker still reads, which the node then frees."""
    segment = tmp_path / "raylite-test-seg"
    segment.write_bytes(b"x" * 4096)
    node.until_done(node.run(views, "hold", segment.name, 4096))
    node.chan.send((protocol.FORGET, [segment.name]))
    return segment.name


def test_an_unprefetch_is_answered_while_a_forgotten_segment_is_still_mapped(node, tmp_path):
    """Housekeeping (segments waiting to be unmapped) must not swallow the answer to UNPREFETCH:
    until it comes, the node never recalls that worker's prefetched task again."""
    held_segment(node, tmp_path)
    node.chan.send((protocol.UNPREFETCH, 77))   # a task it already ran: not given back
    seen = node.until_done(node.run(nothing))
    assert seen.count((protocol.UNPREFETCHED, 77, False)) == 1, seen


def test_a_forgotten_segment_is_released_only_once_no_value_maps_it(node, tmp_path):
    """RELEASED lets the node hand the segment out for another value: not while an array here reads it."""
    name = held_segment(node, tmp_path)
    node.until_done(node.run(nothing))   # housekeeping runs again after this message
    before = node.until_done(node.run(views, "drop"))
    assert (protocol.RELEASED, [name]) not in before, before   # (it was said at the second try)
    assert node.recv() == (protocol.RELEASED, [name])


def test_the_loop_has_one_handler_for_each_message_to_a_worker():
    from types import SimpleNamespace

    from raylite.core.worker.loop import Loop
    loop = Loop(SimpleNamespace(deliver=None, give_back=None), SimpleNamespace(run=None, cancel_call=None))
    assert set(loop.handlers) == protocol.TO_WORKER
