"""Exceptions with Ray's names and class hierarchy, so `except ray.exceptions.X` and `isinstance`
code written for Ray ports unchanged.

The classes take a message, RayTaskError aside (Ray builds some from ids and protobufs); on the
Ray backend, Ray's errors are re-raised as the class here of the same name. Classes for failures
raylite's local runtime cannot have (a raylet, a GCS, another language) exist for code that names
them.
"""
from __future__ import annotations


class RayError(Exception):
    """Base of every error raylite raises on behalf of a task, actor or the runtime."""


class RaySystemError(RayError):
    """The runtime itself failed (not user code)."""


class RayTaskError(RayError):
    """A task raised; carries the remote traceback and the task's name.

    `get` re-raises it as an instance of both this class and the user's exception class
    (see `as_instanceof_cause`), so `except ValueError` still catches a remote ValueError.
    """

    def __init__(self, function_name: str, traceback_str: str, cause: BaseException | None = None,
                 pid: int | None = None):
        self.function_name = function_name
        self.traceback_str = traceback_str
        self.cause = cause
        self.pid = pid
        super().__init__(self._message())

    def _message(self) -> str:
        where = f" (pid={self.pid})" if self.pid else ""
        return f"{self.function_name}(){where} raised:\n\n{self.traceback_str.rstrip()}"

    def __str__(self) -> str:
        return self._message()

    def __reduce__(self):
        return (RayTaskError, (self.function_name, self.traceback_str, self.cause, self.pid))

    def as_instanceof_cause(self) -> RayTaskError:
        """An exception that is both a RayTaskError and an instance of the cause's class."""
        cause_cls = type(self.cause) if self.cause is not None else None
        if (cause_cls is None or issubclass(cause_cls, RayTaskError) or issubclass(RayTaskError, cause_cls)
                or not _subclassable(cause_cls)):   # (a RayError cause: this is one already)
            return self
        derived = _derived_class(cause_cls)
        err = derived.__new__(derived)
        err.function_name, err.traceback_str = self.function_name, self.traceback_str
        err.cause, err.pid = self.cause, self.pid
        err.args = (self._message(),)
        err.__dict__.update(getattr(self.cause, "__dict__", {}))
        return err


_derived: dict[type, type] = {}


def _subclassable(cls: type) -> bool:
    try:
        type("probe", (RayTaskError, cls), {})
        return True
    except TypeError:
        return False


def _derived_class(cause_cls: type) -> type:
    cls = _derived.get(cause_cls)
    if cls is None:
        def __init__(self, *args, **kwargs):  # instances are built by as_instanceof_cause
            Exception.__init__(self, *args)

        def __reduce__(self):
            return (_rebuild_derived, (self.function_name, self.traceback_str, self.cause, self.pid))

        cls = type(f"RayTaskError({cause_cls.__name__})", (RayTaskError, cause_cls),
                   {"__init__": __init__, "__reduce__": __reduce__, "__str__": RayTaskError.__str__,
                    "__module__": __name__})
        _derived[cause_cls] = cls
    return cls


def _rebuild_derived(function_name, traceback_str, cause, pid):
    return RayTaskError(function_name, traceback_str, cause, pid).as_instanceof_cause()


class GetTimeoutError(RayError, TimeoutError):
    """`get` or `wait` ran past its timeout."""


class WorkerCrashedError(RayError):
    """The worker process running a task died (after all retries)."""


class RayActorError(RayError):
    """An actor cannot run the call: it died, was killed or failed to start. ``actor_id``: its id
    in hex (as get_runtime_context().get_actor_id() gives it), when known, as in Ray."""

    def __init__(self, *args, actor_id: str | None = None):
        super().__init__(*args)
        self.actor_id = actor_id


class ActorDiedError(RayActorError):
    """The actor's process is gone (crashed, killed, or its constructor raised)."""


class TaskCancelledError(RayError):
    """The task was cancelled with `cancel()` before it finished."""


class ObjectLostError(RayError):
    """The object's value is gone (freed or its producer failed irrecoverably)."""


class ObjectFetchTimedOutError(ObjectLostError):
    """No copy of the object could be fetched in time (Ray backend)."""


