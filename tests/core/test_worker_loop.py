"""The worker's side of the protocol, driven directly: the test plays the node on the other end of
a worker process's control socket, so the order of messages is the test's, not the machine's."""
import os
import pickle
import select
import socket
import subprocess
import sys
import time
from collections import deque

import cloudpickle
import pytest

from raylite.core.wire import protocol, serialization
from raylite.core.wire.protocol import Channel, Progress, TaskSpec, spec_to_wire

pytestmark = pytest.mark.local_only

_START = ("import pickle, sys; from raylite.core.worker import loop as worker; "
          "worker.run(pickle.loads(bytes.fromhex(sys.argv[1])), *map(int, sys.argv[2:]))")
# a worker whose results are held back however long its tasks take (the bound is not under test)
_START_HOLDING = "from raylite.core.worker import client; client.HOLD_MAX_S = 3600; " + _START

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


def step(gate: str = "", fail: bool = False) -> str:
    """A tiny task; with `gate`, it first waits for that file; with `fail`, it raises."""
    import time
    while gate and not os.path.exists(gate):
        time.sleep(0.005)
    if fail:
        raise ValueError("step failed")
    return gate


class FakeNode:
    """The node's end of one worker's socket."""

    def __init__(self, tmp_path, start: str = _START, progress: bool = False):
        ours, theirs = socket.socketpair()
        out_r, out_w = os.pipe()
        config = {"index": 1, "shm_prefix": "raylite-test-", "sys_path": list(sys.path), "cwd": os.getcwd(),
                  "job_id": "01000000", "node_id": "0" * 56, "namespace": "", "labels": None, "logging": None,
                  "log_dir": None, "env": {}, "runtime_env": None, "site_dirs": [], "totals": {"CPU": 1},
                  "device_ids": {}, "restarted": False}
        fds = [theirs.fileno(), out_w, os.dup(out_w)]   # (it closes both)
        self.progress = None
        if progress:   # the tasks it has begun, as the node reads them (raylite.core.wire.protocol.Progress)
            self.progress = Progress.create()
            fds.append(self.progress.fd)
        self.proc = subprocess.Popen([sys.executable, "-c", start, pickle.dumps(config).hex(), *map(str, fds)],
                                     pass_fds=fds, env={**os.environ, "RAYLITE_SHM_DIR": str(tmp_path)})
        theirs.close()
        os.close(fds[1])
        os.close(fds[2])
        if self.progress:
            self.progress.handed_over()
        self.out_r = out_r
        self.chan = Channel(ours)
        self.chan.sock.settimeout(60)   # a message that never comes fails the test rather than hang it
        self.gates: list[str] = []      # files tasks wait for: made at close, so none is left waiting
        self.task_ids = iter(range(1, 1000))
        self.sent: set[str] = set()
        self.pending: deque = deque()   # DONEs of a DONES not yet taken (see recv)
        self.batches: list[int] = []

    def recv(self):
        """The worker's next message; those a DONES carries come one by one, as DONEs (`batches`:
        how many each DONES carried)."""
        if not self.pending:
            msg = self.chan.recv()
            if msg[0] != protocol.DONES:
                return msg
            self.batches.append(len(msg[1]))
            self.pending.extend((protocol.DONE, *items) for items in msg[1])
        return self.pending.popleft()

    def until_done(self, task_id: int) -> list:
        """The worker's messages up to and including its DONE for `task_id`."""
        seen = [self.recv()]
        while seen[-1][:2] != (protocol.DONE, task_id):
            seen.append(self.recv())
        return seen

    def run(self, fn, *args) -> int:
        return self.run_many([(fn, args)])[0]

    def run_many(self, calls: list, max_retries: int = 3) -> list[int]:
        """RUN each (fn, args) of `calls`, all in one write, as the node sends tasks ahead."""
        ids, data = [], b""
        for fn, args in calls:
            task_id = next(self.task_ids)
            ser, _ = serialization.dumps_args(args, {}, None)
            spec = TaskSpec("task", task_id, fn.__name__, ser, return_ids=(task_id << 8,), fn_id=fn.__name__,
                            max_retries=max_retries)
            fn_bytes = None if fn.__name__ in self.sent else cloudpickle.dumps(fn)   # once: then cached there
            self.sent.add(fn.__name__)
            data += protocol.encode((protocol.RUN, spec_to_wire(spec), fn_bytes, {}, {}, {}))
            ids.append(task_id)
        self.chan.sock.sendall(data)
        return ids

    def run_line(self, fn, args_each: list) -> list[int]:
        """One RUN_LINE of calls of fn, as the node sends a line of tiny tasks ahead."""
        ids = [next(self.task_ids) for _ in args_each]
        ser, _ = serialization.dumps_args((), {}, None)
        spec = TaskSpec("task", 0, fn.__name__, ser, fn_id=fn.__name__, max_retries=3)
        fn_bytes = None if fn.__name__ in self.sent else cloudpickle.dumps(fn)
        self.sent.add(fn.__name__)
        entries = [(task_id, serialization.dumps_args(args, {}, None)[0].wire(), (task_id << 8,))
                   for task_id, args in zip(ids, args_each)]
        self.chan.send((protocol.RUN_LINE, protocol.line_key(spec), fn_bytes, {}, {}, entries))
        return ids

    def gate(self, tmp_path) -> str:
        self.gates.append(str(tmp_path / f"gate{len(self.gates)}"))
        return self.gates[-1]

    def close(self) -> None:
        for gate in self.gates:
            open(gate, "a").close()
        self.chan.send((protocol.EXIT,))
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.chan.close()
            os.close(self.out_r)
            if self.progress:
                self.progress.close()


