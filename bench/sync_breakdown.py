"""Where a synchronous round trip (submit one tiny task, get its result, repeat) spends its time
(issue 24): the rate, the driver's remote() and get() timed apart, and each thread's wake-ups
(voluntary context switches), preemptions and CPU per round trip, read from /proc; then the
worker alone, driven by a minimal node that only writes RUN and reads DONE (what is left is the
worker's own cost and the socket's). The driver's main thread is the user's; its other thread is
the node's.

    python bench/sync_breakdown.py            # 10,000 round trips each
    python bench/sync_breakdown.py -n 3000

Linux only (/proc/PID/task/TID/status and stat). Compare figures of one run: on a shared machine
they move with the load (printed).
"""
import argparse
import os
import pickle
import socket
import subprocess
import sys
import time


def threads(pid: int) -> dict:
    """(tid, name) -> (voluntary switches, involuntary ones, CPU ticks) of each thread of pid."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                status = f.read()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read().rsplit(")", 1)[1].split()
        except OSError:   # it ended meanwhile
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        out[(int(tid), fields["Name"].strip())] = (int(fields["voluntary_ctxt_switches"]),
                                                   int(fields["nonvoluntary_ctxt_switches"]),
                                                   int(stat[11]) + int(stat[12]))
    return out


def per_trip(before: dict, after: dict, n: int, label: str, main_tid: int) -> list[str]:
    tick = os.sysconf("SC_CLK_TCK")
    rows = []
    for key, (v, nv, cpu) in after.items():
        if key not in before:
            continue
        v0, nv0, cpu0 = before[key]
        if (v, nv, cpu) == (v0, nv0, cpu0):
            continue
        who = f"{label} {'main thread' if key[0] == main_tid else f'thread {key[0]} ({key[1]})'}"
        rows.append(f"  {who:<28} wake-ups {(v - v0) / n:5.2f}  preempted {(nv - nv0) / n:5.2f}  "
                    f"CPU {(cpu - cpu0) / tick / n * 1e6:6.1f} us")
    return rows


def through_raylite(n: int) -> None:
    import raylite as ray
    ray.init(num_cpus=2)
    try:
        @ray.remote
        def noop(x):
            return x

        @ray.remote
        def pid():
            return os.getpid()

        worker = ray.get(pid.remote())
        for i in range(500):
            ray.get(noop.remote(i))
        me, pc = os.getpid(), time.perf_counter
        before = {**threads(me), **{("w",) + k: v for k, v in threads(worker).items()}}
        t_remote = t_get = 0.0
        start = pc()
        for _ in range(n):
            a = pc()
            ref = noop.remote(1)
            b = pc()
            ray.get(ref)
            t_remote += b - a
            t_get += pc() - b
        dt = pc() - start
        after = {**threads(me), **{("w",) + k: v for k, v in threads(worker).items()}}
    finally:
        ray.shutdown()
    print(f"through raylite: {n / dt:,.0f} round trips/s, {dt / n * 1e6:.1f} us each: "
          f"remote() {t_remote / n * 1e6:.1f} us, get() {t_get / n * 1e6:.1f} us")
    drv = {k: v for k, v in after.items() if k[0] != "w"}
    wrk = {k[1:]: v for k, v in after.items() if k[0] == "w"}
    print("\n".join(per_trip({k: v for k, v in before.items() if k[0] != "w"}, drv, n, "driver", me)
                    + per_trip({k[1:]: v for k, v in before.items() if k[0] == "w"}, wrk, n, "worker", worker)))


_START = ("import pickle, sys; from raylite.core.worker import loop as worker; "
          "worker.run(pickle.loads(bytes.fromhex(sys.argv[1])), *map(int, sys.argv[2:]))")


def noop(x):
    return x


def worker_alone(n: int) -> None:
    """A worker process as the node starts one (raylite.core.worker.loop.run), its socket's other
    end written and read by this process directly."""
    import cloudpickle
    from raylite.core.wire import protocol, serialization
    from raylite.core.wire.protocol import Channel, Progress, TaskSpec, spec_to_wire
    ours, theirs = socket.socketpair()
    out_r, out_w = os.pipe()
    config = {"index": 1, "shm_prefix": "raylite-bench-", "sys_path": list(sys.path), "cwd": os.getcwd(),
              "job_id": "01000000", "node_id": "0" * 56, "namespace": "", "labels": None, "logging": None,
              "log_dir": None, "env": {}, "runtime_env": None, "site_dirs": [], "totals": {"CPU": 1},
              "device_ids": {}, "restarted": False}
    progress = Progress.create()   # (as the node's workers have: results may be held back)
    fds = [theirs.fileno(), out_w, os.dup(out_w)] + ([progress.fd] if progress else [])
    proc = subprocess.Popen([sys.executable, "-c", _START, pickle.dumps(config).hex(), *map(str, fds)],
                            pass_fds=fds)
    theirs.close()
    os.close(fds[1])
    os.close(fds[2])
    if progress:
        progress.handed_over()
    chan = Channel(ours)
    try:
        assert chan.recv()[0] == protocol.HELLO
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
        fn_bytes = cloudpickle.dumps(noop)
        ser, _ = serialization.dumps_args((1,), {}, None)

        def run(task_id: int) -> bytes:
            spec = TaskSpec("task", task_id, "noop", ser, return_ids=(task_id << 8,), fn_id="noop", max_retries=3)
            return protocol.encode((protocol.RUN, spec_to_wire(spec), fn_bytes if task_id == 1 else None, {}, {}, {}))

        msgs = [run(i) for i in range(1, n + 501)]

        def trips(lo: int, hi: int) -> None:
            for i in range(lo, hi):
                chan.sock.sendall(msgs[i - 1])
                msg = chan.recv()
                if msg[:2] != (protocol.DONE, i):
                    raise RuntimeError(f"expected the DONE of task {i}, got {msg!r:.200}")

        trips(1, 501)
        before = threads(proc.pid)
        start = time.perf_counter()
        trips(501, n + 501)
        dt = time.perf_counter() - start
        after = threads(proc.pid)
        chan.send((protocol.EXIT,))
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        chan.close()
        os.close(out_r)
        if progress:
            progress.close()
    print(f"worker alone (a minimal node writes RUN, reads DONE): {n / dt:,.0f} round trips/s, "
          f"{dt / n * 1e6:.1f} us each")
    print("\n".join(per_trip(before, after, n, "worker", proc.pid)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=10000, help="round trips each (default 10000)")
    args = ap.parse_args()
    if args.n < 1:
        ap.error(f"-n {args.n}: expected at least 1")
    if not os.path.isdir("/proc/self/task"):
        ap.error("this bench reads /proc (Linux)")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; per round trip:")
    through_raylite(args.n)
    worker_alone(args.n)


if __name__ == "__main__":
    main()
