"""`runtime_env` on the local runtime: env_vars, working_dir and py_modules for the job, a task
or an actor, applied before user code runs and inherited by nested work (Ray's runtime_env docs)."""
import logging
import os
import textwrap

import pytest
from helpers import make_wheel

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


@pytest.mark.local_only("Ray takes a local working_dir or py_modules path only in init(), not per task or actor")
def test_variables_are_set_before_user_code_imports(ray_init, tmp_path):
    (tmp_path / "reads_at_import.py").write_text("import os\nSEEN = os.environ.get('RAYLITE_T_IMPORT')\n")
    ray_init(num_cpus=1)

    @ray.remote(runtime_env={"env_vars": {"RAYLITE_T_IMPORT": "early"}, "working_dir": str(tmp_path)})
    def imported():
        import reads_at_import
        return reads_at_import.SEEN, os.getcwd()

    seen, cwd = ray.get(imported.remote())
    assert seen == "early" and os.path.isfile(os.path.join(cwd, "reads_at_import.py"))   # (in its copy)


@pytest.mark.local_only("Ray takes a local working_dir or py_modules path only in init(), not per task or actor")
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


@pytest.mark.local_only("${VAR} expands against the Ray cluster's environment, not the driver's")
def test_env_vars_expand_against_the_workers_environment(ray_init, monkeypatch):
    monkeypatch.setenv("RAYLITE_T_BASE", "/base")   # the worker's environment is the driver's at init
    monkeypatch.delenv("RAYLITE_T_UNSET", raising=False)
    ray_init(num_cpus=1, runtime_env={"env_vars": {"RAYLITE_T_BASE": "${RAYLITE_T_BASE}:/x",
                                                   "RAYLITE_T_GONE": "a${RAYLITE_T_UNSET}b"}})
    assert ray.get(read_env.remote("RAYLITE_T_BASE")) == "/base:/x"
    assert ray.get(read_env.remote("RAYLITE_T_GONE")) == "ab"   # an unset ${VAR} is "", as in Ray
    assert os.environ["RAYLITE_T_BASE"] == "/base"


def _record_pid_and_log_level(path):
    def hook():
        logging.getLogger().setLevel(logging.DEBUG)
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")
    return hook


@ray.remote
def pid_and_log_level():
    return os.getpid(), logging.getLogger().level


def test_setup_hook_runs_once_in_each_worker_before_its_work(ray_init, tmp_path):
    runs = tmp_path / "runs"
    driver_level = logging.getLogger().level
    ray_init(num_cpus=2, runtime_env={"worker_process_setup_hook": _record_pid_and_log_level(str(runs))})

    @ray.remote
    class Logs:
        def level(self):
            return os.getpid(), logging.getLogger().level

    seen = ray.get([pid_and_log_level.remote() for _ in range(6)]) + [ray.get(Logs.remote().level.remote())]
    assert {level for _, level in seen} == {logging.DEBUG}
    lines = runs.read_text().split()
    assert sorted(lines) == sorted({str(pid) for pid, _ in seen})   # once per worker process
    assert logging.getLogger().level == driver_level   # not run in the driver, as in Ray


@pytest.mark.local_only("Ray takes a local working_dir or py_modules path only in init(), not per task or actor")
def test_setup_hook_by_name_is_imported_in_the_worker(ray_init, tmp_path):
    (tmp_path / "raylite_t_hooks.py").write_text("import os\n\ndef setup():\n"
                                                 "    os.environ['RAYLITE_T_HOOKED'] = 'yes'\n")
    ray_init(num_cpus=1)
    env = {"working_dir": str(tmp_path), "worker_process_setup_hook": "raylite_t_hooks.setup"}
    assert ray.get(read_env.options(runtime_env=env).remote("RAYLITE_T_HOOKED")) == "yes"
    assert ray.get(read_env.remote("RAYLITE_T_HOOKED")) is None   # other environments: other workers


