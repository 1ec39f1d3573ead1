"""Values between processes: pickle protocol 5, large buffers placed once in shared memory.

A buffer of at least INLINE_LIMIT bytes (numpy arrays, torch CPU tensors, bytes-like) is written
into its own file under /dev/shm and travels as a (name, size) pair; readers map it instead of
copying, so `put` costs one copy and `get` none. Everything smaller rides inline in the message.

A large plain NumPy array, the commonest such value, skips pickle altogether: its dtype, order and
shape travel as a short text (see _ARRAY_MARK). Rebuilding one through pickle looks up numpy's
reconstructor and dtype by name, which right after the caller streamed 100 MB through the caches
(a task summing the array it was passed) cost ~0.1 ms here; the direct path costs half that.
"""
from __future__ import annotations

import io
import pickle
import sys
import types

from raylite.core.wire import refs as _refs
from raylite.core.wire import segments
from raylite.core.wire.protocol import ArgRef
from raylite.core.wire.segments import mappings, write_segment

INLINE_LIMIT = 1 << 20
_SIMPLE = (int, float, str, bytes, bool, type(None))
_SIMPLE_SET = frozenset(_SIMPLE)
_REFS_MARK = b"R"   # data of plain arguments whose refs travel as 1-tuples of their ids (dumps_args)
_ARRAY_MARK = b"ND"   # data of an array sent directly: b"ND<dtype> <C|F> <shape>"; a pickle starts b"\x80"
_ARRAY_KINDS = "biufcmMSU"   # dtypes a dtype string rebuilds exactly (no fields, objects or metadata)
_dtypes: dict[str, object] = {}


class Serialized:
    """A value in wire form: pickle bytes, out-of-band buffers (bytes or shm segment names), and
    the ids of the ObjectRefs pickled inside it (the driver keeps those alive as long as it)."""

    __slots__ = ("data", "buffers", "is_error", "refs")

    def __init__(self, data: bytes, buffers: tuple = (), is_error: bool = False, refs: tuple = ()):
        self.data, self.buffers, self.is_error, self.refs = data, buffers, is_error, refs

    def __reduce__(self):
        if self.refs:
            return (Serialized, (self.data, self.buffers, self.is_error, self.refs))
        return (Serialized, (self.data, self.buffers, self.is_error))

    def wire(self) -> tuple:
        """As plain data, for the messages every task sends (see protocol.spec_to_wire):
        `Serialized(*ser.wire())` is the same value."""
        return (self.data, self.buffers, self.is_error, self.refs)

    def segments(self) -> list[tuple[str, int]]:
        """(name, size) of the shared-memory buffers."""
        return [b for b in self.buffers if isinstance(b, tuple)]


def results_to_wire(results: list) -> list | bytes:
    """A task's results for its DONE: plain data (see protocol.spec_to_wire); one plain value (no
    buffers, error or refs, what most tasks return) as its pickle bytes alone, which halves the
    cost of pickling and unpickling a line's results."""
    if len(results) == 1:
        r = results[0]
        if not (r.buffers or r.is_error or r.refs):
            return r.data
    return [r.wire() for r in results]


def results_from_wire(wired: list | bytes) -> list:
    """results_to_wire's results again."""
    if type(wired) is bytes:
        return [Serialized(wired)]
    return [Serialized(*r) for r in wired]


_pickler_class = None
_custom: dict[type, tuple] = {}   # register_serializer: class -> (serializer, deserializer)


def check_serializer(cls: type, serializer, deserializer) -> None:
    """register_serializer's arguments, refused as such on either backend (Ray's takes anything)."""
    if not isinstance(cls, type):
        raise TypeError(f"register_serializer needs a class, got {cls!r}")
    for field, fn in (("serializer", serializer), ("deserializer", deserializer)):
        if not callable(fn):
            raise TypeError(f"register_serializer: {field} must be callable, got {fn!r}")


def register_serializer(cls: type, *, serializer, deserializer) -> None:
    """Pickle instances of exactly `cls` as deserializer(serializer(obj)) (ray.util's, for types
    pickle cannot handle). The deserializer travels inside the data, so readers need no
    registration; like Ray's, it applies to what this process serializes."""
    check_serializer(cls, serializer, deserializer)
    _custom[cls] = (serializer, deserializer)


