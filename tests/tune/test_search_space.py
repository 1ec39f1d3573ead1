"""raylite.tune search spaces: every domain's bounds, grids, nesting, sample_from, through Optuna.

No runtime here: configs come from the searchers exactly as tune.run asks for them (an in-memory
Optuna study, `Searcher.suggest(study, index)`).
"""
from __future__ import annotations

import math
import statistics

import pytest

optuna = pytest.importorskip("optuna")

from raylite import tune  # noqa: E402
from raylite.tune.search import BasicVariantGenerator, OptunaSearch  # noqa: E402
from raylite.tune.search_space import SearchSpace  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)


def sample_configs(config, n, searcher=None, seed=0):
    searcher = searcher or BasicVariantGenerator(random_state=seed)
    searcher.set_search_space(config)
    study = optuna.create_study(sampler=searcher.sampler)
    out = []
    for i in range(n):
        cfg, trial = searcher.suggest(study, i)
        study.tell(trial, 0.0)
        out.append(cfg)
    return out


N = 300


def test_uniform_and_loguniform_bounds():
    cfgs = sample_configs({"u": tune.uniform(-2.0, 3.0), "l": tune.loguniform(1e-4, 1e-1)}, N)
    us, ls = [c["u"] for c in cfgs], [c["l"] for c in cfgs]
    assert all(-2.0 <= u <= 3.0 for u in us)
    assert all(1e-4 <= v <= 1e-1 for v in ls)
    assert min(us) < -1.5 and max(us) > 2.5            # spread over the range
    logs = [math.log10(v) for v in ls]                  # log-uniform: about uniform in log space
    assert sum(x < -2.5 for x in logs) > N * 0.3


def test_quniform_is_quantized_and_in_bounds():
    for lo, hi, q in ((0.0, 1.0, 0.25), (0.1, 0.95, 0.2)):   # divisible, and not
        for c in sample_configs({"q": tune.quniform(lo, hi, q)}, 100):
            v = c["q"]
            assert lo - 1e-9 <= v <= hi + 1e-9
            assert abs(v / q - round(v / q)) < 1e-6, v


def test_randint_upper_exclusive():
    vals = [c["r"] for c in sample_configs({"r": tune.randint(3, 7)}, N)]
    assert set(vals) == {3, 4, 5, 6}
    assert all(isinstance(v, int) for v in vals)


def test_qrandint_upper_inclusive_and_quantized():
    vals = {c["r"] for c in sample_configs({"r": tune.qrandint(0, 20, 5)}, N)}
    assert vals == {0, 5, 10, 15, 20}
    vals = {c["r"] for c in sample_configs({"r": tune.qrandint(1, 10, 3)}, N)}   # not divisible
    assert vals <= {0, 3, 6, 9} and all(1 <= v <= 10 for v in vals)


def test_lograndint_upper_exclusive():
    vals = [c["r"] for c in sample_configs({"r": tune.lograndint(1, 100)}, N)]
    assert all(1 <= v <= 99 and isinstance(v, int) for v in vals)
    assert 99 not in vals or max(vals) <= 99
    assert sum(v < 10 for v in vals) > N * 0.3          # log scale favours small values


def test_randn_mean_and_sd():
    vals = [c["n"] for c in sample_configs({"n": tune.randn(5.0, 2.0)}, 600)]
    assert abs(statistics.mean(vals) - 5.0) < 0.4
    assert 1.6 < statistics.stdev(vals) < 2.4


def test_choice_primitive_and_objects():
    objs = [[1, 2], {"a": 1}, None]
    cfgs = sample_configs({"c": tune.choice(["relu", "tanh"]), "o": tune.choice(objs)}, 100)
    assert {c["c"] for c in cfgs} == {"relu", "tanh"}
    seen = [c["o"] for c in cfgs]
    assert all(o in objs for o in seen) and len({repr(o) for o in seen}) == 3


