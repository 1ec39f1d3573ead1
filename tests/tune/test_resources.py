"""Per-config resources (tune.with_resources with a function, a class trainable's
default_resource_request, PlacementGroupFactory per config) and tune.search.Repeater."""
from __future__ import annotations

import pytest

pytest.importorskip("optuna")

from raylite import tune  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def timed(config):
    import time
    start = time.time()
    time.sleep(0.3)
    tune.report({"res": tune.get_trial_resources(), "start": start, "end": time.time()})


def test_resources_chosen_per_config_are_held_by_each_trial(ray_start, tmp_path):
    a = tune.run(tune.with_resources(timed, lambda config: {"cpu": config["n"]}),
                 config={"n": tune.grid_search([1, 2, 1, 0.5])}, storage_path=str(tmp_path), verbose=0)
    assert [t.last_result["res"] for t in a.trials] == [{"CPU": 1.0}, {"CPU": 2.0}, {"CPU": 1.0}, {"CPU": 0.5}]
    assert [t.resources for t in a.trials] == [t.last_result["res"] for t in a.trials]
    whole = next(t for t in a.trials if t.config["n"] == 2)
    for t in a.trials:   # the 2-CPU trial had the machine to itself
        if t is not whole:
            assert t.last_result["end"] <= whole.last_result["start"] + 0.05 or \
                t.last_result["start"] >= whole.last_result["end"] - 0.05


def test_tuner_takes_a_placement_group_factory_per_config(ray_start, tmp_path):
    def bundles(config):
        return tune.PlacementGroupFactory([{"CPU": config["n"]}, {"CPU": 0.5}])

    grid = tune.Tuner(tune.with_resources(timed, bundles), param_space={"n": tune.grid_search([0.5, 1.0])},
                      run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0)).fit()
    assert sorted(r.metrics["res"]["CPU"] for r in grid) == [1.0, 1.5]


def test_a_class_trainables_default_resource_request(ray_start, tmp_path):
    class Sized(tune.Trainable):
        @classmethod
        def default_resource_request(cls, config):
            return {"cpu": config["n"]}

        def step(self):
            return {"res": self.trial_resources, "done": True}

    a = tune.run(Sized, config={"n": tune.grid_search([0.5, 2])}, storage_path=str(tmp_path), verbose=0)
    assert [t.last_result["res"] for t in a.trials] == [{"CPU": 0.5}, {"CPU": 2.0}]


def test_a_config_no_node_can_hold_is_an_error(ray_start, tmp_path):
    with pytest.raises(ValueError, match=r"config \{'n': 64\}.*no node can ever hold"):
        tune.run(tune.with_resources(timed, lambda config: {"cpu": config["n"]}), config={"n": 64},
                 storage_path=str(tmp_path), verbose=0)


def test_repeater_runs_each_config_repeat_times(ray_start, tmp_path):
    from raylite.tune.search import BasicVariantGenerator, OptunaSearch, Repeater

    def trainable(config):
        tune.report({"loss": config["x"] + config.get("__trial_index__", 0)})

    a = tune.run(trainable, config={"x": tune.uniform(0, 1)}, num_samples=6, metric="loss", mode="min",
                 search_alg=Repeater(OptunaSearch(seed=1), repeat=3), storage_path=str(tmp_path), name="o", verbose=0)
    configs = [t.config for t in sorted(a.trials, key=lambda t: t.index)]
    assert [c["__trial_index__"] for c in configs] == [0, 1, 2] * 2
    assert len({c["x"] for c in configs[:3]}) == 1 and len({c["x"] for c in configs[3:]}) == 1
    assert configs[0]["x"] != configs[3]["x"]
    assert len(a.study.trials) == 2 and all(t.state.name == "COMPLETE" for t in a.study.trials)
    b = tune.run(trainable, config={"x": tune.uniform(0, 1)}, num_samples=2, storage_path=str(tmp_path), name="b",
                 search_alg=Repeater(BasicVariantGenerator(), repeat=2, set_index=False), verbose=0)
    assert all("__trial_index__" not in t.config for t in b.trials)
    with pytest.raises(ValueError, match="repeat=0"):
        Repeater(OptunaSearch(), repeat=0)
