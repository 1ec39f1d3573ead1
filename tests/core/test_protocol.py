"""The wire between the driver and its workers (raylite.core.wire.protocol): task specs survive the
trip field by field, and polling before sleeping (SPIN_S) -- a worker waiting for its next task and
a driver thread waiting for a result poll their socket briefly, but only while a CPU is free."""
import collections
import os
import pickle
import socket
import threading
import time

import pytest

from raylite.core.wire import polling, protocol
from raylite.core.wire.polling import spin_on
from raylite.core.wire.protocol import Channel, TaskSpec, encode, spec_from_wire, spec_to_wire
from raylite.core.wire.serialization import Serialized


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


def test_messages_split_and_packed_anyhow_come_out_whole_and_in_order(pair):
    """What one read brings: several messages, and part of the next (a large one in pieces)."""
    a, b = pair
    chan = Channel(b)
    large = ("x", b"y" * (3 << 16))
    data = b"".join(encode(("m", i)) for i in range(20)) + encode(large) + encode(("end",))

    def send():
        for start in range(0, len(data), 7000):
            a.sendall(data[start:start + 7000])
    sender = threading.Thread(target=send)
    sender.start()
    got = [chan.recv() for _ in range(22)]
    sender.join()
    assert got == [("m", i) for i in range(20)] + [large, ("end",)]
    assert not chan.has_message() and chan.rpos == 0 and not chan.rbuf


def test_held_back_messages_go_out_first_and_in_order(pair):
    a, b = pair
    sender, receiver = Channel(a), Channel(b)
    sender.defer(("done", 1))
    sender.defer(("done", 2))
    sender.send(("put", 3))   # any send takes what was held back along, ahead of it
    sender.defer(("done", 4))
    sender.flush_deferred()
    assert [receiver.recv() for _ in range(4)] == [("done", 1), ("done", 2), ("put", 3), ("done", 4)]


def test_spin_on_stops_at_the_deadline():
    assert spin_on(time.perf_counter() - 1e-3) is False


def test_spin_on_stops_when_threads_wait_for_a_cpu(monkeypatch):
    if polling._LOADAVG is None:
        pytest.skip("no /proc/loadavg here: raylite never polls")
    deadline = time.perf_counter() + 60
    monkeypatch.setattr(polling, "_CPUS", 1 << 20)
    assert spin_on(deadline) is True    # the count includes the caller: at least 1 runnable
    monkeypatch.setattr(polling, "_CPUS", 0)
    monkeypatch.setattr(polling, "_free_until", 0.0)   # the last reading's window, over
    assert spin_on(deadline) is False
    monkeypatch.setattr(polling, "_busy_until", 0.0)


def test_spin_on_keeps_a_busy_reading_as_long_as_a_free_one(monkeypatch):
    """Within LOADAVG_EVERY_S of a "busy" reading, a refusal reads nothing and yields nothing (the
    caller blocks next anyway); after it, the load is read again, and a "free" reading is kept too."""
    now, readings, calls = [100.0], [polling._CPUS + 1, 1], []
    monkeypatch.setattr(polling.os, "sched_yield", lambda: calls.append("yield"))
    monkeypatch.setattr(polling, "_free_until", 0.0)
    monkeypatch.setattr(polling, "_busy_until", 0.0)
    window = polling.LOADAVG_EVERY_S

    def spin():
        return spin_on(1e9, clock=lambda: now[0], runnable=lambda: calls.append("read") or readings.pop(0))

    assert spin() is False and calls == ["yield", "read"]   # busy: every CPU has a thread waiting
    now[0] = 100.0 + window / 2
    assert spin() is False and calls == ["yield", "read"]   # kept: no read, no yield
    now[0] = 100.0 + window
    assert spin() is True and calls == ["yield", "read", "yield", "read"]   # over: read again, free
    now[0] = 100.0 + window * 1.5
    assert spin() is True and calls[4:] == ["yield"]        # the free reading kept: yield, no read
    now[0] = 100.0 + window * 3
    readings.append(None)   # /proc/loadavg unreadable: refused, and kept as a busy reading
    assert spin() is False and calls[5:] == ["yield", "read"]
    assert spin() is False and calls[7:] == []


def test_spin_on_reads_the_load_once_per_window(monkeypatch):
    """A poll loop reads /proc/loadavg at most every LOADAVG_EVERY_S, not on each poll: the read
    and its parse were most of a poll's cost."""
    if polling._LOADAVG is None:
        pytest.skip("no /proc/loadavg here: raylite never polls")
    reads = []
    real_pread = os.pread
    monkeypatch.setattr(polling.os, "pread", lambda *a: reads.append(1) or real_pread(*a))
    monkeypatch.setattr(polling, "_CPUS", 1 << 20)
    monkeypatch.setattr(polling, "_free_until", 0.0)
    monkeypatch.setattr(polling, "LOADAVG_EVERY_S", 60.0)
    deadline = time.perf_counter() + 60
    assert all(spin_on(deadline) for _ in range(100))
    assert len(reads) == 1


