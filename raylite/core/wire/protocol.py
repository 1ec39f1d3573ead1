"""Messages between the driver's node manager and its workers.

Every worker talks to the driver over one end of a socketpair made by the driver and handed to
the worker at fork time: nothing listens, so no other process can connect (the kernel is the
authentication). Frames are a 4-byte length plus a pickle; the driver side is non-blocking and
coalesces writes, the worker side blocks, and may hold some messages back to send with the next
(Channel.defer: the results of a line of tiny tasks, several per write).
"""
from __future__ import annotations

import mmap
import operator
import os
import pickle
import select
import socket
import struct

from raylite.core.wire.polling import poll_spinning

# Message kinds: each message is a tuple whose first item is one of these. They stay short
# strings (pickled as such, and readable in a trace); the names say which way each one goes.

# node -> worker
RUN = "run"                     # (RUN, spec wire, fn bytes or None, deps, assigned, accelerator ids)
RUN_LINE = "run_line"           # (RUN_LINE, the calls' shared fields (line_key), fn bytes or None, assigned,
                                #  accelerator ids, [(task id, args wire, return ids), ...]): RUNs of
                                #  calls that differ only there, which the worker unpacks
REPLY = "reply"                 # (REPLY, request id, payload): the answer to one of REQUESTS
CANCEL_CALL = "cancel_call"     # (CANCEL_CALL, task id): an actor call it has was cancelled
FORGET = "forget"               # (FORGET, segment names): freed objects, to unmap once unused
UNPREFETCH = "unprefetch"       # (UNPREFETCH, task id): give back a task sent ahead of time
EXIT = "exit"                   # (EXIT,): end gracefully once running calls are done

# worker -> node
HELLO = "hello"                 # (HELLO, pid): the first message, once the worker is set up
DONE = "done"                   # (DONE, task id, results wire[, retry[, log offsets or None[, run time]]])
                                # (results wire: serialization.results_to_wire)
DONES = "dones"                 # (DONES, [DONE's items after its kind, ...]): several, in order
ITEM = "item"                   # (ITEM, completion id, index, value): a generator's next value
SUBMIT = "submit"               # (SUBMIT, spec, fn bytes or None, submitting task id)
PUT = "put"                     # (PUT, object id, value)
REFS = "refs"                   # (REFS, [(PIN | RELEASE | ADDREF, object id), ...]), in order
KILL = "kill"                   # (KILL, actor id, no_restart)
CANCEL = "cancel"               # (CANCEL, object id, force, recursive)
ACTOR_REPR = "actor_repr"       # (ACTOR_REPR, text): the prefix of the actor's output
EXIT_ACTOR = "exit_actor"       # (EXIT_ACTOR, why): the actor ends for good, then the process
INTERRUPT_MISSED = "interrupt_missed"   # (INTERRUPT_MISSED, task id): a SIGINT came before it ran
UNPREFETCHED = "unprefetched"   # (UNPREFETCHED, task id, given back): the answer to UNPREFETCH
RELEASED = "released"           # (RELEASED, segment names): FORGET's segments, unmapped now
METRICS = "metrics"             # (METRICS, records): what ray.util.metrics recorded here
# requests: (KIND, request id, *args), answered by one REPLY with that id
GET = "get"
WAIT = "wait"
STREAM_NEXT = "stream_next"
CREATE_NAMED = "create_named"
GET_ACTOR = "get_actor"
NAMED_ACTORS = "named_actors"
RESOURCES = "resources"
STATE = "state"
GROUP = "group"

# the reference operations a REFS message carries
PIN, RELEASE, ADDREF = "pin", "release", "addref"

TO_WORKER = frozenset({RUN, RUN_LINE, REPLY, CANCEL_CALL, FORGET, UNPREFETCH, EXIT})
REQUESTS = frozenset({GET, WAIT, STREAM_NEXT, CREATE_NAMED, GET_ACTOR, NAMED_ACTORS, RESOURCES, STATE, GROUP})
TO_NODE = frozenset({HELLO, DONE, DONES, ITEM, SUBMIT, PUT, REFS, KILL, CANCEL, ACTOR_REPR, EXIT_ACTOR, INTERRUPT_MISSED,
                     UNPREFETCHED, RELEASED, METRICS}) | REQUESTS

