"""raylite beside what a user would pick instead on one machine (issue 24), in one run.

    python bench/peers.py                       # every peer that is installed (the bench extra)
    python bench/peers.py --peers raylite,mp    # some of them
    python bench/peers.py --quick               # a smoke run: tiny counts, a 1 MB array, one round
    python bench/peers.py --only putget         # some figures (start + first result always)

Peers: raylite, ray, cf (concurrent.futures.ProcessPoolExecutor), mp (multiprocessing.Pool), loky
and dask (distributed.LocalCluster), 2 worker processes each. Each runs in a fresh child process
(`--_child PEER OUTFILE`), so imports and start are cold and peers cannot interfere; the child
streams one JSON line per figure, and a crash or timeout keeps the figures so far. The same work on
each: start + first result; tiny tasks (a no-op with one small argument) with a result each, and a
batch submitted then gathered (best of --rounds each); a task summing a 100 MB array passed as its
argument; actor calls (n/a where the peer has no actors); put + get of the array beside an
in-process copy. The raw pipe round trip between two processes, each on its own CPU, is the ceiling
for "result each" (printed beside the same on one CPU, where no wake-up crosses CPUs).
Each cell shows its figure and, in brackets, its speed relative to the best peer (1.00 = best).
"""
import argparse, importlib.util, json, os, sys
from time import perf_counter
import children  # bench/children.py: this script's folder is on sys.path
import machine   # bench/machine.py

PEERS = {   # name: (column, module that must be importable)
    "raylite": ("raylite", "raylite"),
    "ray": ("ray", "ray"),
    "cf": ("ProcessPool", "concurrent.futures"),
    "mp": ("mp.Pool", "multiprocessing"),
    "loky": ("loky", "loky"),
    "dask": ("dask", "distributed"),
}
# key, label, unit, higher is better
FIGURES = [
    ("start_s", "start + first result", "s", False),
    ("sync_per_s", "tiny tasks, result each", "/s", True),
    ("batch_per_s", "tiny tasks, {batch} submitted then gathered", "/s", True),
    ("array_ms", "task summing a {mb} MB array argument", "ms", False),
    ("actor_per_s", "actor calls, result each", "/s", True),
    ("actor_batch_per_s", "actor calls, {batch} submitted then gathered", "/s", True),
    ("putget_gbps", "put + get of the {mb} MB array", "GB/s", True),
    ("copy_gbps", "in-process copy of it (same child)", "GB/s", True),
    ("putget_vs_copy", "put + get vs the copy", "x", True),
]
WORKERS = 2
GROUPS = ("sync", "batch", "actor", "array", "putget")   # --only: start + first result is always measured
ROUND_CAP_S = 3.0   # the most one 'result each' round runs
FIGURE_BUDGET_S = 30.0   # no batch round starts after this


# ---------------------------------------------------------------- task bodies (pickled by value from __main__)
def noop(x):
    return x


def total(a):
    return float(a.sum())


class Counter:
    def __init__(self):
        self.n = 0

    def inc(self):
        self.n += 1
        return self.n


# ---------------------------------------------------------------- peers: the same operations on each
class RayLike:
    """raylite, or Ray itself: tasks, actors and the object store."""

    def __init__(self, module):
        import importlib
        self.ray = importlib.import_module(module)
        # Ray's own local instance: init() with no address would join a cluster left running here
        self.ray.init(num_cpus=WORKERS, **({"address": "local"} if module == "ray" else {}))
        self.fns = {}

    def _remote(self, fn):
        if fn not in self.fns:
            self.fns[fn] = self.ray.remote(fn)
        return self.fns[fn]

    def call(self, fn, *args):
        return self.ray.get(self._remote(fn).remote(*args))

    def batch(self, fn, args):
        f = self._remote(fn)
        return self.ray.get([f.remote(a) for a in args])

    def actor(self):
        a = self.ray.remote(Counter).remote()
        return (lambda: self.ray.get(a.inc.remote()),
                lambda n: self.ray.get([a.inc.remote() for _ in range(n)]))

    def putget(self, arr):
        return self.ray.get(self.ray.put(arr))

    def close(self):
        self.ray.shutdown()


class Executor:
    """concurrent.futures.ProcessPoolExecutor or loky's reusable executor: tasks only."""

    def __init__(self, kind):
        if kind == "loky":
            import loky
            self.ex = loky.get_reusable_executor(max_workers=WORKERS)
        else:
            from concurrent.futures import ProcessPoolExecutor
            self.ex = ProcessPoolExecutor(max_workers=WORKERS)

    def call(self, fn, *args):
        return self.ex.submit(fn, *args).result()

    def batch(self, fn, args):
        return [f.result() for f in [self.ex.submit(fn, a) for a in args]]

    actor = putget = None

    def close(self):
        self.ex.shutdown()