def test_spin_window_comes_from_the_environment():
    """RAYLITE_SPIN_US=0 turns polling off (workers inherit the driver's environment)."""
    import subprocess
    import sys
    code = "from raylite.core.wire import polling as p; print(p.SPIN_S, p._LOADAVG is None)"
    env = dict(os.environ, RAYLITE_SPIN_US="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0.0", "True"]
    env["RAYLITE_SPIN_US"] = "250"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert float(out.stdout.split()[0]) == pytest.approx(250e-6)


def test_spin_for_polls_through_a_wait_predicted_short(monkeypatch):
    monkeypatch.setattr(polling, "SPIN_S", 400e-6)
    monkeypatch.setattr(polling, "SPIN_MAX_S", 20e-3)
    assert polling.spin_for(None) == 400e-6            # nothing known: the usual short poll
    assert polling.spin_for(50e-3) == 400e-6           # too long to poll through
    assert 6e-3 < polling.spin_for(6e-3) <= 20e-3      # past the predicted end, within the cap
    assert polling.spin_for(15e-3) == 20e-3             # capped
    assert polling.spin_for(0.0) == 400e-6
    monkeypatch.setattr(polling, "SPIN_MAX_S", 0.0)
    assert polling.spin_for(6e-3) == 400e-6
    monkeypatch.setattr(polling, "SPIN_S", 0.0)
    assert polling.spin_for(1e-3) == 0.0               # polling off: no adaptive polling either


