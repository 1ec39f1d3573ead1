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

* ``FlatGradients``: DDP's gradient averaging without DDP's wrapper (RayStrategy, for a model whose
  gradients fit one slot): every gradient in one exchange at the end of each backward.

Waiting polls (with ``sched_yield``) for 50 microseconds, and on while a CPU is free (up to 2 ms),
then raises its rank's "asleep" flag and sleeps on a futex in the segment; a publish makes the
futex system call only when a peer's flag is up (waking a sleeping peer costs the waker 20-40 us
here, and most waits end within the poll). A peer that died or a wait longer than the process
group's timeout raises instead of hanging. The segment is created by rank 0 after the process
group is up, opened by the others, and unlinked as soon as everyone has it, so nothing stays
behind in ``/dev/shm``. Turned off with
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
# ... and on, up to SPIN_MAX_S, while /proc/loadavg shows no runnable thread waiting for a CPU
# (read every SPIN_S): a sleeper's wake-up costs its waker ~20-40 us and itself ~50 us here, and
# the step after a sleep runs with colder caches (wine quality, 2 ranks on 2 free CPUs: 1.39 s ->
# 1.34 s a fit). raylite's own workers poll by the same rule (raylite.core: RAYLITE_SPIN_US).
SPIN_MAX_S = 0.002
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
        self.mm, self.rank, self.world_size, self.pids = mm, rank, world_size, pids
        self.slot_bytes = slot_bytes
        self.timeout_s = timeout_s
        self.hdr_bytes = _header_bytes(world_size)
        # The header through memoryviews, not numpy: once per step between a whole step of other
        # code, a numpy reduction over two numbers took 10-15 us (its machinery out of the caches);
        # an item of a memoryview is a few instructions.
        hdr = memoryview(mm)[:self.hdr_bytes].cast("q")
        self._hdr = hdr
        self.seqs = hdr[0:world_size * _LINE:_LINE]                 # one cache line per rank
        self.asleep = hdr[1:world_size * _LINE:_LINE]               # in the same line: rank r sleeps
        self.ctl = hdr[world_size * _LINE:(world_size + 1) * _LINE]
        self.seq = 0
        self.checks = 0
        self._views: dict = {}
        # One 32-bit futex word (the low half of ctl[_CTL_FUTEX]) that every publish bumps and
        # wakes: a waiter that has spun long enough sleeps on it instead of polling.
        self._futex = _futex_fn()
        self._futex_addr = ctypes.addressof(ctypes.c_char.from_buffer(mm)) + (world_size * _LINE + _CTL_FUTEX) * 8
        word_at = (world_size * _LINE + _CTL_FUTEX) * 8
        self._word = memoryview(mm)[word_at:word_at + 4].cast("i")
        self._timespec = _Timespec(0, 100_000_000)   # 100 ms: then look at the peers again
        # The first sleep of a wait is short: a publisher reads the flags without a fence, so in
        # principle it can miss a flag raised at that instant; the wait then ends by this timeout.
        self._first_timespec = _Timespec(0, 1_000_000)

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
        for view in (self.seqs, self.asleep, self.ctl, self._hdr, self._word):
            if view is not None:
                view.release()
        self.seqs = self.asleep = self.ctl = self._hdr = self._word = None
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
        spin_until, spin_max = start + SPIN_S, start + SPIN_MAX_S
        while True:
            for _ in range(32):
                yield_()
                if done():
                    return
            now = time.perf_counter()
            if now > spin_until:
                if now > spin_max or not _cpu_free():
                    break
                spin_until = now + SPIN_S
        next_check = start + 1.0
        word, futex, addr = self._word, self._futex, self._futex_addr
        ts, asleep, rank = ctypes.byref(self._first_timespec), self.asleep, self.rank
        asleep[rank] = 1   # before reading the word: a publish that misses it still changes the word
        try:
            while True:
                seen = word[0]
                if done():   # after reading the word: a publish from now on changes it, no lost wake-up
                    return
                if futex is not None:
                    futex(_SYS_FUTEX, ctypes.c_void_p(addr), _FUTEX_WAIT, ctypes.c_int(seen), ts, None, 0)
                    ts = ctypes.byref(self._timespec)
                else:
                    time.sleep(2e-4)
                now = time.perf_counter()
                if now > next_check:
                    next_check = now + 1.0
                    self._check_peers(what, now - start)
        finally:
            asleep[rank] = 0

    def _publish(self) -> None:
        """After a store the others may be waiting for: bump the futex word and wake any asleep."""
        word = self._word
        word[0] = (word[0] + 1) & 0x7FFFFFFF
        if self._futex is not None and any(self.asleep):
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

    def _next(self) -> int:
        """The next exchange's number; its parity picks the slots (a slot is rewritten two
        exchanges later, after every rank has read it)."""
        self.seq += 1
        return self.seq

    def _exchange(self, k: int, dtype, numel: int, out) -> None:
        """After this rank wrote its slot of exchange ``k``: ``out`` := the sum of every rank's
        slot, in rank order (so every rank gets the same bits)."""
        self.seqs[self.rank] = k   # after the data: x86 makes the stores visible in this order
        self._publish()
        seqs = self.seqs
        self._wait(lambda: min(seqs) >= k, "a gradient allreduce")
        slots = [self._slot(k & 1, r, dtype, numel) for r in range(self.world_size)]
        import torch
        torch.add(slots[0], slots[1], out=out)
        for s in slots[2:]:
            out.add_(s)

    def allreduce_mean_(self, tensor):
        """``tensor`` (contiguous, CPU) := the mean over the ranks, summed in rank order."""
        k = self._next()
        flat = tensor.view(-1)
        numel, dtype = flat.numel(), flat.dtype
        self._slot(k & 1, self.rank, dtype, numel).copy_(flat)
        self._exchange(k, dtype, numel, flat)
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
        stop = ctl[_CTL_STOP]
        return stop != 0 and stop <= k


