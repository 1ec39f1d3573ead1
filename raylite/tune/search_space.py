"""Search spaces with Ray Tune's names, sampled through Optuna distributions.

Every sampled domain maps onto one Optuna distribution (`to_optuna`) and decodes Optuna's value
back (`decode`), so the same space drives Optuna's RandomSampler (the default search), TPE or any
other sampler. Bounds follow Ray Tune:

  uniform(a, b)        float in [a, b]             loguniform(a, b)   float in [a, b], log scale
  quniform(a, b, q)    float in [a, b], multiple of q (rounded)
  randint(a, b)        int in [a, b)  (upper exclusive)
  qrandint(a, b, q)    int in [a, b], multiple of q (upper inclusive, as in Ray)
  lograndint(a, b)     int in [a, b), log scale    choice(xs)         one of xs
  randn(mean, sd)      normal; Optuna samples the quantile u in (0, 1), value = mean + sd * Phi^-1(u)
  grid_search(xs)      every value of xs: the cartesian product of all grid axes, x num_samples
  sample_from(f)       f(spec) with spec.config the rest of the resolved config
"""
from __future__ import annotations

import math
import random
from statistics import NormalDist
from typing import Any, Callable

from optuna import distributions as od

_PRIMITIVE = (type(None), bool, int, float, str)
_EPS = 1e-9


class Domain:
    """A sampled parameter. Subclasses map themselves onto one Optuna distribution."""

    def to_optuna(self) -> od.BaseDistribution:
        raise NotImplementedError

    def encode(self, value):
        """A config value as Optuna stores it (for points_to_evaluate)."""
        return value

    def decode(self, value):
        return value

    def sample(self, config: dict | None = None, size: int = 1, random_state=None):
        """Values drawn without Optuna, as Ray's `Domain.sample`: one value, or a list of `size`.
        `random_state`: a seed, a `random.Random`, or numpy's RandomState/Generator (seeds one).
        `config` is Ray's argument for `sample_from` functions; a domain ignores it."""
        rng = _rng(random_state)
        values = [self._draw(rng) for _ in range(size)]
        return values[0] if size == 1 else values

    def _draw(self, rng: random.Random):
        dist = self.to_optuna()
        if isinstance(dist, od.CategoricalDistribution):
            return self.decode(rng.choice(dist.choices))
        if dist.log:
            raw = math.exp(rng.uniform(math.log(dist.low), math.log(dist.high)))
        else:
            raw = rng.uniform(dist.low, dist.high)
        if isinstance(dist, od.IntDistribution):
            raw = min(dist.high, max(dist.low, int(round(raw))))
        return self.decode(raw)


def _rng(random_state) -> random.Random:
    if random_state is None or isinstance(random_state, int):
        return random.Random(random_state)
    if isinstance(random_state, random.Random):
        return random_state
    if hasattr(random_state, "integers"):   # numpy Generator
        return random.Random(int(random_state.integers(0, 2**31 - 1)))
    if hasattr(random_state, "randint"):   # numpy RandomState
        return random.Random(int(random_state.randint(0, 2**31 - 1)))
    raise TypeError(f"random_state must be a seed, a random.Random or a numpy random state, got {random_state!r}")


def _quantize(value: float, q: float, low: float, high: float) -> float:
    v = round(value / q) * q
    # keep inside the bounds on the grid of q (Ray rounds; a value rounded past a bound moves back)
    while v > high + _EPS:
        v -= q
    while v < low - _EPS:
        v += q
    return v


def _divisible(span: float, q: float) -> bool:
    n = span / q
    return abs(n - round(n)) < 1e-6


class Float(Domain):
    def __init__(self, lower: float, upper: float, log: bool = False, q: float | None = None):
        lower, upper = float(lower), float(upper)
        if not lower < upper:
            raise ValueError(f"lower bound {lower} must be below upper bound {upper}")
        if log and lower <= 0:
            raise ValueError(f"a log-scale range needs lower > 0, got {lower}")
        if q is not None and q <= 0:
            raise ValueError(f"q must be positive, got {q}")
        self.lower, self.upper, self.log, self.q = lower, upper, log, q

    def to_optuna(self):
        step = None
        if self.q is not None and not self.log and _divisible(self.upper - self.lower, self.q) \
                and _divisible(self.lower, self.q):
            step = self.q   # Optuna samples the grid exactly
        return od.FloatDistribution(self.lower, self.upper, log=self.log, step=step)

    def encode(self, value):
        return float(value)

    def decode(self, value):
        value = float(value)
        if self.q is not None:
            value = _quantize(value, self.q, self.lower, self.upper)
        return value

    def __repr__(self):
        kind = "qloguniform" if self.log and self.q else "loguniform" if self.log else \
            "quniform" if self.q else "uniform"
        return f"{kind}({self.lower}, {self.upper}{', ' + str(self.q) if self.q else ''})"


