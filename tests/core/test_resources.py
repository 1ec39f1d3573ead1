"""Fixed-point quantities, request validation and per-node device accounting."""

import math
from fractions import Fraction

import pytest

from raylite.core.wire.resources import (
    ACCELERATOR_RESOURCES,
    SCALE,
    Allocation,
    NodeResources,
    format_units,
    from_fixed,
    normalize_request,
    to_fixed,
)

U = SCALE


def gpus(n: int, ids=None, cpus: int = 8) -> NodeResources:
    ids = ids or [str(i) for i in range(n)]
    return NodeResources({"CPU": cpus * U, "GPU": n * U}, {"GPU": ids})


# ---------------------------------------------------------------- fixed point

@pytest.mark.parametrize(
    "value, units",
    [(0, 0), (1, U), (0.5, 5000), (0.0001, 1), (0.1 + 0.2, 3000), (0.7 + 0.1, 8000),
     (1 / 3 * 3, U), (2.0, 2 * U), (Fraction(1, 4), 2500), (12345.6789, 123456789)],
)
def test_to_fixed(value, units):
    assert to_fixed(value, "x") == units
    assert isinstance(to_fixed(value, "x"), int)


def test_float_noise_leaves_no_ghost_remainder():
    total = sum(to_fixed(0.1, "x") for _ in range(10))
    assert total == U
    node = NodeResources({"CPU": U}, {})
    allocs = [node.try_acquire({"CPU": to_fixed(0.1, "x")}) for _ in range(10)]
    assert all(allocs) and node.available()["CPU"] == 0
    for a in allocs:
        node.release(a)
    assert node.available() == {"CPU": U}


@pytest.mark.parametrize(
    "value, words",
    [(-1, "non-negative"), (-0.5, "non-negative"), (math.nan, "finite"), (math.inf, "finite"),
     (0.00005, "finer"), (0.00011, "finer"), (True, "number"), ("1", "number"), (None, "number")],
)
def test_to_fixed_rejects(value, words):
    # a value that is no number is a TypeError, as in Ray; a number out of range a ValueError
    with pytest.raises(TypeError if words == "number" else ValueError) as err:
        to_fixed(value, "num_widgets")
    assert "num_widgets" in str(err.value) and repr(value) in str(err.value)
    assert words in str(err.value)


def test_an_off_grid_share_says_how_to_fix_it():
    with pytest.raises(ValueError, match=r"num_cpus=0\.6666666666666666 .*round it down .*num_cpus=0\.6666"):
        to_fixed(2 / 3, "num_cpus")   # what a division of 2 CPUs by 3 workers gives
    with pytest.raises(ValueError, match=r"ask for 0 or at least 0\.0001"):
        to_fixed(0.00001, "num_gpus")


def test_from_fixed_and_format():
    assert from_fixed(5000) == 0.5 and from_fixed(U) == 1.0 and isinstance(from_fixed(U), float)
    assert from_fixed(3000) == 0.3
    assert format_units(3000) == "0.3" and format_units(4 * U) == "4"
    assert format_units(1) == "0.0001"
    assert format_units(15000) == "1.5" and format_units(-5000) == "-0.5"


# ---------------------------------------------------------- normalize_request

def test_normalize_defaults_and_fields():
    assert normalize_request() == {"CPU": U}
    assert normalize_request(default_cpus=0) == {}
    assert normalize_request(num_cpus=0, num_gpus=0) == {}
    req = normalize_request(num_cpus=2, num_gpus=0.5, resources={"foo": 0.25, "bar": 0},
                            memory=1024, accelerator_type="H200")
    assert req == {"CPU": 2 * U, "GPU": 5000, "foo": 2500, "memory": 1024 * U,
                   "accelerator_type:H200": 10}