def _failing_hook():
    raise ValueError("Setup Failed")


@pytest.mark.local_only("Ray takes a callable worker_process_setup_hook only in init(), not per task or actor")
def test_a_failing_setup_hook_fails_the_work_naming_it(ray_start):
    with pytest.raises(ray.exceptions.RuntimeEnvSetupError,
                       match="(?s)Failed to execute the setup hook method '_failing_hook'.*Setup Failed"):
        ray.get(read_env.options(runtime_env={"worker_process_setup_hook": _failing_hook}).remote("X"))

    @ray.remote
    class Actor:
        def ping(self):
            return "ran"

    actor = Actor.options(runtime_env={"worker_process_setup_hook": "raylite_no_such_module.setup"}).remote()
    with pytest.raises(ray.exceptions.ActorDiedError, match="setup hook method 'raylite_no_such_module.setup'"):
        ray.get(actor.ping.remote(), timeout=30)
    assert ray.get(read_env.remote("X")) is None   # work without the hook is unaffected
    import threading
    lock = threading.Lock()
    with pytest.raises(ray.exceptions.RuntimeEnvSetupError, match="Failed to export the setup function"):
        read_env.options(runtime_env={"worker_process_setup_hook": lambda: print(lock)}).remote("X")


@pytest.mark.local_only("Ray keeps its working_dir copy in its session directory")
def test_working_dir_runs_in_a_copy_without_excluded_files(ray_init, tmp_path):
    src = tmp_path / "project"
    for path, text in {"main_mod.py": "VALUE = 1\n", "data/big.bin": "x", "notes/a.log": "log", "notes/keep.txt": "k",
                       ".gitignore": "*.log\n", ".git/HEAD": "ref", "cache/c.txt": "c", "notes/.rayignore": "/s*\n",
                       "notes/secret.txt": "s", "secret.txt": "not notes'"}.items():
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        (src / path).write_text(text)
    ray_init(num_cpus=1, runtime_env={"working_dir": str(src), "excludes": ["/data", "cache/"]})

    @ray.remote
    def look():
        import main_mod
        with open("written.txt", "w") as f:   # a file the task writes: into the copy only
            f.write("x")
        files = {os.path.relpath(os.path.join(d, f)) for d, _, fs in os.walk(".") for f in fs}
        return os.getcwd(), main_mod.VALUE, sorted(files - {"written.txt"})

    cwd, value, files = ray.get(look.remote())
    assert value == 1 and not os.path.samefile(cwd, src)
    assert [f for f in files if "__pycache__" not in f] == [".gitignore", "main_mod.py", "notes/.rayignore",
                                                            "notes/keep.txt", "secret.txt"]
    assert not (src / "written.txt").exists()
    assert ray.get(look.remote())[0] == cwd   # one copy, reused
    ray.shutdown()
    assert not os.path.exists(cwd)   # the session's copies go with it


@pytest.mark.local_only("Ray takes a local working_dir or py_modules path only in init(), not per task or actor")
def test_working_dir_over_the_size_limit_fails_the_work(ray_init, tmp_path, monkeypatch):
    (tmp_path / "big.bin").write_bytes(b"x" * 4096)
    monkeypatch.setenv("RAY_max_grpc_message_size", "1000")   # Ray's limit (512 MiB unless set)
    ray_init(num_cpus=1)
    with pytest.raises(ray.exceptions.RuntimeEnvSetupError, match="holds 0.00 MiB, more than the limit"):
        ray.get(read_env.options(runtime_env={"working_dir": str(tmp_path)}).remote("X"), timeout=30)
    env = {"working_dir": str(tmp_path), "excludes": ["*.bin"]}
    assert ray.get(read_env.options(runtime_env=env).remote("X"), timeout=30) is None


