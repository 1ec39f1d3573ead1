"""Generator tasks and actor methods, as in Ray: values stream out as they are yielded."""
import asyncio
import gc
import os
import time

import numpy as np
import pytest

import raylite as ray


@ray.remote
def count_until(path, n, before_wait=1):
    """Yield 0..n-1, pausing after `before_wait` values until `path` exists."""
    for i in range(n):
        if i == before_wait:
            while not os.path.exists(path):
                time.sleep(0.01)
        yield i


@pytest.mark.local_only("Ray's completed() ref holds None")
def test_generator_streams_values_before_the_task_ends(ray_start, tmp_path):
    go = tmp_path / "go"
    gen = count_until.remote(str(go), 3)
    assert isinstance(gen, ray.ObjectRefGenerator)
    first = next(gen)
    assert isinstance(first, ray.ObjectRef) and ray.get(first, timeout=20) == 0   # the task still waits
    assert not gen.is_finished()
    go.touch()
    assert [ray.get(ref) for ref in gen] == [1, 2]
    assert gen.is_finished() and list(gen) == []
    assert ray.get(gen.completed()) is not None


def test_generator_error_comes_from_the_ref_after_the_last_value(ray_start):
    @ray.remote
    def fails_after(k):
        for i in range(k):
            yield i
        raise KeyError("no more")

    refs = list(fails_after.remote(2))
    assert len(refs) == 3 and ray.get(refs[:2]) == [0, 1]
    with pytest.raises(KeyError, match="no more"):
        ray.get(refs[2])


def test_dynamic_num_returns_gives_one_ref_to_all_values(ray_start):
    @ray.remote(num_returns="dynamic")
    def squares(n):
        for i in range(n):
            yield i * i

    refgen = ray.get(squares.remote(4))
    assert isinstance(refgen, ray.DynamicObjectRefGenerator) and len(refgen) == 4
    assert ray.get(list(refgen)) == [0, 1, 4, 9]


@pytest.mark.local_only("Ray's own error text for a short generator")
def test_generator_with_fixed_num_returns_and_errors_as_ray(ray_start):
    @ray.remote(num_returns=3)
    def three():
        for i in range(3):
            yield i * 10

    assert ray.get(three.remote()) == [0, 10, 20]

    @ray.remote
    def fails_after_two():
        yield 0
        yield 1
        raise ValueError("third went wrong")

    refs = fails_after_two.options(num_returns=4).remote()
    assert ray.get(refs[:2]) == [0, 1]   # the values yielded before the error
    for ref in refs[2:]:
        with pytest.raises(ValueError, match="third went wrong"):
            ray.get(ref)
    with pytest.raises(ValueError, match="num_returns=4 but its generator yielded 3 values"):
        ray.get(three.options(num_returns=4).remote()[0])

    dynamic = ray.get(fails_after_two.options(num_returns="dynamic").remote())   # the error: last ref
    first, second, error = list(dynamic)
    assert ray.get([first, second]) == [0, 1]
    with pytest.raises(ValueError, match="third went wrong"):
        ray.get(error)


def test_actor_generator_methods_sync_and_async(ray_start):
    @ray.remote
    class Source:
        def __init__(self):
            self.base = 10

        def values(self, n):
            for i in range(n):
                yield self.base + i

    @ray.remote
    class AsyncSource:
        async def values(self, n):
            for i in range(n):
                await asyncio.sleep(0)
                yield i

    assert [ray.get(r) for r in Source.remote().values.remote(3)] == [10, 11, 12]
    assert [ray.get(r) for r in AsyncSource.remote().values.remote(3)] == [0, 1, 2]


@pytest.mark.local_only("Ray's generator tasks cannot `yield from` (it calls send())")
def test_async_for_over_a_generator_in_a_driver_coroutine(ray_start):
    @ray.remote
    def letters():
        yield from "abc"

    async def main():
        return [await ref async for ref in letters.remote()]

    assert asyncio.run(main()) == ["a", "b", "c"]


def test_large_yielded_values_travel_through_shared_memory(ray_start):
    @ray.remote
    def arrays(n):
        for i in range(n):
            yield np.full(300_000, float(i))   # 2.4 MB each

    out = [ray.get(ref) for ref in arrays.remote(3)]
    assert [float(a[0]) for a in out] == [0.0, 1.0, 2.0] and not out[0].flags.writeable


