"""The same-host fast path of CPU DDP (RayStrategy, and raylite.train's ``prepare_model``): the
per-step collectives through shared memory instead of gloo.

A small model's DDP step on CPU is dominated by synchronisation, not arithmetic: each step Lightning
broadcasts a "SIGTERM received" flag from rank 0 (Lightning >= 2.5) and DDP allreduces the gradient
bucket(s), each a gloo round trip over TCP whose cost is mostly waking the peer processes (and
gloo's own I/O thread) up. When every rank of the group runs on one machine (always, with raylite's
own runtime), ``LocalGroup`` replaces those two with a shared-memory segment that the ranks poll:

* ``allreduce_hook``: a DDP communication hook. Each rank copies its bucket into its own slot,
  publishes a sequence number, waits for the others' and sums the slots in rank order, so every
  rank computes bit-identical averaged gradients (as DDP requires). Buckets over the group's slot
  size (``SLOT_BYTES`` unless ``connect`` is told more) or of other dtypes/devices go through gloo,
  as without the hook.
* ``sigterm_check``: stands in for Lightning's per-step ``_broadcast_sigterm_tensor``. A SIGTERM to
  any rank sets a flag in the segment (instead of Lightning's collective inside the signal
  handler, which can deadlock when it hits a rank that is not rank 0); at the start of each
  training step rank 0 decides, and publishes, whether the run stops at the next step; the other
  ranks read rank 0's decision for their step. So every rank raises Lightning's
  ``SIGTERMException`` at the same step (one later than Lightning's broadcast would), as that
  broadcast intends, without a wait for rank 0 at every step.

Waiting polls (with ``sched_yield``) for 50 microseconds, then sleeps on a futex in the segment
that every publish wakes (one wake-up, where gloo needs its I/O thread and then the caller woken);
a peer that died or a wait longer than the process group's timeout raises instead of hanging. The segment is
created by rank 0 after the process group is up, opened by the others, and unlinked as soon as
everyone has it, so nothing stays behind in ``/dev/shm``. Turned off with
``RAYLITE_LIGHTNING_FASTPATH=0`` (then Lightning's and DDP's own gloo collectives run); it also stays
off where the ranks cannot share memory (another machine) or off x86-64 (its stores are seen in
order by the other processes, which the protocol relies on).
"""
from __future__ import annotations

import ctypes
import mmap
import os
import platform
import secrets
import time

ENV = "RAYLITE_LIGHTNING_FASTPATH"   # "0": RayStrategy keeps gloo
TRAIN_ENV = "RAYLITE_TRAIN_FASTPATH"    # "0": raylite.train's prepare_model keeps gloo
SLOT_BYTES = 1 << 20          # per rank and parity by default; larger gradient buckets go through gloo
# Poll (yielding the CPU) this long, then sleep on a futex. Short: a rank that spins uses CPU time
# its peer needs where the machine has less CPU than it shows (a VM whose vCPUs are not all there
# when all are busy: measured, each of 2 busy vCPUs stalled 30-40% of the time), and the peer it
# waits for is usually a whole step (~1 ms) behind, not microseconds.
SPIN_S = 0.00005
_LINE = 8                     # int64s per cache line
_CTL_R0_CHECK, _CTL_STOP, _CTL_SIGTERM, _CTL_FUTEX = 0, 1, 2, 3
_SYS_FUTEX, _FUTEX_WAIT, _FUTEX_WAKE = 202, 0, 1   # x86-64 Linux; shared (not private) futexes
_DTYPES = ("float32", "float64", "float16", "bfloat16")


def wanted(env: str = ENV) -> bool:
    """Whether this process would use the fast path (RayStrategy decides in the driver and ships
    the answer to the ranks; raylite.train's workers read the variable they inherited)."""
    return os.environ.get(env, "1") != "0" and platform.machine().lower() in ("x86_64", "amd64")


class PeerGone(RuntimeError):
    """A rank waited for a peer that died (reported as a peer's symptom, not the cause)."""