@pytest.mark.local_only("Ray takes a local working_dir or py_modules path only in init(), not per task or actor")
def test_py_modules_are_copied_alone(ray_init, tmp_path):
    pkg = tmp_path / "raylite_t_copied"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("VALUE = 5\n")
    (tmp_path / "raylite_t_sibling.py").write_text("")
    ray_init(num_cpus=1)

    @ray.remote(runtime_env={"py_modules": [str(pkg)]})
    def use():
        import raylite_t_copied
        try:
            import raylite_t_sibling  # noqa: F401
        except ImportError:
            return raylite_t_copied.VALUE, raylite_t_copied.__file__
        return "the package's folder was put on sys.path", None

    value, where = ray.get(use.remote())
    assert value == 5 and not where.startswith(str(tmp_path)) and where.endswith("raylite_t_copied/__init__.py")


def test_runtime_env_object_has_rays_accessors(tmp_path):
    from raylite.runtime_env import RuntimeEnv
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("requests\ntoolz==1.0\n")
    env = RuntimeEnv(env_vars={"A": "1"}, working_dir="/w", py_modules=["/m"], pip=str(reqs),
                     config={"eager_install": False})
    assert env.env_vars() == {"A": "1"} and env.working_dir() == "/w" and env.has_working_dir()
    assert env.py_modules() == ["/m"] and env.has_pip() and not env.has_uv() and not env.has_conda()
    assert env.pip_config() == {"packages": ["requests", "toolz==1.0"], "pip_check": False}
    assert env.get("working_dir") == "/w" and env.get("conda", "none") == "none"
    assert env.to_dict()["config"]["eager_install"] is False and env.py_executable() is None
    empty = RuntimeEnv(conda="my-env", uv={"packages": ["x"]}, _validate=False)
    assert empty.env_vars() == {} and empty.working_dir() == "" and empty.py_modules() == []
    assert empty.conda_env_name() == "my-env" and empty.conda_config() is None
    assert empty.uv_config() == {"packages": ["x"], "uv_check": False} and empty.pip_config() == {}
    assert RuntimeEnv(my_plugin={"k": 1}).plugins() == [("my_plugin", {"k": 1})]