class MpPool:
    """multiprocessing.Pool (its default start method): apply and apply_async."""

    def __init__(self):
        import multiprocessing
        self.pool = multiprocessing.Pool(WORKERS)

    def call(self, fn, *args):
        return self.pool.apply(fn, args)

    def batch(self, fn, args):
        return [r.get() for r in [self.pool.apply_async(fn, (a,)) for a in args]]

    actor = putget = None

    def close(self):
        self.pool.close()
        self.pool.join()


class Dask:
    """dask.distributed on a LocalCluster of 2 single-threaded worker processes."""

    def __init__(self):
        import logging, warnings
        from distributed import Client, LocalCluster
        warnings.filterwarnings("ignore")   # "large object in the task graph" for the array figure
        logging.getLogger("distributed").setLevel(logging.ERROR)
        self.cluster = LocalCluster(n_workers=WORKERS, threads_per_worker=1, processes=True,
                                    dashboard_address=None)
        self.client = Client(self.cluster)

    def call(self, fn, *args):
        return self.client.submit(fn, *args, pure=False).result()

    def batch(self, fn, args):
        return self.client.gather([self.client.submit(fn, a, pure=False) for a in args])

    def actor(self):
        a = self.client.submit(Counter, actor=True).result()
        return (lambda: a.inc().result(), lambda n: [f.result() for f in [a.inc() for _ in range(n)]])

    def putget(self, arr):
        return self.client.scatter(arr).result()

    def close(self):
        self.client.close()
        self.cluster.close()


def make_peer(name):
    if name in ("raylite", "ray"):
        return RayLike(name)
    if name in ("cf", "loky"):
        return Executor(name)
    if name == "mp":
        return MpPool()
    if name == "dask":
        return Dask()
    raise ValueError(f"--peers: unknown peer {name!r}; expected some of {', '.join(PEERS)}")


# ---------------------------------------------------------------- child side
def best_rate(rounds, n, run, budget_s=FIGURE_BUDGET_S):
    """The best of `rounds` rates of `run()`, which does `n` operations; no round starts once
    `budget_s` has passed (a slow peer's 5,000 calls can take minutes)."""
    best, start = 0.0, perf_counter()
    for _ in range(rounds):
        t0 = perf_counter()
        run()
        best = max(best, n / (perf_counter() - t0))
        if perf_counter() - start > budget_s:
            break
    return best


def best_rate_each(rounds, n, call, cap_s=ROUND_CAP_S):
    """The best of `rounds` rates of `call()` repeated `n` times, a round stopping after `cap_s`
    (a slow peer's 2,000 calls would take minutes)."""
    best = 0.0
    for _ in range(rounds):
        t0 = perf_counter()
        deadline = t0 + cap_s
        done = 0
        while done < n:
            call()
            done += 1
            if perf_counter() > deadline:
                break
        best = max(best, done / (perf_counter() - t0))
    return best