class Integer(Domain):
    """Integers in [lower, upper] (both inclusive here; the constructors apply Ray's bounds)."""

    def __init__(self, lower: int, upper: int, log: bool = False, q: int | None = None, name: str = "randint"):
        if not isinstance(lower, int) or not isinstance(upper, int):
            raise TypeError(f"{name} bounds must be integers, got {lower!r}, {upper!r}")
        if upper < lower:
            raise ValueError(f"{name}: empty range [{lower}, {upper}]")
        if log and lower <= 0:
            raise ValueError(f"{name}: a log-scale range needs lower > 0, got {lower}")
        if q is not None and (not isinstance(q, int) or q <= 0):
            raise ValueError(f"{name}: q must be a positive integer, got {q!r}")
        self.lower, self.upper, self.log, self.q, self.name = lower, upper, log, q, name

    def to_optuna(self):
        step = 1
        if self.q and not self.log and (self.upper - self.lower) % self.q == 0 and self.lower % self.q == 0:
            step = self.q
        return od.IntDistribution(self.lower, self.upper, log=self.log, step=step)

    def encode(self, value):
        return int(value)

    def decode(self, value):
        value = int(value)
        if self.q and self.q > 1:
            value = int(_quantize(value, self.q, self.lower, self.upper))
        return value

    def __repr__(self):
        return f"{self.name}[{self.lower}..{self.upper}]"


class Categorical(Domain):
    def __init__(self, categories):
        categories = list(categories)
        if not categories:
            raise ValueError("choice() needs at least one category")
        self.categories = categories
        # Optuna stores None/bool/int/float/str; anything else is sampled by index.
        self.by_index = not all(isinstance(c, _PRIMITIVE) for c in categories)

    def to_optuna(self):
        if self.by_index:
            return od.CategoricalDistribution(list(range(len(self.categories))))
        return od.CategoricalDistribution(self.categories)

    def encode(self, value):
        return self.categories.index(value) if self.by_index else value

    def decode(self, value):
        return self.categories[value] if self.by_index else value

    def __repr__(self):
        return f"choice({self.categories!r})"


class Normal(Domain):
    def __init__(self, mean: float = 0.0, sd: float = 1.0, q: float | None = None):
        if sd <= 0:
            raise ValueError(f"randn: sd must be positive, got {sd}")
        self.mean, self.sd, self.q = float(mean), float(sd), q

    def to_optuna(self):
        return od.FloatDistribution(1e-6, 1 - 1e-6)   # the quantile

    def encode(self, value):
        return min(1 - 1e-6, max(1e-6, NormalDist(self.mean, self.sd).cdf(float(value))))

    def decode(self, value):
        v = NormalDist(self.mean, self.sd).inv_cdf(float(value))
        if self.q:
            v = round(v / self.q) * self.q
        return v

    def __repr__(self):
        return f"randn({self.mean}, {self.sd})"


class Function:
    """`sample_from(f)`: evaluated after the other parameters, with `spec.config` filled in."""

    def __init__(self, func: Callable):
        if not callable(func):
            raise TypeError(f"sample_from expects a callable, got {type(func).__name__}")
        self.func = func

    def __repr__(self):
        return f"sample_from({getattr(self.func, '__name__', 'f')})"


# ---------------------------------------------------------------------------- Ray's constructors
def uniform(lower: float, upper: float) -> Float:
    return Float(lower, upper)


def quniform(lower: float, upper: float, q: float) -> Float:
    return Float(lower, upper, q=q)


def loguniform(lower: float, upper: float, base: float = 10) -> Float:
    return Float(lower, upper, log=True)


def qloguniform(lower: float, upper: float, q: float, base: float = 10) -> Float:
    return Float(lower, upper, log=True, q=q)


def randint(lower: int, upper: int) -> Integer:
    """Integer in [lower, upper): upper is exclusive, as in Ray."""
    return Integer(lower, upper - 1, name="randint")


def qrandint(lower: int, upper: int, q: int = 1) -> Integer:
    """Integer in [lower, upper], a multiple of q: upper is inclusive, as in Ray."""
    return Integer(lower, upper, q=q, name="qrandint")


def lograndint(lower: int, upper: int, base: float = 10) -> Integer:
    """Integer in [lower, upper) on a log scale: upper exclusive, as in Ray."""
    return Integer(lower, upper - 1, log=True, name="lograndint")


def qlograndint(lower: int, upper: int, q: int, base: float = 10) -> Integer:
    return Integer(lower, upper, log=True, q=q, name="qlograndint")


def choice(categories) -> Categorical:
    return Categorical(categories)


def randn(mean: float = 0.0, sd: float = 1.0) -> Normal:
    return Normal(mean, sd)


def qrandn(mean: float, sd: float, q: float) -> Normal:
    return Normal(mean, sd, q)


def sample_from(func: Callable) -> Function:
    return Function(func)


