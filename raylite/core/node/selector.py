"""The node thread's selector: the part of `selectors`' interface the node uses, on epoll (poll
where there is none), plus park and resume.

A driver thread blocked in get() reads the worker that produces its result itself
(raylite.core.node.reader), and the node thread must not wake for that worker's messages
meanwhile. Parking keeps the socket registered, asking for no events (one epoll_ctl each way):
through `selectors`, unregistering it and registering it again cost every get 3 us. A parked
socket that hangs up or fails is still reported (the OS always reports those); whichever thread
serves it first does so under the node lock, as with the output pipes both watch.
"""
from __future__ import annotations

import math
import select
from selectors import EVENT_READ, EVENT_WRITE


class Key:
    """A registered file: `events` what it asks for, `data` what the loop calls with its events."""

    __slots__ = ("fileobj", "fd", "events", "data", "parked")

    def __init__(self, fileobj, fd: int, events: int, data):
        self.fileobj, self.fd, self.events, self.data = fileobj, fd, events, data
        self.parked = False


def _fd(fileobj) -> int:
    fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
    if fd < 0:
        raise ValueError(f"invalid file descriptor {fd} (closed?)")
    return fd


if hasattr(select, "epoll"):
    _IN, _OUT = select.EPOLLIN, select.EPOLLOUT
else:
    _IN, _OUT = select.POLLIN, select.POLLOUT


class NodeSelector:
    def __init__(self):
        self._epoll = hasattr(select, "epoll")
        self._os = select.epoll() if self._epoll else select.poll()
        self._keys: dict[int, Key] = {}

    @staticmethod
    def _mask(events: int) -> int:
        return (_IN if events & EVENT_READ else 0) | (_OUT if events & EVENT_WRITE else 0)

    def register(self, fileobj, events: int, data=None) -> Key:
        fd = _fd(fileobj)
        if fd in self._keys:
            raise KeyError(f"{fileobj!r} (fd {fd}) is already registered")
        self._os.register(fd, self._mask(events))
        key = self._keys[fd] = Key(fileobj, fd, events, data)
        return key

    def _key_of(self, fileobj) -> Key:
        """Its key; a closed socket (fileno -1) is found by identity, as `selectors` does."""
        if isinstance(fileobj, int):
            key = self._keys.get(fileobj)
        else:
            key = self._keys.get(fileobj.fileno())
            if key is None or key.fileobj is not fileobj:
                key = next((k for k in self._keys.values() if k.fileobj is fileobj), None)
        if key is None:
            raise KeyError(f"{fileobj!r} is not registered")
        return key

    def unregister(self, fileobj) -> Key:
        key = self._key_of(fileobj)
        del self._keys[key.fd]
        try:
            self._os.unregister(key.fd)
        except (OSError, KeyError):   # closed already: the OS dropped it
            pass
        return key

    def modify(self, fileobj, events: int, data=None) -> Key:
        """New events and data; a parked file takes them when it resumes."""
        key = self._key_of(fileobj)
        if events != key.events and not key.parked:
            self._os.modify(key.fd, self._mask(events))
        key.events, key.data = events, data
        return key

    def get_key(self, fileobj) -> Key:
        return self._key_of(fileobj)

    def keys(self) -> list[Key]:
        return list(self._keys.values())

    def park(self, fileobj) -> Key:
        """Ask for no events on fileobj until resume() (KeyError if it is not registered)."""
        key = self._key_of(fileobj)
        if not key.parked:
            self._os.modify(key.fd, 0)
            key.parked = True
        return key

    def resume(self, key: Key, events: int) -> None:
        """Watch a parked key again, for `events`."""
        key.events = events
        if key.parked and self._keys.get(key.fd) is key:
            key.parked = False
            self._os.modify(key.fd, self._mask(events))

    def select(self, timeout: float | None = None) -> list[tuple[Key, int]]:
        if self._epoll:
            ready = self._os.poll(-1 if timeout is None else max(timeout, 0.0), max(len(self._keys), 1))
        else:
            ready = self._os.poll(None if timeout is None else math.ceil(max(timeout, 0.0) * 1e3))
        out = []
        keys = self._keys
        for fd, event in ready:
            key = keys.get(fd)
            if key is None:
                continue
            # as `selectors`: a hang-up or error reads as whatever the file asked for
            events = (EVENT_WRITE if event & ~_IN else 0) | (EVENT_READ if event & ~_OUT else 0)
            if events & key.events:
                out.append((key, events & key.events))
        return out

    def close(self) -> None:
        self._keys.clear()
        if self._epoll:
            self._os.close()
