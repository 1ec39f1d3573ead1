"""raylite.util.shm_collectives' waiting protocol, on one anonymous shared mapping (no process group).

A publish makes the futex system call only when some rank has said it sleeps; a rank that sleeps
is woken by the next publish (here: a forked peer, woken long before its 100 ms re-check).
"""
from __future__ import annotations

import mmap
import os
import time

import pytest

from raylite.util import shm_collectives as sc

pytestmark = pytest.mark.skipif(not sc.wanted(), reason="the fast path is x86-64 only")


def _group(rank: int, mm=None) -> sc.LocalGroup:
    mm = mm if mm is not None else mmap.mmap(-1, sc._header_bytes(2) + 4 * 4096)
    return sc.LocalGroup(mm, rank, 2, [], timeout_s=10.0, slot_bytes=4096)


def test_publish_calls_futex_only_when_a_rank_sleeps():
    group = _group(0)
    calls = []
    real = group._futex
    group._futex = lambda *args: calls.append(args[2]) or real(*args)
    group._publish()
    assert calls == []
    group.asleep[1] = 1
    group._publish()
    assert calls == [1]   # one FUTEX_WAKE
    group.asleep[1] = 0
    group.close()


def test_a_sleeping_rank_is_woken_by_the_publish(monkeypatch):
    monkeypatch.setattr(sc, "SPIN_MAX_S", 0.0)   # no polling past SPIN_S: the peer sleeps at once
    mm = mmap.mmap(-1, sc._header_bytes(2) + 4 * 4096)
    pid = os.fork()
    if pid == 0:   # rank 1: waits for rank 0's flag, then says how long it slept
        code = 1
        try:
            peer = _group(1, mm)
            peer._timespec = sc._Timespec(5, 0)   # a missed wake-up would take seconds
            peer._first_timespec = sc._Timespec(5, 0)
            t0 = time.perf_counter()
            peer._wait(lambda: peer.ctl[1] == 7, "test")
            code = 0 if time.perf_counter() - t0 < 2.0 else 2
        finally:
            os._exit(code)
    group = _group(0, mm)
    deadline = time.monotonic() + 10
    while not group.asleep[1]:   # the peer is asleep (its flag is up)
        assert time.monotonic() < deadline, "the peer never went to sleep"
        time.sleep(0.001)
    group.ctl[1] = 7
    group._publish()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not group.asleep[1]   # it lowered its flag on the way out


def test_flat_gradients_tell_the_peers_which_gradients_a_rank_had_after_a_step_without_one():
    """Each rank's slot carries a "had a gradient" flag per parameter, which a peer missing one
    reads. They are set once per slot, not every step, and set again after a step in which this
    rank had no gradient for some parameter. The peer here is always ahead with zeros in its slots,
    so each average is this rank's own gradient halved."""
    torch = pytest.importorskip("torch")
    group = _group(0)
    group.seqs[1] = 1 << 40
    params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))]
    flat = sc.FlatGradients(group, params)

    def step(grads):
        for p, g in zip(params, grads):
            p.grad = None if g is None else g.clone()
        flat.arm()
        flat.finish()
        return flat._mine_flags[group.seq & 1].tolist()

    assert step([torch.full((3,), 4.0), torch.full((2,), 2.0)]) == [1.0, 1.0]   # slot 1
    assert torch.equal(params[1].grad, torch.ones(2))
    assert step([torch.full((3,), 4.0), torch.full((2,), 2.0)]) == [1.0, 1.0]   # slot 0
    assert step([torch.full((3,), 4.0), None]) == [1.0, 0.0]                     # slot 1, one missing
    assert params[1].grad is None   # nobody had it
    assert step([torch.full((3,), 4.0), torch.full((2,), 2.0)]) == [1.0, 1.0]   # slot 0: untouched
    assert step([torch.full((3,), 4.0), torch.full((2,), 6.0)]) == [1.0, 1.0]   # slot 1 again: set again
    assert torch.equal(params[1].grad, torch.full((2,), 3.0))
    flat.close()
    group.close()
