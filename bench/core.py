"""Core runtime benchmark: raylite side by side with Ray (targets from issues 2 and 3).

Run from the repository root:

    python bench/core.py                    # raylite, plus Ray when `import ray` works
    python bench/core.py --backend both     # raylite and Ray (the ratio column is raylite/ray)
    python bench/core.py --backend ray      # only Ray

Each backend runs in a fresh child process (`bench/core.py --_child MODULE OUTFILE`), so
imports and init are cold and backends cannot interfere. The child streams one JSON line per
figure into OUTFILE; the parent prints the table (a crash or timeout keeps the figures so far).
Any importable module with Ray's API can be passed as `--backend NAME` (handy for testing).
Ray is never required; `-v` shows the children's own output.
"""
import argparse, json, os, statistics, subprocess, sys, time
from time import perf_counter
import children  # bench/children.py: this script's folder is on sys.path

MB = 1e6
N_BYTES = 100 * 1_000_000  # the "100 MB" float64 array

# key, label, unit, target as (op, value) or None; values with a target that they miss get "!".
FIGURES = [
    ("import_s", "1. import", "s", None),
    ("init_s", "   init()", "s", None),
    ("first_task_s", "   first task submit+get", "s", None),
    ("startup_total_s", "   import + init + first task result", "s", ("<=", 0.15)),
    ("startup_ctl_s", "   same, median of 3 fresh processes (control endpoint on: the default)", "s", ("<=", 0.15)),
    ("startup_noctl_s", "   same with RAYLITE_CONTROL=0 (no control endpoint)", "s", None),
    ("startup_dash_s", "   same with init(include_dashboard=True)", "s", None),
    ("sleep8_cold_s", "2. 8 tasks sleeping i/10 s, right after init(num_cpus=8)", "s", ("<=", 0.72)),
    ("sleep8_warm_s", "   same, second (warm) round", "s", ("<=", 0.72)),
    ("tiny_each_per_s", "3. tiny tasks, get each", "/s", (">=", 3000)),
    ("tiny_batch_per_s", "   tiny tasks, batch get", "/s", (">=", 10000)),
    ("actor_each_per_s", "4. actor calls, get each", "/s", (">=", 3000)),
    ("actor_batch_per_s", "   actor calls, batch get", "/s", (">=", 10000)),
    ("putget_gbps", "5. put + get of a 100 MB array (best)", "GB/s", None),
    ("copy_gbps", "   in-process arr.copy() (best)", "GB/s", None),
    ("putget_vs_copy", "   put+get vs copy", "x", (">=", 0.95)),
    ("local_sum_ms", "6. in-process sum of 100 MB (median)", "ms", None),
    ("refsum_first_ms", "   task sum by ref minus local sum, first call", "ms", None),
    ("refsum_median_ms", "   task sum by ref minus local sum, median", "ms", ("<=", 1.0)),
    ("shm_sum_ms", "   in-process sum of get(ref), i.e. over shared memory (median)", "ms", None),
    ("refsum_vs_shm_ms", "   task sum by ref minus that, median (the runtime's own cost)", "ms", None),
    ("rss_idle_mb", "7. RSS driver+children, idle after init(num_cpus=8)", "MB", ("<=", 150)),
    ("pss_idle_mb", "   PSS of the same", "MB", None),
    ("nproc_idle", "   processes", "", None),
    ("rss_after_mb", "   RSS after 8 parallel tasks (workers exist)", "MB", ("<=", 150)),
    ("pss_after_mb", "   PSS of the same", "MB", None),
    ("nproc_after", "   processes", "", None),
    ("gpu_frac_wall_s", "8. 4 tasks num_gpus=0.25 sleeping 1 s (num_gpus=1)", "s", ("<=", 1.1)),
    ("reused_rt_ms", "   reused-worker trivial task round trip (median)", "ms", None),
    ("fresh_task_ms", "   max_calls=1 trivial task round trip (median)", "ms", None),
    ("fresh_worker_ms", "   fresh-worker start latency (difference)", "ms", ("<=", 20)),
]

# ---------------------------------------------------------------- child side
# Task bodies: plain functions, wrapped with `ray.remote` once the backend is imported.
def trivial():
    return 1

def nap(seconds):
    time.sleep(seconds)
    return seconds

def total(a):
    return float(a.sum())

class Counter:
    def __init__(self):
        self.n = 0
    def inc(self):
        self.n += 1
        return self.n

