"""The node thread's selector (raylite.core.node.selector): what the loop needs of `selectors`,
and parking, which lets a get() read its producer's socket without the node thread waking for it."""
import os
import select
import selectors
import socket

import pytest

from raylite.core.node.selector import NodeSelector

R, W = selectors.EVENT_READ, selectors.EVENT_WRITE


@pytest.fixture(params=["epoll", "poll"])
def sel(request, monkeypatch):
    if request.param == "poll":   # the fallback where there is no epoll
        monkeypatch.delattr(select, "epoll", raising=False)
    elif not hasattr(select, "epoll"):
        pytest.skip("no epoll here")
    s = NodeSelector()
    assert s._epoll == (request.param == "epoll")
    yield s
    s.close()


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_reports_readable_and_writable_with_each_keys_data(sel, pair):
    a, b = pair
    key = sel.register(a, R, "on-a")
    assert sel.select(0) == []
    b.send(b"x")
    assert [(k.data, ev) for k, ev in sel.select(0)] == [("on-a", R)]
    sel.modify(a, R | W, "on-a2")
    [(k, ev)] = sel.select(0)
    assert (k is key, k.data, ev) == (True, "on-a2", R | W)
    with pytest.raises(KeyError, match="already registered"):
        sel.register(a, R)


def test_a_parked_socket_reports_nothing_until_it_resumes_with_what_was_asked_meanwhile(sel, pair):
    a, b = pair
    key = sel.register(a, R, "on-a")
    b.send(b"x")
    assert sel.park(a) is key
    assert sel.select(0) == []
    sel.modify(a, R | W, "later")   # (the loop's flush, while a thread has the socket on loan)
    assert sel.select(0) == [] and key.events == R | W
    sel.resume(key, R)
    assert [(k.data, ev) for k, ev in sel.select(0)] == [("later", R)]


def test_a_parked_socket_whose_peer_hangs_up_is_still_reported(sel, pair):
    a, b = pair
    sel.register(a, R, "on-a")
    sel.park(a)
    b.close()
    assert [(k.data, ev & R) for k, ev in sel.select(0)] == [("on-a", R)]


def test_unregister_finds_a_closed_socket_and_forgets_it(sel):
    a, b = socket.socketpair()
    fd = a.fileno()
    sel.register(a, R)
    a.close()
    assert sel.unregister(a).fd == fd
    with pytest.raises(KeyError):
        sel.get_key(a)
    b.close()
    r, w = os.pipe()
    try:   # plain descriptors (the output pipes) by number
        sel.register(r, R, "pipe")
        assert [k.data for k in sel.keys()] == ["pipe"]
        os.write(w, b"line")
        assert [(k.fileobj, ev) for k, ev in sel.select(1.0)] == [(r, R)]
        sel.unregister(r)
        assert sel.keys() == []
    finally:
        os.close(r)
        os.close(w)