@pytest.fixture
def node(tmp_path):
    yield from _started(FakeNode(tmp_path))


@pytest.fixture
def holding_node(tmp_path):
    """A worker that shares its count of begun tasks (as the node's workers do): it holds results back."""
    yield from _started(FakeNode(tmp_path, _START_HOLDING, progress=True))


def _started(node):
    cloudpickle.register_pickle_by_value(sys.modules[__name__])   # the worker cannot import this module
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
    assert set(loop.handlers) | {protocol.RUN_LINE} == protocol.TO_WORKER   # (the client unpacks RUN_LINEs into RUNs)


def _dones(node, n: int) -> list:
    """The task ids of the next n DONEs, with each one's outcome (True: a value)."""
    out = []
    while len(out) < n:
        msg = node.recv()
        if msg[0] == protocol.DONE:
            out.append((msg[1], not serialization.results_from_wire(msg[2])[0].is_error))
    return out


def _begun(node, n: int) -> None:
    deadline = time.monotonic() + 30
    while node.progress.begun() < n:
        assert time.monotonic() < deadline, f"the worker began {node.progress.begun()} tasks, not {n}"
        time.sleep(0.005)


def test_results_of_tasks_sent_ahead_come_back_together_once_the_line_is_done(holding_node, tmp_path):
    """Short tasks that came in one write: each result waits while the next task is already here,
    so the node reads them in one go; they all go out, in order, before the worker waits again."""
    node = holding_node
    gate = node.gate(tmp_path)
    node.until_done(node.run(step))   # it runs once: now its function is known to be short
    ids = node.run_many([(step, ())] * 4 + [(step, (gate,))])
    _begun(node, 6)   # all of them: the last one waits for the gate
    ready, _, _ = select.select([node.chan.sock], [], [], 0.3)
    assert not ready, "a result came back while the next task of the line was still running"
    open(gate, "w").close()
    assert _dones(node, 5) == [(i, True) for i in ids]
    assert node.batches == [5], "the held results came in one DONES message"


def _values(node, n: int) -> list:
    """(task id, value) of the next n DONEs."""
    out = []
    while len(out) < n:
        msg = node.recv()
        if msg[0] == protocol.DONE:
            out.append((msg[1], serialization.loads(serialization.results_from_wire(msg[2])[0])))
    return out


def test_a_run_line_runs_each_call_with_its_own_arguments_in_order(holding_node, tmp_path):
    """RUN_LINE carries the shared fields once and each call's ids and arguments: every call runs,
    in order, with its own arguments and return id, and the function sent with the line."""
    node = holding_node
    gate = node.gate(tmp_path)
    ids = node.run_line(step, [("",)] * 3 + [(gate,)])
    _begun(node, 4)
    open(gate, "w").close()
    assert _values(node, 4) == [(i, "") for i in ids[:3]] + [(ids[3], gate)]


def test_a_failed_task_sends_what_was_held_back_and_its_error_at_once(holding_node, tmp_path):
    """An error is never held back (a get fails fast on it), and the results held before it go first."""
    node = holding_node
    gate = node.gate(tmp_path)
    node.until_done(node.run(step))
    ids = node.run_many([(step, ())] * 3 + [(step, ("", True)), (step, (gate,))])
    assert _dones(node, 4) == [(i, True) for i in ids[:3]] + [(ids[3], False)]   # the gate is still shut
    open(gate, "w").close()
    assert _dones(node, 1) == [(ids[4], True)]


