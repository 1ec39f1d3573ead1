"""Wine quality, data-parallel: the project's wine model trained with ``raylite.train.Trainer``.

The model and data preparation are those of ``examples/wine_quality.py`` (11 -> 10 -> 8 -> 1 with a
sigmoid, BCE loss, label quality >= 6, 67/33 split, features standardised on the train split). Here
``Trainer(num_workers=2)`` runs the training function in two worker processes joined in a
torch.distributed process group (gloo on CPU): ``prepare_data_loader`` gives each its half of every
epoch, ``prepare_model`` wraps the model in DistributedDataParallel, and every epoch rank 0 reports
the mean training loss and the held-out accuracy with a checkpoint (model + optimizer + epoch). The
driver prints the per-epoch history, then reloads the final checkpoint and checks its accuracy.

    python examples/train_wine_quality.py --data ../shared/data/wine-quality/winequality-red.csv
    python examples/train_wine_quality.py --epochs 5 --num-workers 2 --storage-path /tmp/runs
    python examples/train_wine_quality.py --resume /tmp/runs/.../run_001/checkpoint_000004

Data: ``--data PATH``, else ``$RAYLITE_WINE_DATA``, else a cached download (as wine_quality.py).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wine_quality as wq  # noqa: E402  (data loading, split and model, shared with the main example)

import raylite as ray  # noqa: E402
from raylite import train  # noqa: E402
from raylite.train import Checkpoint, CheckpointConfig, Trainer  # noqa: E402

if __name__ != "__main__" and __name__ in sys.modules:
    # Imported as a module (tests): ship this file's and wine_quality's functions by value, since the
    # workers may not be able to import them by name.
    import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cloudpickle.register_pickle_by_value(wq)


def train_func(config: dict) -> dict:
    """Runs in every worker. Resumes from ``train.get_checkpoint()`` when there is one."""
    import torch.distributed as dist
    from raylite.train.torch import get_device, prepare_data_loader, prepare_model

    torch.manual_seed(config["seed"])
    data = config["data"]
    # Copies: arrays that came through the object store may be read-only views.
    X = torch.from_numpy(np.array(data["X_train"], dtype=np.float32))
    y = torch.from_numpy(np.array(data["y_train"], dtype=np.float32)).reshape(-1, 1)
    X_test = torch.from_numpy(np.array(data["X_test"], dtype=np.float32))
    y_test = np.asarray(data["y_test"])
    loader = DataLoader(TensorDataset(X, y), batch_size=config["batch_size"], shuffle=True, drop_last=True)
    loader = prepare_data_loader(loader)          # DistributedSampler: each rank gets its shard
    model = prepare_model(wq.make_model())        # DistributedDataParallel with 2+ workers
    opt = torch.optim.Adam(model.parameters(), lr=config["lr"])
    loss_fn = nn.BCELoss()
    device = get_device()

    start_epoch = 0
    ckpt = train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            state = torch.load(os.path.join(d, "model.pt"), map_location=device)
        getattr(model, "module", model).load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1

    rank = train.get_context().get_world_rank()
    for epoch in range(start_epoch, config["epochs"]):
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)       # a new shuffle each epoch, the same on every rank
        model.train()
        total = torch.zeros(2, device=device)     # [sum of batch losses, batches]
        for xb, yb in loader:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()                       # DDP averages the gradients across workers
            opt.step()
            total += torch.stack([loss.detach(), torch.ones((), device=device)])
        dist.all_reduce(total)                    # mean training loss over all workers' batches
        model.eval()
        with torch.no_grad():
            pred = (model(X_test.to(device)).reshape(-1) >= 0.5).float().cpu().numpy()
        metrics = {"epoch": epoch, "loss": (total[0] / total[1]).item(),
                   "accuracy": float((pred == y_test).mean())}
        if rank == 0:   # rank 0 writes the checkpoint; every rank reports (rank 0's metrics are kept)
            with tempfile.TemporaryDirectory() as d:
                torch.save({"model": getattr(model, "module", model).state_dict(),
                            "optimizer": opt.state_dict(), "epoch": epoch}, os.path.join(d, "model.pt"))
                train.report(metrics, checkpoint=Checkpoint.from_directory(d))
        else:
            train.report(metrics)
    return {"rank": rank, "pid": os.getpid(), "device": str(device), "start_epoch": start_epoch}


def load_model(checkpoint: Checkpoint) -> nn.Module:
    model = wq.make_model()
    with checkpoint.as_directory() as d:
        model.load_state_dict(torch.load(os.path.join(d, "model.pt"), map_location="cpu")["model"])
    return model


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help=f"winequality-red.csv (';' or ','); default ${wq.DATA_ENV}, else downloaded")
    p.add_argument("--num-workers", type=int, default=2, help="training workers (default 2)")
    p.add_argument("--use-gpu", default="false", choices=["false", "true", "auto"],
                   help="one GPU per worker (NCCL); 'auto' falls back to CPU (default false)")
    p.add_argument("--epochs", type=int, default=20, help="passes over the training split (default 20)")
    p.add_argument("--batch-size", type=int, default=32, help="per-worker batch size (default 32)")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 0.003)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split-seed", type=int, default=42)
    p.add_argument("--num-cpus", type=int, default=None,
                   help="CPUs for ray.init (default: this machine's, at least --num-workers)")
    p.add_argument("--keep", type=int, default=2, help="checkpoints to keep (default 2)")
    p.add_argument("--storage-path", default=None,
                   help="where run directories go (default $RAYLITE_RESULTS_DIR or ~/raylite_results)")
    p.add_argument("--resume", default=None, help="a checkpoint directory to continue from")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.num_workers < 1:
        p.error("--epochs and --num-workers must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    loaded = wq.load_for_cli(args.data)
    if loaded is None:
        return 2
    path, X, quality = loaded
    data = wq.prepare(X, quality, seed=args.split_seed)
    print(f"data: {path} ({len(X)} rows; train {len(data['X_train'])}, test {len(data['X_test'])}); "
          f"{args.num_workers} workers x batch {args.batch_size}, {args.epochs} epochs")

    owns_runtime = not ray.is_initialized()
    if owns_runtime:
        ray.init(num_cpus=max(args.num_workers, args.num_cpus or os.cpu_count() or 1))
    use_gpu = {"false": False, "true": True, "auto": "auto"}[args.use_gpu]
    logdir = None
    if args.storage_path:
        logdir = os.path.join(args.storage_path, time.strftime("train_wine_quality_%Y-%m-%d_%H-%M-%S"))
    config = {"data": data, "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
              "seed": args.seed}
    resume = Checkpoint.from_directory(args.resume) if args.resume else None
    try:
        t0 = time.perf_counter()
        with Trainer(num_workers=args.num_workers, use_gpu=use_gpu, logdir=logdir) as trainer:
            t_start = time.perf_counter() - t0
            t1 = time.perf_counter()
            workers = trainer.run(train_func, config, checkpoint=resume,
                                  checkpoint_strategy=CheckpointConfig(num_to_keep=args.keep))
            t_run = time.perf_counter() - t1
            result = trainer.last_result
    finally:
        if owns_runtime:
            ray.shutdown()

    if result.checkpoint is None:
        print(f"nothing to train: the checkpoint is already past --epochs {args.epochs}")
        return 0
    print(f"\n{'epoch':>5} {'loss':>8} {'accuracy':>9}")
    for row in result.metrics_history:
        print(f"{row['epoch']:>5} {row['loss']:>8.4f} {row['accuracy']:>9.3f}")
    accuracy = wq.accuracy(load_model(result.checkpoint), data["X_test"], data["y_test"])
    where = ", ".join(f"rank {w['rank']} pid {w['pid']} ({w['device']})" for w in workers)
    print(f"\nworkers: {where}")
    print(f"worker group start {t_start:.2f} s, training {t_run:.2f} s")
    print(f"final checkpoint: {result.checkpoint.path}")
    print(f"held-out accuracy of the final checkpoint: {accuracy:.3f} "
          f"(majority class: {wq.majority_baseline(data):.3f})")
    print(f"metrics history: {os.path.join(result.path, 'result.json')} and progress.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
