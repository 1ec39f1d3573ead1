"""Ray's import path for search-space domains: `from ray.tune.search.sample import Categorical, uniform`.
Ray's sampler classes (Uniform, LogUniform, Normal, Grid, Quantized) have no counterpart: each
domain here maps to one Optuna distribution instead."""
from raylite.tune.search_space import (Categorical, Domain, Float, Function, Integer, choice, lograndint,
                                       loguniform, qlograndint, qloguniform, qrandint, qrandn, quniform, randint,
                                       randn, sample_from, uniform)

__all__ = ["Categorical", "Domain", "Float", "Function", "Integer", "choice", "lograndint", "loguniform",
           "qlograndint", "qloguniform", "qrandint", "qrandn", "quniform", "randint", "randn", "sample_from",
           "uniform"]