def child(name, outfile, args):
    t0 = perf_counter()   # nothing but the stdlib imported so far: the peer's imports count
    out = open(outfile, "a")

    def emit(key, value=None, error=None):
        out.write(json.dumps({"key": key, "value": value, "error": error}) + "\n")
        out.flush()

    def figure(keys, fn):
        if args.only and fn.__name__ not in args.only:
            return
        try:
            fn()
        except Exception as e:   # one failing figure must not stop the others
            import traceback
            traceback.print_exception(e)
            for k in keys:
                emit(k, error=f"{type(e).__name__}: {e}"[:200])

    peer = make_peer(name)
    assert peer.call(noop, 1) == 1
    emit("start_s", perf_counter() - t0)
    try:
        def sync():
            for i in range(20):
                peer.call(noop, i)
            emit("sync_per_s", best_rate_each(args.rounds, args.sync, lambda: peer.call(noop, 1)))

        def batch():
            items = list(range(args.batch))
            assert peer.batch(noop, items[:10]) == items[:10]
            emit("batch_per_s", best_rate(args.rounds, args.batch, lambda: peer.batch(noop, items)))
        figure(["sync_per_s"], sync)
        figure(["batch_per_s"], batch)

        def actor():
            if peer.actor is None:
                return [emit(k, "n/a") for k in ("actor_per_s", "actor_batch_per_s")]
            each, many = peer.actor()
            each()
            emit("actor_per_s", best_rate_each(args.rounds, args.sync, each))
            emit("actor_batch_per_s", best_rate(args.rounds, args.batch, lambda: many(args.batch)))
        figure(["actor_per_s", "actor_batch_per_s"], actor)

        import numpy as np
        arr = np.random.default_rng(0).random(int(args.array_mb * 1e6) // 8)
        expect = float(arr.sum())

        def array():
            times = []
            for _ in range(args.rounds):
                t = perf_counter()
                got = peer.call(total, arr)
                times.append(perf_counter() - t)
                assert abs(got - expect) <= 1e-6 * abs(expect)
            emit("array_ms", min(times) * 1e3)
        figure(["array_ms"], array)

        def putget():
            keys = ("putget_gbps", "copy_gbps", "putget_vs_copy")
            if peer.putget is None:
                return [emit(k, "n/a") for k in keys]
            copy_t, pg_t = [], []
            for _ in range(max(args.rounds, 3)):
                t = perf_counter(); c = arr.copy(); copy_t.append(perf_counter() - t); del c
                t = perf_counter(); c = peer.putget(arr); pg_t.append(perf_counter() - t)
                assert c.shape == arr.shape; del c
            emit("putget_gbps", arr.nbytes / min(pg_t) / 1e9)
            emit("copy_gbps", arr.nbytes / min(copy_t) / 1e9)
            emit("putget_vs_copy", min(copy_t) / min(pg_t))
        figure(["putget_gbps", "copy_gbps", "putget_vs_copy"], putget)
    finally:
        peer.close()
        out.close()


def pipe_round_trips(n, rounds, cpus=None):
    """Round trips per second of one byte each way over a pair of pipes between two processes:
    the most a synchronous submit-then-get can reach here without spinning. `cpus`: the CPUs to
    pin this process and the echo to (unpinned, the figure is whichever placement the scheduler
    picked: on this VM a wake-up across CPUs costs tens of microseconds, on the same CPU a few)."""
    mine = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, {cpus[0]})
    down_r, down_w = os.pipe()
    up_r, up_w = os.pipe()
    pid = os.fork()
    if pid == 0:   # echo until the parent closes its end
        try:
            if cpus:
                os.sched_setaffinity(0, {cpus[1]})
            os.close(down_w)
            os.close(up_r)
            while os.read(down_r, 1):
                os.write(up_w, b"r")
        finally:
            os._exit(0)
    os.close(down_r)
    os.close(up_w)
    try:
        def run():
            for _ in range(n):
                os.write(down_w, b"x")
                os.read(up_r, 1)
        return best_rate(rounds, n, run)
    finally:
        os.close(down_w)
        os.close(up_r)
        os.waitpid(pid, 0)
        os.sched_setaffinity(0, mine)


def pipe_ceilings(n, rounds):
    """The pipe round trip with the two processes on two CPUs (as raylite's driver and worker run:
    the ceiling of 'result each'; None on one CPU) and on one."""
    cpus = sorted(os.sched_getaffinity(0))
    two = pipe_round_trips(n, rounds, (cpus[0], cpus[1])) if len(cpus) > 1 else None
    return two, pipe_round_trips(n, rounds, (cpus[0], cpus[0]))


# ---------------------------------------------------------------- parent side
def run_child(name, args):
    """One peer in a fresh process in its own session (what it leaves running is killed)."""
    extra = ["--rounds", args.rounds, "--batch", args.batch, "--sync", args.sync, "--array-mb", args.array_mb]
    if args.only:
        extra += ["--only", ",".join(args.only)]
    return children.run_child(__file__, name, extra, [k for k, *_ in FIGURES],
                              args.timeout, args.verbose)


DIGITS = {"s": 2, "ms": 1, "GB/s": 2, "x": 2, "/s": 0}


def fmt(v, unit):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return f"{v:,.{DIGITS[unit]}f}"


def speed(v, best, higher):
    """v's speed relative to best (1.0 = as fast)."""
    return v / best if higher else best / v


