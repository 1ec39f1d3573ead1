"""`ray.util.metrics` (Counter, Gauge, Histogram) from Ray's "Adding Application-Level Metrics"
docs, on raylite: points recorded in the driver, tasks and actors reach the driver's totals."""
import math
import pickle
import uuid
import warnings

import pytest

import raylite as ray
from raylite.util import metrics
from raylite.util.metrics import Counter, Gauge, Histogram


RAYS_OWN = ("on Ray the points go to Ray's own metrics agent (scrape its Prometheus endpoint); collect() and "
            "prometheus_text() total the local runtime's")


def _name(prefix: str) -> str:   # metrics live for the process: every test its own names
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def _series(name: str) -> list[dict]:
    return [row for row in metrics.collect() if row["name"] == name]


@pytest.mark.local_only(RAYS_OWN)
def test_tasks_actors_and_the_driver_add_up(ray_start):
    reqs, lat, depth = _name("reqs"), _name("latency_s"), _name("queue_depth")
    counter = Counter(reqs, description="requests served", tag_keys=("route",)).set_default_tags({"route": "/"})
    hist = Histogram(lat, boundaries=[0.1, 1.0], tag_keys=("route",))

    @ray.remote
    def serve(i, counter, hist):
        counter.inc()
        counter.inc(2, tags={"route": "/admin"})
        hist.observe(i * 0.3, tags={"route": "/"})
        return i

    @ray.remote
    class Queue:
        def __init__(self, name):
            self.gauge = Gauge(name, description="items waiting")

        def resize(self, n):
            self.gauge.set(n)
            return n

    assert ray.get([serve.remote(i, counter, hist) for i in range(5)]) == list(range(5))
    q = Queue.remote(depth)
    assert ray.get([q.resize.remote(n) for n in (3, 7)]) == [3, 7]
    counter.inc(10)   # the driver's own points join the workers'

    by_route = {row["tags"]["route"]: row["value"] for row in _series(reqs)}
    assert by_route == {"/": 15.0, "/admin": 10.0}
    [h] = _series(lat)   # 0, 0.3, 0.6, 0.9, 1.2
    assert h["type"] == "histogram" and h["count"] == 5 and h["sum"] == pytest.approx(3.0)
    assert h["buckets"] == {0.1: 1, 1.0: 4, math.inf: 5}
    [g] = _series(depth)
    assert (g["type"], g["value"], g["description"]) == ("gauge", 7.0, "items waiting")

    text = metrics.prometheus_text()
    assert f"# HELP {reqs}_total requests served" in text
    assert f'{reqs}_total{{route="/admin"}} 10.0' in text   # counters exported with _total, as Ray does
    assert f'{lat}_bucket{{route="/",le="+Inf"}} 5' in text
    assert f"{depth} 7.0" in text


@pytest.mark.local_only(RAYS_OWN)
def test_points_recorded_after_the_last_call_arrive_when_the_actor_exits(ray_start, wait_until, tmp_path):
    name = _name("late")
    go, done = tmp_path / "go", tmp_path / "set"

    @ray.remote
    class Background:
        def start(self, name, go, done):
            import os
            import threading
            import time
            gauge = Gauge(name)

            def later():
                while not os.path.exists(go):
                    time.sleep(0.01)
                gauge.set(42)
                open(done, "w").close()
            threading.Thread(target=later).start()

    actor = Background.remote()
    ray.get(actor.start.remote(name, str(go), str(done)))
    assert _series(name) == []
    go.touch()        # the thread sets it now, after the last call finished
    wait_until(done.exists, timeout=10, what="the actor's thread setting the gauge")
    del actor         # the last handle: the actor exits, reporting first
    assert wait_until(lambda: [r["value"] for r in _series(name)] == [42.0], timeout=10)