def grid_search(values) -> dict:
    """Every value in turn; several grid axes give their cartesian product (Ray's dict form)."""
    values = list(values)
    if not values:
        raise ValueError("grid_search() needs at least one value")
    return {"grid_search": values}


# ---------------------------------------------------------------------------- parsing a config
def is_grid(value) -> bool:
    return isinstance(value, dict) and len(value) == 1 and "grid_search" in value


def path_name(path: tuple) -> str:
    return "/".join(str(p) for p in path)


class SearchSpace:
    """A config split into constants, grid axes, Optuna-sampled domains and sample_from functions."""

    def __init__(self, config: dict | None):
        self.config = dict(config or {})
        self.grids: list[tuple[tuple, list]] = []
        self.domains: list[tuple[tuple, Domain]] = []
        self.functions: list[tuple[tuple, Function]] = []
        self._walk(self.config, ())
        self.names = {path_name(p) for p, _ in self.grids + self.domains}

    def _walk(self, node, path: tuple) -> None:
        """Find the search spaces in nested dicts and lists (Ray's `"layers": [tune.grid_search(...), ...]`);
        a list element's path holds its index."""
        if isinstance(node, dict):
            items = node.items()
        elif isinstance(node, list):
            items = enumerate(node)
        else:
            if isinstance(node, tuple) and any(_searched(v) for v in node):
                raise ValueError(f"config {path_name(path)!r}: search spaces inside a tuple are not resolved; "
                                 f"use a list")
            return
        for key, value in items:
            p = path + (key,)
            if is_grid(value):
                self.grids.append((p, list(value["grid_search"])))
            elif isinstance(value, Domain):
                self.domains.append((p, value))
            elif isinstance(value, Function):
                self.functions.append((p, value))
            else:
                self._walk(value, p)

    @property
    def num_grid_points(self) -> int:
        return math.prod(len(v) for _, v in self.grids) if self.grids else 1

    def grid_point(self, index: int) -> dict[tuple, Any]:
        """The index-th combination of the grid axes; the first axis varies fastest (as in Ray)."""
        out = {}
        for path, values in self.grids:
            out[path] = values[index % len(values)]
            index //= len(values)
        return out

    def distributions(self) -> dict[str, od.BaseDistribution]:
        return {path_name(p): d.to_optuna() for p, d in self.domains}

    def grid_param(self, path: tuple, value) -> tuple[str, Any, od.BaseDistribution] | None:
        """How a grid value is recorded in Optuna (None when the axis is not primitive-valued)."""
        values = dict(self.grids)[path]
        if all(isinstance(v, _PRIMITIVE) for v in values):
            return path_name(path), value, od.CategoricalDistribution(_unique(values))
        return path_name(path), values.index(value), od.CategoricalDistribution(list(range(len(values))))

    def resolve(self, grid: dict[tuple, Any], sampled: dict[str, Any]) -> dict:
        """A concrete config: grid values, decoded Optuna values, then sample_from functions."""
        config = _copy(self.config)
        for path, value in grid.items():
            _set(config, path, value)
        for path, domain in self.domains:
            _set(config, path, domain.decode(sampled[path_name(path)]))
        pending = list(self.functions)
        for _ in range(len(pending) + 1):   # a function may read another's value: retry in rounds
            if not pending:
                break
            later = []
            for path, fn in pending:
                try:
                    _set(config, path, fn.func(_Spec(config)))
                except _Unresolved:
                    later.append((path, fn))
            if len(later) == len(pending):
                names = ", ".join(path_name(p) for p, _ in later)
                raise ValueError(f"sample_from for {names} depends on values that never resolve")
            pending = later
        return config


def _unique(values: list) -> list:
    out = []
    for v in values:
        if not any(v is o or (type(v) is type(o) and v == o) for o in out):
            out.append(v)
    return out


def _searched(value) -> bool:
    return is_grid(value) or isinstance(value, (Domain, Function))


def _copy(node):
    if isinstance(node, dict) and not is_grid(node):
        return {k: _copy(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_copy(v) for v in node]
    return node


def _set(config: dict, path: tuple, value) -> None:
    node = config
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


class _Unresolved(Exception):
    pass


class _AttrDict(dict):
    """spec.config: dict access and attribute access (`spec.config.lr`), as in Ray."""

    def __getitem__(self, key):
        value = dict.__getitem__(self, key)
        if isinstance(value, (Domain, Function)) or is_grid(value):
            raise _Unresolved(key)
        return _AttrDict(value) if isinstance(value, dict) else value

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def get(self, key, default=None):
        return self[key] if key in self else default


class _Spec:
    def __init__(self, config: dict):
        self.config = _AttrDict(config)


__all__ = ["Categorical", "Domain", "Float", "Function", "Integer", "Normal", "SearchSpace", "choice",
           "grid_search", "lograndint", "loguniform", "qlograndint", "qloguniform", "qrandint", "qrandn",
           "quniform", "randint", "randn", "sample_from", "uniform"]
