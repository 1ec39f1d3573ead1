"""``ray.job_config.JobConfig``: a job's settings, given to ``init(job_config=...)``.

On the local runtime the fields that mean something on one machine apply as in Ray:
``runtime_env`` and ``ray_namespace`` (init's own ``runtime_env=`` / ``namespace=`` win, as in
Ray), a logging config set with ``set_py_logging_config``, and ``metadata`` (kept on the config;
no job table shows it here). Those that cannot apply are refused before anything starts:
``jvm_options`` (no Java workers), ``code_search_path`` (workers import from the driver's
``sys.path``; ship code with ``runtime_env={"py_modules": [...]}`` instead) and
``default_actor_lifetime="detached"`` (give ``lifetime="detached"`` per actor). On the Ray
backend the whole config goes to Ray.
"""
from __future__ import annotations

from typing import Any

_LIFETIMES = ("detached", "non_detached")
_RAY_LIFETIMES = {0: "detached", 1: "non_detached"}   # Ray's JobConfig keeps its protobuf enum


class JobConfig:
    """Ray's JobConfig: the same arguments, setters and ``from_json``."""

    def __init__(self, jvm_options: list[str] | None = None, code_search_path: list[str] | None = None,
                 runtime_env: dict | None = None, _client_job: bool = False, metadata: dict | None = None,
                 ray_namespace: str | None = None, default_actor_lifetime: str = "non_detached",
                 _disable_job_level_lineage_reconstruction: bool = False,
                 _py_driver_sys_path: list[str] | None = None):
        self.jvm_options = list(jvm_options or [])
        if not isinstance(code_search_path or [], (list, tuple)):
            raise TypeError(f"code_search_path must be a list of paths, got code_search_path={code_search_path!r}")
        self.code_search_path = list(code_search_path or [])
        self._client_job = _client_job
        self.metadata = dict(metadata or {})
        self.ray_namespace = ray_namespace
        self.set_runtime_env(runtime_env)
        self.set_default_actor_lifetime(default_actor_lifetime)
        self._disable_job_level_lineage_reconstruction = _disable_job_level_lineage_reconstruction
        self._py_driver_sys_path = list(_py_driver_sys_path or [])
        self.py_logging_config = None

    def set_metadata(self, key: str, value: str) -> None:
        self.metadata[key] = value

    def set_runtime_env(self, runtime_env: dict | None, validate: bool = False) -> None:
        """``validate``: check it now (init checks it anyway, before anything starts)."""
        self.runtime_env = runtime_env if runtime_env is not None else {}
        if validate:
            from raylite.core.envs import runtime_env as runtime_envs
            runtime_envs.normalize(self.runtime_env, "JobConfig")

    def set_py_logging_config(self, logging_config=None) -> None:
        self.py_logging_config = logging_config

    def set_ray_namespace(self, ray_namespace: str) -> None:
        self.ray_namespace = ray_namespace

    def set_default_actor_lifetime(self, default_actor_lifetime: str) -> None:
        if default_actor_lifetime not in _LIFETIMES:
            raise ValueError("Default actor lifetime must be one of `detached`, `non_detached`, got "
                             f"default_actor_lifetime={default_actor_lifetime!r}")
        self._default_actor_lifetime = default_actor_lifetime

    @classmethod
    def from_json(cls, job_config_json: dict[str, Any]) -> JobConfig:
        return cls(jvm_options=job_config_json.get("jvm_options"),
                   code_search_path=job_config_json.get("code_search_path"),
                   runtime_env=job_config_json.get("runtime_env"), metadata=job_config_json.get("metadata"),
                   ray_namespace=job_config_json.get("ray_namespace"),
                   _disable_job_level_lineage_reconstruction=job_config_json.get(
                       "disable_job_level_lineage_reconstruction", False),
                   _client_job=job_config_json.get("client_job", False),
                   _py_driver_sys_path=job_config_json.get("py_driver_sys_path"))

    def __repr__(self) -> str:
        fields = {"runtime_env": self.runtime_env, "ray_namespace": self.ray_namespace,
                  "metadata": self.metadata, "default_actor_lifetime": self._default_actor_lifetime}
        return f"JobConfig({', '.join(f'{k}={v!r}' for k, v in fields.items())})"


def local_settings(job_config, runtime_env, namespace, logging_config) -> tuple:
    """(runtime_env, namespace, logging_config) for the local runtime's init: init's own
    arguments first, then the job config's; a field the local runtime cannot honour raises
    here, naming it, before anything starts. Takes raylite's JobConfig or Ray's."""
    if job_config is None:
        return runtime_env, namespace, logging_config
    if type(job_config).__name__ != "JobConfig" or not hasattr(job_config, "code_search_path"):
        raise TypeError(f"job_config must be a ray.job_config.JobConfig, got {type(job_config).__name__}")
    if job_config.jvm_options:
        raise ValueError(f"JobConfig(jvm_options={job_config.jvm_options!r}) cannot apply: raylite's local "
                         "runtime runs Python workers only")
    if job_config.code_search_path:
        raise ValueError(f"JobConfig(code_search_path={job_config.code_search_path!r}) is not supported on "
                         "raylite's local runtime: workers import from the driver's sys.path; ship other code "
                         "with runtime_env={'py_modules': [...]}")
    lifetime = job_config._default_actor_lifetime
    if _RAY_LIFETIMES.get(lifetime, lifetime) == "detached":
        raise ValueError("JobConfig(default_actor_lifetime='detached') is not supported on raylite's local "
                         "runtime: pass lifetime='detached' in the options of each actor that should outlive "
                         "its handles")
    if runtime_env is None and job_config.runtime_env:
        runtime_env = job_config.runtime_env
    if namespace is None:
        namespace = job_config.ray_namespace
    if logging_config is None:
        logging_config = job_config.py_logging_config
    return runtime_env, namespace, logging_config