@pytest.mark.parametrize(
    "kwargs, names",
    [
        (dict(num_cpus=-1), ["num_cpus", "-1"]),
        (dict(num_gpus=math.nan), ["num_gpus", "nan"]),
        (dict(num_gpus=0.00005), ["num_gpus", "5e-05"]),
        (dict(num_gpus=1.5), ["GPU", "1.5"]),
        (dict(num_gpus=2.5), ["GPU", "2.5"]),
        (dict(resources={"neuron_cores": 0.5}), ["neuron_cores", "0.5"]),
        (dict(resources={"HPU": 0.5}), ["HPU", "0.5"]),
        (dict(resources={"TPU": 0.5}), ["TPU", "0.5"]),
        (dict(resources={"TPU": 3}), ["TPU", "3"]),
        (dict(resources={"TPU": 16}), ["TPU", "16"]),
        (dict(resources={"NPU": 1.5}), ["NPU", "1.5"]),
        (dict(resources={"foo": -2}), ["foo", "-2"]),
        (dict(resources={"CPU": 1}), ["CPU", "num_cpus="]),
        (dict(resources={"GPU": 1}), ["GPU", "num_gpus="]),
        (dict(resources={"memory": 10}), ["memory", "memory="]),
        (dict(memory=-5), ["memory", "-5"]),
        (dict(accelerator_type=""), ["accelerator_type"]),
    ],
)
def test_normalize_rejects_with_field_and_value(kwargs, names):
    with pytest.raises(ValueError) as err:
        normalize_request(**kwargs)
    for name in names:
        assert name in str(err.value)


def test_normalize_accepts_family_shapes():
    assert normalize_request(resources={"NPU": 0.5}, num_cpus=0) == {"NPU": 5000}
    assert normalize_request(num_gpus=2, num_cpus=0) == {"GPU": 2 * U}
    for chips in (0, 1, 2, 4, 8):
        normalize_request(resources={"TPU": chips})
    assert normalize_request(resources={"neuron_cores": 2.0}, num_cpus=0) == {"neuron_cores": 2 * U}


@pytest.mark.parametrize("bad", [["GPU"], "GPU=1", 3])
def test_normalize_resources_type(bad):
    with pytest.raises((TypeError, ValueError), match="resources"):
        normalize_request(resources=bad)


def test_normalize_resources_keys():
    with pytest.raises((TypeError, ValueError), match="resources"):
        normalize_request(resources={1: 1})


# ------------------------------------------------------------- NodeResources

def test_fraction_best_fit_packs_0_0_1():
    node = gpus(3)
    got = [node.try_acquire({"GPU": 5000}).device_ids["GPU"] for _ in range(3)]
    assert got == [["0"], ["0"], ["1"]]


def test_four_quarters_share_one_gpu():
    node = gpus(1)
    allocs = [node.try_acquire({"CPU": U, "GPU": 2500}) for _ in range(4)]
    assert all(a and a.device_ids == {"GPU": ["0"]} for a in allocs)
    assert node.try_acquire({"GPU": 2500}) is None
    assert node.available()["GPU"] == 0 and node.available()["CPU"] == 4 * U


def test_best_fit_prefers_fullest_device_that_fits():
    node = gpus(3)
    a = node.try_acquire({"GPU": 7000})   # dev0 0.3 left
    b = node.try_acquire({"GPU": 5000})   # dev1 0.5 left
    c = node.try_acquire({"GPU": 3000})   # best fit: dev0 (0.3) rather than dev1 (0.5)
    got = [x.device_ids["GPU"] for x in (a, b, c)]
    assert got == [["0"], ["1"], ["0"]]
    assert c.device_units == {"GPU": {"0": 3000}}
    d = node.try_acquire({"GPU": 6000})   # only dev2 has room
    assert d.device_ids == {"GPU": ["2"]}


def test_whole_devices_take_free_lowest_ids():
    node = gpus(4, ids=["1", "3", "5", "7"])
    half = node.try_acquire({"GPU": 5000})
    assert half.device_ids == {"GPU": ["1"]}
    two = node.try_acquire({"GPU": 2 * U})
    assert two.device_ids == {"GPU": ["3", "5"]}
    assert two.device_units == {"GPU": {"3": U, "5": U}}
    assert node.try_acquire({"GPU": 2 * U}) is None      # only "7" whole; "1" partly used
    one = node.try_acquire({"GPU": U})
    assert one.device_ids == {"GPU": ["7"]}
    node.release(half)
    assert node.try_acquire({"GPU": U}).device_ids == {"GPU": ["1"]}


