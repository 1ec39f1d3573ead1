"""Core objects: put/get, ObjectRef, and zero-copy shared memory for large buffers.

Covers issue #2: put(value)/get; numpy arrays and torch tensors >= 1 MB travel
through shared memory without pickling copies (read-only, zero-copy mapping in
the reader, one put read by many tasks, large task results); segments are
reclaimed when refs are dropped and are gone from /dev/shm after shutdown.

A worker-side "probe" reports whether the buffer it received lies inside a
mapping of a raylite shared-memory segment (/proc/self/maps), which is how
these tests tell zero-copy from a pickled copy.
"""

import gc
import os

import numpy as np
import pytest

import raylite as ray
from backend import ON_RAY

MB = 1024 * 1024


def _make_probe():
    @ray.remote
    def probe(x):
        if type(x).__module__.split(".")[0] == "torch":
            addr, nbytes = x.data_ptr(), x.numel() * x.element_size()
            writeable = None
        else:
            addr, nbytes = x.__array_interface__["data"][0], x.nbytes
            writeable = bool(x.flags.writeable)
        in_shm = False
        segments = set()  # raylite shm files this worker has mapped
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6 or "raylite" not in parts[5]:
                    continue
                path = parts[5].strip()
                if path.endswith(" (deleted)"):
                    path = path[: -len(" (deleted)")]
                if path.startswith("/dev/shm/raylite-"):
                    segments.add(path)
                lo, hi = (int(v, 16) for v in parts[0].split("-"))
                if lo <= addr and addr + nbytes <= hi:
                    in_shm = True
        return {
            "type": type(x).__name__,
            "sum": float(x.sum()),
            "writeable": writeable,
            "in_shm": in_shm,
            "segments": sorted(segments),
            "pid": os.getpid(),
        }

    return probe


def _big_array(seed=0, nbytes=10 * MB):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(nbytes // 8)


# --------------------------------------------------------------------------
# put / get basics
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [0, -3.5, "text", b"bytes", None, True, [1, [2, {"k": (3, 4)}]], {"a": {1, 2}},
     np.arange(10, dtype=np.int32)],
    ids=["int", "float", "str", "bytes", "none", "bool", "nested", "dict-set", "small-array"],
)
def test_put_get_roundtrip(ray_start, value):
    ref = ray.put(value)
    assert isinstance(ref, ray.ObjectRef)
    out = ray.get(ref)
    if isinstance(value, np.ndarray):
        assert out.dtype == value.dtype
        np.testing.assert_array_equal(out, value)
    else:
        assert out == value
        assert type(out) is type(value)


def test_object_refs_are_hashable_and_distinct(ray_start):
    a = ray.put(1)
    b = ray.put(1)
    assert a == a
    assert a != b
    assert len({a: "a", b: "b"}) == 2
    assert ray.get([a, b]) == [1, 1]


def test_get_mixes_put_and_task_refs(ray_start):
    @ray.remote
    def double(x):
        return 2 * x

    refs = [ray.put(1), double.remote(2), ray.put("three"), double.remote(ray.put(4))]
    assert ray.get(refs) == [1, 4, "three", 8]


def test_put_with_an_owner_actor_outlives_it(ray_start):
    """Ray's put(value, _owner=actor): the node owns every object here, so it survives the actor."""
    @ray.remote
    class Holder:
        def ping(self):
            return 1

    holder = Holder.remote()
    ref = ray.put([1, 2], _owner=holder)
    ray.kill(holder)
    assert ray.get(ref) == [1, 2]
    with pytest.raises(TypeError, match="_owner must be an actor handle"):
        ray.put(3, _owner="holder")


# --------------------------------------------------------------------------
# large buffers via shared memory
# --------------------------------------------------------------------------


