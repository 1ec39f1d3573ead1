"""Tasks and actors whose runtime_env needs setting up wait, without holding
resources, until it is ready, in a thread per setup: a copy of a working_dir or py_modules
folder (raylite.core.envs.working_dir), an install of pip or uv packages (raylite.core.envs.pip); then
they are queued as usual. If a setup fails, they fail with RuntimeEnvSetupError (an actor's calls
with ActorDiedError naming it), and so does later work asking for the same, as in Ray."""
from __future__ import annotations

import threading
import time
from typing import Protocol

from raylite import exceptions
from raylite.core.envs import pip as pip_envs
from raylite.core.envs import runtime_env, working_dir
from raylite.core.node.records import Actor
from raylite.core.node.state import NodeState
from raylite.core.wire.protocol import TaskSpec
from raylite.core.wire.serialization import error_value


class Calls(Protocol):
    def call(self, fn, *args) -> None: ...


class Finishes(Protocol):
    def finish(self, spec: TaskSpec, results) -> None: ...


class EndsActors(Protocol):
    def actor_gone(self, actor: Actor) -> None: ...


class EnvSetup:
    def __init__(self, state: NodeState, loop: Calls, dispatch: Finishes, actor_ops: EndsActors):
        self.s, self.loop, self.dispatch, self.actor_ops = state, loop, dispatch, actor_ops

    def when_env_ready(self, spec, then) -> None:
        """`then` once every setup of the work's environment is ready (each checked in turn)."""
        s = self.s
        for setup in runtime_env.setups(runtime_env.merge(s.job_env, spec.runtime_env)):
            key = setup if setup[0] == "copy" else setup[:2]
            state = s.installs.get(key)
            if state is True:
                continue
            if isinstance(state, str):
                return self._env_failed(spec, state)
            if state is None:
                state = s.installs[key] = []
                job = s.installers[key] = pip_envs.Install(*setup) if setup[0] != "copy" else \
                    working_dir.Copy(*setup[1:], working_dir.session_root(s.session))
                threading.Thread(target=self._install, args=(key, job), name="raylite-runtime-env", daemon=True).start()
            state.append((spec, lambda: self.when_env_ready(spec, then)))
            return
        then()

    def _install(self, key: tuple, job: pip_envs.Install | working_dir.Copy) -> None:
        s = self.s
        try:
            why = job.run()
        except Exception as e:   # noqa: BLE001 - reported to every waiting task
            why = f"{type(e).__name__}: {e}"
        if s.failure.cause is None:   # else the node is broken and refuses work: nobody waits
            self.loop.call(self._installed, key, why)

    def _installed(self, key: tuple, why: str | None) -> None:
        s = self.s
        waiting = s.installs.get(key)
        s.installers.pop(key, None)
        s.installs[key] = True if why is None else why
        if why is not None:
            s.cluster_events.add("ERROR", "RAYLET", f"runtime_env setup failed: {why}",
                                    **({"path": key[2]} if key[0] == "copy" else {"requirements": list(key[1])}))
        for spec, then in waiting if isinstance(waiting, list) else ():
            if why is None:
                then()
            else:
                env = runtime_env.merge(s.job_env, spec.runtime_env)
                s.runtime_envs.setdefault(env, [time.time(), why])
                self._env_failed(spec, why)

    def _env_failed(self, spec, why: str) -> None:
        s = self.s
        message = f"the runtime_env of {spec.name} could not be set up: {why}"
        if spec.kind == "actor_create":
            actor = s.actors.get(spec.actor_id)
            if actor is not None and actor.state != "DEAD":
                actor.restarts_left, actor.error = 0, f"RuntimeEnvSetupError: {message}"
                self.actor_ops.actor_gone(actor)
            return
        if spec.task_id in s.cancelled or (spec.return_ids and s.producers.get(spec.return_ids[0]) is not spec):
            return   # cancelled (and finished) while it waited
        self.dispatch.finish(spec, error_value(exceptions.RuntimeEnvSetupError(message)))

    def cancel_installs(self) -> None:
        """At shutdown: stop the installers and copies (what they made so far is discarded)."""
        s = self.s
        for job in list(s.installers.values()):
            job.cancel()
