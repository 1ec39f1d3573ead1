"""Refs nested in values (arguments, put values, task results) are reference-counted across
processes: the object lives while any copy of the ref, or any value holding it, lives, and is
freed (with its shared memory) once none does. A ref pickled where raylite cannot follow it
(plain pickle) pins its object until shutdown.
"""

import gc
import pickle

import numpy as np
import pytest

import raylite as ray

MB = 1 << 20


def _in_table(object_id: int) -> bool:
    """Whether the driver still stores the object (white-box: the only way to see a free)."""
    from raylite.core.api import runtime as api
    node = api._node
    return node.call_sync(lambda: object_id in node.table.objects)


def _freed(wait_until, object_id: int) -> None:
    gc.collect()
    wait_until(lambda: not _in_table(object_id), timeout=10,
               message=f"object {object_id:x} was never freed")


@ray.remote
def get_inner(holder):
    return float(ray.get(holder[0]).sum())


@pytest.mark.local_only("white-box: reads the local node's object table")
def test_ref_nested_in_an_argument_lives_until_the_task_ends(ray_start, wait_until):
    ref = ray.put(np.ones(2 * MB // 8))
    oid = ref.id
    out = get_inner.remote([ref])
    del ref   # only the pending task's argument holds it now
    gc.collect()
    assert ray.get(out) == 2 * MB // 8
    _freed(wait_until, oid)


@pytest.mark.local_only("white-box: reads the local node's object table")
def test_ref_returned_by_a_task_outlives_the_worker_that_made_it(ray_start, wait_until):
    @ray.remote
    def make():
        return [ray.put(np.full(2 * MB // 8, 3.0))]   # the worker drops its own ref at once

    holder = ray.get(make.remote())
    inner = holder[0]
    assert ray.get(inner).sum() == 3.0 * (2 * MB // 8)
    oid = inner.id
    del holder
    assert ray.get(inner)[0] == 3.0   # this copy still counts
    del inner
    _freed(wait_until, oid)


@pytest.mark.local_only("white-box: reads the local node's object table")
def test_put_value_holds_its_refs_and_frees_them_with_it(ray_start, wait_until):
    inner = ray.put(np.arange(2 * MB // 8, dtype=np.float64))
    oid = inner.id
    outer = ray.put({"data": inner})
    del inner
    gc.collect()
    assert _in_table(oid)   # held by the outer value
    assert ray.get(ray.get(outer)["data"])[-1] == 2 * MB // 8 - 1
    assert ray.get(get_inner.remote([ray.get(outer)["data"]])) > 0
    del outer
    _freed(wait_until, oid)


@pytest.mark.local_only("white-box: reads the local node's object table")
def test_refs_passed_between_workers_are_counted_in_each(ray_start, wait_until):
    @ray.remote
    class Keeper:
        def __init__(self):
            self.kept = None

        def keep(self, holder):
            self.kept = holder[0]   # a copy unpickled in the actor's process

        def read(self):
            return float(ray.get(self.kept)[0])

        def drop(self):
            self.kept = None

    keeper = Keeper.remote()
    ref = ray.put(np.full(2 * MB // 8, 7.0))
    oid = ref.id
    ray.get(keeper.keep.remote([ref]))
    del ref
    gc.collect()
    assert ray.get(keeper.read.remote()) == 7.0   # the actor's copy keeps it alive
    ray.get(keeper.drop.remote())
    _freed(wait_until, oid)


@pytest.mark.local_only("white-box: reads the local node's object table")
def test_a_long_chain_of_nested_refs_is_freed_without_recursion(ray_start, wait_until):
    first = ray.put(0)
    oid = first.id
    ref = first
    del first
    for i in range(3000):
        ref = ray.put([ref])
    gc.collect()
    assert _in_table(oid)
    del ref
    _freed(wait_until, oid)


@pytest.mark.local_only("white-box: reads the local node's object table")
def test_plain_pickle_pins_the_object(ray_start):
    ref = ray.put("kept")
    data = pickle.dumps(ref)
    oid = ref.id
    del ref
    gc.collect()
    assert _in_table(oid)
    assert ray.get(pickle.loads(data)) == "kept"


@pytest.mark.local_only("white-box: reads the local node's object table")
def test_actor_constructor_arguments_are_held_for_restarts(ray_start, wait_until):
    @ray.remote(max_restarts=1)
    class Reader:
        def __init__(self, holder):
            self.value = ray.get(holder[0])

        def value_and_pid(self):
            import os
            return self.value, os.getpid()

        def crash(self):
            import os
            os._exit(1)

    ref = ray.put("config")
    oid = ref.id
    reader = Reader.remote([ref])
    del ref
    gc.collect()
    value, pid = ray.get(reader.value_and_pid.remote())
    assert value == "config"
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(reader.crash.remote())
    assert _in_table(oid)
    # the restarted actor re-ran its constructor with the same (still stored) argument
    wait_until(lambda: ray.get(reader.value_and_pid.remote())[1] != pid, timeout=10,  # noqa: F821 (pyflakes reads lambdas after the del)
               message="the actor did not restart")
    assert ray.get(reader.value_and_pid.remote())[0] == "config"
    ray.kill(reader)
    del reader
    _freed(wait_until, oid)


@pytest.mark.local_only("white-box: reads the local node's object table")
def test_nested_refs_through_a_pipeline_keep_every_value_and_free_all(ray_start, wait_until):
    """Refs made in workers, nested in results, passed on to other tasks and dropped along the
    way: every value stays readable while referenced, and the table is back to empty at the end."""
    from raylite.core.api import runtime as api
    node = api._node
    baseline = node.call_sync(lambda: len(node.table.objects))

    @ray.remote
    def produce(i):
        return {"i": i, "refs": [ray.put(np.full(1000, float(i))), ray.put(str(i))]}

    @ray.remote
    def consume(batch):
        total = 0.0
        for item in batch:
            values = ray.get(item["refs"])
            assert values[1] == str(item["i"])
            total += float(values[0][0])
        return [ray.put(total)]   # hand a fresh ref back, nested

    results = []
    for round_ in range(5):
        batch = ray.get([produce.remote(i) for i in range(round_ * 10, round_ * 10 + 10)])
        results.append(consume.remote(batch))
        del batch
        gc.collect()
    totals = [ray.get(ray.get(r)[0]) for r in results]
    assert totals == [float(sum(range(k * 10, k * 10 + 10))) for k in range(5)]
    del results
    gc.collect()
    wait_until(lambda: node.call_sync(lambda: len(node.table.objects)) == baseline, timeout=10,
               message="objects left in the table after every ref was dropped")


@ray.remote
class Counter:
    def __init__(self):
        self.n = 0

    def add(self):
        import os
        self.n += 1
        return self.n, os.getpid()


def test_actor_handle_nested_in_an_argument_keeps_the_actor_until_the_task_ends(
        ray_start, wait_until, pid_alive):
    @ray.remote
    def use(holder):
        return ray.get(holder[0].add.remote())

    counter = Counter.remote()
    _, pid = ray.get(counter.add.remote())
    out = use.remote([counter])
    del counter   # only the pending task's argument (then the task's own copy) holds it
    gc.collect()
    assert ray.get(out)[0] == 2
    wait_until(lambda: not pid_alive(pid), timeout=10,
               message="the actor outlived every handle to it")


def test_actor_handle_in_a_put_value_lives_with_the_value(ray_start, wait_until, pid_alive):
    box = ray.put({"counter": Counter.remote()})
    n, pid = ray.get(ray.get(box)["counter"].add.remote())
    gc.collect()
    assert (n, pid_alive(pid)) == (1, True)
    assert ray.get(ray.get(box)["counter"].add.remote())[0] == 2   # same actor, state kept
    del box
    wait_until(lambda: not pid_alive(pid), timeout=10,
               message="the actor outlived the value holding its only handle")


@pytest.mark.local_only("Ray 2.60 ends the actor once its last live handle goes, pickled copies notwithstanding")
def test_plain_pickle_of_an_actor_handle_keeps_the_actor(ray_start):
    counter = Counter.remote()
    data = pickle.dumps(counter)
    del counter
    gc.collect()
    assert ray.get(pickle.loads(data).add.remote())[0] == 1


def _node():
    from raylite.core.api import runtime as api
    return api._node


@ray.remote(num_cpus=1)
def _held(gate: str) -> int:
    import os
    import time
    while not os.path.exists(gate):
        time.sleep(0.005)
    return 1


@pytest.mark.local_only("white-box: counts the local node's scheduling passes")
def test_refs_dropped_together_cost_no_scheduling_pass_each(ray_start, tmp_path, wait_until, monkeypatch):
    """While a task waits in a queue (every CPU taken), each locked section ends with a scheduling
    pass, unless it changed nothing a pass reads (SETTLED): dropping a ref is such a change. A list
    of refs going out of scope then costs no pass per ref. Every object is freed all the same."""
    node = _node()
    gate = str(tmp_path / "gate")
    held = [_held.remote(gate) for _ in range(3)]   # two run, one waits for a CPU
    wait_until(lambda: node.call_sync(lambda: sum(len(q) for q in node.shared.queues.values())) == 1,
               timeout=10, message="the third task never queued")
    refs = [ray.put(i) for i in range(2000)]
    ids = [r.id for r in refs]
    passes = []
    schedule = node.scheduler.schedule
    monkeypatch.setattr(node.scheduler, "schedule", lambda: (passes.append(1), schedule())[1])
    del refs
    assert len(passes) < 50, len(passes)
    wait_until(lambda: node.call_sync(lambda: not any(i in node.table.objects for i in ids)), timeout=10,
               message="the dropped refs' objects were never freed")
    open(gate, "w").close()
    assert ray.get(held) == [1, 1, 1]


@pytest.mark.local_only("white-box: reads the local node's object table")
def test_a_dropped_ref_is_freed_while_the_driver_does_nothing_else(ray_start, wait_until):
    """The release of a value larger than a tiny one does not wait for the driver's next call: the
    idle node thread is woken for it. (Read without the node's lock: a call would release it on the way.)"""
    node = _node()
    ref = ray.put(b"x" * 4096)
    oid = ref.id
    del ref
    wait_until(lambda: oid not in node.table.objects, timeout=10, message="the dropped ref's object stayed")


@pytest.mark.local_only("white-box: reads the local node's object table unlocked")
def test_dropped_refs_to_tiny_values_are_counted_down_by_the_next_call_and_bounded(ray_start, wait_until):
    """A dropped ref to a tiny value is released by the node's next locked section (a result ref
    dropped by `get(f.remote())` costs no section of its own), and seen released by any
    observation; no more than DROPPED_MAX wait meanwhile."""
    node = _node()
    refs = [ray.put(i) for i in range(node.table.DROPPED_MAX + 10)]
    ids = [r.id for r in refs]
    del refs
    held = sum(i in node.table.objects for i in ids)
    assert 0 < held <= node.table.DROPPED_MAX   # the ones past the bound went at once, with the rest
    assert not _in_table(ids[0])                # an observation counts what was dropped before it
    ref = ray.put("x")
    oid = ref.id
    del ref
    assert oid in node.table.objects            # held back ...
    ray.put("y")                                # ... until the next call
    assert oid not in node.table.objects


@pytest.mark.local_only("white-box: reads the segments of the local node's objects")
def test_a_dropped_value_in_shared_memory_is_released_before_the_next_put(ray_start):
    """Its release is not deferred: the next put of the same size reuses its segment from the pool."""
    node = _node()
    first = ray.put(np.ones(2 * MB // 8))
    segment = node.table.objects[first.id].value.buffers
    del first
    second = ray.put(np.ones(2 * MB // 8))
    assert node.table.objects[second.id].value.buffers == segment


@pytest.mark.local_only("white-box: holds the local node's lock")
def test_a_dropped_ref_is_not_held_back_behind_a_queued_command(ray_start, wait_until):
    """An addref queued while the node lock was busy must be counted before this thread's later
    release: held back, the release would be counted at the end of the node's running section,
    ahead of the addref, and free a value still referenced."""
    node = _node()
    ref = ray.put("x")
    oid = ref.id
    with node.shared.lock:   # busy: the call below is queued for the node thread
        node.call(node.table.addref, oid)
        del ref
        assert oid not in node.table.dropped
        node.table.release_dropped()   # what the end of a running section would do
        assert oid in node.table.objects
    wait_until(lambda: node.call_sync(lambda: node.table.objects[oid].refs) == 1, timeout=10,
               message="the queued addref and the release were not both counted")
    node.call(node.table.release, oid)