@pytest.mark.parametrize("env, error, match", [
    ({"env_vars": {"X": 1}}, TypeError, r"must map str to str, got 'X': 1"),
    ({"env_vars": ["X"]}, TypeError, r"env_vars'\] must be a dict"),
    ({"working_dir": "/no/such/dir"}, ValueError, r"working_dir'\]='/no/such/dir' is not a directory"),
    ({"working_dir": "s3://bucket/code.zip"}, ValueError, "remote URIs are not fetched"),
    ({"container": {"image": "x"}}, ValueError, "field 'container' is not supported"),
    ({"excludes": "*.log"}, TypeError, r"excludes'\] must be a list"),
    ({"worker_process_setup_hook": "setup"}, ValueError, "must be a callable or a 'module.function' name"),
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


@pytest.fixture
def offline_pip(tmp_path, monkeypatch):
    """pip installs from local wheels only, into environments under tmp_path."""
    monkeypatch.setenv("RAYLITE_RUNTIME_ENV_DIR", str(tmp_path / "envs"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    return tmp_path


@pytest.mark.local_only("Ray's pip plugin builds a virtualenv (needs the package), with its own errors")
def test_pip_packages_are_installed_for_the_task_that_asks_only(ray_start, offline_pip):
    wheel = make_wheel(offline_pip, "raylite_probe_pkg", "1.0", "VALUE = 42\n")

    @ray.remote(runtime_env={"pip": [wheel]})
    def probe():
        import raylite_probe_pkg
        return raylite_probe_pkg.VALUE, raylite_probe_pkg.__file__

    @ray.remote
    def plain():
        try:
            import raylite_probe_pkg  # noqa: F401
        except ImportError:
            return "not installed"
        return "installed"

    value, where = ray.get(probe.remote(), timeout=120)
    assert value == 42 and where.startswith(str(offline_pip / "envs"))
    assert ray.get(plain.remote()) == "not installed"   # the driver's Python is untouched too
    with pytest.raises(ImportError):
        import raylite_probe_pkg  # noqa: F401
    envs = sorted(os.listdir(offline_pip / "envs"))
    assert len(envs) == 1 and ".tmp-" not in envs[0]
    # a requirements file in the dict form names the same list: the same environment, reused
    reqs = offline_pip / "requirements.txt"
    reqs.write_text(f"# the probe\n{wheel}\n")
    again = probe.options(runtime_env={"pip": {"packages": str(reqs), "pip_check": False}})
    assert ray.get(again.remote(), timeout=30)[0] == 42
    assert sorted(os.listdir(offline_pip / "envs")) == envs


@pytest.mark.local_only("Ray's pip plugin builds a virtualenv (needs the package), with its own errors")
def test_a_failed_install_fails_the_work_with_the_installers_words(ray_start, offline_pip):
    @ray.remote
    def never():
        return "ran"

    @ray.remote
    class Never:
        def ping(self):
            return "ran"

    env = {"pip": ["raylite-no-such-package==9.9"]}
    with pytest.raises(ray.exceptions.RuntimeEnvSetupError, match="No matching distribution"):
        ray.get(never.options(runtime_env=env).remote(), timeout=120)
    actor = Never.options(runtime_env=env).remote()
    with pytest.raises(ray.exceptions.ActorDiedError, match="RuntimeEnvSetupError"):
        ray.get(actor.ping.remote(), timeout=60)
    assert ray.get(never.remote()) == "ran"
    assert os.listdir(offline_pip / "envs") == []   # nothing half-built is kept


def _children_running(word: str) -> list[int]:
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and word.encode() in cmdline:
            pids.append(int(pid))
    return pids


@pytest.mark.local_only("Ray's pip plugin builds a virtualenv (needs the package), with its own errors")
def test_a_hung_install_times_out_and_shutdown_stops_the_installer(ray_init, offline_pip, monkeypatch,
                                                                   wait_until, wait_pids_gone):
    import socket
    silent = socket.create_server(("127.0.0.1", 0))   # an index that accepts and never answers
    monkeypatch.delenv("PIP_NO_INDEX")
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{silent.getsockname()[1]}/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_RETRIES", "0")
    try:
        ray_init(num_cpus=1)
        env = {"pip": ["raylite-slow-package"], "config": {"setup_timeout_seconds": 2}}
        with pytest.raises(ray.exceptions.RuntimeEnvSetupError, match="setup_timeout_seconds=2"):
            ray.get(read_env.options(runtime_env=env).remote("X"), timeout=60)
        read_env.options(runtime_env={"pip": ["raylite-other-package"]}).remote("X")
        installers = wait_until(lambda: _children_running("raylite-other-package"), timeout=30)
        ray.shutdown()
        wait_pids_gone(installers, timeout=10, what="the pip installer")
    finally:
        silent.close()


def test_pip_field_is_checked_where_it_is_given():
    with pytest.raises(TypeError, match=r"runtime_env\['pip'\] must be a list of requirement strings"):
        read_env.options(runtime_env={"pip": [1]})
    with pytest.raises(ValueError, match="cannot have both 'pip' and 'uv'"):
        read_env.options(runtime_env={"pip": ["a"], "uv": ["b"]})
    with pytest.raises(ValueError, match="needs 'packages'"):
        read_env.options(runtime_env={"pip": {"pip_version": "==23"}})
    with pytest.raises(ValueError, match="neither a list of requirements nor a readable requirements file"):
        read_env.options(runtime_env={"pip": "/no/such/requirements.txt"})
    with pytest.raises(ValueError, match=r"setup_timeout_seconds'\] must be a positive int"):
        read_env.options(runtime_env={"pip": ["a"], "config": {"setup_timeout_seconds": 0}})
