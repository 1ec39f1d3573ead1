"""`runtime_env` on the local runtime: env_vars, working_dir and py_modules for the job, a task
or an actor, applied before user code runs and inherited by nested work (Ray's runtime_env docs)."""
import os
import textwrap

import pytest

import raylite as ray


@ray.remote
def read_env(name):
    return os.environ.get(name)


@ray.remote
def nested_read(name):
    return ray.get(read_env.remote(name))


def test_doc_snippet_job_env_vars_reach_every_worker(ray_init):
    ray_init(num_cpus=2, runtime_env={"env_vars": {"RAYLITE_T_JOB": "job"}})
    assert ray.get(read_env.remote("RAYLITE_T_JOB")) == "job"

    @ray.remote
    class Reader:
        def read(self, name):
            return os.environ.get(name)

    assert ray.get(Reader.remote().read.remote("RAYLITE_T_JOB")) == "job"
    assert "RAYLITE_T_JOB" not in os.environ   # the driver's own environment is untouched


def test_task_env_vars_merge_over_the_job_and_are_inherited(ray_init):
    ray_init(num_cpus=2, runtime_env={"env_vars": {"A_VAR": "job", "B_VAR": "job"}})
    env = {"env_vars": {"B_VAR": "task"}}
    assert ray.get(read_env.options(runtime_env=env).remote("A_VAR")) == "job"
    assert ray.get(read_env.options(runtime_env=env).remote("B_VAR")) == "task"
    assert ray.get(read_env.remote("B_VAR")) == "job"   # workers are not shared across environments
    assert ray.get(nested_read.options(runtime_env=env).remote("B_VAR")) == "task"   # inherited


def test_variables_are_set_before_user_code_imports(ray_init, tmp_path):
    (tmp_path / "reads_at_import.py").write_text("import os\nSEEN = os.environ.get('RAYLITE_T_IMPORT')\n")
    ray_init(num_cpus=1)

    @ray.remote(runtime_env={"env_vars": {"RAYLITE_T_IMPORT": "early"}, "working_dir": str(tmp_path)})
    def imported():
        import reads_at_import
        return reads_at_import.SEEN, os.getcwd()

    seen, cwd = ray.get(imported.remote())
    assert seen == "early" and os.path.samefile(cwd, tmp_path)


def test_py_modules_make_a_package_importable(ray_init, tmp_path):
    pkg = tmp_path / "raylite_t_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        def answer():
            return 42
    """))
    ray_init(num_cpus=1)

    @ray.remote(runtime_env={"py_modules": [str(pkg)]})
    def use():
        import raylite_t_pkg
        return raylite_t_pkg.answer()

    assert ray.get(use.remote()) == 42


@pytest.mark.parametrize("env, error, match", [
    ({"env_vars": {"X": 1}}, TypeError, r"must map str to str, got 'X': 1"),
    ({"env_vars": ["X"]}, TypeError, r"env_vars'\] must be a dict"),
    ({"working_dir": "/no/such/dir"}, ValueError, r"working_dir'\]='/no/such/dir' is not a directory"),
    ({"working_dir": "s3://bucket/code.zip"}, ValueError, "remote URIs are not fetched"),
    ({"container": {"image": "x"}}, ValueError, "field 'container' is not supported"),
    ("env_vars", TypeError, "runtime_env must be a dict"),
])
def test_bad_runtime_env_names_the_field(ray_start, env, error, match):
    with pytest.raises(error, match=match):   # at submission: a Ray cluster accepts more
        ray.remote(runtime_env=env)(lambda: 1).remote()
    with pytest.raises(error, match=match):
        read_env.options(runtime_env=env).remote("X")

    @ray.remote
    class Actor:
        pass

    with pytest.raises(error, match=match):
        Actor.options(runtime_env=env).remote()


def test_bad_job_runtime_env_fails_init_before_starting_anything(ray_init):
    with pytest.raises(TypeError, match="init\\(\\): runtime_env\\['env_vars'\\]"):
        ray.init(num_cpus=1, runtime_env={"env_vars": {"X": 1}})
    assert not ray.is_initialized()


def test_pip_is_not_installed_but_warned_about(ray_start):
    from raylite.core import runtime_env
    runtime_env._warned.discard("pip")
    f = read_env.options(runtime_env={"pip": ["requests"], "env_vars": {"P": "1"}})
    with pytest.warns(UserWarning, match=r"installs nothing: runtime_env\['pip'\]"):
        ref = f.remote("P")
    assert ray.get(ref) == "1"