def deregister_serializer(cls: type) -> None:
    _custom.pop(cls, None)


def _pickler():
    """cloudpickle's Pickler plus zero-copy torch CPU tensors; imported on first use (startup cost)."""
    global _pickler_class
    if _pickler_class is None:
        import cloudpickle

        code_reduce = getattr(cloudpickle.cloudpickle, "_code_reduce", None)

        class Pickler(cloudpickle.Pickler):
            def reducer_override(self, obj):
                if type(obj) is types.CodeType and code_reduce is not None:
                    # cloudpickle >= 3.1 blanks co_filename; remote tracebacks should name the file
                    rebuild, args = code_reduce(obj)
                    return rebuild, tuple(obj.co_filename if a == "<dynamic-code>" else a for a in args)
                if _custom and type(obj) in _custom:
                    serializer, deserializer = _custom[type(obj)]
                    return deserializer, (serializer(obj),)
                torch = sys.modules.get("torch")   # never import torch for the user
                if torch is not None and type(obj) is torch.Tensor and _tensor_shareable(obj, torch):
                    try:
                        return _rebuild_tensor, (obj.detach().numpy(), obj.requires_grad)
                    except (TypeError, RuntimeError):   # dtypes numpy lacks (bfloat16, ...)
                        pass
                return super().reducer_override(obj)

        _pickler_class = Pickler
    return _pickler_class


def _tensor_shareable(t, torch) -> bool:
    return (t.device.type == "cpu" and t.layout == torch.strided and t.is_contiguous()
            and not t.is_conj() and not t.is_neg() and t.nbytes >= INLINE_LIMIT)