def test_put_get_large_numpy_array(ray_start):
    arr = _big_array()
    out = ray.get(ray.put(arr))
    assert out.shape == arr.shape and out.dtype == arr.dtype
    np.testing.assert_array_equal(out, arr)


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.arange(2 * MB, dtype=np.int32).reshape(1024, -1),  # 8 MB 2-D
        lambda: np.asfortranarray(np.arange(MB, dtype=np.float64).reshape(1024, 1024)),
        lambda: np.arange(4 * MB, dtype=np.int64)[::3],  # strided view
        lambda: np.arange(MB, dtype=">i4").reshape(16, 64, -1),  # big-endian, 3-D
        lambda: np.arange(MB).astype("datetime64[ns]"),  # no buffer protocol of its own
        lambda: np.array(["ab", "xyz"] * MB, dtype="U3"),
        lambda: np.zeros(MB, dtype=[("a", "f8"), ("b", "i4")]),  # structured: fields survive
        lambda: np.ma.masked_array(np.arange(MB, dtype=np.float64), mask=np.arange(MB) % 3 == 0),  # subclass
        lambda: np.array(b"x" * (2 * MB)),  # 0-d, one 2 MB element
    ],
    ids=["2d-int32", "fortran-order", "strided-view", "big-endian-3d", "datetime64", "unicode", "structured",
         "masked-array", "0-d"],
)
def test_put_get_large_array_layouts(ray_start, make):
    arr = make()
    contiguous = arr.flags.c_contiguous or arr.flags.f_contiguous

    @ray.remote
    def echo_layout(a):
        return type(a).__name__, a.dtype, a.shape, bool(a.flags.f_contiguous), a

    seen_by_task = ray.get(echo_layout.remote(ray.put(arr)))
    assert seen_by_task[:3] == (type(arr).__name__, arr.dtype, arr.shape)
    if contiguous:
        assert seen_by_task[3] == arr.flags.f_contiguous
    for out in (ray.get(ray.put(arr)), seen_by_task[-1], ray.get(echo_layout.remote(arr))[-1]):
        assert type(out) is type(arr) and out.shape == arr.shape and out.dtype == arr.dtype
        if contiguous:
            assert (out.flags.c_contiguous, out.flags.f_contiguous) == (arr.flags.c_contiguous, arr.flags.f_contiguous)
        np.testing.assert_array_equal(out, arr)
        if isinstance(arr, np.ma.MaskedArray):
            np.testing.assert_array_equal(out.mask, arr.mask)


def test_put_get_object_with_several_large_arrays(ray_start):
    value = {"a": _big_array(1, 4 * MB), "b": [_big_array(2, 2 * MB), "tag"], "n": 5}
    out = ray.get(ray.put(value))
    np.testing.assert_array_equal(out["a"], value["a"])
    np.testing.assert_array_equal(out["b"][0], value["b"][0])
    assert out["b"][1] == "tag" and out["n"] == 5


def test_put_get_large_bytes(ray_start):
    payload = os.urandom(4 * MB)
    assert ray.get(ray.put(payload)) == payload

    @ray.remote
    def size_and_tail(b):
        return len(b), bytes(b[-16:])

    assert ray.get(size_and_tail.remote(ray.put(payload))) == (len(payload), payload[-16:])


@pytest.mark.parametrize("via_put", [True, False], ids=["ray.put", "direct-arg"])
@pytest.mark.local_only("the local runtime's shared-memory segments")
def test_large_array_argument_is_read_only_zero_copy(ray_start, via_put):
    arr = _big_array()
    probe = _make_probe()
    arg = ray.put(arr) if via_put else arr
    info = ray.get(probe.remote(arg))
    assert info["type"] == "ndarray"
    assert info["sum"] == pytest.approx(float(arr.sum()))
    assert info["writeable"] is False, "argument arrays are read-only, like Ray"
    assert info["in_shm"], "argument array is not mapped from a raylite shm segment"