_HEADER = struct.Struct("<I")
# Below glibc's mmap threshold (128 KiB): a larger recv() buffer is mapped and unmapped on every
# call, which cost 28 us per small message against 5 us for this size.
_READ_CHUNK = 1 << 16
_COPY_BELOW = 1 << 12   # a message this small is unpickled from a copy (cheaper than a memoryview)


class TaskSpec:
    """One unit of work: a task, an actor's creation, or an actor method call."""

    __slots__ = ("kind", "task_id", "name", "args", "deps", "return_ids", "fn_id", "fn_bytes", "request",
                 "max_calls", "max_retries", "actor_id", "method", "actor_name", "max_restarts",
                 "schedule_request", "class_meta", "max_concurrency", "runtime_env", "placement", "stream",
                 "retry_exceptions", "concurrency_groups", "concurrency_group", "detached", "unschedulable",
                 "out_of_order")

    def __init__(self, kind: str, task_id: int, name: str, args, deps: tuple = (), return_ids: tuple = (),
                 fn_id: str = "", fn_bytes: bytes | None = None, request: dict | None = None,
                 max_calls: int = 0, max_retries: int | None = 0, *, actor_id: int = 0, method: str = "",
                 actor_name: str | None = None, max_restarts: int = 0, schedule_request: dict | None = None,
                 class_meta: tuple | None = None, max_concurrency: int = 0, runtime_env: tuple | None = None,
                 placement: tuple | None = None, stream: str | None = None,
                 retry_exceptions: bool | tuple = False, concurrency_groups: dict | None = None,
                 concurrency_group: str | None = None, detached: bool = False, unschedulable: str | None = None,
                 out_of_order: bool = False):
        self.kind = kind                    # "task" | "actor_create" | "actor_call"
        self.task_id = task_id
        self.name = name                    # function, class or Class.method (for logs and errors)
        self.args = args                    # Serialized (args, kwargs), top-level refs as placeholders
        self.deps = deps                    # object ids of top-level ref arguments
        self.return_ids = return_ids
        self.fn_id = fn_id                  # function or class id (tasks and actor creation)
        self.fn_bytes = fn_bytes
        self.request = request or {}        # resources held while running (units)
        self.max_calls = max_calls
        self.max_retries = max_retries      # actor calls: None until the node applies the actor's default
        self.actor_id = actor_id
        self.method = method
        self.actor_name = actor_name
        self.max_restarts = max_restarts
        self.schedule_request = schedule_request  # actors: what placement needs, if more than held
        self.class_meta = class_meta              # actors: (class name, {method: num_returns})
        self.max_concurrency = max_concurrency    # actors: calls at once (0: Ray's default)
        self.runtime_env = runtime_env            # normalized (raylite.core.envs.runtime_env), inherited
        self.placement = placement                # (group id, bundle index or -1, capture children)
        self.stream = stream                      # generators: "streaming" or "dynamic" (raylite.core.client.streams)
        self.retry_exceptions = retry_exceptions  # tasks: True, or the qualified names of the types to retry
        self.concurrency_groups = concurrency_groups   # actors: {group: calls at once in it}
        self.concurrency_group = concurrency_group     # actor calls: the group named by .options()
        self.detached = detached                  # actors: lifetime="detached", kept without handles
        self.unschedulable = unschedulable        # why no node could ever run it (its label selector)
        self.out_of_order = out_of_order          # actors: a call still waiting for its arguments lets
                                                  # later ones go first (allow_out_of_order_execution)

    def __reduce__(self):   # a flat tuple pickles several times faster than slot state
        return (_spec_from_tuple, (_spec_fields(self),))


