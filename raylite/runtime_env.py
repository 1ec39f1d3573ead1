"""``ray.runtime_env``: ``RuntimeEnv`` and ``RuntimeEnvConfig``, so code that builds a typed
runtime environment for ``init``, ``@remote`` or ``.options`` ports unchanged.

Both are dicts, as in Ray, so everything that takes ``runtime_env=`` accepts them as it accepts a
plain dict; what raylite's local runtime applies of each field is described in
``raylite.core.envs.runtime_env``.
"""
from __future__ import annotations

import copy
import json
import warnings
from typing import Any, Callable

_DEFAULT_SETUP_TIMEOUT_S = 600


class RuntimeEnvConfig(dict):
    """Options for setting up a runtime environment (``runtime_env["config"]``); on the local
    runtime, ``setup_timeout_seconds`` bounds a pip or uv install, and the others only travel with
    the environment."""

    def __init__(self, setup_timeout_seconds: int = _DEFAULT_SETUP_TIMEOUT_S, eager_install: bool = True,
                 log_files: list[str] | None = None):
        super().__init__()
        if isinstance(setup_timeout_seconds, bool) or not isinstance(setup_timeout_seconds, int):
            raise TypeError(f"setup_timeout_seconds must be an int, got {type(setup_timeout_seconds).__name__}")
        if setup_timeout_seconds <= 0 and setup_timeout_seconds != -1:
            raise ValueError(f"setup_timeout_seconds must be greater than zero or -1 (no timeout), "
                             f"got {setup_timeout_seconds}")
        if not isinstance(eager_install, bool):
            raise TypeError(f"eager_install must be a bool, got {type(eager_install).__name__}")
        if log_files is not None and (not isinstance(log_files, list)
                                      or not all(isinstance(f, str) for f in log_files)):
            raise TypeError(f"log_files must be a list of str or None, got {log_files!r}")
        self.update(setup_timeout_seconds=setup_timeout_seconds, eager_install=eager_install,
                    log_files=[] if log_files is None else log_files)

    def to_dict(self) -> dict:
        return copy.deepcopy(dict(self))