def rate_each(call, seconds):
    """Calls per second of `call()` repeated for about `seconds`."""
    n, t0 = 0, perf_counter()
    while True:
        call(); n += 1
        el = perf_counter() - t0
        if el >= seconds:
            return n / el

def rate_batch(ray, submit, seconds):
    """Submit n, then get the list; n grows until one batch takes about `seconds`."""
    n = 100
    while True:
        t0 = perf_counter()
        ray.get([submit() for _ in range(n)])
        el = perf_counter() - t0
        if el >= seconds * 0.8 or n >= 2_000_000:
            return n / el
        n = min(2_000_000, max(n * 2, int(n * seconds / max(el, 1e-4))))

def proc_tree(root):
    """root and all its descendants, found by walking the ppid field of /proc/*/stat."""
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                kids.setdefault(ppid, []).append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [root]
    while todo:
        pid = todo.pop(); out.append(pid); todo.extend(kids.get(pid, []))
    return out

def field_kb(path, name):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None

def memory(emit, suffix):
    """Sum VmRSS (and PSS, which splits pages shared by forked workers) over this process tree."""
    mem = [(field_kb(f"/proc/{p}/status", "VmRSS"), field_kb(f"/proc/{p}/smaps_rollup", "Pss"))
           for p in proc_tree(os.getpid())]
    mem = [(rss, pss) for rss, pss in mem if rss is not None]  # skip processes gone meanwhile
    emit(f"rss_{suffix}_mb", sum(rss for rss, _ in mem) * 1024 / MB)
    pss = [pss for _, pss in mem]
    emit(f"pss_{suffix}_mb", sum(pss) * 1024 / MB if None not in pss else "unreadable")
    emit(f"nproc_{suffix}", len(mem))