@pytest.mark.local_only("Ray's generator tasks cannot `yield from` (it calls send())")
def test_task_consumes_a_generator_without_deadlock(ray_init):
    ray_init(num_cpus=1)   # the consumer holds the only CPU while the generator needs one

    @ray.remote
    def numbers(n):
        yield from range(n)

    @ray.remote
    def total(n):
        return sum(ray.get(ref) for ref in numbers.remote(n))

    assert ray.get(total.remote(5), timeout=60) == 10


def test_retried_generator_repeats_no_value(ray_start, tmp_path):
    marker = tmp_path / "crashed"

    @ray.remote(max_retries=1)
    def flaky(path):
        yield 0
        yield 1
        if not os.path.exists(path):
            open(path, "w").close()
            os._exit(1)   # the worker dies mid-stream; the retry yields 0 and 1 again
        yield 2

    assert [ray.get(r) for r in flaky.remote(str(marker))] == [0, 1, 2]


@pytest.mark.local_only("white-box: reads the local node's streams")
def test_dropped_generator_frees_the_values_nobody_took(ray_start, tmp_path, wait_until):
    from raylite.core.api import runtime as api
    node = api._node

    def stored():
        return node.call_sync(lambda: (len(node.table.objects), len(node.table.streams)))

    before = stored()
    gen = count_until.remote(str(tmp_path / "go"), 4, before_wait=4)
    first = next(gen)
    wait_until(lambda: stored()[0] >= before[0] + 4, timeout=20, message="values not stored")
    del gen
    gc.collect()
    wait_until(lambda: stored() == (before[0] + 1, before[1]), timeout=20,
               message="the dropped generator's values were kept")
    assert ray.get(first) == 0   # the ref taken before stays valid


def test_cancel_a_running_generator(ray_start, tmp_path):
    gen = count_until.remote(str(tmp_path / "never"), 3)
    assert ray.get(next(gen)) == 0
    ray.cancel(gen)
    with pytest.raises(ray.exceptions.TaskCancelledError):
        ray.get(next(gen), timeout=20)
    with pytest.raises(StopIteration):
        next(gen)


@pytest.mark.local_only("Ray refuses streaming on a plain function at decoration")
def test_bad_num_returns_and_non_generators_are_clear_errors(ray_start):
    def plain():
        return 1

    with pytest.raises(TypeError, match="num_returns"):
        ray.remote(num_returns="bogus")(plain)
    with pytest.raises(TypeError, match="not a generator"):
        ray.get(next(ray.remote(num_returns="streaming")(plain).remote()))


def test_wait_on_generators_and_refs_together(ray_start, tmp_path):
    go = tmp_path / "go"

    @ray.remote
    def later(path):
        while not os.path.exists(path):
            time.sleep(0.01)
        return "late"

    gen = count_until.remote(str(go), 2)
    slow = later.remote(str(go))
    assert ray.get(next(gen)) == 0
    ready, not_ready = ray.wait([slow, gen], num_returns=1, timeout=0.3)
    assert ready == [] and not_ready == [slow, gen]   # its next value waits for `go` as well
    go.touch()
    ready, _ = ray.wait([gen], timeout=20)
    assert ready == [gen] and ray.get(next(gen)) == 1
    ready, _ = ray.wait([gen], timeout=20)   # the end: next() would not block either
    assert ready == [gen] and list(gen) == []
    assert ray.wait([slow, gen], num_returns=2, timeout=20)[0] == [slow, gen]


@pytest.mark.local_only("Ray's own error text")
def test_generator_cannot_travel_to_another_task(ray_start):
    @ray.remote
    def consume(gen):
        return list(gen)

    with pytest.raises(TypeError, match="ObjectRefGenerator cannot be passed"):
        consume.remote(count_until.remote("/nonexistent", 1))


@pytest.mark.local_only("Ray runs async generators only as async actor methods")
def test_async_generator_task(ray_start):
    @ray.remote
    async def ticks(n):
        for i in range(n):
            await asyncio.sleep(0)
            yield i * 10

    assert [ray.get(r) for r in ticks.remote(3)] == [0, 10, 20]
