"""Ray Core behaviours that Ray's docs and its own tests rely on, checked the way a program
written for Ray uses them (issue 20): actor classes, get/wait, call order, placement groups,
streaming generators, CPU accounting while blocked."""

import math
import time

import pytest

import raylite as ray


def test_actor_class_attributes_static_and_class_methods_as_in_ray(ray_start):
    @ray.remote
    class Limited:
        """A limited actor."""
        LIMIT = 3

        def limit(self):
            return Limited.LIMIT, type(self).LIMIT

        def scaled(self, x):
            return Limited.double(x) + Limited.plus_limit(0)

        @staticmethod
        def double(x):
            return 2 * x

        @classmethod
        def plus_limit(cls, x):
            return cls.LIMIT + x

    assert Limited.LIMIT == 3
    assert Limited.double(4) == 8 and Limited.plus_limit(1) == 4   # run here, as in Ray
    assert Limited.__name__ == "Limited" and Limited.__doc__ == "A limited actor."
    a = Limited.remote()
    assert ray.get(a.limit.remote()) == (3, 3)
    assert ray.get(a.scaled.remote(5)) == 13
    assert ray.get([a.double.remote(1), a.plus_limit.remote(1)]) == [2, 4]
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        Limited.nothing


def test_an_instance_attribute_named_like_a_method_does_not_hide_it(ray_start):
    @ray.remote
    class Counter:
        def __init__(self):
            self.value = 0

        def incr(self):
            self.value += 1

        def value(self):
            return self.value

    c = Counter.remote()
    c.incr.remote()
    assert ray.get(c.value.remote()) == 1


@pytest.mark.parametrize("call", ["get", "wait"])
def test_a_nan_or_bad_timeout_is_refused_naming_it(ray_start, call):
    ref = ray.put(1)
    run = (lambda t: ray.get(ref, timeout=t)) if call == "get" else (lambda t: ray.wait([ref], timeout=t))
    with pytest.raises(ValueError, match="timeout=nan"):
        run(math.nan)
    with pytest.raises(ValueError, match="timeout=-1"):
        run(-1)
    with pytest.raises(TypeError, match="timeout='1'"):
        run("1")
    assert run(math.inf) in (1, ([ref], []))   # no limit


def test_get_and_wait_refuse_what_is_no_ref_with_rays_types(ray_start):
    """Ray 2.x: get(42) is a ValueError (not a ref or a list), get([42]) and wait([42]) TypeErrors."""
    with pytest.raises(ValueError, match="Invalid type of object refs"):
        ray.get(42)
    with pytest.raises(TypeError, match="expects ObjectRefs, got int"):
        ray.get([42])
    with pytest.raises(TypeError, match="expects ObjectRefs, got int"):
        ray.wait([42])
    with pytest.raises(TypeError, match="expects a list of ObjectRefs, got int"):
        ray.wait(42)
