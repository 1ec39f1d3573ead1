"""How fast a synchronous round trip between two processes can go here, beside the raw pipe
(issue 24: tiny tasks with a result each): a pipe, and a shared-memory doorbell with a bounded
spin, for each spin bound.

    python bench/doorbell.py                   # spins of 0, 20, 50 and 100 us, both sides
    python bench/doorbell.py --spin 0,50 -n 5000

A caller (the driver's side) sends a message of --down bytes and waits for one of --up bytes
from an echo process (the worker's side); the defaults are the sizes of a tiny task's RUN and
DONE in raylite. Three ways to carry them:

- pipe: os.write / a blocking os.read on a pair of pipes (what raylite's sockets cost at least);
- doorbell, spin N us: the message is copied into shared memory and a counter there bumped. The
  waiter reads the counter for up to N us; then it raises its "asleep" flag, looks once more, and
  blocks reading a pipe, which the sender writes only when it saw that flag (after its bump). A
  locked instruction orders each side's store before its load (x86: the acquire of a lock is
  one), so a bump is never missed: either the waiter's second look sees it, or the sender sees
  the flag. While the peer spins, a round trip makes no system call at all;
- the same with only the caller, or only the echo, spinning (which side a design would make spin).

Each figure is the best of --rounds rounds; with it, the CPU each side spent per round trip, and
what the echo burns while idle: in the second after a request (its spin, once), and in the
second after that (what an idle worker would pay all day: 0, it is blocked). --place pins the two
to one CPU or two (where the scheduler puts them decides which costs what: a wake-up on another
CPU of this VM costs tens of microseconds, a spin beside its peer on the same CPU delays it by the
whole spin); --caller-work and --echo-work stand in for what each side does per message.
"""
import argparse
import mmap
import os
import select
import sys
import threading
import time

ROUND_CAP_S = 2.0   # the most one round runs
IDLE_S = 1.0        # the echo's idle wait, whose CPU is measured
IDLE_WAIT_S = 0.1   # (far past any spin: the echo is blocked by then)
GUARD_S = 5.0       # a blocked waiter looks at the counter again after this (a missed wake-up is counted, not hung on)
LANE = 512          # bytes per direction in the shared page: [seq, asleep, size], then the message
_SEQ, _ASLEEP, _SIZE = 0, 1, 2
_HEAD = 24


class Lane:
    """One direction of the doorbell: one writer, one waiter."""

    def __init__(self, mm: mmap.mmap, offset: int, bell_r: int, bell_w: int):
        self.mm, self.base = mm, offset
        self.q = memoryview(mm)[offset:offset + _HEAD].cast("Q")
        self.bell_r, self.bell_w = bell_r, bell_w
        self.fence = threading.Lock()
        self.missed = 0   # wake-ups the guard had to make up for (a bug if not 0)

    def _fence(self) -> None:
        self.fence.acquire()
        self.fence.release()

    def send(self, data: bytes) -> None:
        q = self.q
        start = self.base + _HEAD
        self.mm[start:start + len(data)] = data
        q[_SIZE] = len(data)
        q[_SEQ] += 1
        self._fence()
        if q[_ASLEEP]:
            q[_ASLEEP] = 0
            os.write(self.bell_w, b"!")

    def wait(self, seen: int, spin_s: float) -> bytes:
        """The next message after number `seen`."""
        q = self.q
        if q[_SEQ] == seen and spin_s:
            deadline = time.perf_counter() + spin_s
            while q[_SEQ] == seen and time.perf_counter() < deadline:
                pass
        while q[_SEQ] == seen:
            q[_ASLEEP] = 1
            self._fence()
            if q[_SEQ] != seen:
                q[_ASLEEP] = 0   # (the sender may ring anyway: a later wait reads that byte and looks again)
                break
            if select.select([self.bell_r], [], [], GUARD_S)[0]:
                os.read(self.bell_r, 1)
            elif q[_SEQ] != seen:
                self.missed += 1
        start = self.base + _HEAD
        return self.mm[start:start + q[_SIZE]]


def busy(seconds: float) -> None:
    """Stand in for the work a side does per message (--caller-work, --echo-work)."""
    if seconds:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass


