"""`ray.actor`: `exit_actor()`, with which an actor ends itself from inside one of its methods,
`method` (per-method options), and the actor types (`ActorClass`, `ActorHandle`, `ActorMethod`)
that Ray code names in annotations."""
from __future__ import annotations

from raylite.core.api.remote import ActorClass, ActorClassInheritanceException, ActorHandle, ActorMethod, method
from raylite.core.client import context, link
from raylite.core.client.link import process

__all__ = ["ActorClass", "ActorClassInheritanceException", "ActorHandle", "ActorMethod", "exit_actor", "method"]


def exit_actor() -> None:
    """End the calling actor for good (no restart): this call and every call queued or running
    on it fail with ActorDiedError, as in Ray."""
    if link.on_ray():   # (attaches first in a Ray worker that has not used raylite yet)
        import ray
        return ray.actor.exit_actor()
    if process.index == 0 or context.now().actor_id is None:
        raise TypeError("exit_actor() can only be called inside an actor's method")
    from raylite.core.worker.executor import ActorExit
    raise ActorExit("it called ray.actor.exit_actor()")
