"""`runtime_env` on the local runtime: environment variables, a working directory, extra Python
modules, pip (or uv) packages and a setup hook for a job's, a task's or an actor's workers.

Everything here is applied when a worker is forked, before any user code runs (so frameworks see
the variables at import), and workers are reused only by work with the same environment, as Ray
dedicates workers per runtime environment. A child's ``runtime_env`` inherits its parent's (the
job's, or the submitting task's): its fields replace the parent's, except ``env_vars``, which
are merged. ``working_dir`` and local ``py_modules`` run from a copy (raylite.core.envs.working_dir),
and ``pip`` and ``uv`` packages are installed (raylite.core.envs.pip), before the work starts;
``conda`` installs nothing (raylite warns once), and remote URIs are not fetched.
"""
from __future__ import annotations

import functools
import os
import re
import types
import warnings

Env = tuple   # normalized form: sorted (field, value) pairs, hashable, None when empty

DEFAULT_SETUP_TIMEOUT_S = 600
INSTALLERS = ("pip", "uv")   # fields whose packages raylite.core.envs.pip installs (imported when used)
_NOT_INSTALLED = {"conda"}
_IGNORED = {"_ray_commit"}
_HOOK = "worker_process_setup_hook"
_MAX_HOOK_BYTES = 256 * 1024   # it travels in the zygote's fork request (raylite.core.worker.zygote)
_UNSET_REFERENCE = re.compile(r"\$\{[A-Z0-9_]+\}")
_warned: set[str] = set()


class SetupHook(str):
    """A callable ``worker_process_setup_hook``, pickled: it shows as its name (as Ray reports
    it), and equals only the same pickled function, so work with another hook gets other workers."""

    def __new__(cls, name: str, pickled: bytes):
        self = super().__new__(cls, name)
        self.pickled = pickled
        return self

    def __eq__(self, other) -> bool:
        return isinstance(other, SetupHook) and self.pickled == other.pickled

    def __ne__(self, other) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self.pickled)

    def __reduce__(self):
        return SetupHook, (str(self), self.pickled)


def normalize(runtime_env, where: str) -> Env | None:
    """Check a user's ``runtime_env`` (naming the bad field and value) and make it hashable."""
    if runtime_env is None:
        return None
    if hasattr(runtime_env, "to_dict"):   # ray.runtime_env.RuntimeEnv
        runtime_env = runtime_env.to_dict()
    if not isinstance(runtime_env, dict):
        raise TypeError(f"{where}: runtime_env must be a dict, got {type(runtime_env).__name__}")
    out = {}
    for field, value in runtime_env.items():
        if field == "env_vars":
            out[field] = _env_vars(value, where)
        elif field == "working_dir":
            out[field] = _local_dir(value, f"{where}: runtime_env['working_dir']")
        elif field == "py_modules":
            out[field] = tuple(_module_source(m, where) for m in _as_list(value, field, where))
        elif field == "excludes":
            if value:
                out[field] = _excludes(value, where)
        elif field == _HOOK:
            if value is not None:
                out[field] = _setup_hook(value, where)
        elif field in INSTALLERS:
            if value is not None:
                from raylite.core.envs import pip as pip_envs
                out[field] = pip_envs.requirements(field, value, where)
        elif field == "config":
            if value is not None:
                out[field] = _config(value, where)
        elif field in _NOT_INSTALLED:
            if field not in _warned:
                _warned.add(field)
                warnings.warn(f"{where}: raylite's local runtime installs nothing: runtime_env[{field!r}] is "
                              f"ignored, so those packages must already be installed in this Python "
                              f"(or run on a Ray cluster with backend='ray')", UserWarning, stacklevel=5)
        elif field not in _IGNORED:
            raise ValueError(f"{where}: runtime_env field {field!r} is not supported by raylite's local "
                             f"runtime (supported: env_vars, working_dir, py_modules, excludes, pip, uv, "
                             f"conda as already installed, worker_process_setup_hook, config)")
    if "pip" in out and "uv" in out:
        raise ValueError(f"{where}: runtime_env cannot have both 'pip' and 'uv' (as in Ray): pick one installer")
    return tuple(sorted(out.items())) or None