class LocalGroup:
    """The ranks of the default process group, sharing one memory segment."""

    def __init__(self, mm: mmap.mmap, rank: int, world_size: int, pids: list[int], timeout_s: float,
                 slot_bytes: int = SLOT_BYTES):
        import numpy as np
        self.mm, self.rank, self.world_size, self.pids = mm, rank, world_size, pids
        self.slot_bytes = slot_bytes
        self.timeout_s = timeout_s
        self.hdr_bytes = _header_bytes(world_size)
        hdr = np.frombuffer(mm, dtype=np.int64, count=self.hdr_bytes // 8)
        self._hdr = hdr
        self.seqs = hdr[0:world_size * _LINE:_LINE]                 # one cache line per rank
        self.ctl = hdr[world_size * _LINE:(world_size + 1) * _LINE]
        self.seq = 0
        self.checks = 0
        self._views: dict = {}
        # One 32-bit futex word (the low half of ctl[_CTL_FUTEX]) that every publish bumps and
        # wakes: a waiter that has spun long enough sleeps on it instead of polling.
        self._futex = _futex_fn()
        self._futex_addr = ctypes.addressof(ctypes.c_char.from_buffer(mm)) + (world_size * _LINE + _CTL_FUTEX) * 8
        self._word = np.frombuffer(mm, dtype=np.int32, count=1, offset=(world_size * _LINE + _CTL_FUTEX) * 8)
        self._timespec = _Timespec(0, 100_000_000)   # 100 ms: then look at the peers again

    # -- setup ---------------------------------------------------------------------------------

    @classmethod
    def connect(cls, timeout_s: float = 1800.0, slot_bytes: int = SLOT_BYTES) -> "LocalGroup | None":
        """Collective over the default process group: every rank gets a LocalGroup, or every rank
        gets None (some rank could not open the segment: then gloo it is, everywhere)."""
        import torch.distributed as dist
        rank, world = dist.get_rank(), dist.get_world_size()
        size = _header_bytes(world) + 2 * world * slot_bytes   # tmpfs: pages are taken as written
        mm, path = None, None
        if rank == 0:
            path = f"/dev/shm/raylite-pl-{os.getpid()}-{secrets.token_hex(8)}"
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.ftruncate(fd, size)
                    mm = mmap.mmap(fd, size)
                finally:
                    os.close(fd)
            except OSError:
                mm, path = None, None
        box = [path]
        dist.broadcast_object_list(box, src=0)
        path = box[0]
        if rank != 0 and path is not None:
            try:
                fd = os.open(path, os.O_RDWR)
                try:
                    if os.fstat(fd).st_size == size:
                        mm = mmap.mmap(fd, size)
                finally:
                    os.close(fd)
            except OSError:
                mm = None
        answers: list = [None] * world
        dist.all_gather_object(answers, (mm is not None, os.getpid(), _pid_namespace()))
        if rank == 0 and path is not None:
            try:
                os.unlink(path)   # everyone that could open it has: nothing left behind
            except OSError:
                pass
        if not all(ok for ok, _, _ in answers):
            if mm is not None:
                mm.close()
            return None
        # pids tell a dead peer only within one pid namespace; elsewhere only the timeout does
        same_ns = len({ns for _, _, ns in answers}) == 1 and answers[0][2] is not None
        return cls(mm, rank, world, [pid for _, pid, _ in answers] if same_ns else [], timeout_s, slot_bytes)

    def __reduce__(self):
        """Copies of a model hooked to this group (``copy.deepcopy``, pickling, ``torch.save``) get
        None: torch rebuilds a copied DDP's reducer without comm hooks, so the copy averages
        through gloo like a copy of plain DDP, and a mapping shared with or re-opened by a copy
        could only corrupt the live ring."""
        return _detached, ()

    def close(self) -> None:
        self._views.clear()
        self.seqs = self.ctl = self._hdr = self._word = None
        try:
            self.mm.close()
        except BufferError:   # a view is still alive somewhere: the mapping goes with the process
            pass

    # -- waiting -------------------------------------------------------------------------------

    def _wait(self, done, what: str) -> None:
        if done():
            return
        yield_ = os.sched_yield
        start = time.perf_counter()
        spin_until = start + SPIN_S
        while True:
            for _ in range(32):
                yield_()
                if done():
                    return
            if time.perf_counter() > spin_until:
                break
        next_check = start + 1.0
        word, futex, addr, ts = self._word, self._futex, self._futex_addr, ctypes.byref(self._timespec)
        while True:
            seen = int(word[0])
            if done():   # after reading the word: a publish from now on changes it, so no lost wake-up
                return
            if futex is not None:
                futex(_SYS_FUTEX, ctypes.c_void_p(addr), _FUTEX_WAIT, ctypes.c_int(seen), ts, None, 0)
            else:
                time.sleep(2e-4)
            now = time.perf_counter()
            if now > next_check:
                next_check = now + 1.0
                self._check_peers(what, now - start)

    def _publish(self) -> None:
        """After a store the others may be waiting for: bump the futex word and wake them."""
        word = self._word
        word[0] = (int(word[0]) + 1) & 0x7FFFFFFF
        if self._futex is not None:
            self._futex(_SYS_FUTEX, ctypes.c_void_p(self._futex_addr), _FUTEX_WAKE, ctypes.c_int(0x7FFFFFFF),
                        None, None, 0)

    def _check_peers(self, what: str, waited: float) -> None:
        for r, pid in enumerate(self.pids):   # empty: not in one pid namespace
            if r == self.rank:
                continue
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                raise PeerGone(f"RayStrategy: rank {r} (pid {pid}) is gone; rank {self.rank} was waiting "
                               f"for it in {what}") from None
            except PermissionError:
                pass
        if waited > self.timeout_s:
            raise PeerGone(f"RayStrategy: rank {self.rank} timed out after {waited:.0f} s waiting for its "
                           f"peers in {what}")

    # -- gradients -----------------------------------------------------------------------------

    def _slot(self, parity: int, rank: int, dtype, numel: int):
        key = (parity, rank, dtype, numel)
        view = self._views.get(key)
        if view is None:
            import torch
            offset = self.hdr_bytes + (parity * self.world_size + rank) * self.slot_bytes
            view = self._views[key] = torch.frombuffer(self.mm, dtype=dtype, count=numel, offset=offset)
        return view

    def fits(self, tensor) -> bool:
        return (tensor.device.type == "cpu" and str(tensor.dtype).rsplit(".", 1)[-1] in _DTYPES
                and tensor.numel() * tensor.element_size() <= self.slot_bytes)

    def allreduce_mean_(self, tensor):
        """``tensor`` (contiguous, CPU) := the mean over the ranks, summed in rank order."""
        k = self.seq = self.seq + 1
        parity = k & 1   # a slot is rewritten two calls later, after every rank has read it
        flat = tensor.view(-1)
        numel, dtype = flat.numel(), flat.dtype
        self._slot(parity, self.rank, dtype, numel).copy_(flat)
        self.seqs[self.rank] = k   # after the data: x86 makes the stores visible in this order
        self._publish()
        seqs = self.seqs
        self._wait(lambda: seqs.min() >= k, "a gradient allreduce")
        slots = [self._slot(parity, r, dtype, numel) for r in range(self.world_size)]
        import torch
        torch.add(slots[0], slots[1], out=flat)
        for s in slots[2:]:
            flat.add_(s)
        flat.div_(self.world_size)
        return tensor

    # -- SIGTERM -------------------------------------------------------------------------------

    def note_sigterm(self) -> None:
        """From a signal handler on any rank: ask the group to stop at the next step."""
        ctl = self.ctl
        if ctl is not None:
            ctl[_CTL_SIGTERM] = 1
            self._publish()

    def sigterm_check(self, received: bool) -> bool:
        """Once per training step on every rank: whether all ranks stop now. Rank 0 decides one
        step ahead (a SIGTERM seen at step k stops every rank at step k+1), so the others need
        rank 0 only to have passed the previous step's check, which the previous step's gradient
        allreduce already guarantees: the check costs them no wait."""
        k = self.checks = self.checks + 1
        ctl = self.ctl
        if self.rank == 0:
            if (received or ctl[_CTL_SIGTERM]) and not ctl[_CTL_STOP]:
                ctl[_CTL_STOP] = k + 1
            ctl[_CTL_R0_CHECK] = k   # after the decision
            self._publish()
        else:
            self._wait(lambda: ctl[_CTL_R0_CHECK] >= k - 1, "the per-step SIGTERM check")
        stop = int(ctl[_CTL_STOP])
        return stop != 0 and stop <= k


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _futex_fn():
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    return fn


def _header_bytes(world_size: int) -> int:
    return (world_size + 1) * _LINE * 8


def _detached() -> None:
    """What a pickled or copied LocalGroup becomes (see ``LocalGroup.__reduce__``)."""
    return None


def allreduce_hook(group: LocalGroup | None, bucket):
    """DDP communication hook: gloo's allreduce-and-average, through ``group`` when it fits (a
    copied model's ``group`` is None: gloo)."""
    import torch
    tensor = bucket.buffer()
    if group is None or not group.fits(tensor):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook as gloo_hook
        return gloo_hook(None, bucket)
    group.allreduce_mean_(tensor)
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(tensor)
    return fut
