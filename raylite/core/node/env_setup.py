"""Node mixin: tasks and actors whose runtime_env needs setting up wait, without holding
resources, until it is ready, in a thread per setup: a copy of a working_dir or py_modules
folder (raylite.core.envs.working_dir), an install of pip or uv packages (raylite.core.envs.pip); then
they are queued as usual. If a setup fails, they fail with RuntimeEnvSetupError (an actor's calls
with ActorDiedError naming it), and so does later work asking for the same, as in Ray."""
from __future__ import annotations

import threading
import time

from raylite import exceptions
from raylite.core.envs import pip as pip_envs
from raylite.core.envs import runtime_env, working_dir
from raylite.core.wire.serialization import error_value


class EnvSetup:
    """Needs: session, job_env, actors, cancelled, producers, cluster_events, runtime_envs, failure, call,
    _finish, _actor_gone."""

    def _init_env_setup(self) -> None:
        # a setup (runtime_env.setups; pip's without its timeout) -> waiting [(spec, then)], True, or error
        self.installs: dict[tuple, object] = {}
        self.installers: dict[tuple, pip_envs.Install | working_dir.Copy] = {}   # those running now

    def _when_env_ready(self, spec, then) -> None:
        """`then` once every setup of the work's environment is ready (each checked in turn)."""
        for setup in runtime_env.setups(runtime_env.merge(self.job_env, spec.runtime_env)):
            key = setup if setup[0] == "copy" else setup[:2]
            state = self.installs.get(key)
            if state is True:
                continue
            if isinstance(state, str):
                return self._env_failed(spec, state)
            if state is None:
                state = self.installs[key] = []
                job = self.installers[key] = pip_envs.Install(*setup) if setup[0] != "copy" else \
                    working_dir.Copy(*setup[1:], working_dir.session_root(self.session))
                threading.Thread(target=self._install, args=(key, job), name="raylite-runtime-env", daemon=True).start()
            state.append((spec, lambda: self._when_env_ready(spec, then)))
            return
        then()

    def _install(self, key: tuple, job: pip_envs.Install | working_dir.Copy) -> None:
        try:
            why = job.run()
        except Exception as e:   # noqa: BLE001 - reported to every waiting task
            why = f"{type(e).__name__}: {e}"
        if self.failure.cause is None:   # else the node is broken and refuses work: nobody waits
            self.call(self._installed, key, why)

    def _installed(self, key: tuple, why: str | None) -> None:
        waiting = self.installs.get(key)
        self.installers.pop(key, None)
        self.installs[key] = True if why is None else why
        if why is not None:
            self.cluster_events.add("ERROR", "RAYLET", f"runtime_env setup failed: {why}",
                                    **({"path": key[2]} if key[0] == "copy" else {"requirements": list(key[1])}))
        for spec, then in waiting if isinstance(waiting, list) else ():
            if why is None:
                then()
            else:
                env = runtime_env.merge(self.job_env, spec.runtime_env)
                self.runtime_envs.setdefault(env, [time.time(), why])
                self._env_failed(spec, why)

    def _env_failed(self, spec, why: str) -> None:
        message = f"the runtime_env of {spec.name} could not be set up: {why}"
        if spec.kind == "actor_create":
            actor = self.actors.get(spec.actor_id)
            if actor is not None and actor.state != "DEAD":
                actor.restarts_left, actor.error = 0, f"RuntimeEnvSetupError: {message}"
                self._actor_gone(actor)
            return
        if spec.task_id in self.cancelled or (spec.return_ids and self.producers.get(spec.return_ids[0]) is not spec):
            return   # cancelled (and finished) while it waited
        self._finish(spec, error_value(exceptions.RuntimeEnvSetupError(message)))

    def _cancel_installs(self) -> None:
        """At shutdown: stop the installers and copies (what they made so far is discarded)."""
        for job in list(self.installers.values()):
            job.cancel()