def test_grid_product_times_num_samples_and_order():
    space = SearchSpace({"a": tune.grid_search([1, 2, 3]), "b": {"c": tune.grid_search(["x", "y"])}})
    assert space.num_grid_points == 6
    num_samples = 2
    cfgs = sample_configs({"a": tune.grid_search([1, 2, 3]), "b": {"c": tune.grid_search(["x", "y"])},
                           "u": tune.uniform(0, 1)}, 6 * num_samples)
    pairs = [(c["a"], c["b"]["c"]) for c in cfgs]
    assert pairs[:6] == [(1, "x"), (2, "x"), (3, "x"), (1, "y"), (2, "y"), (3, "y")]   # first axis fastest
    assert pairs[6:] == pairs[:6]                                                      # repeated num_samples times
    assert len({c["u"] for c in cfgs}) == 12                                           # sampled anew each trial


def test_grid_of_objects():
    cfgs = sample_configs({"layers": tune.grid_search([[8], [16, 8]])}, 4)
    assert [c["layers"] for c in cfgs] == [[8], [16, 8], [8], [16, 8]]


def test_nested_dicts_constants_and_sample_from():
    config = {
        "model": {"h": tune.choice([4, 8]), "act": "relu", "deep": {"drop": tune.uniform(0.0, 0.5)}},
        "lr": tune.loguniform(1e-3, 1e-1),
        "double_h": tune.sample_from(lambda spec: spec.config.model.h * 2),
        "lr_x10": tune.sample_from(lambda spec: spec.config["lr"] * 10),
        "chained": tune.sample_from(lambda spec: spec.config.double_h + 1),
        "seed": 7,
    }
    for c in sample_configs(config, 20):
        assert c["model"]["act"] == "relu" and c["seed"] == 7
        assert 0.0 <= c["model"]["deep"]["drop"] <= 0.5
        assert c["double_h"] == 2 * c["model"]["h"] and c["chained"] == c["double_h"] + 1
        assert math.isclose(c["lr_x10"], c["lr"] * 10)
    assert not isinstance(config["model"]["h"], int)   # the template is not modified


def test_optuna_params_recorded_with_path_names():
    searcher = BasicVariantGenerator(random_state=1)
    searcher.set_search_space({"a": tune.grid_search([1, 2]), "m": {"u": tune.uniform(0, 1)}})
    study = optuna.create_study(sampler=searcher.sampler)
    cfg, trial = searcher.suggest(study, 1)
    assert trial.params == {"a": 2, "m/u": cfg["m"]["u"]}


def test_seeded_search_is_reproducible():
    a = sample_configs({"u": tune.uniform(0, 1)}, 5, seed=3)
    b = sample_configs({"u": tune.uniform(0, 1)}, 5, seed=3)
    assert a == b


def test_domain_errors_and_sample():
    with pytest.raises(ValueError):
        tune.uniform(1, 1)
    with pytest.raises(ValueError):
        tune.loguniform(0, 1)
    with pytest.raises(ValueError):
        tune.randint(5, 5)
    with pytest.raises(ValueError):
        tune.choice([])
    assert 0 <= tune.uniform(0, 1).sample() <= 1
    assert tune.randint(0, 3).sample() in (0, 1, 2)


def test_optuna_search_rejects_grids_clearly():
    with pytest.raises(ValueError, match="grid_search"):
        OptunaSearch(metric="x", mode="min").set_search_space({"a": tune.grid_search([1, 2])})


def test_optuna_search_points_to_evaluate_first():
    searcher = OptunaSearch(metric="x", mode="min", seed=0, points_to_evaluate=[{"m": {"u": 0.25}, "c": "b"}])
    cfgs = sample_configs({"m": {"u": tune.uniform(0, 1)}, "c": tune.choice(["a", "b"])}, 3, searcher)
    assert cfgs[0] == {"m": {"u": 0.25}, "c": "b"}


def test_domain_sample_takes_rays_arguments():
    values = tune.randint(0, 10).sample(size=3)
    assert isinstance(values, list) and len(values) == 3 and all(0 <= v < 10 for v in values)
    assert tune.uniform(0, 1).sample(size=5, random_state=7) == tune.uniform(0, 1).sample(None, 5, 7)
    np = pytest.importorskip("numpy")
    assert tune.choice(["a", "b"]).sample(random_state=np.random.RandomState(0)) in ("a", "b")
    assert tune.loguniform(1e-4, 1e-1).sample(random_state=np.random.default_rng(0)) > 0
