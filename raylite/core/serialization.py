"""Values between processes: pickle protocol 5, large buffers placed once in shared memory.

A buffer of at least INLINE_LIMIT bytes (numpy arrays, torch CPU tensors, bytes-like) is written
into its own file under /dev/shm and travels as a (name, size) pair; readers map it instead of
copying, so `put` costs one copy and `get` none. Everything smaller rides inline in the message.
"""
from __future__ import annotations

import io
import itertools
import mmap
import os
import pickle
import sys
import types

INLINE_LIMIT = 1 << 20
SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else os.environ.get("TMPDIR", "/tmp")
SEGMENT_PREFIX = "raylite-"
_SIMPLE = (int, float, str, bytes, bool, type(None))
_counter = itertools.count()


class Serialized:
    """A value in wire form: pickle bytes plus out-of-band buffers (bytes or shm segment names)."""

    __slots__ = ("data", "buffers", "is_error")

    def __init__(self, data: bytes, buffers: tuple = (), is_error: bool = False):
        self.data, self.buffers, self.is_error = data, buffers, is_error

    def __reduce__(self):
        return (Serialized, (self.data, self.buffers, self.is_error))

    def segments(self) -> list[str]:
        return [b[0] for b in self.buffers if isinstance(b, tuple)]


def session_prefix(session: str) -> str:
    return f"{SEGMENT_PREFIX}{session}-"


def _write_segment(prefix: str, raw: memoryview) -> tuple[str, int]:
    name = f"{prefix}{os.getpid()}-{next(_counter)}"
    fd = os.open(os.path.join(SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        view, done = raw.cast("B"), 0
        while done < len(view):
            done += os.write(fd, view[done:])
    finally:
        os.close(fd)
    return (name, raw.nbytes)


def map_segment(name: str, size: int, private: bool = False) -> memoryview:
    """Map a segment read-only and shared, or copy-on-write when a writer needs its own pages."""
    if size == 0:
        return memoryview(b"")
    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY)
    try:
        if private:
            mm = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        else:
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    return memoryview(mm)


_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


class MappingCache:
    """Segments this process has mapped, so a value read by many tasks is mapped once.

    Names are never reused, so a cached mapping can't go stale; the driver sends `forget` when
    an object is freed, and the cache also drops its oldest entries past MAX_BYTES.
    """

    MAX_BYTES = 1 << 30

    def __init__(self):
        self.maps: dict[str, memoryview] = {}
        self.names: dict[int, str] = {}   # id(mmap) -> segment name, to re-map tensors privately
        self.bytes = 0

    def get(self, name: str, size: int) -> memoryview:
        view = self.maps.get(name)
        if view is None:
            view = map_segment(name, size).toreadonly()
            self.maps[name] = view
            self.names[id(view.obj)] = name
            self.bytes += size
            while self.bytes > self.MAX_BYTES and len(self.maps) > 1:
                self.forget([next(iter(self.maps))])
        return view

    def forget(self, names) -> None:
        for name in names:
            view = self.maps.pop(name, None)
            if view is not None:
                self.names.pop(id(view.obj), None)
                self.bytes -= view.nbytes

    def segment_of(self, array) -> str | None:
        base = array
        while base is not None and not isinstance(base, memoryview):
            base = getattr(base, "base", None)
        return self.names.get(id(base.obj)) if base is not None else None


mappings = MappingCache()


def unlink_segments(names) -> None:
    for name in names:
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except FileNotFoundError:
            pass


def remove_session_segments(session: str) -> None:
    prefix = session_prefix(session)
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(prefix)]
    except OSError:
        return
    unlink_segments(names)


_pickler_class = None


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
        private = map_segment(name, array.nbytes, private=True)
        array = numpy.frombuffer(private, dtype=array.dtype).reshape(array.shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a read-only array (small, in-band) is copied by torch below
        t = torch.from_numpy(array) if array.flags.writeable else torch.from_numpy(array.copy())
    return t.requires_grad_(requires_grad) if requires_grad else t


_NO_ARGS = Serialized(pickle.dumps(((), {}), 5))


def dumps_args(args: tuple, kwargs: dict, shm_prefix: str | None) -> Serialized:
    """(args, kwargs) in wire form, skipping cloudpickle for the common plain cases."""
    if not args and not kwargs:
        return _NO_ARGS
    if all(type(a) in _SIMPLE for a in args) and all(type(v) in _SIMPLE for v in kwargs.values()):
        return Serialized(pickle.dumps((args, kwargs), 5))
    return dumps((args, kwargs), shm_prefix)


def dumps(value, shm_prefix: str | None, is_error: bool = False) -> Serialized:
    """Serialize `value`; large buffers go to shared memory when a session prefix is given."""
    if type(value) in _SIMPLE:
        return Serialized(pickle.dumps(value, 5), (), is_error)
    buffers: list = []

    def callback(pb: pickle.PickleBuffer):
        try:
            raw = pb.raw()
        except BufferError:  # non-contiguous: pickle it in-band
            return True
        if raw.nbytes < INLINE_LIMIT or shm_prefix is None:
            buffers.append(bytes(raw))
        else:
            buffers.append(_write_segment(shm_prefix, raw))
        return False

    out = io.BytesIO()
    _pickler()(out, protocol=5, buffer_callback=callback).dump(value)
    return Serialized(out.getvalue(), tuple(buffers), is_error)


def loads(ser: Serialized):
    if not ser.buffers:
        return pickle.loads(ser.data)
    bufs = [b if isinstance(b, bytes) else mappings.get(*b) for b in ser.buffers]
    return pickle.loads(ser.data, buffers=bufs)


def dumps_function(fn) -> bytes:
    out = io.BytesIO()
    _pickler()(out, protocol=5).dump(fn)
    return out.getvalue()