def table(peers, results, args, ceiling):
    numeric = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
    others = [p for p in peers if p != "raylite"]
    head = ["figure", "unit"] + [PEERS[p][0] for p in peers]
    if "raylite" in peers and others:
        head.append("raylite/best other")
    rows, errors = [], {}
    for key, label, unit, higher in FIGURES:
        row = [label.format(batch=f"{args.batch:,}", mb=f"{args.array_mb:g}"), unit]
        vals = {p: results[p].get(key, "-") for p in peers}
        good = [v for v in vals.values() if numeric(v)]
        best = (max if higher else min)(good) if good else None
        for p in peers:
            v = vals[p]
            if isinstance(v, str) and v.startswith("error: "):
                row.append(f"error [{errors.setdefault(f'{p}: {v[7:]}', len(errors) + 1)}]")
            elif numeric(v) and key != "copy_gbps":
                row.append(f"{fmt(v, unit)} ({speed(v, best, higher):.2f})")
            else:
                row.append(fmt(v, unit))
        if len(head) > len(row):
            mine = vals["raylite"]
            theirs = [vals[p] for p in others if numeric(vals[p])]
            ok = numeric(mine) and theirs and key not in ("copy_gbps", "putget_vs_copy")
            row.append(f"{speed(mine, (max if higher else min)(theirs), higher):.2f}x" if ok else "")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    lines = [line(head), "  ".join("-" * w for w in widths)] + [line(r) for r in rows]
    sync = results.get("raylite", {}).get("sync_per_s")
    two, one = ceiling
    if two is not None:
        lines.append(f"ceiling of 'result each': raw pipe round trip between two processes on two CPUs {two:,.0f} /s"
                     + (f" (raylite at {sync / two:.0%} of it)" if numeric(sync) else "")
                     + f"; on one CPU {one:,.0f} /s (no wake-up crosses CPUs; spinning beats both: bench/doorbell.py)")
    else:
        lines.append(f"ceiling of 'result each': raw pipe round trip between two processes on this one CPU {one:,.0f} /s"
                     + (f" (raylite at {sync / one:.0%} of it)" if numeric(sync) else ""))
    lines.append(f"(n) = speed relative to the best peer; {WORKERS} workers each; best of {args.rounds} "
                 f"round(s) (fewer after {FIGURE_BUDGET_S:g} s), {args.sync:,} calls (or {ROUND_CAP_S:g} s) per "
                 "'result each' round")
    lines += [f"[{n}] {msg}" for msg, n in errors.items()]
    return "\n".join(lines)


def installed(name):
    try:
        return importlib.util.find_spec(PEERS[name][1]) is not None
    except (ImportError, ValueError):
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", default=None, help=f"comma-separated, of {','.join(PEERS)} (default: all installed)")
    ap.add_argument("--rounds", type=int, help="rounds per figure; the best counts (default 3)")
    ap.add_argument("--batch", type=int, help="tasks per submitted-then-gathered batch (default 5000)")
    ap.add_argument("--sync", type=int, help="calls per 'result each' round (default 2000)")
    ap.add_argument("--array-mb", type=float, help="size of the array figures, MB (default 100)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: defaults of 1 round, 200 batched and 50 'each' calls, a 1 MB array")
    ap.add_argument("--timeout", type=float, default=600, help="limit per peer, in seconds (default 600)")
    ap.add_argument("--only", help=f"comma-separated figure groups to measure, of {','.join(GROUPS)} "
                                   "(default: all; start + first result always)")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    ap.add_argument("-v", "--verbose", action="store_true", help="show the children's output")
    ap.add_argument("--_child", nargs=2, metavar=("PEER", "OUTFILE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    for field, full, quick in (("rounds", 3, 1), ("batch", 5000, 200), ("sync", 2000, 50), ("array_mb", 100, 1)):
        if getattr(args, field) is None:
            setattr(args, field, quick if args.quick else full)
    for field in ("rounds", "batch", "sync"):
        if getattr(args, field) < 1:
            ap.error(f"--{field} must be at least 1, got {getattr(args, field)}")
    if args.array_mb <= 0:
        ap.error(f"--array-mb must be positive, got {args.array_mb:g}")
    args.only = [g.strip() for g in args.only.split(",") if g.strip()] if args.only else None
    bad = [g for g in args.only or () if g not in GROUPS]
    if bad or args.only == []:
        ap.error(f"--only: unknown figure group(s) {', '.join(map(repr, bad)) or 'none given'}; "
                 f"expected some of {', '.join(GROUPS)}")
    if args._child:
        return child(*args._child, args)
    if args.peers is None:
        peers = [p for p in PEERS if installed(p)]
        missing = [p for p in PEERS if p not in peers]
        if missing:
            print(f"not installed (pip install -e '.[bench]'): {', '.join(missing)}", file=sys.stderr)
    else:
        peers = [p.strip() for p in args.peers.split(",") if p.strip()]
        unknown = [p for p in peers if p not in PEERS]
        if unknown or not peers:
            ap.error(f"--peers: unknown peer(s) {', '.join(map(repr, unknown)) or 'none given'}; "
                     f"expected some of {', '.join(PEERS)}")
    context = machine.Context()
    ceiling = pipe_ceilings(args.sync * 5, args.rounds)
    results = {}
    for p in peers:
        print(f"measuring {p} ...", file=sys.stderr, flush=True)
        results[p] = run_child(p, args)
    print(context.line())
    print(table(peers, results, args, ceiling))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**context.figures(), "pipe_per_s": ceiling[0] or ceiling[1],
                       "pipe_one_cpu_per_s": ceiling[1], "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