def cpu_ns(pid: int) -> int:
    """Nanoseconds `pid` has run (/proc/PID/schedstat's first field)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


PLACES = {"os": None, "same": (0, 0), "apart": (0, 1)}   # --place: the caller's CPU, the echo's


def place(which: int) -> None:
    """Pin this process (0: the caller, 1: the echo) as --place says (PLACE)."""
    cpus = PLACES[PLACE]
    if cpus is not None:
        os.sched_setaffinity(0, {cpus[which] % os.cpu_count()})


PLACE = "os"
WORK = [0.0, 0.0]   # --caller-work, --echo-work (s)


def measure(name: str, start_echo, call, stop, rounds: int, n: int, down: bytes) -> dict:
    """Best rate of `n` calls over `rounds`, the CPU per round trip of each side in that round,
    and the echo's CPU over an idle second."""
    pid = start_echo()
    me = os.getpid()
    try:
        for _ in range(200):
            call(down)
        best = None
        for _ in range(rounds):
            c0, e0, t0 = cpu_ns(me), cpu_ns(pid), time.perf_counter()
            done, deadline = 0, t0 + ROUND_CAP_S
            while done < n and time.perf_counter() < deadline:
                call(down)
                done += 1
            dt = time.perf_counter() - t0
            c1, e1 = cpu_ns(me), cpu_ns(pid)
            row = {"rate": done / dt, "caller_us": (c1 - c0) / done / 1e3, "echo_us": (e1 - e0) / done / 1e3}
            if best is None or row["rate"] > best["rate"]:
                best = row
        # the echo's CPU is read while it is blocked (a running process's count lags up to a tick)
        call(down)
        time.sleep(IDLE_WAIT_S)
        e0 = cpu_ns(pid)
        call(down)   # the echo now waits for the next request, which comes IDLE_S later
        time.sleep(IDLE_S)
        e1 = cpu_ns(pid)
        best["idle_us"] = (e1 - e0) / 1e3
        time.sleep(IDLE_S)   # and a second idle second: what an idle echo burns for ever
        best["idle_more_us"] = (cpu_ns(pid) - e1) / 1e3
        call(down)
    finally:
        stop()
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status):
            print(f"  ({name}: the echo ended with {os.waitstatus_to_exitcode(status)}; 3: its guard made up "
                  f"for a missed wake-up)", file=sys.stderr)
    best["name"] = name
    return best


def pipe_peer(up_size: int):
    """An echo over a pair of pipes: (start, call, stop)."""
    state = {}

    def start():
        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                place(1)
                os.close(down_w)
                os.close(up_r)
                reply = b"r" * up_size
                while os.read(down_r, 65536):
                    busy(WORK[1])
                    os.write(up_w, reply)
            finally:
                os._exit(0)
        os.close(down_r)
        os.close(up_w)
        state.update(down=down_w, up=up_r)
        return pid

    def call(data: bytes) -> bytes:
        busy(WORK[0])
        os.write(state["down"], data)
        return os.read(state["up"], 65536)

    def stop():
        os.close(state["down"])
        os.close(state["up"])

    return start, call, stop