class ObjectFreedError(ObjectLostError):
    """The object was freed explicitly while a reference to it was still in use."""


class OwnerDiedError(ObjectLostError):
    """The process that created the object (its owner) died while the object was still referenced."""


class ObjectReconstructionFailedError(ObjectLostError):
    """The lost object could not be recomputed from the task that made it."""


class ReferenceCountingAssertionError(ObjectLostError, AssertionError):
    """The object was deleted while a reference to it remained: a reference-counting bug."""


class NodeDiedError(RayError):
    """The node a task ran on died (Ray backend: a machine lost, preempted or its raylet crashed)."""


class ActorUnavailableError(RayActorError):
    """The actor is temporarily unreachable (Ray backend: restarting, or its node is unreachable)."""


class OutOfMemoryError(RayError):
    """The task's worker was ended for want of memory: by the kernel's out-of-memory killer
    (raylite reads the kernel's count of such kills), or by Ray's memory monitor (Ray backend)."""


class PendingCallsLimitExceeded(RayError):
    """An actor call was refused: its handle already has max_pending_calls calls unfinished."""


class UserCodeException(RayError):
    """Wraps an exception raised by user code (Ray libraries use it; retries still see the cause)."""


class CrossLanguageError(RayError):
    """An error raised by a task or actor written in another language (Ray backend)."""


class LocalRayletDiedError(RayError):
    """The local node manager (Ray's raylet) died."""


class AuthenticationError(RayError):
    """Connecting to a Ray cluster failed its token authentication (Ray backend)."""


class ObjectStoreFullError(RayError):
    """The object store has no room for the object, even after evicting what it could."""


class OutOfDiskError(RayError):
    """The object store is full and the disk it spills to is too."""


class AsyncioActorExit(RayError):
    """An asyncio actor ended itself with `ray.actor.exit_actor()`."""


class RuntimeEnvSetupError(RayError):
    """A task's, actor's or job's runtime_env could not be set up."""


class TaskPlacementGroupRemoved(RayError):
    """The placement group the task was scheduled into was removed."""


class ActorPlacementGroupRemoved(RayError):
    """The placement group the actor was scheduled into was removed."""


class TaskUnschedulableError(RayError):
    """The task can never be scheduled (e.g. it asks for more than any node has)."""


class ActorUnschedulableError(RayError):
    """The actor can never be scheduled (e.g. it asks for more than any node has)."""


# Ray fails a task no node can ever fit with TaskUnschedulableError (with its infeasible-task early
# exit on; otherwise the task waits for the autoscaler), so `except TaskUnschedulableError` must
# catch raylite's error for it. Not ActorUnschedulableError too: raylite raises this class only for
# tasks (an infeasible actor's calls fail with ActorDiedError).
class InfeasibleTaskError(TaskUnschedulableError):
    """The task or actor asks for more than this node has, so it can never be scheduled."""


class StreamingGeneratorReplayInconsistentError(RaySystemError):
    """A retried streaming generator yielded a different number of items than its first run."""


class RayChannelError(RaySystemError):
    """A compiled graph's channel failed (Ray backend)."""


class RayChannelTimeoutError(RayChannelError, TimeoutError):
    """A compiled graph's channel operation timed out (Ray backend)."""


class RayCgraphCapacityExceeded(RaySystemError):
    """A compiled graph's channel buffer is full (Ray backend)."""


class RayDirectTransportError(RaySystemError):
    """A direct (out-of-object-store) tensor transfer failed (Ray backend)."""


class UnserializableException(RayError):
    """A remote exception could not be rebuilt where it is raised; it carries the original's text
    and traceback (as Ray's)."""

    def __init__(self, original_stack_trace: str):
        super().__init__(original_stack_trace)
        self._original_stack_trace = original_stack_trace

    def __str__(self) -> str:
        return ("Failed to deserialize exception. Refer to Ray's docs on custom serializers for exceptions.\n"
                f"Original exception:\n{self._original_stack_trace}")


class ActorAlreadyExistsError(ValueError, RayError):
    """A named actor with that name already exists in the namespace (a ValueError, as in Ray)."""


class ActorHandleNotFoundError(ValueError, RayError):
    """The actor handle belongs to an earlier session (a ValueError, as in Ray)."""