def site_dirs(env: Env | None) -> list[str]:
    """The installed packages' directory, whose .pth files a worker processes (editable installs)."""
    install = to_install(env)
    if install is None:
        return []
    from raylite.core.envs import pip as pip_envs
    return [pip_envs.site_dir(pip_envs.env_dir(install[0], install[1]))]


def to_dict(env: Env | None) -> dict:
    """The normalized form as the dict a user writes (for the state API)."""
    out = {}
    for field, value in env or ():
        out[field] = dict(value) if field in ("env_vars", "config") else list(value) if isinstance(value, tuple) \
            else str(value)
    return out


def _config(value, where: str) -> tuple:
    """``config`` (a dict or RuntimeEnvConfig): its setup timeout is what applies here."""
    if not isinstance(value, dict):
        raise TypeError(f"{where}: runtime_env['config'] must be a dict or RuntimeEnvConfig, got {value!r}")
    timeout = value.get("setup_timeout_seconds", DEFAULT_SETUP_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or (timeout <= 0 and timeout != -1):
        raise ValueError(f"{where}: runtime_env['config']['setup_timeout_seconds'] must be a positive int or -1 "
                         f"(no timeout), got {timeout!r}")
    return (("setup_timeout_seconds", timeout),)


@functools.lru_cache(maxsize=256)   # asked for every task submitted (raylite.core.node.env_setup)
def to_install(env: Env | None) -> tuple | None:
    """(field, requirements, timeout in seconds or None) when the environment has packages to install."""
    if not env:
        return None
    fields = dict(env)
    for field in INSTALLERS:
        if field in fields:
            timeout = dict(fields.get("config", ())).get("setup_timeout_seconds", DEFAULT_SETUP_TIMEOUT_S)
            return field, fields[field], None if timeout == -1 else timeout
    return None


@functools.lru_cache(maxsize=256)
def setups(env: Env | None) -> tuple[tuple, ...]:
    """What must be ready before a worker with this environment starts, in order: a copy of its
    working_dir and of each local py_modules entry, ("copy", kind, path, excludes), then its
    packages, (installer, requirements, timeout) as in to_install."""
    fields = dict(env or ())
    excludes = fields.get("excludes", ())
    out = [("copy", "working_dir", fields["working_dir"], excludes)] if "working_dir" in fields else []
    out += [("copy", "py_modules", m, excludes) for m in fields.get("py_modules", ())]
    install = to_install(env)
    return tuple(out) + ((install,) if install else ())


def merge(parent: Env | None, child: Env | None) -> Env | None:
    """The child's fields win; ``env_vars`` are merged, the child's value winning per variable."""
    if not parent or not child:
        return parent or child
    merged = dict(parent)
    for field, value in child:
        if field == "env_vars" and "env_vars" in merged:
            value = tuple(sorted({**dict(merged["env_vars"]), **dict(value)}.items()))
        merged[field] = value
    return tuple(sorted(merged.items()))


def worker_settings(env: Env | None, sys_path: list[str], cwd: str) -> tuple[dict, list[str], str]:
    """(variables to set, sys.path, working directory) for a worker with this environment: the
    copies of its working_dir and py_modules (see setups: ready by now), then its installed
    packages, come first on sys.path, as in Ray."""
    if not env:
        return {}, sys_path, cwd
    from raylite.core.envs import working_dir
    fields = dict(env)
    excludes = fields.get("excludes", ())
    extra = [working_dir.copy_of("working_dir", fields["working_dir"], excludes)] if "working_dir" in fields else []
    for p in [working_dir.copy_of("py_modules", m, excludes) for m in fields.get("py_modules", ())] + site_dirs(env):
        if p not in extra:
            extra.append(p)
    return dict(fields.get("env_vars", ())), extra + [p for p in sys_path if p not in extra], \
        extra[0] if "working_dir" in fields else cwd


def expand_env_vars(env: dict) -> None:
    """In a new worker, before it sets ``env``: expand ``$VAR`` and ``${VAR}`` in the values against
    this process's environment, as Ray does (an unset ``${VAR}`` becomes ""), each variable in
    turn, so ``{"LD_LIBRARY_PATH": "${LD_LIBRARY_PATH}:/x"}`` extends the worker's own."""
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
            continue
        if "$" in value:
            value = env[key] = _UNSET_REFERENCE.sub("", os.path.expandvars(value))
        os.environ[key] = value


def run_setup_hook(env: Env | None) -> str | None:
    """In a new worker, before any task: run the environment's worker_process_setup_hook, as Ray
    does once per worker process. None, or why it failed: then every task this worker is given
    fails with RuntimeEnvSetupError saying so, and an actor dies with it."""
    hook = dict(env or ()).get(_HOOK)
    if hook is None:
        return None
    try:
        if isinstance(hook, SetupHook):
            import pickle
            fn = pickle.loads(hook.pickled)
        else:
            import importlib
            module, _, name = hook.rpartition(".")
            fn = getattr(importlib.import_module(module), name)
        fn()
    except Exception as e:   # noqa: BLE001 - reported to the work sent here
        import traceback
        trace = "".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next)).rstrip()
        return (f"Failed to execute the setup hook method {str(hook)!r} (runtime_env['{_HOOK}']) in worker "
                f"process {os.getpid()}:\n{trace}")
    return None