def test_adaptive_window_comes_from_the_environment():
    import subprocess
    import sys
    code = "from raylite.core.wire import polling as p; print(p.SPIN_MAX_S, p.spin_for(1e-3))"
    env = dict(os.environ, RAYLITE_SPIN_US="400", RAYLITE_SPIN_MAX_US="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert [float(x) for x in out.stdout.split()] == [0.0, pytest.approx(400e-6)]
    env["RAYLITE_SPIN_US"] = "0"
    env.pop("RAYLITE_SPIN_MAX_US")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert [float(x) for x in out.stdout.split()] == [0.0, 0.0]


def test_a_worker_polls_as_long_as_its_last_wait(monkeypatch):
    """A worker whose messages came after 5 ms polls past 5 ms for the next one."""
    from raylite.core.worker import client as worker_client
    client = worker_client.WorkerClient.__new__(worker_client.WorkerClient)
    client.inbox, client.refops, client.lock, client.last_wait = collections.deque(), [], threading.RLock(), None
    client.late_sender, client.held = None, []   # no results held back: this thread is the only one
    spins = []

    class FakeChannel:
        deferred = b""   # nothing held back to go out with the next message

        def recv(self, spin):
            spins.append(spin)
            time.sleep(0.005)
            return ("exit",)

        def has_message(self):
            return False

        def flush_deferred(self):
            pass

    client.chan = FakeChannel()
    monkeypatch.setattr(worker_client, "alone", lambda: True)
    monkeypatch.setattr(worker_client, "spin_for", lambda predicted: ("spin", predicted))
    assert client.next_message() == ("exit",) and spins == [("spin", None)]
    client.next_message()
    assert spins[1][0] == "spin" and 0.005 <= spins[1][1] < 1.0


def test_a_driver_waiting_on_a_task_polls_for_what_its_function_usually_takes():
    from types import SimpleNamespace

    from raylite.core.node.reader import time_left
    spec = TaskSpec("task", 1, "f", None, fn_id="fid")
    w = SimpleNamespace(task=spec, started=time.monotonic() - 0.002)
    assert 0.0035 < time_left({"fid": 0.006}, w) <= 0.004   # 6 ms usual, 2 ms gone
    w.started -= 1.0
    assert time_left({"fid": 0.006}, w) == 0.0                # overdue: the usual short poll
    assert time_left({}, w) is None                           # never ran before
    spec.kind = "actor_call"
    assert time_left({"fid": 0.006}, w) is None
    w.task = None
    assert time_left({"fid": 0.006}, w) is None


def test_only_the_runtimes_sleeping_threads_leave_a_thread_free_to_poll():
    """alone(): a user's thread competes for the GIL (a wait sleeps at once); the runtime's own
    sleepers (the node's loop, the control endpoint), started by start_sleeper, do not, while
    they run."""
    assert polling.alone()
    entered, leave = threading.Event(), threading.Event()

    def body():
        entered.set()
        leave.wait(30)

    for as_sleeper in (False, True):
        entered.clear()
        leave.clear()
        if as_sleeper:
            thread = polling.start_sleeper(body, "test-sleeper")
        else:
            thread = threading.Thread(target=body)
            thread.start()
        try:
            assert entered.wait(30)
            assert polling.alone() is as_sleeper
        finally:
            leave.set()
            thread.join(30)
    assert polling.alone() and not polling._sleepers


def test_a_driver_waiting_on_a_tiny_task_polls_while_the_control_endpoint_runs(monkeypatch):
    """The node's thread and the control endpoint's sleep: a get that waits on a worker polls
    before it sleeps all the same (with either counted, each result cost a wake-up)."""
    import raylite as ray
    from raylite.core.node import reader

    monkeypatch.delenv("RAYLITE_CONTROL", raising=False)
    if not polling.SPIN_S:
        pytest.skip("polling is turned off here (RAYLITE_SPIN_US=0)")
    polls = []

    def counting(poller, seconds):
        polls.append(seconds)
        return polling.poll_spinning(poller, seconds)

    monkeypatch.setattr(reader, "poll_spinning", counting)
    ray.init(num_cpus=1)
    assert {"raylite-node", "raylite-control"} <= {t.name for t in threading.enumerate()}

    @ray.remote
    def echo(x):
        return x

    assert ray.get(echo.remote(0)) == 0   # the worker is up
    deadline = time.monotonic() + 30
    while not polling.alone() and time.monotonic() < deadline:   # the endpoint is in its select loop
        time.sleep(0.01)
    assert polling.alone()
    polls.clear()
    assert [ray.get(echo.remote(i)) for i in range(20)] == list(range(20))
    assert polls and min(polls) > 0


@pytest.mark.parametrize("cgroups, files, limited", [
    ("0::/\n", {"/sys/fs/cgroup/cpu.max": "max 100000\n"}, False),
    ("0::/pod\n", {"/sys/fs/cgroup/pod/cpu.max": "200000 100000\n"}, True),           # cgroup v2, a limit
    ("4:cpu,cpuacct:/docker/x\n1:name=systemd:/\n",
     {"/sys/fs/cgroup/cpu,cpuacct/docker/x/cpu.cfs_quota_us": "50000\n"}, True),     # v1, docker --cpus
    ("4:cpu,cpuacct:/\n", {"/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n"}, False),
    ("4:memory:/x\n", {"/sys/fs/cgroup/cpu.max": "200000 100000"}, False),          # no cpu controller line
    (None, {}, False),
], ids=["v2-max", "v2-quota", "v1-quota", "v1-none", "other-controllers", "no-proc"])
def test_a_cpu_quota_is_recognised(cgroups, files, limited):
    """Under a CPU quota the long predicted polls are off by default: they would spend the quota."""
    assert polling.cpu_quota_set(cgroups, files.get) is limited


@pytest.mark.parametrize("variable, value", [("RAYLITE_SPIN_US", "fast"), ("RAYLITE_SPIN_MAX_US", "-5"),
                                             ("RAYLITE_SPIN_MAX_US", "nan")])
def test_a_bad_polling_window_names_its_variable(variable, value):
    import subprocess
    import sys
    env = dict(os.environ, **{variable: value})
    out = subprocess.run([sys.executable, "-c", "import raylite.core.wire.protocol"], env=env, capture_output=True, text=True)
    assert out.returncode != 0
    assert f"{variable}={value!r}: expected a number of microseconds >= 0" in out.stderr


def test_message_kinds_are_distinct_and_each_has_one_direction():
    """A kind names one message: the same string both ways (or twice one way) would be read as the
    other message by whichever side's table has it."""
    kinds = {name: value for name, value in vars(protocol).items()
             if name.isupper() and isinstance(value, str) and value in protocol.TO_WORKER | protocol.TO_NODE}
    assert len(set(kinds.values())) == len(kinds), kinds
    assert not protocol.TO_WORKER & protocol.TO_NODE
    assert protocol.REQUESTS <= protocol.TO_NODE


def test_a_tasks_results_travel_compact_when_plain_and_come_back_the_same():
    """One plain value goes as its pickle bytes alone; errors, several values and values with refs
    or buffers as full wire tuples. Either way the node reads the same results."""
    from raylite.core.wire import serialization as S
    plain = S.dumps(41, None)
    error = S.dumps(ValueError("no"), None, is_error=True)
    with_refs = S.Serialized(plain.data, (), False, (7,))
    assert S.results_to_wire([plain]) == plain.data
    for results in ([plain], [error], [plain, plain], [with_refs]):
        back = S.results_from_wire(S.results_to_wire(results))
        assert [r.wire() for r in back] == [r.wire() for r in results]
    assert type(S.results_to_wire([error])) is list and type(S.results_to_wire([with_refs])) is list
    assert S.loads(S.results_from_wire(S.results_to_wire([plain]))[0]) == 41


def test_a_call_built_from_a_template_has_every_other_field_of_the_spec_it_was_made_from():
    spec = TaskSpec.__new__(TaskSpec)
    for i, slot in enumerate(TaskSpec.__slots__):
        setattr(spec, slot, f"value-{i}")
    own = {"task_id": 9, "args": "args", "deps": (1,), "return_ids": (9 << 8,), "runtime_env": ("env",)}
    call = protocol.call_of(protocol.call_template(spec), **own)
    for slot in TaskSpec.__slots__:
        assert getattr(call, slot) == own.get(slot, getattr(spec, slot)), slot
