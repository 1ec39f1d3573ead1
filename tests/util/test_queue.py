"""`ray.util.queue.Queue`, from Ray's "Utility Classes" docs, on raylite."""
import queue as std_queue

import pytest

import raylite as ray
from raylite.util.queue import Empty, Full, Queue


def test_doc_snippet_consumers_drain_the_queue(ray_start):
    q = Queue()

    @ray.remote
    def consumer(queue):
        got = []
        while True:
            try:
                got.append(queue.get(timeout=0.5))
            except Empty:
                return got

    consumers = [consumer.remote(q) for _ in range(2)]
    for i in range(20):
        q.put(i)
    got = ray.get(consumers)
    assert sorted(got[0] + got[1]) == list(range(20))


def test_blocked_get_is_served_by_a_later_put(ray_start, wait_until):
    from raylite.util.state import list_tasks
    q = ray.util.queue.Queue()

    @ray.remote
    def getter(queue):
        return queue.get(timeout=30)

    pending = getter.remote(q)
    wait_until(lambda: [t for t in list_tasks(filters=[("name", "=", "_QueueActor.get")]) if t.state == "RUNNING"],
               what="the queue's get blocked in its actor")
    assert ray.wait([pending], timeout=0)[0] == []
    q.put("late")
    assert ray.get(pending, timeout=30) == "late"


def test_bounded_queue_full_and_empty(ray_start):
    q = Queue(maxsize=2)
    q.put_nowait_batch([1, 2])
    assert q.full() and len(q) == 2
    with pytest.raises(Full):
        q.put(3, timeout=0.05)
    with pytest.raises(std_queue.Full):   # also the standard library's exception
        q.put_nowait(3)
    with pytest.raises(Full):
        q.put_nowait_batch([3])
    assert q.get_nowait_batch(2) == [1, 2]
    assert q.empty()
    with pytest.raises(Empty):
        q.get(block=False)
    with pytest.raises(std_queue.Empty):
        q.get(timeout=0.05)
    with pytest.raises(Empty):
        q.get_nowait_batch(1)


def test_bad_arguments_name_the_field(ray_start):
    with pytest.raises(ValueError, match="maxsize=-1"):
        Queue(maxsize=-1)
    q = Queue()
    with pytest.raises(ValueError, match="timeout=-1"):
        q.get(timeout=-1)


def test_shutdown_stops_the_actor(ray_start):
    q = Queue()
    q.put(1)
    actor = q.actor
    q.shutdown()
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(actor.qsize.remote())


def test_batch_arguments_of_the_wrong_type_are_type_errors_as_in_ray(ray_start):
    q = Queue()
    with pytest.raises(TypeError, match="'num_items' must be an int, got num_items='2'"):
        q.get_nowait_batch("2")
    with pytest.raises(ValueError, match="'num_items' must be nonnegative, got num_items=-1"):
        q.get_nowait_batch(-1)
    with pytest.raises(TypeError, match="'items' must be an Iterable, got items=5"):
        q.put_nowait_batch(5)
    q.put_nowait_batch(iter(range(3)))   # any iterable
    assert q.get_nowait_batch(3) == [0, 1, 2]