def _env_vars(value, where: str) -> tuple:
    if not isinstance(value, dict):
        raise TypeError(f"{where}: runtime_env['env_vars'] must be a dict of str to str, "
                        f"got {type(value).__name__}")
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"{where}: runtime_env['env_vars'] must map str to str, got {k!r}: {v!r}")
    return tuple(sorted(value.items()))


def _as_list(value, field: str, where: str) -> list:
    if isinstance(value, (list, tuple)):
        return list(value)
    raise TypeError(f"{where}: runtime_env[{field!r}] must be a list, got {type(value).__name__}")


def _excludes(value, where: str) -> tuple:
    value = _as_list(value, "excludes", where)
    if not all(isinstance(p, str) for p in value):
        raise TypeError(f"{where}: runtime_env['excludes'] must be a list of str (gitignore patterns), got {value!r}")
    return tuple(value)


def _setup_hook(value, where: str) -> str:
    """A "module.function" name as given; a callable pickled here, so one that cannot be fails now."""
    what = f"{where}: runtime_env['{_HOOK}']"
    if isinstance(value, str):
        if "." not in value.strip("."):
            raise ValueError(f"{what} must be a callable or a 'module.function' name, got {value!r}")
        return value
    if not callable(value):
        raise TypeError(f"{what} must be a callable or a 'module.function' name, got {type(value).__name__}")
    from raylite.core.wire import serialization
    try:
        pickled = serialization.dumps_function(value)
    except Exception as e:
        from raylite import exceptions
        raise exceptions.RuntimeEnvSetupError(f"{what}: Failed to export the setup function {value!r}: it "
                                              f"cannot be pickled: {e}") from e
    if len(pickled) > _MAX_HOOK_BYTES:
        raise ValueError(f"{what}: {value!r} pickles to {len(pickled)} bytes (what it captures?), more than "
                         f"{_MAX_HOOK_BYTES}: give a 'module.function' name, or a function that loads what it needs")
    return SetupHook(getattr(value, "__name__", type(value).__name__), pickled)


def _local_dir(path, what: str) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a path, got {type(path).__name__}")
    path = os.fspath(path)
    if "://" in path:
        raise ValueError(f"{what}={path!r}: remote URIs are not fetched by raylite's local runtime; "
                         f"give a local directory")
    if not os.path.isdir(path):
        raise ValueError(f"{what}={path!r} is not a directory")
    return os.path.abspath(path)


def _module_source(module, where: str) -> str:
    """What a py_modules entry copies (raylite.core.envs.working_dir): a package's folder or a module's file."""
    what = f"{where}: runtime_env['py_modules'] entry"
    if isinstance(module, types.ModuleType):
        paths = list(getattr(module, "__path__", None) or [])
        if len(paths) > 1:
            raise ValueError(f"{what} {module.__name__} is a namespace package spread over {len(paths)} folders: "
                             f"give one of them")
        name, module = module.__name__, paths[0] if paths else getattr(module, "__file__", None)
        if module is None:
            raise ValueError(f"{what} {name} has no files to import from")
    if isinstance(module, (str, os.PathLike)) and os.fspath(module).endswith(".py") and os.path.isfile(module):
        return os.path.abspath(module)
    return _local_dir(module, f"{what} {module!r}")
