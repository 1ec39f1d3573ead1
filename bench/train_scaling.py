"""raylite.train scaling: the same total work on 1 and 2 CPU workers (issue 4's target: >= 1.6x on
2 cores), and the worker group's start-up time.

Run from the repository root:

    python bench/train_scaling.py                  # defaults: MLP 1024 wide, global batch 1024, 8 steps
    python bench/train_scaling.py --steps 16 --width 2048
    python bench/train_scaling.py --no-preload-startup   # skip the start-up with preloading

The model is a plain MLP, wide enough that the matrix multiplies dominate (the gradient all_reduce
of DDP is a few MB per step; prepare_model averages it through shared memory, and
RAYLITE_TRAIN_FASTPATH=0 in the environment makes it gloo's, for comparison). With N workers each step processes global_batch / N samples per
worker (one intra-op thread per worker, as each holds one CPU), so every configuration does the same
arithmetic. Times are around ``trainer.run`` in the driver, on a warm group, after one warm-up run;
the best of ``--repeats`` runs is reported (other processes on a shared machine only add time), with
the median beside it. The intra-op threads each worker's torch actually used are printed too.

Start-up is that of a fresh group: without preloading, each worker imports torch (and, with 2
workers, torch._dynamo for DDP) itself. A second runtime is then started with
``raylite.train.init_with_preload`` (the zygote imports them once, workers fork with them): the
first group there still waits for the zygote's import, a group started later does not.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import raylite as ray  # noqa: E402
from raylite import train  # noqa: E402
from raylite.train import Trainer  # noqa: E402


def train_func(config):
    import torch

    from raylite import train
    from raylite.train.torch import prepare_model
    torch.manual_seed(0)
    w, depth = config["width"], config["depth"]
    layers = [torch.nn.Linear(config["inputs"], w), torch.nn.ReLU()]
    for _ in range(depth - 1):
        layers += [torch.nn.Linear(w, w), torch.nn.ReLU()]
    model = prepare_model(torch.nn.Sequential(*layers, torch.nn.Linear(w, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    per_worker = config["global_batch"] // train.world_size()
    x = torch.randn(per_worker, config["inputs"])
    y = torch.randint(0, 10, (per_worker,))
    loss_fn = torch.nn.CrossEntropyLoss()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(config["steps"]):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    return time.perf_counter() - t0, time.process_time() - c0, torch.get_num_threads()


_SCRATCH = tempfile.TemporaryDirectory(prefix="raylite-bench-")   # removed when the bench exits


def _logdir() -> str:
    return tempfile.mkdtemp(dir=_SCRATCH.name)


def start(label: str, config: dict, **trainer_kwargs):
    t0 = time.perf_counter()
    trainer = Trainer(logdir=_logdir(), **trainer_kwargs)
    trainer.start()
    start_s = time.perf_counter() - t0
    trainer.run(train_func, {**config, "steps": 1})   # warm-up: first-touch allocations
    return {"label": label, "trainer": trainer, "start": start_s, "runs": [], "loops": [], "cpu": [], "threads": []}


def timed_run(entry: dict, config: dict) -> None:
    t = time.perf_counter()
    out = entry["trainer"].run(train_func, config)
    entry["runs"].append(time.perf_counter() - t)
    entry["loops"].append(max(o[0] for o in out))
    entry["cpu"].append(max(o[1] for o in out))
    entry["threads"] = [o[2] for o in out]


def preloaded_startup(num_workers: int) -> tuple[float, float]:
    """Start-up of a group right after ``init_with_preload`` (waits for the zygote's import), then of
    another one started after that (zygote warm)."""
    t0 = time.perf_counter()
    train.init_with_preload(num_cpus=2 * num_workers)
    try:
        times = []
        for _ in range(2):
            t = time.perf_counter()
            trainer = Trainer(num_workers=num_workers, logdir=_logdir())
            trainer.start()
            times.append(time.perf_counter() - (t0 if not times else t))
            trainer.shutdown()
    finally:
        ray.shutdown()
    return times[0], times[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--depth", type=int, default=3, help="hidden layers (default 3)")
    p.add_argument("--inputs", type=int, default=512)
    p.add_argument("--global-batch", type=int, default=1024)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-threads-baseline", action="store_true",
                   help="skip the 1 worker x 2 CPUs (two intra-op threads) line")
    p.add_argument("--no-preload-startup", action="store_true",
                   help="skip measuring start-up with torch preloaded (raylite.train.init_with_preload)")
    args = p.parse_args(argv)
    config = {"width": args.width, "depth": args.depth, "inputs": args.inputs,
              "global_batch": args.global_batch, "steps": args.steps}
    params = args.inputs * args.width + (args.depth - 1) * args.width ** 2 + args.width * 10
    print(f"MLP {args.inputs} -> {args.depth} x {args.width} -> 10 ({params / 1e6:.1f} M parameters), "
          f"global batch {args.global_batch}, {args.steps} steps; {os.cpu_count()} CPUs here, "
          f"load average {os.getloadavg()[0]:.1f}")
    # Logical CPUs (1 + 2 + 2) for all three groups at once, so they stay warm and their runs can alternate
    # (a shared machine's load drifts; alternating and keeping the best is fairer than one block
    # per configuration). Only one group computes at a time, so 2 real cores are never oversubscribed.
    ray.init(num_cpus=5)
    try:
        entries = [start("1 worker  x 1 CPU", config, num_workers=1),
                   start("2 workers x 1 CPU (DDP)", config, num_workers=2)]
        if not args.no_threads_baseline:
            entries.append(start("1 worker  x 2 CPUs (2 threads)", config, num_workers=1,
                                 resources_per_worker={"CPU": 2}))
        for _ in range(args.repeats):
            for e in entries:
                timed_run(e, config)
        for e in entries:
            e["trainer"].shutdown()
    finally:
        ray.shutdown()
    preloaded = {} if args.no_preload_startup else {n: preloaded_startup(n) for n in (1, 2)}
    for e in entries:
        print(f"  {e['label']:<32} start {e['start']:6.2f} s   run {min(e['runs']):6.2f} s "
              f"(median {statistics.median(e['runs']):5.2f})   (loop {min(e['loops']):6.2f} s, CPU time per "
              f"worker {min(e['cpu']):6.2f} s, torch threads {e['threads']})")
    one, two = entries[0], entries[1]
    print(f"speed-up, 2 workers vs 1: best run {min(one['runs']) / min(two['runs']):.2f}x  (target >= 1.6x), "
          f"median {statistics.median(one['runs']) / statistics.median(two['runs']):.2f}x; "
          f"load average now {os.getloadavg()[0]:.1f}")
    print(f"worker group start-up: 1 worker {one['start']:.2f} s, 2 workers {two['start']:.2f} s "
          f"(fresh processes importing torch; then warm for every run)")
    if preloaded:
        print("  with torch preloaded (raylite.train.init_with_preload): "
              + ", ".join(f"{n} worker{'s' if n > 1 else ''} {a:.2f} s from init (zygote importing), "
                          f"{b:.2f} s later" for n, (a, b) in preloaded.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