def test_failed_acquire_takes_nothing():
    node = gpus(1, cpus=1)
    before = node.available()
    assert node.try_acquire({"CPU": U, "GPU": 2 * U}) is None
    assert node.try_acquire({"CPU": 2 * U, "GPU": U}) is None
    assert node.available() == before and node.device_free("GPU") == {"0": U}


def test_release_restores_and_rejects_double_release():
    node = gpus(2)
    alloc = node.try_acquire({"CPU": 2 * U, "GPU": 15000 - 5000, "custom": 0})
    assert alloc.resources == {"CPU": 2 * U, "GPU": U}
    node.release(alloc)
    assert node.available() == node.total
    assert node.device_free("GPU") == {"0": U, "1": U}
    with pytest.raises(ValueError, match="double release"):
        node.release(alloc)


def test_custom_and_memory_resources():
    node = NodeResources({"CPU": U, "memory": 1000 * U, "foo": 5000}, {})
    assert node.try_acquire({"foo": 5000, "memory": 400 * U}) is not None
    assert node.try_acquire({"foo": 1}) is None
    assert node.try_acquire({"bar": 1}) is None
    assert node.available()["memory"] == 600 * U


def test_adjust_lends_cpu_and_may_go_negative():
    node = NodeResources({"CPU": U}, {})
    blocked = node.try_acquire({"CPU": U})
    node.adjust("CPU", +U)                      # blocked in get(): CPU back to the pool
    child = node.try_acquire({"CPU": U})
    assert child is not None
    node.adjust("CPU", -U)                      # resumes before the child finished
    assert node.available()["CPU"] == -U
    assert node.try_acquire({"CPU": 1}) is None
    node.release(child)
    node.release(blocked)
    assert node.available()["CPU"] == U
    with pytest.raises(ValueError, match="GPU"):
        gpus(1).adjust("GPU", U)
    with pytest.raises(ValueError, match="nope"):
        node.adjust("nope", 1)


def test_feasible():
    node = gpus(2, cpus=4)
    node.try_acquire({"GPU": 2 * U, "CPU": 4 * U})         # busy does not matter
    assert node.feasible({"CPU": 4 * U, "GPU": 2 * U})
    assert node.feasible({"GPU": 2500})
    assert not node.feasible({"GPU": 3 * U})
    assert not node.feasible({"GPU": 15000})
    assert not node.feasible({"CPU": 5 * U})
    assert not node.feasible({"TPU": U})
    assert not node.feasible({"foo": 1})
    assert node.feasible({})
    assert not NodeResources({"CPU": U}, {}).feasible({"GPU": 2500})


def test_describe():
    node = gpus(1)
    assert node.describe({"CPU": U, "GPU": 4 * U}) == "{CPU: 1, GPU: 4}"
    assert node.describe({"CPU": 5000, "GPU": 2500}) == "{CPU: 0.5, GPU: 0.25}"
    assert node.describe(normalize_request(num_cpus=0.1 + 0.2)) == "{CPU: 0.3}"
    # bytes in GiB (MiB below one), not raw counts
    assert node.describe(normalize_request(num_cpus=1, memory=3 << 30)) == "{CPU: 1, memory: 3.0 GiB}"
    assert node.describe({"object_store_memory": (512 << 20) * U}) == "{object_store_memory: 512.0 MiB}"


def test_node_device_ids_validation_and_defaults():
    node = NodeResources({"GPU": 2 * U, "neuron_cores": 2 * U}, {"GPU": ["1", "3"]})
    assert node.device_free("GPU") == {"1": U, "3": U}
    assert node.device_free("neuron_cores") == {"0": U, "1": U}
    with pytest.raises(ValueError, match="GPU"):
        NodeResources({"GPU": 2 * U}, {"GPU": ["0"]})
    with pytest.raises(ValueError, match="whole"):
        NodeResources({"GPU": 15000}, {})


@pytest.mark.parametrize("res", [r for r in ACCELERATOR_RESOURCES if r != "TPU"])
def test_every_family_gets_device_ids(res):
    node = NodeResources({res: 2 * U}, {res: ["0", "1"]})
    actor = node.try_acquire({res: U})
    task = node.try_acquire({res: U})
    assert (actor.device_ids, task.device_ids) == ({res: ["0"]}, {res: ["1"]})
    assert isinstance(actor, Allocation)
