"""Lightning overhead benchmark (issue 5): the wine-quality model, max_steps=1000, timed around
``trainer.fit`` in the driver, three ways:

  one      pl.Trainer in one process (accelerator="cpu", devices=1)
  ddp      Lightning's own DDP: strategy="ddp", devices=2, accelerator="cpu" (it re-runs this
           script in a child process for rank 1)
  ray      strategy=RayStrategy(num_workers=2) after raylite.plugins.init_with_preload(): the first
           fit (cold: the workers start, forked from a zygote that imported torch and Lightning
           while the driver did) and a second fit with a new Trainer on the warm workers
  ray-plain  the same after a plain ray.init() (each worker imports torch and Lightning itself)

Targets: ray cold <= 0.5 x ddp; ray warm <= 1.5 x one. Each way runs in a fresh Python process
(this script with --only WAY), so imports are cold and nothing is shared between them.

    python bench/lightning_overhead.py [--data PATH] [--steps 1000] [--repeat 1] [-v]
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
WAYS = ("one", "ddp", "ray", "ray-plain")


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
        try:
            _fit(wq, data, steps, RayStrategy(num_workers=2), "auto", out)
            _fit(wq, data, steps, RayStrategy(num_workers=2), "auto", out, "warm_")
        finally:
            ray.shutdown()
    print("RESULT " + json.dumps(out), flush=True)


def run_child(way: str, args) -> dict:
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
    p.add_argument("--repeat", type=int, default=1, help="runs of each way; the best is shown")
    p.add_argument("--only", choices=WAYS, help=argparse.SUPPRESS)
    p.add_argument("--workdir", default=None, help="working directory of the runs (default: a temp dir)")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    if args.only:
        child(args.only, args.data, args.steps)
        return 0
    if not os.path.isfile(args.data):
        print(f"error: wine data not found at {args.data} (--data PATH)", file=sys.stderr)
        return 2
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        args.workdir = args.workdir or tmp
        best: dict = {}
        for _ in range(args.repeat):
            for way in WAYS:
                r = run_child(way, args)
                for k, v in r.items():
                    if isinstance(v, float) and k != "accuracy" and not k.endswith("accuracy"):
                        best.setdefault(way, {})[k] = min(v, best.get(way, {}).get(k, v))
                    else:
                        best.setdefault(way, {})[k] = v
    one, ddp, ray, plain = best["one"], best["ddp"], best["ray"], best["ray-plain"]
    rows = [
        ("Lightning, one process", one["fit_s"], one["loop_s"], one["accuracy"], ""),
        ("Lightning DDP (2 procs)", ddp["fit_s"], ddp["loop_s"], ddp["accuracy"], ""),
        ("RayStrategy(2), cold", ray["fit_s"], ray["loop_s"], ray["accuracy"],
         f"{ray['fit_s'] / ddp['fit_s']:.2f} x DDP (target <= 0.5)"),
        ("RayStrategy(2), warm", ray["warm_fit_s"], ray["warm_loop_s"], ray["warm_accuracy"],
         f"{ray['warm_fit_s'] / one['fit_s']:.2f} x one process (target <= 1.5)"),
        ("  cold, no preload", plain["fit_s"], plain["loop_s"], plain["accuracy"],
         f"{plain['fit_s'] / ddp['fit_s']:.2f} x DDP"),
        ("  warm, no preload", plain["warm_fit_s"], plain["warm_loop_s"], plain["warm_accuracy"],
         f"{plain['warm_fit_s'] / one['fit_s']:.2f} x one process"),
    ]
    print(f"wine quality, max_steps={args.steps}, batch 32; fit: seconds around trainer.fit in the driver; "
          f"loop: rank 0's training loop alone (best of {args.repeat}); driver import of torch+Lightning "
          f"{one['driver_import_s']:.2f} s (not counted)")
    print("RayStrategy: init_with_preload(num_cpus=2) first, so raylite's zygote imports torch+Lightning "
          "while the driver does; 'no preload': ray.init after the imports, each worker imports them")
    print(f"{'':<26} {'fit (s)':>8} {'loop (s)':>9} {'accuracy':>9}  ratio")
    for name, fit_s, loop_s, acc, note in rows:
        print(f"{name:<26} {fit_s:>8.2f} {loop_s:>9.2f} {acc:>9.3f}  {note}")
    print(f"DDP's own step cost: Lightning DDP loop {ddp['loop_s'] / one['loop_s']:.2f} x the one-process loop; "
          f"RayStrategy warm fit {ray['warm_fit_s'] / ddp['loop_s']:.2f} x Lightning DDP's loop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
