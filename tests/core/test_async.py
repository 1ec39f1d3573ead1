"""`await ref` in coroutines and async actor methods, as in Ray."""
import asyncio

import pytest

import raylite as ray


pytestmark = pytest.mark.parametrize("ray_start", [1], indirect=True, ids=["1cpu"])


@pytest.mark.timeout(60)
def test_await_ref_in_driver_coroutine(ray_start):
    @ray.remote
    def inc(x):
        return x + 1

    async def main():
        return await inc.remote(1), await asyncio.gather(*[inc.remote(i) for i in range(3)])

    assert asyncio.run(main()) == (2, [1, 2, 3])


@pytest.mark.timeout(60)
def test_async_actor_method_awaits_task(ray_start):
    @ray.remote
    def double(x):
        return 2 * x

    @ray.remote
    class Async:
        async def run(self, x):
            return await double.remote(x) + 1

    actor = Async.remote()
    assert ray.get([actor.run.remote(i) for i in range(3)]) == [1, 3, 5]