def _spec_parts(name: str, own: tuple = ()):
    """(shared, `name`): `shared(spec)`, spec's slots other than `own` in slot order, and
    `name(shared_values, *own)`, a TaskSpec of those and of its `own` slots given after them.
    `name` is one unpacking assignment to every slot, written out from __slots__ (as dataclasses
    writes __init__): 5x faster than a setattr loop, and half the cost of TaskSpec(...) with keywords."""
    targets = ", ".join(f"spec.{slot}" for slot in TaskSpec.__slots__ if slot not in own)
    params = "".join(f", {slot}" for slot in own)
    body = "".join(f"    spec.{slot} = {slot}\n" for slot in own)
    source = (f"def {name}(values{params}, _new=TaskSpec.__new__):\n"
              f"    spec = _new(TaskSpec)\n    {targets}, = values\n{body}    return spec\n")
    namespace = {"TaskSpec": TaskSpec}
    exec(source, namespace)   # noqa: S102 - fixed source, built from the slot names above
    built = namespace[name]
    built.__module__ = __name__   # pickle finds _spec_from_tuple here by name
    return operator.attrgetter(*(slot for slot in TaskSpec.__slots__ if slot not in own)), built


_spec_fields, _spec_from_tuple = _spec_parts("_spec_from_tuple")   # a worker runs it for each task
# what the calls of a remote function with its own options share, kept by it, and its next call
# from that: call_of(template, task_id, args, deps, return_ids, runtime_env)
call_template, call_of = _spec_parts("call_of", ("task_id", "args", "deps", "return_ids", "runtime_env"))

_ARGS = TaskSpec.__slots__.index("args")


def spec_to_wire(spec: TaskSpec) -> tuple:
    """A spec as plain data for the "run" message: pickle then looks up no class (TaskSpec's and
    Serialized's reduce made that message cost 7 us to pickle here, plain data 2 us)."""
    values = _spec_fields(spec)
    return values[:_ARGS] + (spec.args.wire(),) + values[_ARGS + 1:]


def spec_from_wire(values: tuple, serialized) -> TaskSpec:
    """The spec again; `serialized` is serialization.Serialized (which imports this module)."""
    spec = _spec_from_tuple(values)
    spec.args = serialized(*spec.args)
    return spec


# what the calls of one RUN_LINE share (the message carries it once), and a call of it again
line_key, _line_call = _spec_parts("_line_call", ("task_id", "args", "return_ids"))


def line_entry(spec: TaskSpec) -> tuple:
    """A call's own part of a RUN_LINE."""
    return spec.task_id, spec.args.wire(), spec.return_ids


def specs_from_line(shared: tuple, entries: list, serialized) -> list[TaskSpec]:
    """The specs a RUN_LINE carries: its shared fields (line_key) with each entry's ids and arguments."""
    return [_line_call(shared, task_id, serialized(*args), return_ids) for task_id, args, return_ids in entries]


class ArgRef:
    """Placeholder for a top-level ObjectRef argument; the worker swaps in the value."""

    __slots__ = ("object_id",)

    def __init__(self, object_id: int):
        self.object_id = object_id

    def __reduce__(self):
        return ArgRef, (self.object_id,)


def encode(msg) -> bytes:
    data = pickle.dumps(msg, 5)
    return _HEADER.pack(len(data)) + data


