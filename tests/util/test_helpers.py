"""ray.util.as_completed, ray.util.map_unordered, ray.util.inspect_serializability and
ray.util.register_serializer."""
import threading
import time

import pytest

import raylite as ray


@ray.remote
def nap(seconds):
    time.sleep(seconds)
    return seconds


def test_as_completed_yields_results_as_they_finish(ray_start, tmp_path):
    gate = str(tmp_path / "gate")

    @ray.remote
    def gated():
        import os
        import time
        while not os.path.exists(gate):   # until the test has had the other result
            time.sleep(0.01)
        return "gated"

    refs = [gated.remote(), nap.remote(0.0)]
    finished = ray.util.as_completed(refs, chunk_size=1)
    assert next(finished) == 0.0
    open(gate, "w").close()
    assert list(finished) == ["gated"]
    got = list(ray.util.as_completed(refs, chunk_size=5, yield_obj_refs=True))
    assert set(got) == set(refs)
    with pytest.raises(ValueError, match="chunk_size"):
        list(ray.util.as_completed(refs, chunk_size=0))
    for helper in (lambda: ray.util.as_completed(refs, num_returns=1),
                   lambda: ray.util.map_unordered(nap, [0.0], num_returns=1)):
        with pytest.raises(ValueError, match="instead of `num_returns`"):   # Ray's message
            list(helper())


def test_map_unordered_bounds_the_tasks_in_flight(ray_start):
    submitted, yielded, most = [0], [0], [0]

    class Counting:   # fn.remote is all map_unordered needs
        def remote(self, x):
            submitted[0] += 1
            most[0] = max(most[0], submitted[0] - yielded[0])
            return nap.remote(x)

    out = []
    for value in ray.util.map_unordered(Counting(), [0.0] * 9, backpressure_size=3, chunk_size=1):
        yielded[0] += 1
        out.append(value)
    assert out == [0.0] * 9 and most[0] <= 3
    assert sorted(ray.util.map_unordered(nap, [0.2, 0.0, 0.1], backpressure_size=None)) == [0.0, 0.1, 0.2]


def test_inspect_serializability_names_the_culprit(capsys):
    """Ray's serialization troubleshooting example: the lock a function captures, or an object keeps."""
    assert ray.util.inspect_serializability(lambda: 1) == (True, set())
    lock = threading.Lock()

    def uses_lock():
        return lock

    class Holder:
        def __init__(self):
            self.fine, self.lock = 1, threading.Lock()

    ok, bad = ray.util.inspect_serializability(uses_lock, name="uses_lock")
    (failure,) = bad
    assert not ok and failure.path == ("uses_lock", "lock") and failure.obj is lock and failure.parent is uses_lock
    holder = Holder()
    ok, bad = ray.util.inspect_serializability(holder, name="holder")
    assert not ok and [(f.path, f.obj) for f in bad] == [(("holder", "lock"), holder.lock)]
    assert "'lock' (lock) cannot be serialized" in capsys.readouterr().out
    ok, bad = ray.util.inspect_serializability(lock)   # nothing inside: the object itself
    assert not ok and [f.obj for f in bad] == [lock]


# raylite's text, or Ray's ("Could not serialize the argument <...> for a task or actor <module>.read")
CANNOT_SEND = r"arguments of read|the argument .* for a task or actor \S*\bread\b"


def test_register_serializer_for_an_unpicklable_class(ray_start):
    class Guarded:   # a lock inside: pickle refuses it
        def __init__(self, value):
            self.value, self.lock = value, threading.Lock()

    @ray.remote
    def read(g):
        return g.value, type(g.lock).__name__

    with pytest.raises(TypeError, match=CANNOT_SEND):
        read.remote(Guarded(1))
    ray.util.register_serializer(Guarded, serializer=lambda g: g.value,
                                 deserializer=lambda value: Guarded(value * 10))
    try:
        assert ray.get(read.remote(Guarded(2))) == (20, "lock")   # rebuilt by the deserializer
        assert ray.get(ray.put(Guarded(3))).value == 30
    finally:
        ray.util.deregister_serializer(Guarded)
    with pytest.raises(TypeError, match=CANNOT_SEND):
        read.remote(Guarded(4))
    with pytest.raises(TypeError, match="serializer must be callable"):
        ray.util.register_serializer(Guarded, serializer=None, deserializer=str)