def _rebuild_tensor(array, requires_grad: bool):
    import warnings

    import numpy
    import torch
    name = mappings.segment_of(array)
    if name is not None:   # tensors are writable: give this one its own copy-on-write mapping
        private = mappings.private_view(name, array.nbytes)
        array = numpy.frombuffer(private, dtype=array.dtype).reshape(array.shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a read-only array (small, in-band) is copied by torch below
        t = torch.from_numpy(array) if array.flags.writeable else torch.from_numpy(array.copy())
    return t.requires_grad_(requires_grad) if requires_grad else t


_NO_ARGS = Serialized(pickle.dumps(((), {}), 5))


def dumps_args(args: tuple, kwargs: dict, shm_prefix: str | None) -> tuple[Serialized, tuple]:
    """(args, kwargs) in wire form, and the ids of the top-level ObjectRefs among them, whose
    values the worker passes instead (loads_args). Plain arguments (numbers, strings, refs) skip
    cloudpickle, and their refs travel as 1-tuples of their ids, which no other plain argument
    is: pickling a placeholder class (ArgRef, used otherwise) looks it up by name on both sides,
    which right after user code evicted the caches costs ~20 us each."""
    if not kwargs:   # the common call, f.remote(x, y): a loop, not the generators below (~2 us)
        for a in args:
            if type(a) not in _SIMPLE_SET:
                break
        else:
            return (Serialized(pickle.dumps((args, kwargs), 5)), ()) if args else (_NO_ARGS, ())
    ref = _refs.ref_type
    plain = all(type(a) in _SIMPLE or type(a) is ref for a in args) and all(
        type(v) in _SIMPLE or type(v) is ref for v in kwargs.values())
    deps = tuple(v.id for v in (*args, *kwargs.values()) if type(v) is ref)
    if plain and not deps:
        return Serialized(pickle.dumps((args, kwargs), 5)), ()
    if plain:
        args = tuple((a.id,) if type(a) is ref else a for a in args)
        kwargs = {k: (v.id,) if type(v) is ref else v for k, v in kwargs.items()}
        return Serialized(_REFS_MARK + pickle.dumps((args, kwargs), 5)), deps
    if deps:
        args = tuple(ArgRef(a.id) if type(a) is ref else a for a in args)
        kwargs = {k: ArgRef(v.id) if type(v) is ref else v for k, v in kwargs.items()}
    return dumps((args, kwargs), shm_prefix), deps


def loads_args(ser: Serialized, values: dict) -> tuple[list, dict]:
    """dumps_args' (args, kwargs), each ref's placeholder replaced by `values[object id]`."""
    if ser.data[:1] == _REFS_MARK:
        args, kwargs = pickle.loads(memoryview(ser.data)[1:])
        return ([values[a[0]] if type(a) is tuple else a for a in args],
                {k: values[v[0]] if type(v) is tuple else v for k, v in kwargs.items()})
    args, kwargs = loads(ser)
    if values:
        args = [values[a.object_id] if type(a) is ArgRef else a for a in args]
        kwargs = {k: values[v.object_id] if type(v) is ArgRef else v for k, v in kwargs.items()}
    return args, kwargs


def dumps(value, shm_prefix: str | None, is_error: bool = False) -> Serialized:
    """Serialize `value`; large buffers go to shared memory when a session prefix is given."""
    if type(value) in _SIMPLE:
        return Serialized(pickle.dumps(value, 5), (), is_error)
    if shm_prefix is not None and _direct_array(value):
        return _dumps_array(value, shm_prefix, is_error)
    buffers: list = []
    staged: list = []   # its new segments keep their writing names until the whole value is written

    def callback(pb: pickle.PickleBuffer):
        try:
            raw = pb.raw()
        except BufferError:  # non-contiguous: pickle it in-band
            return True
        if raw.nbytes < INLINE_LIMIT or shm_prefix is None:
            buffers.append(bytes(raw))
        else:
            buffers.append(write_segment(shm_prefix, raw, staged))
        return False

    out = io.BytesIO()
    outer = _refs.collect()
    try:
        _pickler()(out, protocol=5, buffer_callback=callback).dump(value)
    except BaseException:   # nothing of a value that failed half-way stays in /dev/shm
        segments.discard([b for b in buffers if isinstance(b, tuple)], staged)
        raise
    finally:
        refs = _refs.collected(outer)
    segments.publish(staged)
    return Serialized(out.getvalue(), tuple(buffers), is_error, refs)


def _direct_array(value) -> bool:
    """A large, contiguous numpy.ndarray (not a subclass, not 0-d) whose dtype its string rebuilds."""
    cls = type(value)
    if cls.__name__ != "ndarray" or cls.__module__ != "numpy" or value.nbytes < INLINE_LIMIT or not value.ndim:
        return False
    dtype, flags = value.dtype, value.flags
    return (dtype.kind in _ARRAY_KINDS and dtype.fields is None and dtype.subdtype is None
            and dtype.metadata is None and (flags.c_contiguous or flags.f_contiguous))


def _dumps_array(array, shm_prefix: str, is_error: bool) -> Serialized:
    order = "C" if array.flags.c_contiguous else "F"
    raw = memoryview(array.reshape(-1, order=order).view("u1"))   # (datetimes export no buffer of their own)
    segment = write_segment(shm_prefix, raw)
    header = f"{array.dtype.str} {order} {','.join(map(str, array.shape))}"
    return Serialized(_ARRAY_MARK + header.encode(), (segment,), is_error)


def _loads_array(data: bytes, segment: tuple):
    import numpy
    dtype_str, order, shape = data[len(_ARRAY_MARK):].decode().split(" ")
    dtype = _dtypes.get(dtype_str)
    if dtype is None:
        dtype = _dtypes[dtype_str] = numpy.dtype(dtype_str)
    return numpy.frombuffer(mappings.view(*segment), dtype).reshape(tuple(map(int, shape.split(","))), order=order)


def loads(ser: Serialized):
    if not ser.buffers:
        return pickle.loads(ser.data)
    if ser.data[:2] == _ARRAY_MARK:
        return _loads_array(ser.data, ser.buffers[0])
    bufs = [b if isinstance(b, bytes) else mappings.view(*b) for b in ser.buffers]
    return pickle.loads(ser.data, buffers=bufs)


def dumps_function(fn) -> bytes:
    out = io.BytesIO()
    _pickler()(out, protocol=5).dump(fn)
    return out.getvalue()


def error_value(err: BaseException) -> Serialized:
    """An exception stored as a task's result: get() raises it."""
    return dumps(err, None, is_error=True)
