"""`ray.util.ActorPool`, from Ray's "Utility Classes" docs, on raylite."""
import os
import time

import pytest

import raylite as ray
from helpers import wait_until


@ray.remote
class Doubler:
    def double(self, n):
        return n * 2

    def gated_double(self, n, gate):
        """n == 0 waits for the file ``gate``, which the test creates when it wants that result."""
        import os
        while n == 0 and not os.path.exists(gate):
            time.sleep(0.01)
        return n * 2

    def pid(self, _):
        import os
        return os.getpid()


def test_doc_snippet_map_keeps_order(ray_start):
    a1, a2 = Doubler.remote(), Doubler.remote()
    pool = ray.util.ActorPool([a1, a2])
    assert list(pool.map(lambda a, v: a.double.remote(v), [1, 2, 3, 4])) == [2, 4, 6, 8]


def test_work_is_spread_over_every_actor(ray_start):
    pool = ray.util.ActorPool([Doubler.remote() for _ in range(2)])
    pids = list(pool.map(lambda a, v: a.pid.remote(v), range(8)))
    assert len(set(pids)) == 2


def test_map_unordered_returns_fast_results_first(ray_start, tmp_path):
    gate = str(tmp_path / "gate")
    pool = ray.util.ActorPool([Doubler.remote(), Doubler.remote()])
    out = pool.map_unordered(lambda a, v: a.gated_double.remote(v, gate), [0, 1, 2, 3])
    assert sorted(next(out) for _ in range(3)) == [2, 4, 6]   # the other actor's, while 0 waits
    open(gate, "w").close()
    assert list(out) == [0]


def test_submit_queues_until_an_actor_frees_and_get_next_keeps_order(ray_start):
    pool = ray.util.ActorPool([Doubler.remote()])
    for v in range(5):
        pool.submit(lambda a, v: a.double.remote(v), v)
    assert not pool.has_free()
    assert [pool.get_next() for _ in range(5)] == [0, 2, 4, 6, 8]
    assert not pool.has_next() and pool.has_free()
    with pytest.raises(StopIteration):
        pool.get_next()


def test_get_next_timeout(ray_start, tmp_path):
    gate = str(tmp_path / "gate")
    pool = ray.util.ActorPool([Doubler.remote()])
    pool.submit(lambda a, v: a.gated_double.remote(v, gate), 0)
    with pytest.raises(TimeoutError):
        pool.get_next(timeout=0.01)
    open(gate, "w").close()
    assert pool.get_next(timeout=30) == 0


def test_push_and_pop_idle(ray_start):
    first = Doubler.remote()
    pool = ray.util.ActorPool([first])
    assert pool.pop_idle() is first and pool.pop_idle() is None
    pool.submit(lambda a, v: a.double.remote(v), 21)   # waits: no actor
    assert not pool.has_next()
    pool.push(first)
    assert pool.get_next() == 42
    with pytest.raises(ValueError, match="already belongs"):
        pool.push(first)


def test_fn_must_return_a_ref(ray_start):
    pool = ray.util.ActorPool([Doubler.remote()])
    with pytest.raises(TypeError, match="must return an ObjectRef"):
        pool.submit(lambda a, v: v, 1)
    assert pool.has_free()


def test_methods_with_num_returns(ray_start):
    @ray.remote
    class Pair:
        @ray.method(num_returns=2)
        def split(self, v):
            return v, v * 10

    pool = ray.util.ActorPool([Pair.remote(), Pair.remote()])
    for v in range(3):   # more calls than actors: one waits in the pool
        pool.submit(lambda a, v: a.split.remote(v), v)
    assert [pool.get_next(timeout=30) for _ in range(3)] == [[0, 0], [1, 10], [2, 20]]
    for v in range(3):
        pool.submit(lambda a, v: a.split.remote(v), v)
    assert sorted(pool.get_next_unordered(timeout=30) for _ in range(3)) == [[0, 0], [1, 10], [2, 20]]
    assert list(pool.map(lambda a, v: a.split.remote(v), [4, 5])) == [[4, 40], [5, 50]]
    assert list(pool.map_unordered(lambda a, v: a.split.remote(v), [6])) == [[6, 60]]
    with pytest.raises(TypeError, match="list of int"):
        pool.submit(lambda a, v: [v], 1)
    assert pool.has_free()


def test_a_dead_actor_leaves_the_pool(ray_start):
    @ray.remote
    class Mortal:
        def die(self, _):
            import os
            os._exit(1)

        def double(self, n):
            return n * 2

    pool = ray.util.ActorPool([Mortal.remote()])
    pool.submit(lambda a, v: a.die.remote(v), 0)
    pool.submit(lambda a, v: a.double.remote(v), 1)   # waits for an actor
    with pytest.raises(ray.exceptions.ActorDiedError):
        pool.get_next(timeout=30)
    assert not pool.has_free() and not pool.has_next()   # as Ray: never handed out again
    survivor = Doubler.remote()
    pool.push(survivor)   # the waiting call runs on it
    assert pool.get_next(timeout=30) == 2
    assert pool.pop_idle() is survivor


def test_map_submits_before_the_first_result_is_read(ray_start, tmp_path):
    @ray.remote
    class Toucher:
        def touch(self, name):
            open(name, "w").close()
            return name

    pool = ray.util.ActorPool([Toucher.remote()])
    names = [str(tmp_path / "ordered"), str(tmp_path / "unordered")]
    ordered = pool.map(lambda a, v: a.touch.remote(v), names[:1])   # not iterated yet, as Ray's test_map_eager
    wait_until(lambda: os.path.exists(names[0]), timeout=30)
    assert list(ordered) == names[:1]
    unordered = pool.map_unordered(lambda a, v: a.touch.remote(v), names[1:])
    wait_until(lambda: os.path.exists(names[1]), timeout=30)
    assert list(unordered) == names[1:]