def test_a_task_that_may_not_run_again_has_its_result_sent_at_once(holding_node, tmp_path):
    """max_retries=0: were the worker to die holding its result, the task could not be run again,
    so its result goes out as soon as it is done."""
    node = holding_node
    gate = node.gate(tmp_path)
    node.until_done(node.run(step))
    ids = node.run_many([(step, ()), (step, (gate,))], max_retries=0)
    assert _dones(node, 1) == [(ids[0], True)]
    open(gate, "w").close()
    assert _dones(node, 1) == [(ids[1], True)]


def test_a_worker_without_a_shared_count_holds_nothing_back(node, tmp_path):
    """Without the count (no memfd), the node could not tell which tasks of a dead worker began."""
    gate = node.gate(tmp_path)
    node.until_done(node.run(step))
    ids = node.run_many([(step, ()), (step, (gate,))])
    assert _dones(node, 1) == [(ids[0], True)]
    open(gate, "w").close()
    assert _dones(node, 1) == [(ids[1], True)]


class _Writes:
    """A socket that keeps each write apart, to count them."""

    def __init__(self):
        self.writes: list[bytes] = []

    def sendall(self, data) -> None:
        self.writes.append(bytes(data))


def _messages(data: bytes) -> list:
    reader = Channel(None)
    reader.rbuf += data
    out = []
    while reader.has_message():
        out.append(reader.recv())
    return out


def _client():
    from raylite.core.wire.resources import NodeResources
    from raylite.core.worker.client import WorkerClient
    sock = _Writes()
    return WorkerClient(Channel(sock), "raylite-test-", NodeResources({"CPU": 1}, {})), sock


def test_reference_ops_go_out_in_the_write_of_the_message_that_follows():
    """Each write is a system call, and wakes a node thread that sleeps: the ops that pickling
    and GC queued ride with the next message instead of costing a write of their own."""
    client, sock = _client()
    client.release(7)
    client.addref(8)
    client.send((protocol.PUT, 1, "value"))
    assert len(sock.writes) == 1, sock.writes
    assert _messages(sock.writes[0]) == [(protocol.REFS, [(protocol.RELEASE, 7), (protocol.ADDREF, 8)]),
                                         (protocol.PUT, 1, "value")]


def test_a_tasks_metrics_go_out_in_the_write_of_its_result(monkeypatch):
    """The driver has a call's metrics once get returns its result: they go ahead of the DONE, in
    the same write."""
    from types import SimpleNamespace

    from raylite.core.worker.executor import Executor
    points = [("calls", (), 1.0)]
    store = SimpleNamespace(pending=True, take=lambda: points)
    monkeypatch.setitem(sys.modules, "raylite.core.client.metrics", SimpleNamespace(store=store))
    client, sock = _client()
    spec = TaskSpec("task", 5, "f", serialization.dumps_args((), {}, None)[0], return_ids=(5 << 8,), fn_id="f")
    Executor(client).finish(spec, [serialization.dumps(1, None)])
    assert len(sock.writes) == 1, sock.writes
    metrics, done = _messages(sock.writes[0])
    assert metrics == (protocol.METRICS, points)
    assert done[:2] == (protocol.DONE, 5)


def test_a_call_of_a_run_line_is_given_back_like_a_run_of_its_own():
    """The node asks back a call it sent ahead (its worker blocked in get): one that came in a
    RUN_LINE is found in the inbox and given back, and the others stay, in order."""
    client, sock = _client()
    ser, _ = serialization.dumps_args((), {}, None)
    spec = TaskSpec("task", 0, "f", ser, fn_id="f", max_retries=3)
    entries = [(i, serialization.dumps_args((i,), {}, None)[0].wire(), (i << 8,)) for i in (11, 12, 13)]
    client.chan.rbuf += protocol.encode((protocol.RUN_LINE, protocol.line_key(spec), b"fn", {"CPU": 1}, {}, entries))
    first = client.peek()
    assert first[0] == protocol.RUN and first[1].task_id == 11 and first[2] == b"fn"
    client.give_back(12)
    assert _messages(sock.writes[-1]) == [(protocol.UNPREFETCHED, 12, True)]
    left = [client.next_message() for _ in range(2)]
    assert [(m[1].task_id, m[1].return_ids, m[2], m[4]) for m in left] == [(11, (11 << 8,), b"fn", {"CPU": 1}),
                                                                         (13, (13 << 8,), None, {"CPU": 1})]
    assert serialization.loads_args(left[1][1].args, {}) == ((13,), {})