def doorbell_peer(up_size: int, caller_spin_s: float, echo_spin_s: float):
    """An echo over the shared-memory doorbell: (start, call, stop)."""
    state = {}

    def start():
        mm = mmap.mmap(-1, 2 * LANE)   # anonymous and shared: the fork sees the same page
        bells = [os.pipe(), os.pipe()]
        down = Lane(mm, 0, *bells[0])
        up = Lane(mm, LANE, *bells[1])
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                place(1)
                reply, seen = b"r" * up_size, 0
                while True:
                    msg = down.wait(seen, echo_spin_s)
                    seen += 1
                    if not len(msg):
                        break
                    busy(WORK[1])
                    up.send(reply)
                code = 0 if not down.missed else 3
            finally:
                os._exit(code)
        state.update(mm=mm, down=down, up=up, seen=0, bells=bells)
        return pid

    def call(data: bytes) -> bytes:
        busy(WORK[0])
        state["down"].send(data)
        msg = state["up"].wait(state["seen"], caller_spin_s)
        state["seen"] += 1
        return msg

    def stop():
        state["down"].send(b"")
        if state["up"].missed:
            print(f"  (the caller's guard made up for {state['up'].missed} missed wake-ups)", file=sys.stderr)
        for r, w in state["bells"]:
            os.close(r)
            os.close(w)

    return start, call, stop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spin", default="0,20,50,100", help="spin bounds in us, comma-separated (default 0,20,50,100)")
    ap.add_argument("-n", type=int, default=20000, help="round trips per round (default 20000)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per figure, the best kept (default 3)")
    ap.add_argument("--down", type=int, default=156, help="bytes of each request (default 156: a tiny task's RUN)")
    ap.add_argument("--up", type=int, default=57, help="bytes of each reply (default 57: its DONE)")
    ap.add_argument("--one-side", type=float, default=50.0,
                    help="the spin (us) of the one-side-only rows; 0 leaves them out (default 50)")
    ap.add_argument("--place", default="os", choices=sorted(PLACES),
                    help="os: where the scheduler puts them (default); same: both on CPU 0; apart: CPUs 0 and 1")
    ap.add_argument("--caller-work", type=float, default=0.0,
                    help="us of CPU the caller spends before each request (raylite's driver: ~50)")
    ap.add_argument("--echo-work", type=float, default=0.0,
                    help="us of CPU the echo spends on each request before replying (raylite's worker: ~20)")
    args = ap.parse_args()
    global PLACE
    PLACE = args.place
    if args.caller_work < 0 or args.echo_work < 0:
        ap.error("--caller-work/--echo-work must be >= 0 us")
    WORK[:] = [args.caller_work * 1e-6, args.echo_work * 1e-6]
    if PLACES[PLACE] is not None and os.cpu_count() < 2 and PLACE == "apart":
        ap.error("--place apart: this machine has one CPU")
    place(0)
    try:
        spins = [float(s) for s in args.spin.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--spin {args.spin!r}: expected microseconds separated by commas, such as 0,20,50")
    for field in ("n", "rounds", "down", "up"):
        if getattr(args, field) < 1:
            ap.error(f"--{field} {getattr(args, field)}: expected at least 1")
    if args.down > LANE - _HEAD or args.up > LANE - _HEAD:
        ap.error(f"--down/--up: at most {LANE - _HEAD} bytes (one lane of the shared page)")
    if any(s < 0 for s in spins) or args.one_side < 0:
        ap.error("spin bounds must be >= 0 us")
    down = b"x" * args.down
    rows = [measure("pipe, 1 byte each way", *pipe_peer(1), args.rounds, args.n, b"x"),
            measure(f"pipe, {args.down} B down, {args.up} B up", *pipe_peer(args.up), args.rounds, args.n, down)]
    for s in spins:
        rows.append(measure(f"doorbell, both spin {s:g} us", *doorbell_peer(args.up, s * 1e-6, s * 1e-6),
                            args.rounds, args.n, down))
    if args.one_side:
        s = args.one_side * 1e-6
        rows.append(measure(f"doorbell, caller spins {args.one_side:g} us", *doorbell_peer(args.up, s, 0.0),
                            args.rounds, args.n, down))
        rows.append(measure(f"doorbell, echo spins {args.one_side:g} us", *doorbell_peer(args.up, 0.0, s),
                            args.rounds, args.n, down))
    load = os.getloadavg()[0]
    print(f"load average {load:.2f} on {os.cpu_count()} CPUs, placed: {PLACE}; work per trip: caller "
          f"{args.caller_work:g} us, echo {args.echo_work:g} us; best of {args.rounds} round(s) of {args.n:,} "
          f"round trips (or {ROUND_CAP_S:g} s)")
    print(f"{'carrier':<36} {'round trips/s':>13} {'us each':>8} {'caller CPU':>10} {'echo CPU':>9} "
          f"{'echo idle CPU, us':>18}")
    print(f"{'':<36} {'':>13} {'':>8} {'us/trip':>10} {'us/trip':>9} {'1st s':>8} {'2nd s':>9}")
    for r in rows:
        print(f"{r['name']:<36} {r['rate']:>13,.0f} {1e6 / r['rate']:>8.1f} {r['caller_us']:>10.1f} "
              f"{r['echo_us']:>9.1f} {r['idle_us']:>8.0f} {r['idle_more_us']:>9.0f}")
    print("echo idle CPU: in the 1st idle second, one request from blocked (a wake-up), its reply, then its "
          "spin; in the 2nd, what an idle echo burns for ever (0: it is blocked)")


if __name__ == "__main__":
    main()
