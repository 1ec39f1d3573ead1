"""ray.job_config.JobConfig given to init(job_config=...): the fields that apply on one machine
are honoured, init's own arguments win as in Ray, and the rest are refused before anything starts."""
import pytest

import raylite as ray
from raylite.job_config import JobConfig


def test_runtime_env_and_namespace_apply(ray_init):
    config = JobConfig(runtime_env={"env_vars": {"FROM_JOB": "yes"}}, ray_namespace="job-ns",
                       metadata={"owner": "me"})
    config.set_metadata("team", "core")
    ray_init(job_config=config)

    @ray.remote
    def env():
        import os
        return os.environ.get("FROM_JOB"), ray.get_runtime_context().namespace

    assert ray.get(env.remote()) == ("yes", "job-ns")
    assert ray.get_runtime_context().namespace == "job-ns"
    assert config.metadata == {"owner": "me", "team": "core"}


def test_inits_own_arguments_win(ray_init):
    config = JobConfig(runtime_env={"env_vars": {"WHO": "job"}}, ray_namespace="job-ns")
    ray_init(job_config=config, runtime_env={"env_vars": {"WHO": "init"}}, namespace="init-ns")

    @ray.remote
    def who():
        import os
        return os.environ.get("WHO")

    assert ray.get(who.remote()) == "init" and ray.get_runtime_context().namespace == "init-ns"


@pytest.mark.local_only("on Ray the job's LoggingConfig installs Ray's own formatter")
def test_a_logging_config_set_on_the_job_applies(ray_init):
    import logging
    config = JobConfig()
    config.set_py_logging_config(ray.LoggingConfig(encoding="JSON"))
    root = logging.getLogger()
    try:
        ray_init(job_config=config)
        assert any(type(h.formatter).__module__ == "raylite.core.client.logging_config" for h in root.handlers)
    finally:   # leave other tests the root logger they had
        root.handlers = [h for h in root.handlers if type(h.formatter).__module__ != "raylite.core.client.logging_config"]


@pytest.mark.parametrize("config, field", [
    (JobConfig(jvm_options=["-Xmx1g"]), "jvm_options"),
    (JobConfig(code_search_path=["/opt/code"]), "code_search_path"),
    (JobConfig(default_actor_lifetime="detached"), "default_actor_lifetime"),
])
def test_fields_that_cannot_apply_are_refused_before_anything_starts(config, field):
    with pytest.raises(ValueError, match=field):
        ray.init(job_config=config)
    assert not ray.is_initialized()


def test_bad_values_name_the_field():
    with pytest.raises(ValueError, match="default_actor_lifetime='forever'"):
        JobConfig(default_actor_lifetime="forever")
    with pytest.raises(TypeError, match="code_search_path='/opt'"):
        JobConfig(code_search_path="/opt")
    with pytest.raises(TypeError, match="job_config must be a ray.job_config.JobConfig, got dict"):
        ray.init(job_config={"runtime_env": {}})
    assert not ray.is_initialized()


def test_from_json_and_the_module_path():
    config = JobConfig.from_json({"runtime_env": {"env_vars": {"A": "1"}}, "metadata": {"k": "v"},
                                  "ray_namespace": "ns"})
    assert (config.runtime_env, config.metadata, config.ray_namespace) == ({"env_vars": {"A": "1"}}, {"k": "v"}, "ns")
    assert ray.job_config.JobConfig is JobConfig   # reachable as ray.job_config, as in Ray


def test_on_the_ray_backend_it_becomes_rays_job_config():
    real_ray = pytest.importorskip("ray")
    from raylite.core.client.ray_backend import _ray_job_config   # what connect() hands ray.init
    ours = JobConfig(runtime_env={"env_vars": {"A": "1"}}, ray_namespace="ns", metadata={"k": "v"},
                     default_actor_lifetime="detached")
    ours.set_py_logging_config(ray.LoggingConfig(encoding="JSON"))
    theirs = _ray_job_config(real_ray, ours)
    assert isinstance(theirs, real_ray.job_config.JobConfig)
    assert (theirs.runtime_env, theirs.ray_namespace, theirs.metadata) == ({"env_vars": {"A": "1"}}, "ns", {"k": "v"})
    assert theirs._default_actor_lifetime == real_ray.job_config.JobConfig(
        default_actor_lifetime="detached")._default_actor_lifetime   # a cluster honours it
    assert isinstance(theirs.py_logging_config, real_ray.LoggingConfig)