class FlatGradients:
    """DDP's gradient averaging for ``params`` without DDP (RayStrategy's same-host path).

    DDP's wrapper costs a small model more per step than its arithmetic (forward bookkeeping, an
    autograd hook per parameter, buckets, a comm hook). Here each parameter only has a
    post-accumulate hook, and the first one of an armed backward queues ``_finish`` for the end of
    that backward (where DDP's reducer finishes too, before Lightning's ``on_after_backward``):
    one exchange of every gradient and a "had a gradient" flag per parameter, averaged in rank order
    as ``allreduce_mean_``. A gradient that only some ranks produced is averaged with zeros from the
    others (DDP's ``find_unused_parameters``); one no rank produced stays None. ``arm`` before a
    backward that should synchronise (Lightning's ``pre_backward``); an unarmed backward (gradient
    accumulation's ``no_sync``, a backward of the user's own) stays local, as under DDP.
    """

    def __init__(self, group: LocalGroup, params: list):
        import torch
        self.group, self.params = group, list(params)
        self.sizes = [p.numel() for p in self.params]
        self.numel = sum(self.sizes)
        self.total = self.numel + len(self.params)
        self.dtype = self.params[0].dtype
        self.armed = False
        self._queued = False
        self._sum = torch.empty(self.total, dtype=self.dtype)
        self._sum_grads = self._chunks(self._sum)
        self._sum_values = self._sum[:self.numel]
        self._sum_flags = self._sum[self.numel:]
        # dividing by a 0-d tensor, not a number, skips wrapping the number each step (2 us -> 0.9)
        self._world = torch.tensor(group.world_size, dtype=self.dtype)
        mine = [group._slot(parity, group.rank, self.dtype, self.total) for parity in (0, 1)]
        self._mine_grads = [self._chunks(m) for m in mine]
        self._mine_flags = [m[self.numel:] for m in mine]
        self._flags_set = [False, False]   # per parity: every "had a gradient" flag in my slot is 1 already
        self._handles = [p.register_post_accumulate_grad_hook(self._accumulated) for p in self.params]

    @staticmethod
    def fits(group: LocalGroup, params: list) -> bool:
        """Dense CPU parameters of one supported dtype whose gradients and flags fit one slot."""
        if not params:
            return False
        dtype = params[0].dtype
        return (str(dtype).rsplit(".", 1)[-1] in _DTYPES
                and all(p.device.type == "cpu" and p.dtype == dtype and p.layout == params[0].layout
                        for p in params)
                and (sum(p.numel() for p in params) + len(params)) * params[0].element_size() <= group.slot_bytes)

    def _chunks(self, flat) -> list:
        return [c.view_as(p) for c, p in zip(flat[:self.numel].split(self.sizes), self.params)]

    def arm(self, sync: bool = True) -> None:
        self.armed, self._queued = sync, False

    def _accumulated(self, _param) -> None:
        if self.armed and not self._queued:
            import torch
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self.finish)

    def finish(self) -> None:
        """The exchange of an armed backward (also called after a backward in which no parameter
        got a gradient on this rank, so that its peers are not left waiting)."""
        if not self.armed:
            return
        self.armed = self._queued = False
        import torch
        group = self.group
        k = group._next()
        parity = k & 1
        grads = [p.grad for p in self.params]
        missing = [i for i, g in enumerate(grads) if g is None]
        if not missing:
            torch._foreach_copy_(self._mine_grads[parity], grads)
            if not self._flags_set[parity]:
                self._mine_flags[parity].fill_(1)
                self._flags_set[parity] = True
        else:
            flags = self._mine_flags[parity]
            flags.fill_(1)
            self._flags_set[parity] = False
            for i, (chunk, g) in enumerate(zip(self._mine_grads[parity], grads)):
                if g is None:
                    chunk.zero_()
                    flags[i] = 0
                else:
                    chunk.copy_(g)
        group._exchange(k, self.dtype, self.total, self._sum)
        self._sum_values.div_(self._world)
        if not missing:
            torch._foreach_copy_(grads, self._sum_grads)
            return
        used = self._sum_flags.tolist()
        for i, (p, g, avg) in enumerate(zip(self.params, grads, self._sum_grads)):
            if g is not None:
                g.copy_(avg)
            elif used[i]:
                p.grad = avg.clone()

    def close(self) -> None:
        """Remove the hooks and let go of the segment (before ``LocalGroup.close``)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._mine_grads = self._mine_flags = None


def _cpu_free() -> bool:
    """Whether no runnable thread waits for a CPU (this one counts as running): /proc/loadavg's
    fourth field against the machine's CPUs; False where it cannot be read."""
    global _LOADAVG
    if _LOADAVG is None:
        try:
            _LOADAVG = os.open("/proc/loadavg", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            _LOADAVG = -1
    if _LOADAVG < 0:
        return False
    try:   # "1.00 0.50 0.25 3/120 4567": 3 runnable now
        return int(os.pread(_LOADAVG, 64, 0).split()[3].split(b"/")[0]) <= _CPUS
    except (OSError, ValueError, IndexError):
        return False


_LOADAVG: int | None = None
_CPUS = os.cpu_count() or 1   # the machine's: /proc/loadavg counts all of its threads


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
