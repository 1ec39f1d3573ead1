"""A @numba.jit function called inside a task, defined at module level of an importable module
and in __main__ (a script run as a subprocess), as in the seed's pattern."""
import os
import subprocess
import sys
import textwrap

from helpers import REPO_ROOT

REPO = REPO_ROOT

JITTED = """
import numba
import numpy as np

@numba.jit(nopython=True)
def total(a):
    s = 0.0
    for x in a:
        s += x
    return s
"""


def _run(tmp_path, script: str) -> str:
    (tmp_path / "script.py").write_text(textwrap.dedent(script))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    done = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_jitted_function_from_an_importable_module_runs_in_tasks(tmp_path):
    import numba  # noqa: F401 - the dev extra has it: without it this test fails, as it should
    (tmp_path / "jitmod.py").write_text(JITTED)
    out = _run(tmp_path, """
        import os
        import numpy as np
        import raylite as ray
        import jitmod

        @ray.remote
        def in_task(n):
            return jitmod.total(np.arange(n, dtype=np.float64)), os.getpid()

        ray.init(num_cpus=1)
        value, pid = ray.get(in_task.remote(10))
        direct = ray.get(ray.remote(jitmod.total).remote(np.arange(5.0)))   # the dispatcher itself as a task
        print(value, direct, pid != os.getpid())
        ray.shutdown()
    """)
    assert out.split() == ["45.0", "10.0", "True"]


def test_a_jitted_function_in_main_runs_in_tasks(tmp_path):
    import numba  # noqa: F401
    out = _run(tmp_path, JITTED + """
import os
import raylite as ray

@ray.remote
def in_task(n):
    return total(np.arange(n, dtype=np.float64)), os.getpid()

if __name__ == "__main__":
    ray.init(num_cpus=1)
    value, pid = ray.get(in_task.remote(10))
    print(value, pid != os.getpid(), ray.get(ray.remote(total).remote(np.ones(3))))
    ray.shutdown()
""")
    assert out.split() == ["45.0", "True", "3.0"]