def test_bad_input_names_the_field_and_value():
    with pytest.raises(ValueError, match="needs a name"):
        Counter("")
    with pytest.raises(TypeError, match="tag_keys must be a tuple"):
        Counter(_name("c"), tag_keys=["a"])
    with pytest.raises(TypeError, match="tag keys must be str"):
        Gauge(_name("g"), tag_keys=("a", 1))
    c = Counter(_name("c"), tag_keys=("a",))
    with pytest.raises(ValueError, match="unrecognized tag key 'b'"):
        c.set_default_tags({"b": "x"})
    with pytest.raises(ValueError, match="value must be > 0, got 0"):
        c.inc(0, tags={"a": "x"})
    with pytest.raises(ValueError, match="must be > 0, got -1"):
        c.inc(-1, tags={"a": "x"})
    with pytest.raises(TypeError, match="value must be int or float, got str"):
        c.inc("1", tags={"a": "x"})
    with pytest.raises(ValueError, match="missing value for tag key"):
        c.inc()
    with pytest.raises(TypeError, match="tag values must be str"):
        c.inc(tags={"a": 1})
    with pytest.raises(ValueError, match="needs boundaries"):
        Histogram(_name("h"))
    with pytest.raises(ValueError, match="positive numbers, got -1 at index 1"):
        Histogram(_name("h"), boundaries=[1, -1])
    with pytest.raises(ValueError, match="boundaries must increase, got 1 after 2"):
        Histogram(_name("h"), boundaries=[2, 1])
    taken = _name("taken")
    Counter(taken)
    with pytest.raises(ValueError, match=f"'{taken}' is already a counter"):
        Gauge(taken)


def test_a_name_prometheus_rejects_is_discarded_with_a_warning():
    name = "9" + _name("bad")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = Gauge(name)
    assert any("invalid metric name" in str(w.message) for w in caught)
    g.set(1.0)   # accepted, and dropped
    assert _series(name) == []


def test_gauge_set_none_does_nothing_and_pickling_keeps_the_metric():
    name = _name("g")
    g = Gauge(name, description="d", tag_keys=("k",)).set_default_tags({"k": "v"})
    g.set(None)
    assert _series(name) == []
    copy = pickle.loads(pickle.dumps(g))
    assert copy.info == {"name": name, "description": "d", "tag_keys": ("k",), "default_tags": {"k": "v"}}
    copy.set(5)
    assert [(r["tags"], r["value"]) for r in _series(name)] == [({"k": "v"}, 5.0)]
    h = pickle.loads(pickle.dumps(Histogram(_name("h"), boundaries=[1, 2])))
    assert h.info["boundaries"] == [1, 2]


@pytest.mark.local_only(RAYS_OWN)
def test_an_actors_own_threads_are_reported_between_calls(ray_start, wait_until, tmp_path):
    name, go = _name("heartbeat"), tmp_path / "go"

    @ray.remote
    class Service:
        def start(self, name, go):
            import os
            import threading
            import time
            counter = Counter(name)

            def beat():
                while not os.path.exists(go):   # the beats come after the call has returned
                    time.sleep(0.01)
                for _ in range(3):
                    counter.inc()
            threading.Thread(target=beat, daemon=True).start()

    service = Service.remote()
    ray.get(service.start.remote(name, str(go)))
    assert _series(name) == []
    go.touch()
    # no call finishes after them, and the actor lives on: they arrive with the periodic report
    assert wait_until(lambda: [r["value"] for r in _series(name)] == [3.0], timeout=15)
    ray.get(service.start.remote(_name("again"), str(go)))   # the actor still serves calls


@pytest.mark.local_only("raylite's own polling (raylite.core.wire.polling)")
def test_a_worker_that_records_metrics_still_polls_for_its_next_task(ray_start):
    """The thread that reports a worker's points between calls sleeps: the worker's wait for
    its next task polls as before (a user's thread would stop that)."""
    name = _name("polled")

    @ray.remote
    def record_then_look(name):
        import threading
        import time

        from raylite.core.wire import polling
        Counter(name).inc()   # starts the reporting thread
        deadline = time.monotonic() + 5
        while not polling.alone() and time.monotonic() < deadline:   # until it is in its sleep
            time.sleep(0.01)
        return polling.alone(), sorted(t.name for t in threading.enumerate())

    alone, threads = ray.get(record_then_look.remote(name))
    assert "raylite-metrics" in threads
    assert alone