class Channel:
    """Framed pickles over a stream socket."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.rbuf = bytearray()
        self.rpos = 0   # where the next message starts in rbuf
        self.wbuf = bytearray()
        self.watch_write = False   # the node's selector watches it for writing (wbuf was left over)
        self.deferred = bytearray()   # the blocking side's messages held back (see defer)
        self.poller = None         # the blocking side's, for polling before it sleeps (see polling.SPIN_S)

    def fileno(self) -> int:
        return self.sock.fileno()

    # --- blocking side (workers) ---
    def send(self, msg) -> None:
        """Send msg, after what was deferred (in order)."""
        if self.deferred:
            self.deferred += encode(msg)
            self.flush_deferred()
        else:
            self.sock.sendall(encode(msg))

    def defer(self, msg) -> None:
        """Queue msg to go out with the next send or flush_deferred (several results, one write)."""
        self.deferred += encode(msg)

    def flush_deferred(self) -> None:
        if self.deferred:
            data, self.deferred = self.deferred, bytearray()
            self.sock.sendall(data)

    def has_message(self) -> bool:
        """Whether a whole message is already read and waits in the buffer."""
        buf, pos = self.rbuf, self.rpos
        return len(buf) - pos >= 4 and len(buf) - pos >= 4 + _HEADER.unpack_from(buf, pos)[0]

    def recv(self, spin: float = 0.0):
        """Next message, or None at end of stream. With `spin`, poll that many seconds before
        blocking (see polling.SPIN_S)."""
        while True:
            msg = self._pop()
            if msg is not _INCOMPLETE:
                return msg
            chunk = self._spin(spin) if spin else None
            if chunk is None:
                chunk = self.sock.recv(_READ_CHUNK)
            if not chunk:
                return None
            self.rbuf += chunk

    def _spin(self, seconds: float) -> bytes | None:
        if self.poller is None:
            self.poller = select.poll()
            self.poller.register(self.sock, select.POLLIN)
        return self.sock.recv(_READ_CHUNK) if poll_spinning(self.poller, seconds) else None

    # --- non-blocking side (the node manager) ---
    def feed(self) -> list | None:
        """Read what is available; return complete messages, or None at end of stream."""
        while True:
            try:
                chunk = self.sock.recv(_READ_CHUNK)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                return None
            if not chunk:
                return None
            self.rbuf += chunk
            if len(chunk) < _READ_CHUNK:
                break
        out = []
        while (msg := self._pop()) is not _INCOMPLETE:
            out.append(msg)
        return out

    def queue(self, msg) -> None:
        self.wbuf += encode(msg)

    def flush(self) -> bool:
        """Write what the socket takes now; True when nothing is left."""
        while self.wbuf:
            try:
                n = self.sock.send(self.wbuf)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                self.wbuf.clear()
                return True
            del self.wbuf[:n]
        return True

    def _pop(self):
        """The next whole message in rbuf, read from rpos on (rbuf is compacted when it is all
        read, or its read part is large: cutting each message off its front cost ~2 us)."""
        buf, pos = self.rbuf, self.rpos
        if len(buf) - pos < 4:
            return _INCOMPLETE
        (size,) = _HEADER.unpack_from(buf, pos)
        end = pos + 4 + size
        if len(buf) < end:
            if pos:
                del buf[:pos]
                self.rpos = 0
            return _INCOMPLETE
        msg = pickle.loads(buf[pos + 4:end] if size < _COPY_BELOW else memoryview(buf)[pos + 4:end])
        if end == len(buf):
            buf.clear()
            self.rpos = 0
        elif end > _READ_CHUNK:
            del buf[:end]
            self.rpos = 0
        else:
            self.rpos = end
        return msg

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


_INCOMPLETE = object()


class Progress:
    """A counter of the tasks a worker has begun, in memory the worker shares (a memfd): the
    worker holds results back to send several in one write (protocol.Channel.defer), so when it
    dies the node cannot tell from the results it got how far it went through the tasks sent
    ahead; this says which began (retried or failed, as a crash) and which never did (queued
    again as they were). Without memfd (not Linux) there is none, and workers hold nothing back."""

    __slots__ = ("fd", "mm")

    def __init__(self, fd: int, mm):
        self.fd, self.mm = fd, mm

    @classmethod
    def create(cls) -> Progress | None:
        if not hasattr(os, "memfd_create"):
            return None
        fd = os.memfd_create("raylite-progress", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, 8)
            return cls(fd, mmap.mmap(fd, 8))
        except OSError:
            os.close(fd)
            raise

    def handed_over(self) -> None:
        """The worker has its own descriptor now (or none came to be): the mapping stays."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def begun(self) -> int:
        return struct.unpack_from("Q", self.mm)[0] if not self.mm.closed else 0

    def close(self) -> None:
        self.handed_over()
        self.mm.close()


def progress_counter(fd: int) -> memoryview:
    """The worker's side of its Progress: [0] += 1 as each task begins."""
    mm = mmap.mmap(fd, 8)
    os.close(fd)
    return memoryview(mm).cast("Q")
