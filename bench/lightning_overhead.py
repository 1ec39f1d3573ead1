"""Lightning overhead benchmark (issue 5): the wine-quality model, max_steps=1000, timed around
``trainer.fit`` in the driver, three ways:

  one      pl.Trainer in one process (accelerator="cpu", devices=1)
  ddp      Lightning's own DDP: strategy="ddp", devices=2, accelerator="cpu" (it re-runs this
           script in a child process for rank 1)
  ray      strategy=RayStrategy(num_workers=2) after raylite.plugins.init_with_preload(): the first
           fit (cold: the workers start, forked from a zygote that imported torch and Lightning
           while the driver did) and a second fit with a new Trainer on the warm workers
  ray-after  the same with init_with_preload() after the driver's imports (examples/wine_quality.py's
           order): the zygote is the driver's fork, torch and Lightning come with it
  ray-plain  the same after a plain ray.init() (each worker imports torch and Lightning itself)
  ray-one  ray-after with RayStrategy(num_workers=1): one worker, no gradients to average (nor
           DDP's wrapper), so its warm fit is the runtime's own cost over `one`
  two      two of `one` at once, in two processes (the slower one's figures): what this machine
           gives two busy processes, the floor under any 2-worker fit (a VM whose vCPUs stall when
           all are busy makes it well over 1.0 x one)

Targets (issue 24): RayStrategy cold <= 1.5 x one, warm <= 1.0 x one. Each way runs in a fresh
Python process (this script with --only WAY), so imports are cold and nothing is shared between
them; with --repeat N the ways run in N rounds, back to back, and each ratio is taken per round.
The phases (raylite.plugins' worker_results["phases"]) say where a fit's seconds went.

    python bench/lightning_overhead.py [--data PATH] [--steps 1000] [--repeat 1] [--ways one,ray-after] [-v]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "wine-quality" / "winequality-red.csv"
WAYS = ("one", "two", "ddp", "ray", "ray-after", "ray-plain", "ray-one")


def _wine():
    spec = importlib.util.spec_from_file_location("wine_quality", ROOT / "examples" / "wine_quality.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["wine_quality"] = mod
    spec.loader.exec_module(mod)
    return mod


def _fit(wq, data, steps, strategy, devices, out: dict, prefix: str = ""):
    """One trainer.fit of the example's LightningModule: seconds around fit, the training loop's
    own seconds (rank 0's), accuracy into ``out``; returns the trainer."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    pl, WineModule, LossRecorder = wq._lightning()
    torch.manual_seed(0)
    module = WineModule(3e-3)
    X = torch.from_numpy(data["X_train"].copy())
    y = torch.from_numpy(data["y_train"].copy()).reshape(-1, 1)
    loader = DataLoader(TensorDataset(X, y), batch_size=32, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(0))
    recorder = LossRecorder()
    trainer = pl.Trainer(max_steps=steps, strategy=strategy, accelerator="cpu", devices=devices, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[recorder])
    t0 = time.perf_counter()
    trainer.fit(module, loader)
    out[prefix + "fit_s"] = time.perf_counter() - t0
    out[prefix + "loop_s"] = recorder.seconds
    out[prefix + "accuracy"] = wq.accuracy(module.model, data["X_test"], data["y_test"])
    phases = getattr(trainer.strategy, "worker_results", {}).get("phases")
    if phases:
        out[prefix + "phases"] = phases
    return trainer


def child(way: str, data_path: str, steps: int) -> None:
    out: dict = {"way": way}
    if way == "ray":
        # raylite first, its zygote preloading torch + Lightning while this process imports them
        from raylite.plugins import init_with_preload
        t0 = time.perf_counter()
        init_with_preload(num_cpus=2)
        out["init_s"] = time.perf_counter() - t0
    t_import = time.perf_counter()
    import torch
    wq = _wine()
    wq._lightning()   # pytorch_lightning, as the driver of any of these imports it
    out["driver_import_s"] = time.perf_counter() - t_import
    X, quality = wq.load_wine(data_path)
    data = wq.prepare(X, quality)
    if way == "one":
        torch.set_num_threads(1)   # what each DDP rank gets too (Lightning: cpu_count / 2 here)
        _fit(wq, data, steps, "auto", 1, out)
    elif way == "ddp":
        trainer = _fit(wq, data, steps, "ddp", 2, out)
        if trainer.global_rank != 0:
            return   # the child rank Lightning started: only rank 0 reports
    else:
        import cloudpickle

        import raylite as ray
        from raylite.plugins import RayStrategy
        cloudpickle.register_pickle_by_value(wq)   # the workers cannot import the example by name
        if way == "ray-plain":   # plain init after the imports: each worker imports for itself
            ray.init(num_cpus=2)
        elif way in ("ray-after", "ray-one"):   # after the imports: the zygote forks from this process
            from raylite.plugins import init_with_preload
            t0 = time.perf_counter()
            init_with_preload(num_cpus=2)
            out["init_s"] = time.perf_counter() - t0
        workers = 1 if way == "ray-one" else 2
        try:
            _fit(wq, data, steps, RayStrategy(num_workers=workers), "auto", out)
            _fit(wq, data, steps, RayStrategy(num_workers=workers), "auto", out, "warm_")
        finally:
            ray.shutdown()
    print("RESULT " + json.dumps(out), flush=True)


def run_child(way: str, args) -> dict:
    if way == "two":   # two of "one" at once; the slower one's figures
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(2) as pool:
            runs = list(pool.map(lambda _: run_child("one", args), range(2)))
        return {**max(runs, key=lambda r: r["fit_s"]), "way": "two"}
    cmd = [sys.executable, os.path.abspath(__file__), "--only", way, "--data", args.data, "--steps", str(args.steps)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=args.workdir)
    if args.verbose:
        sys.stderr.write(proc.stdout + proc.stderr)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{way} failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.environ.get("RAYLITE_WINE_DATA") or str(DEFAULT_DATA))
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=1, help="rounds (each runs every way once, back to back)")
    p.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated subset of {','.join(WAYS)} (one is needed)")
    p.add_argument("--only", choices=[w for w in WAYS if w != "two"], help=argparse.SUPPRESS)
    p.add_argument("--workdir", default=None, help="working directory of the runs (default: a temp dir)")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    if args.only:
        child(args.only, args.data, args.steps)
        return 0
    if not os.path.isfile(args.data):
        print(f"error: wine data not found at {args.data} (--data PATH)", file=sys.stderr)
        return 2
    ways = [w for w in WAYS if w in args.ways.split(",")]
    if "one" not in ways:
        print("error: --ways must include one (the ratios' base)", file=sys.stderr)
        return 2
    import tempfile
    import machine   # bench/machine.py: this script's folder is on sys.path
    context = machine.Context()
    rounds: list[dict] = []   # each: way -> that run's figures; the ways of a round run back to back
    with tempfile.TemporaryDirectory() as tmp:
        args.workdir = args.workdir or tmp
        for _ in range(args.repeat):
            rounds.append({way: run_child(way, args) for way in ways})
    print(context.line())
    _report(args, ways, rounds)
    return 0


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def _report(args, ways: list[str], rounds: list[dict]) -> None:
    """Median (min-max) of each figure over the rounds, and each ratio to the one-process fit taken
    round by round (the runs of a round are back to back, so a drifting machine cancels out)."""
    def fig(way: str, key: str) -> str:
        vals = [r[way][key] for r in rounds if key in r[way]]
        return f"{_median(vals):6.2f} ({min(vals):.2f}-{max(vals):.2f})" if vals else ""

    def ratio(way: str, key: str) -> str:
        vals = [r[way][key] / r["one"]["fit_s"] for r in rounds if key in r[way]]
        return f"{_median(vals):.2f} x one ({min(vals):.2f}-{max(vals):.2f})" if vals else ""

    rows = [("one", "fit_s", "loop_s", "Lightning, one process", ""),
            ("two", "fit_s", "loop_s", "two of those at once (slower)", "the machine's floor"),
            ("ddp", "fit_s", "loop_s", "Lightning DDP (2 procs)", "")]
    for way, label in (("ray", "init first"), ("ray-after", "init after imports"), ("ray-plain", "plain ray.init")):
        rows += [(way, "fit_s", "loop_s", f"RayStrategy(2) cold, {label}", "target <= 1.5"),
                 (way, "warm_fit_s", "warm_loop_s", f"RayStrategy(2) warm, {label}", "target <= 1.0")]
    rows += [("ray-one", "fit_s", "loop_s", "RayStrategy(1) cold, init after imports", ""),
             ("ray-one", "warm_fit_s", "warm_loop_s", "RayStrategy(1) warm, init after imports", "")]
    print(f"wine quality, max_steps={args.steps}, batch 32, {len(rounds)} round(s); fit: seconds around "
          f"trainer.fit in the driver; loop: rank 0's training loop alone; median (min-max)")
    print(f"{'':<38} {'fit (s)':>18} {'loop (s)':>18}  ratio (fit / one process's, round by round)")
    for way, fit_key, loop_key, name, target in rows:
        if way not in ways:
            continue
        note = "" if way == "one" else ratio(way, fit_key) + (f"  {target}" if target else "")
        print(f"{name:<38} {fig(way, fit_key):>18} {fig(way, loop_key):>18}  {note}")
    for way in ("ray", "ray-after", "ray-plain", "ray-one"):
        if way not in ways:
            continue
        for prefix, what in (("", "cold"), ("warm_", "warm")):
            phases = rounds[-1][way].get(prefix + "phases")
            if phases:
                print(f"phases, {way} {what} (last round, s after launch): "
                      + " ".join(f"{k}={v:.2f}" for k, v in phases.items()))


if __name__ == "__main__":
    sys.exit(main())