def child(module, outfile, seconds):
    done = set()
    out = open(outfile, "a")
    def emit(key, value=None, error=None):
        done.add(key)
        out.write(json.dumps({"key": key, "value": value, "error": error}) + "\n"); out.flush()

    def fail(keys, e):
        import traceback; traceback.print_exception(e)
        for k in keys:
            if k not in done:
                emit(k, error=f"{type(e).__name__}: {e}"[:200])

    def figure(keys, fn):
        try:
            fn()
        except Exception as e:  # one failing figure must not stop the others
            fail(keys, e)

    FIGURES_1 = ("import_s", "init_s", "first_task_s", "startup_total_s")
    # 1. Cold start: nothing but the stdlib is imported before this point (numpy comes later).
    t0 = perf_counter()
    try:
        import importlib
        ray = importlib.import_module(module)
        t1 = perf_counter()
        ray.init()
        t2 = perf_counter()
        assert ray.get(ray.remote(trivial).remote()) == 1
        t3 = perf_counter()
    except Exception as e:
        ray = sys.modules.get(module)  # None when the import itself failed: nothing else can run
        fail([k for k, *_ in FIGURES] if ray is None else FIGURES_1, e)
    else:
        emit("import_s", t1 - t0); emit("init_s", t2 - t1)
        emit("first_task_s", t3 - t2); emit("startup_total_s", t3 - t0)
    if ray is None:
        return
    try:
        ray.shutdown()
    except Exception:
        pass

    def startup_variants():   # raylite's knobs only: Ray has no control endpoint to turn off
        for key, env, kwargs in (("startup_ctl_s", {}, {}), ("startup_noctl_s", {"RAYLITE_CONTROL": "0"}, {}),
                                 ("startup_dash_s", {}, {"include_dashboard": True, "dashboard_port": 0})):
            if module != "raylite":
                emit(key, "n/a")
                continue
            runs = [startup_once(module, env, kwargs) for _ in range(3)]
            emit(key, statistics.median(runs))
    figure(("startup_ctl_s", "startup_noctl_s", "startup_dash_s"), startup_variants)

    def session(init_kwargs, figures):
        try:
            ray.init(**init_kwargs)
        except Exception as e:
            return fail([k for keys, _ in figures for k in keys], e)
        try:
            for keys, fn in figures:
                figure(keys, fn)
        finally:
            try:
                ray.shutdown()
            except Exception:
                pass

    # 7. Memory (before numpy is imported in the driver).
    def mem():
        time.sleep(1.0)  # let runtimes that pre-start workers settle
        memory(emit, "idle")
        f = ray.remote(nap)
        ray.get([f.remote(0.2) for _ in range(8)])
        time.sleep(0.5)
        memory(emit, "after")
    session(dict(num_cpus=8), [(("rss_idle_mb", "pss_idle_mb", "nproc_idle", "rss_after_mb",
                                 "pss_after_mb", "nproc_after"), mem)])

    # 2-6 on one init(num_cpus=8).
    def sleeps():
        f = ray.remote(nap)
        for key in ("sleep8_cold_s", "sleep8_warm_s"):
            t0 = perf_counter()
            ray.get([f.remote(i / 10) for i in range(8)])
            emit(key, perf_counter() - t0)

    def tiny():
        f = ray.remote(trivial)
        ray.get([f.remote() for _ in range(20)])
        emit("tiny_each_per_s", rate_each(lambda: ray.get(f.remote()), seconds))
        emit("tiny_batch_per_s", rate_batch(ray, f.remote, seconds))

    def actor():
        a = ray.remote(Counter).remote()
        ray.get(a.inc.remote())
        emit("actor_each_per_s", rate_each(lambda: ray.get(a.inc.remote()), seconds))
        emit("actor_batch_per_s", rate_batch(ray, a.inc.remote, seconds))
        ray.kill(a)

    arrays = {}
    def array():
        import numpy as np
        if "arr" not in arrays:
            arrays["arr"] = np.random.default_rng(0).random(N_BYTES // 8)
        return arrays["arr"]

    def putget():
        arr, copy_t, pg_t = array(), [], []
        for _ in range(5):
            t0 = perf_counter(); c = arr.copy(); copy_t.append(perf_counter() - t0); del c
            t0 = perf_counter(); out = ray.get(ray.put(arr)); pg_t.append(perf_counter() - t0)
            assert out.shape == arr.shape; del out
        emit("putget_gbps", arr.nbytes / min(pg_t) / 1e9)
        emit("copy_gbps", arr.nbytes / min(copy_t) / 1e9)
        emit("putget_vs_copy", min(copy_t) / min(pg_t))

    def refsum():
        arr = array(); f = ray.remote(total); ref = ray.put(arr)
        shared = ray.get(ref)   # zero-copy get: the same pages a task reads
        local, diffs, shm, shm_diffs = [], [], [], []
        for _ in range(21):   # the first call, then a median of 20 (single runs on a shared VM vary)
            t0 = perf_counter(); expect = float(arr.sum()); local.append(perf_counter() - t0)
            t0 = perf_counter(); float(shared.sum()); shm.append(perf_counter() - t0)
            t0 = perf_counter(); got = ray.get(f.remote(ref)); took = perf_counter() - t0
            diffs.append(took - local[-1]); shm_diffs.append(took - shm[-1])
            assert abs(got - expect) <= 1e-6 * abs(expect)
        emit("local_sum_ms", statistics.median(local) * 1e3)
        emit("refsum_first_ms", diffs[0] * 1e3)
        emit("refsum_median_ms", statistics.median(diffs[1:]) * 1e3)
        emit("shm_sum_ms", statistics.median(shm) * 1e3)
        emit("refsum_vs_shm_ms", statistics.median(shm_diffs[1:]) * 1e3)

    session(dict(num_cpus=8), [(("sleep8_cold_s", "sleep8_warm_s"), sleeps),
                               (("tiny_each_per_s", "tiny_batch_per_s"), tiny),
                               (("actor_each_per_s", "actor_batch_per_s"), actor),
                               (("putget_gbps", "copy_gbps", "putget_vs_copy"), putget),
                               (("local_sum_ms", "refsum_first_ms", "refsum_median_ms", "shm_sum_ms",
                                 "refsum_vs_shm_ms"), refsum)])
    arrays.clear()

    # 8. Fresh workers (logical GPUs).
    def gpu_frac():
        f = ray.remote(num_gpus=0.25, max_calls=1)(nap)
        t0 = perf_counter()
        ray.get([f.remote(1.0) for _ in range(4)])
        emit("gpu_frac_wall_s", perf_counter() - t0)

    def fresh():
        def per_call(f, budget, most):
            ray.get(f.remote())  # warm up
            times, start = [], perf_counter()
            while len(times) < 3 or (len(times) < most and perf_counter() - start < budget):
                t0 = perf_counter(); ray.get(f.remote()); times.append(perf_counter() - t0)
            return statistics.median(times)
        reused = per_call(ray.remote(trivial), 0.5, 1000)
        emit("reused_rt_ms", reused * 1e3)
        fresh_t = per_call(ray.remote(max_calls=1)(trivial), 3.0, 30)
        emit("fresh_task_ms", fresh_t * 1e3)
        emit("fresh_worker_ms", (fresh_t - reused) * 1e3)

    session(dict(num_cpus=4, num_gpus=1), [(("gpu_frac_wall_s",), gpu_frac),
                                           (("reused_rt_ms", "fresh_task_ms", "fresh_worker_ms"), fresh)])
    out.close()

# ---------------------------------------------------------------- parent side
def startup_once(module, env, init_kwargs):
    """import + init(**init_kwargs) + first task result in a fresh process (`--_startup MODULE
    KWARGS`), in seconds."""
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--_startup", module, json.dumps(init_kwargs)],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, **env))
    if done.returncode:
        raise RuntimeError(f"--_startup exited {done.returncode}: {done.stderr.strip()[-200:]}")
    return float(done.stdout.split()[-1])

def startup(module, init_kwargs):
    t0 = perf_counter()
    import importlib
    ray = importlib.import_module(module)
    ray.init(**json.loads(init_kwargs))
    assert ray.get(ray.remote(trivial).remote()) == 1
    print(perf_counter() - t0)
    ray.shutdown()

def run_child(module, args):
    """Run one backend in a fresh process (own session, so leftovers can be killed); return results."""
    return children.run_child(__file__, module, ["--seconds", args.seconds], [k for k, *_ in FIGURES],
                              args.timeout, args.verbose)

DIGITS = {"s": 3, "ms": 2, "GB/s": 2, "x": 2, "MB": 1, "/s": 0, "": 0}

def fmt(v, unit):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    digits = 0 if float(v).is_integer() and unit != "s" else DIGITS[unit]
    return f"{v:,.{digits}f} {unit}".strip()

def meets(v, target):
    if target is None or not isinstance(v, (int, float)):
        return True
    op, lim = target
    return v <= lim if op == "<=" else v >= lim

def print_table(backends, results):
    head = ["figure"] + backends + ["target"]
    ratio = len(backends) >= 2
    if ratio:
        head.append(f"{backends[0]}/{backends[1]}")
    rows, errors = [], {}  # error message -> footnote number
    for key, label, unit, target in FIGURES:
        row = [label]
        for b in backends:
            v = results[b].get(key, "-")
            if isinstance(v, str) and v.startswith("error: "):
                row.append(f"error [{errors.setdefault(f'{b}: {v[7:]}', len(errors) + 1)}]")
            else:
                row.append(fmt(v, unit) + ("" if meets(v, target) else " !"))
        row.append(f"{target[0]} {target[1]:,} {unit}".strip() if target else "")
        if ratio:
            a, b = (results[x].get(key) for x in backends[:2])
            ok = all(isinstance(x, (int, float)) for x in (a, b)) and b
            row.append(f"{a / b:.2f}x" if ok else "")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    print(line(head)); print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))
    print("(! = misses the target)")
    for msg, n in errors.items():
        print(f"[{n}] {msg}")

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default=None, help="raylite | ray | both (default: raylite, plus ray if installed)")
    ap.add_argument("--seconds", type=float, default=1.0, help="duration of each throughput run")
    ap.add_argument("--timeout", type=float, default=600, help="limit per backend, in seconds")
    ap.add_argument("-v", "--verbose", action="store_true", help="show the children's output")
    ap.add_argument("--_child", nargs=2, metavar=("MODULE", "OUTFILE"), help=argparse.SUPPRESS)
    ap.add_argument("--_startup", nargs=2, metavar=("MODULE", "KWARGS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._startup:
        return startup(*args._startup)
    if args._child:
        return child(args._child[0], args._child[1], args.seconds)
    if args.backend is None:
        import importlib.util
        backends = ["raylite"] + (["ray"] if importlib.util.find_spec("ray") else [])
    elif args.backend == "both":
        backends = ["raylite", "ray"]
    else:
        backends = args.backend.split(",")
    results = {}
    for b in backends:
        print(f"measuring {b} ...", file=sys.stderr, flush=True)
        results[b] = run_child(b, args)
    print_table(backends, results)

if __name__ == "__main__":
    main()