@pytest.mark.local_only("the local runtime's shared-memory segments")
def test_one_put_read_by_many_tasks(ray_start, shm_allocated_bytes):
    arr = _big_array()
    ref = ray.put(arr)
    probe = _make_probe()
    infos = ray.get([probe.remote(ref) for _ in range(8)])
    expected = pytest.approx(float(arr.sum()))
    assert all(i["sum"] == expected for i in infos)
    assert all(i["in_shm"] and i["writeable"] is False for i in infos), infos
    # Put once: the eight readers map the same data, not eight copies of it.
    segments = set().union(*(i["segments"] for i in infos))
    allocated = shm_allocated_bytes(segments)
    assert allocated < 4 * arr.nbytes, (
        f"{allocated / MB:.0f} MB of shm mapped by readers of one 10 MB object: {segments}"
    )


def test_return_large_array_from_task(ray_start):
    @ray.remote
    def make(n):
        return np.arange(n, dtype=np.float64)

    n = 2 * MB  # 16 MB
    out = ray.get(make.remote(n))
    assert out.shape == (n,)
    np.testing.assert_array_equal(out, np.arange(n, dtype=np.float64))


@pytest.mark.local_only("the local runtime's shared-memory segments")
def test_large_task_result_passed_to_next_task_zero_copy(ray_start):
    @ray.remote
    def make(n):
        return np.ones(n, dtype=np.float64)

    probe = _make_probe()
    info = ray.get(probe.remote(make.remote(2 * MB)))
    assert info["sum"] == 2 * MB
    assert info["in_shm"] and info["writeable"] is False


