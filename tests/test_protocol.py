"""The wire between the driver and its workers (raylite.core.protocol): task specs survive the
trip field by field, and polling before sleeping (SPIN_S) -- a worker waiting for its next task and
a driver thread waiting for a result poll their socket briefly, but only while a CPU is free."""
import os
import pickle
import socket
import threading
import time

import pytest

from raylite.core import protocol
from raylite.core.protocol import Channel, TaskSpec, encode, spec_from_wire, spec_to_wire, spin_on
from raylite.core.serialization import Serialized


def test_task_spec_round_trips_every_slot():
    spec = TaskSpec.__new__(TaskSpec)
    for i, slot in enumerate(TaskSpec.__slots__):
        setattr(spec, slot, (slot, i))   # a distinct value per slot: a shifted field shows
    back = pickle.loads(pickle.dumps(spec, 5))
    assert type(back) is TaskSpec
    assert {s: getattr(back, s) for s in TaskSpec.__slots__} == {s: (s, i) for i, s in enumerate(TaskSpec.__slots__)}


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_a_spec_as_plain_data_comes_back_whole():
    """The "run" message carries a spec as a tuple of plain values (no class for pickle to look up)."""
    spec = TaskSpec.__new__(TaskSpec)
    for i, slot in enumerate(TaskSpec.__slots__):
        setattr(spec, slot, (slot, i))
    spec.args = Serialized(b"data", (("seg", 4),), True, (7,))
    wire = pickle.loads(pickle.dumps(spec_to_wire(spec), 5))
    assert type(wire) is tuple and b"Serialized" not in pickle.dumps(wire, 5)
    back = spec_from_wire(wire, Serialized)
    for slot in TaskSpec.__slots__:
        if slot != "args":
            assert getattr(back, slot) == getattr(spec, slot), slot
    assert (back.args.data, back.args.buffers, back.args.is_error, back.args.refs) == (b"data", (("seg", 4),), True, (7,))


def test_recv_with_spin_gets_a_message_sent_while_polling(pair):
    a, b = pair
    chan = Channel(b)
    threading.Timer(0.002, lambda: a.sendall(encode(("run", 1)))).start()
    assert chan.recv(spin=0.5) == ("run", 1)


def test_recv_with_spin_falls_back_to_blocking_after_the_window(pair):
    a, b = pair
    chan = Channel(b)
    threading.Timer(0.05, lambda: a.sendall(encode(("late", 2)) + encode(("next", 3)))).start()
    t0 = time.perf_counter()
    assert chan.recv(spin=0.001) == ("late", 2)   # a 1 ms window, then a blocking recv
    assert time.perf_counter() - t0 >= 0.04
    assert chan.recv(spin=0.001) == ("next", 3)   # already buffered: no poll at all


def test_recv_with_spin_sees_the_end_of_the_stream(pair):
    a, b = pair
    chan = Channel(b)
    threading.Timer(0.002, a.shutdown, (socket.SHUT_WR,)).start()
    assert chan.recv(spin=0.5) is None


def test_spin_on_stops_at_the_deadline():
    assert spin_on(time.perf_counter() - 1e-3) is False


def test_spin_on_stops_when_threads_wait_for_a_cpu(monkeypatch):
    if protocol._LOADAVG is None:
        pytest.skip("no /proc/loadavg here: raylite never polls")
    deadline = time.perf_counter() + 60
    monkeypatch.setattr(protocol, "_CPUS", 1 << 20)
    assert spin_on(deadline) is True    # the count includes the caller: at least 1 runnable
    monkeypatch.setattr(protocol, "_CPUS", 0)
    assert spin_on(deadline) is False


def test_spin_window_comes_from_the_environment():
    """RAYLITE_SPIN_US=0 turns polling off (workers inherit the driver's environment)."""
    import subprocess
    import sys
    code = "from raylite.core import protocol as p; print(p.SPIN_S, p._LOADAVG is None)"
    env = dict(os.environ, RAYLITE_SPIN_US="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0.0", "True"]
    env["RAYLITE_SPIN_US"] = "250"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert float(out.stdout.split()[0]) == pytest.approx(250e-6)