class RuntimeEnv(dict):
    """A runtime environment as a dict of its fields, built from keyword arguments as in Ray
    (``nsight`` and ``rocprof_sys`` are stored as ``_nsight`` and ``_rocprof_sys``; other keyword
    arguments are kept as given), with Ray's accessors (``env_vars()``, ``working_dir()``,
    ``has_pip()``, ``pip_config()``, ...)."""

    known_fields: set[str] = {"py_modules", "py_executable", "java_jars", "working_dir", "conda", "pip", "uv",
                              "container", "excludes", "env_vars", "_ray_release", "_ray_commit",
                              "_inject_current_ray", "config", "worker_process_setup_hook", "_nsight",
                              "_rocprof_sys", "image_uri"}
    extensions_fields: set[str] = {"_ray_release", "_ray_commit", "_inject_current_ray"}

    def __init__(self, *, py_modules: list | None = None, py_executable: str | None = None,
                 working_dir: str | None = None, pip: list[str] | dict | str | None = None,
                 conda: dict | str | None = None, container: dict | None = None,
                 env_vars: dict[str, str] | None = None,
                 worker_process_setup_hook: Callable | str | None = None,
                 nsight: str | dict | None = None, rocprof_sys: str | dict | None = None,
                 config: dict | RuntimeEnvConfig | None = None, _validate: bool = True,
                 image_uri: str | None = None, uv: list[str] | dict | None = None, **kwargs: Any):
        super().__init__()
        named = {"py_modules": py_modules, "py_executable": py_executable, "working_dir": working_dir,
                 "pip": pip, "uv": uv, "conda": conda, "_nsight": nsight, "_rocprof_sys": rocprof_sys,
                 "container": container, "env_vars": env_vars, "config": config,
                 "worker_process_setup_hook": worker_process_setup_hook, "image_uri": image_uri}
        self.update(kwargs)
        self.update((k, v) for k, v in named.items() if v is not None)
        if not _validate:   # deserialize: trust what serialize wrote
            return
        installers = [k for k in ("pip", "conda", "uv") if self.get(k) is not None]
        if len(installers) > 1:
            raise ValueError(f"runtime_env: {', '.join(installers)} cannot be given together; to use pip "
                             f"with conda, list the pip packages in the conda environment")
        for alone, allowed in (("container", {"container", "config", "env_vars"}),
                               ("image_uri", {"image_uri", "config", "env_vars"})):
            if self.get(alone) and set(self) - allowed:
                raise ValueError(f"runtime_env: {alone!r} cannot be combined with "
                                 f"{sorted(set(self) - allowed)}")
        if self.get("config") is not None:
            self["config"] = _config(self["config"])

    @classmethod
    def deserialize(cls, serialized_runtime_env: str) -> RuntimeEnv:
        return cls(_validate=False, **json.loads(serialized_runtime_env))

    def serialize(self) -> str:
        """The environment as sorted JSON (what get_runtime_context().get_runtime_env_string() gives)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    def to_dict(self) -> dict:
        """A deep copy as a plain dict (``config`` a plain dict too)."""
        out = copy.deepcopy(dict(self))
        if isinstance(out.get("config"), RuntimeEnvConfig):
            out["config"] = out["config"].to_dict()
        return out

    def get(self, name: str, default: Any = None, data_class: type | None = None) -> Any:
        """A field's value (``default`` when absent); with ``data_class``, a dict value built into one."""
        if name not in self:
            return default
        value = self[name]
        return data_class(**value) if data_class is not None and isinstance(value, dict) else value

    def set(self, name: str, value: Any) -> None:
        self[name] = value

    def env_vars(self) -> dict:
        return self.get("env_vars", {})

    def working_dir(self) -> str:
        return self.get("working_dir", "")

    def has_working_dir(self) -> bool:
        return self.get("working_dir") is not None

    def working_dir_uri(self) -> str | None:
        return self.get("working_dir")

    def py_modules(self) -> list:
        return list(self.get("py_modules") or [])

    def py_modules_uris(self) -> list:
        return self.py_modules()

    def py_executable(self) -> str | None:
        return self.get("py_executable")

    def java_jars(self) -> list:
        return list(self.get("java_jars") or [])

    def nsight(self) -> str | dict | None:
        return self.get("_nsight")

    def rocprof_sys(self) -> str | dict | None:
        return self.get("_rocprof_sys")

    def image_uri(self) -> str | None:
        return self.get("image_uri")

    def has_conda(self) -> bool:
        return bool(self.get("conda"))

    def conda_env_name(self) -> str | None:
        """The name of an existing conda environment, when ``conda`` gives one."""
        return self["conda"] if self.has_conda() and isinstance(self["conda"], str) else None

    def conda_config(self) -> str | None:
        """A conda environment spec (a dict) as sorted JSON."""
        return json.dumps(self["conda"], sort_keys=True) if self.has_conda() and isinstance(self["conda"], dict) \
            else None

    def has_pip(self) -> bool:
        return bool(self.get("pip"))

    def has_uv(self) -> bool:
        return bool(self.get("uv"))

    def virtualenv_name(self) -> str | None:
        return None   # as Ray: a pip field is always read into packages, never an environment's name

    def pip_config(self) -> dict:
        """``pip`` in Ray's parsed form: {"packages": [...], "pip_check": False, ...}."""
        return _packages(self.get("pip"), "pip_check") if self.has_pip() else {}

    def uv_config(self) -> dict:
        """``uv`` in Ray's parsed form: {"packages": [...], "uv_check": False, ...}."""
        return _packages(self.get("uv"), "uv_check") if self.has_uv() else {}

    def has_py_container(self) -> bool:
        return bool(self.get("container"))

    def py_container_image(self) -> str | None:
        return self["container"].get("image", "") if self.has_py_container() else None

    def py_container_worker_path(self) -> str | None:
        return self["container"].get("worker_path", "") if self.has_py_container() else None

    def py_container_run_options(self) -> list | None:
        return self["container"].get("run_options", []) if self.has_py_container() else None

    def get_extension(self, key: str) -> str | None:
        if key not in self.extensions_fields:
            raise ValueError(f"Extension key must be one of {self.extensions_fields}, got: {key}")
        return self.get(key)

    def plugins(self) -> list[tuple[str, Any]]:
        """The fields that are not Ray's own, as (name, value)."""
        return [(k, v) for k, v in self.items() if k not in self.known_fields]

    def plugin_uris(self) -> list[str]:
        return []   # (Ray's is not implemented either)


def _packages(value, check: str) -> dict:
    """A pip or uv field as Ray parses it: a list or a requirements file becomes {"packages": ...}."""
    if isinstance(value, dict):
        return {check: False, **value}
    if isinstance(value, str):
        with open(value) as f:
            value = f.read().strip().split("\n")
    return {"packages": list(value), check: False}


_CONFIG_FIELDS = ("setup_timeout_seconds", "eager_install", "log_files")


def _config(value) -> RuntimeEnvConfig:
    """``config`` as a RuntimeEnvConfig; unknown keys are dropped with a warning, as Ray does."""
    if isinstance(value, RuntimeEnvConfig):
        return value
    if not isinstance(value, dict):
        raise TypeError(f"runtime_env['config'] must be a dict or RuntimeEnvConfig, got {type(value).__name__}")
    unknown = sorted(set(value) - set(_CONFIG_FIELDS))
    if unknown:
        warnings.warn(f"runtime_env['config']: ignoring unknown entries {unknown}", UserWarning, stacklevel=3)
    return RuntimeEnvConfig(**{k: value[k] for k in _CONFIG_FIELDS if k in value})
