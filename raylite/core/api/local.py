"""The local runtime's Backend (raylite.core.client.interface): the API's whole calls carried out
over this process's Client, by ids. runtime.py checks the arguments and hands each call to
``link.backend()``: this, or the Ray adapter while raylite runs on Ray."""
from __future__ import annotations

from raylite import exceptions
from raylite.core.api.remote import ActorHandle
from raylite.core.client import context
from raylite.core.client.link import process, put_id
from raylite.core.client.objects import ObjectRef
from raylite.core.client.streams import ObjectRefGenerator
from raylite.core.wire import serialization
from raylite.core.wire.ids import NODE_IP


def _value(ser):
    value = serialization.loads(ser)
    if ser.is_error:
        if isinstance(value, exceptions.RayTaskError):
            raise value.as_instanceof_cause()
        raise value
    return value


class LocalBackend:
    """Stateless: each call reads ``process.client``, which the caller (link.backend) has checked."""

    def get(self, object_refs, timeout: float | None):
        single = isinstance(object_refs, ObjectRef)
        refs = [object_refs] if single else object_refs
        values = [_value(v) for v in process.client.get([r.id for r in refs], timeout)]
        return values[0] if single else values

    def wait(self, object_refs: list, num_returns: int, timeout: float | None, fetch_local: bool):
        ids = [-r.completed().id if isinstance(r, ObjectRefGenerator) else r.id for r in object_refs]
        ready_ids = process.client.wait(ids, num_returns, timeout)
        ready = set([i for i in ids if i in ready_ids][:num_returns])
        return ([r for r, i in zip(object_refs, ids) if i in ready],
                [r for r, i in zip(object_refs, ids) if i not in ready])

    def put(self, value, owner) -> ObjectRef:
        """``owner`` is not used: the node owns every object, so it outlives that actor anyway."""
        client = process.client
        try:
            ser = serialization.dumps(value, client.shm_prefix)
        except exceptions.ObjectStoreFullError:
            raise
        except Exception as e:
            raise TypeError(f"Could not serialize the value passed to put(): {e}") from e
        oid = put_id(context.running_task_id())
        client.put(oid, ser)
        return ObjectRef(oid, True)

    def kill(self, actor, no_restart: bool) -> None:
        if not isinstance(actor, ActorHandle):
            raise TypeError(f"kill() expects an actor handle, got {type(actor).__name__}")
        process.client.kill(actor._actor_id, no_restart)

    def cancel(self, object_ref, force: bool, recursive: bool) -> None:
        client = process.client
        if force and object_ref.id in client.state("actor_calls", False)[0]:
            raise ValueError("force=True is not supported for actor tasks.")
        client.cancel(object_ref.id, force, recursive)

    def get_actor(self, name: str, namespace: str | None) -> ActorHandle:
        if not isinstance(name, str) or not name:
            raise ValueError(f"get_actor needs a non-empty actor name, got name={name!r}")
        if namespace is not None and (not isinstance(namespace, str) or not namespace):
            raise ValueError(f"namespace must be a non-empty string (or None), got namespace={namespace!r}")
        actor_id, meta = process.client.get_actor(name, namespace)
        return ActorHandle(actor_id, meta, False)

    def list_named_actors(self, all_namespaces: bool) -> list:
        named = process.client.named_actors()
        if all_namespaces:
            return [{"name": name, "namespace": namespace} for namespace, name in named]
        current = context.state.namespace
        return [name for namespace, name in named if namespace == current]

    def cluster_resources(self) -> dict:
        return process.client.resources()[0]

    def available_resources(self) -> dict:
        return process.client.resources()[1]

    def nodes(self) -> list[dict]:
        return [{"NodeID": context.state.node_id, "Alive": True, "NodeManagerAddress": NODE_IP,
                 "Resources": self.cluster_resources(), "Labels": context.node_labels()}]

    def get_gpu_ids(self) -> list:
        ids = context.now().accelerator_ids.get("GPU", [])
        return [int(i) if i.isdigit() else i for i in ids]

    def timeline(self, filename: str | None) -> list[dict] | None:
        trace, _ = process.client.state("timeline", False)
        if filename is None:
            return trace
        import json   # (not at import: init imports no file or http modules, see test_control)
        with open(filename, "w") as f:
            json.dump(trace, f)
        return None
