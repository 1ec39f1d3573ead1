"""Hyperparameter search for the wine-quality classifier with raylite.tune.

Sweeps the learning rate, both hidden sizes and the batch size of the wine model
(11 -> h1 -> h2 -> 1, ReLU, sigmoid, BCE) with OptunaSearch (TPE) and ASHA: each trial is a raylite
task with `--cpus-per-trial` / `--gpus-per-trial`, trains one epoch per `tune.report`, and is stopped
early when its validation loss falls behind. Prints the best config, its validation and held-out
accuracy, and writes the optimisation history and parameter importances as PNGs.

Data: ``--data PATH``, else ``$RAYLITE_WINE_DATA``, else the cached UCI download (the loading helpers
of examples/wine_quality.py).

    python examples/tune_wine_quality.py --data ../shared/data/wine-quality/winequality-red.csv
    python examples/tune_wine_quality.py --num-samples 40 --max-epochs 30 --gpus-per-trial 0.25
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import wine_quality as wq  # noqa: E402 - the sibling example: data loading and splitting

import raylite as ray  # noqa: E402
from raylite import tune  # noqa: E402

N_FEATURES = wq.N_FEATURES   # the trial code below uses no helper of wine_quality: nothing to ship


def make_model(h1: int, h2: int):
    from torch import nn
    return nn.Sequential(nn.Linear(N_FEATURES, h1), nn.ReLU(), nn.Linear(h1, h2), nn.ReLU(),
                         nn.Linear(h2, 1), nn.Sigmoid())


def split_validation(data: dict, fraction: float = 0.2, seed: int = 0) -> dict:
    """Carve a validation split out of the training split: the search never sees the test split."""
    import numpy as np
    n = len(data["X_train"])
    idx = np.random.default_rng(seed).permutation(n)
    n_val = int(round(n * fraction))
    val, train = idx[:n_val], idx[n_val:]
    return {"X_train": data["X_train"][train], "y_train": data["y_train"][train],
            "X_val": data["X_train"][val], "y_val": data["y_train"][val],
            "X_test": data["X_test"], "y_test": data["y_test"]}


def train_wine(config: dict, data: dict = None, max_epochs: int = 20):
    """One trial: `max_epochs` epochs of minibatch Adam; one `tune.report` per epoch."""
    import numpy as np
    import torch
    from torch import nn

    torch.set_num_threads(max(1, int(tune.get_trial_resources().get("CPU", 1))))
    device = torch.device("cuda" if torch.cuda.is_available() and ray.get_gpu_ids() else "cpu")
    t = {k: torch.from_numpy(np.array(v, dtype=np.float32)).to(device) for k, v in data.items()}
    y_train, y_val, y_test = (t[k].reshape(-1, 1) for k in ("y_train", "y_val", "y_test"))
    torch.manual_seed(config["seed"])
    model = make_model(config["h1"], config["h2"]).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=config["lr"])
    loss_fn = nn.BCELoss()
    start_epoch = 0
    ckpt = tune.get_checkpoint()
    if ckpt:                                        # a restarted trial (retry or resume) goes on from here
        state = ckpt.to_dict()
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start_epoch = state["epoch"]
    gen = torch.Generator().manual_seed(config["seed"] + start_epoch)
    n, bs = len(t["X_train"]), config["batch_size"]
    for epoch in range(start_epoch, max_epochs):
        model.train()
        order = torch.randperm(n, generator=gen).to(device)
        for i in range(0, n - bs + 1, bs):          # drop the ragged last batch
            b = order[i:i + bs]
            opt.zero_grad()
            loss = loss_fn(model(t["X_train"][b]), y_train[b])
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            p_val, p_test = model(t["X_val"]), model(t["X_test"])
            val_loss = float(loss_fn(p_val, y_val))
            val_acc = float(((p_val >= 0.5).float() == y_val).float().mean())
            test_acc = float(((p_test >= 0.5).float() == y_test).float().mean())
        state = {"model": {k: v.cpu() for k, v in model.state_dict().items()}, "opt": opt.state_dict(),
                 "epoch": epoch + 1}
        tune.report({"val_loss": val_loss, "val_acc": val_acc, "test_acc": test_acc, "epoch": epoch + 1},
                    checkpoint=tune.Checkpoint.from_dict(state))


SEARCH_SPACE = {
    "lr": tune.loguniform(1e-4, 3e-2),
    "h1": tune.choice([8, 16, 32, 64]),
    "h2": tune.choice([4, 8, 16, 32]),
    "batch_size": tune.choice([16, 32, 64, 128]),
    "seed": 0,
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help=f"winequality-red.csv; default ${wq.DATA_ENV}, else downloaded")
    p.add_argument("--num-samples", type=int, default=20, help="trials (default 20)")
    p.add_argument("--max-epochs", type=int, default=20, help="ASHA's max_t in epochs (default 20)")
    p.add_argument("--grace-period", type=int, default=2, help="epochs before ASHA may stop a trial")
    p.add_argument("--cpus-per-trial", type=float, default=1)
    p.add_argument("--gpus-per-trial", type=float, default=0, help="e.g. 0.25: four trials share a GPU")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs for ray.init (default: all)")
    p.add_argument("--max-concurrent", type=int, default=None, help="max_concurrent_trials")
    p.add_argument("--seed", type=int, default=0, help="TPE seed")
    p.add_argument("--storage-path", default=None, help="default ~/raylite_results")
    p.add_argument("--name", default=None, help="experiment name (default: timestamped)")
    p.add_argument("--resume", action="store_true", help="continue the experiment --name")
    p.add_argument("--plot", default="tune_wine_quality.png",
                   help="prefix of the PNGs (default tune_wine_quality.png -> *_history.png, *_importances.png)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--verbose", type=int, default=1)
    args = p.parse_args(argv)
    if args.num_samples < 1 or args.max_epochs < 1:
        p.error("--num-samples and --max-epochs must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    loaded = wq.load_for_cli(args.data)
    if loaded is None:
        return 2
    path, X, quality = loaded
    data = split_validation(wq.prepare(X, quality))
    print(f"data: {path} (train {len(data['X_train'])}, validation {len(data['X_val'])}, "
          f"test {len(data['X_test'])}); {args.num_samples} trials, up to {args.max_epochs} epochs each")
    owns_runtime = not ray.is_initialized()
    if owns_runtime:
        ray.init(num_cpus=args.num_cpus)
    try:
        t0 = time.perf_counter()
        analysis = tune.run(
            tune.with_parameters(train_wine, data=data, max_epochs=args.max_epochs),
            config=dict(SEARCH_SPACE), num_samples=args.num_samples, metric="val_loss", mode="min",
            search_alg=tune.OptunaSearch(seed=args.seed),
            scheduler=tune.ASHAScheduler(max_t=args.max_epochs, grace_period=min(args.grace_period, args.max_epochs),
                                         reduction_factor=2, time_attr="training_iteration"),
            resources_per_trial={"cpu": args.cpus_per_trial, "gpu": args.gpus_per_trial},
            max_concurrent_trials=args.max_concurrent, storage_path=args.storage_path, name=args.name,
            resume=args.resume, verbose=args.verbose)
        seconds = time.perf_counter() - t0
    finally:
        if owns_runtime:
            ray.shutdown()

    best = analysis.best_trial
    epochs = [t.last_result.get("training_iteration", 0) for t in analysis.trials]
    stopped = sum(t.early_stopped for t in analysis.trials)
    print(f"\n{len(analysis.trials)} trials in {seconds:.1f} s; ASHA stopped {stopped} early "
          f"({sum(epochs)} epochs trained of {len(epochs) * args.max_epochs} possible)")
    print(f"best trial: {best.trial_id} after {best.last_result['training_iteration']} epochs: "
          f"val_loss {best.last_result['val_loss']:.4f}, val_acc {best.last_result['val_acc']:.3f}, "
          f"test_acc {best.last_result['test_acc']:.3f} (majority class {wq.majority_baseline(data):.3f})")
    cfg = {k: v for k, v in analysis.best_config.items() if k != "seed"}
    print("best config: " + ", ".join(f"{k}={v:.5g}" if isinstance(v, float) else f"{k}={v}"
                                      for k, v in cfg.items()))
    print(f"results: {analysis.experiment_path}")
    if not args.no_plot:
        try:
            for f in analysis.plot(args.plot):
                print(f"plot: {f}")
        except ImportError as e:
            print(f"no plots: {e}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