@pytest.mark.local_only("the local runtime's shared-memory segments")
def test_large_torch_tensor_roundtrip_and_zero_copy(ray_start):
    torch = pytest.importorskip("torch")
    # small integers: every partial sum is exact in float32
    t = (torch.arange(10 * MB // 4) % 7).to(torch.float32)
    out = ray.get(ray.put(t))
    assert isinstance(out, torch.Tensor)
    assert out.dtype == t.dtype and out.shape == t.shape
    assert torch.equal(out, t)

    probe = _make_probe()
    info = ray.get(probe.remote(ray.put(t)))
    assert info["type"] == "Tensor"
    assert info["sum"] == pytest.approx(float(t.double().sum()))
    assert info["in_shm"], "tensor argument is not mapped from a raylite shm segment"

    @ray.remote
    def make_tensor(n):
        import torch

        return torch.full((n,), 2.0)

    got = ray.get(make_tensor.remote(MB))
    assert isinstance(got, torch.Tensor) and float(got.sum()) == 2.0 * MB


def test_array_from_get_stays_valid_after_ref_is_dropped(ray_start):
    arr = _big_array(3)
    ref = ray.put(arr)
    out = ray.get(ref)
    del ref
    gc.collect()
    # Churn the store so a prematurely freed segment would be reused/unmapped.
    for i in range(5):
        ray.get(ray.put(np.full(10 * MB // 8, float(i))))
    gc.collect()
    np.testing.assert_array_equal(out, arr)


# --------------------------------------------------------------------------
# shm reclamation
# --------------------------------------------------------------------------


@pytest.mark.local_only("the local runtime's shared-memory segments")
def test_shm_reclaimed_when_last_ref_is_dropped(ray_init, shm_allocated_bytes, wait_until):
    ray_init(num_cpus=1)
    probe = _make_probe()
    seen = set()  # every segment a reader mapped (this session's, whatever the naming)
    for i in range(20):  # 200 MB put in total, never more than one alive
        ref = ray.put(np.full(10 * MB // 8, float(i)))
        info = ray.get(probe.remote(ref))
        assert info["sum"] == float(i) * (10 * MB // 8) and info["in_shm"]
        seen.update(info["segments"])
        del ref, info
    gc.collect()
    assert seen
    wait_until(
        lambda: shm_allocated_bytes(seen) <= 30 * MB,
        timeout=10,
        message=f"shm not reclaimed: {shm_allocated_bytes(seen) / MB:.0f} MB still allocated",
    )


@pytest.mark.local_only("the local runtime's shared-memory segments")
def test_shm_segments_removed_after_shutdown(ray_init, shm_segments, raylite_mappings, wait_until):
    ray_init(num_cpus=2)
    ref = ray.put(_big_array())

    @ray.remote
    def make():
        return np.ones(2 * MB)

    probe = _make_probe()
    info = ray.get(probe.remote(ref))
    assert info["in_shm"]
    result = ray.get(make.remote())
    assert result.sum() == 2 * MB
    # This session's segments: those its worker and the driver have mapped.
    ours = set(info["segments"]) | raylite_mappings()
    assert ours & shm_segments(), "large objects should live in /dev/shm/raylite-* segments"
    del result, ref
    ray.shutdown()
    wait_until(
        lambda: not (ours & shm_segments()),
        timeout=5,
        message=f"shm segments left after shutdown: {ours & shm_segments()}",
    )


@pytest.mark.local_only("ObjectRef(id bytes) makes a local runtime's ref, which Ray does not know")
def test_object_ref_from_its_bytes_and_as_future(ray_start):
    import asyncio

    ref = ray.put(42)
    same = ray.ObjectRef(bytes.fromhex(ref.hex()))   # Ray's out-of-band pattern (refs by id)
    assert same == ref and same.binary() == ref.binary() and repr(same) == repr(ref)
    assert ray.wait([same], timeout=5) == ([same], []) and ray.get(same) == 42
    with pytest.raises(TypeError, match="ObjectRef takes the id's bytes"):
        ray.ObjectRef("not bytes")
    assert ray.ObjectRef.from_hex(ref.hex()) == ref and not ref.is_nil() and ray.ObjectRef.nil().is_nil()
    from raylite._raylet import ObjectRef, ObjectRefGenerator   # where Ray's docs import them from
    assert ObjectRef is ray.ObjectRef and ObjectRefGenerator is ray.ObjectRefGenerator

    async def main():
        return await ref.as_future()

    assert asyncio.run(main()) == 42


def test_a_refs_task_id_is_the_task_that_made_it(ray_start):
    """As Ray's: a return's and a yielded value's ``task_id()`` is the id
    get_runtime_context().get_task_id() gave inside the task that made it; a put value's is
    the putting task's (exactly that id on the local runtime)."""
    def current():
        return ray.get_runtime_context().get_task_id()

    mine = ray.remote(current)

    @ray.remote(num_returns=2)
    def pair():
        return current(), "second"

    @ray.remote
    def puts():
        return [ray.put(1), ray.put(2)], current()

    @ray.remote
    def yields():
        yield current()

    @ray.remote
    class Actor:
        def mine(self):
            return current()

    ref, other = mine.remote(), mine.remote()
    assert ref.task_id().hex() == ray.get(ref) and ref.task_id() == ref.task_id()
    assert other.task_id() != ref.task_id() and other.task_id().hex() == ray.get(other)
    first, second = pair.remote()
    assert first.task_id() == second.task_id() and first.task_id().hex() == ray.get(first)
    (put_one, put_two), putter = ray.get(puts.remote())
    assert put_one != put_two and put_one.task_id() == put_two.task_id() != ref.task_id()
    assert ray.get([put_one, put_two]) == [1, 2]
    if not ON_RAY:   # Ray's is an id of its own derived from the task's (its first byte differs)
        assert put_one.task_id().hex() == putter and ray.ObjectRef(put_one.binary()) == put_one
    item = next(yields.remote())
    assert item.task_id().hex() == ray.get(item)
    call = Actor.remote().mine.remote()
    assert call.task_id().hex() == ray.get(call)
    driver_put = ray.put(0)   # the driver runs no task: its puts share one id, no task's
    assert driver_put.task_id() == ray.put(1).task_id() not in (ref.task_id(), other.task_id(), put_one.task_id())
