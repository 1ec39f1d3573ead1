"""Ray Tune's module paths (`ray.tune.error`, `.result_grid`, `.tune_config`, `.search.sample`,
`.experiment`) re-export raylite's classes, and `import raylite.tune` loads none of them."""
import subprocess
import sys

from raylite import tune


def test_ray_module_paths_reexport():
    from raylite.tune.error import TuneError
    from raylite.tune.experiment import Trial
    from raylite.tune.result_grid import ResultGrid
    from raylite.tune.search.sample import Categorical, Domain, Float, Integer, choice, randint, uniform
    from raylite.tune.tune_config import TuneConfig
    assert (TuneError, Trial, ResultGrid, TuneConfig) == (tune.TuneError, tune.Trial, tune.ResultGrid, tune.TuneConfig)
    assert isinstance(uniform(0, 1), Float) and isinstance(randint(0, 3), Integer)
    assert isinstance(choice([1, 2]), Categorical) and issubclass(Float, Domain)
    assert tune.error.TuneError is TuneError   # as attributes too, as in Ray


def test_import_tune_stays_light():
    code = ("import sys, raylite.tune\n"
            "heavy = {'optuna', 'raylite.tune.error', 'raylite.tune.result_grid', 'raylite.tune.tune_config',\n"
            "         'raylite.tune.search', 'raylite.tune.search.sample'} & set(sys.modules)\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True)
