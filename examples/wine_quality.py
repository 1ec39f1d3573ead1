"""Wine quality: the project's main job.

Trains a small binary classifier (is a red wine's quality >= 6?) on the UCI wine-quality data in
several ways and prints a table of training time and held-out accuracy for each:

  torch          plain PyTorch in this process
  raylite        the same training function as a raylite remote task (data shipped with ``ray.put``)
  lightning      PyTorch Lightning, ``pl.Trainer(max_steps=...)`` in this process
  ray-lightning  Lightning with ``pl.Trainer(strategy=RayStrategy(num_workers=N))``: DDP in N raylite
                 worker actors (``--num-workers``, default 2); the trained weights come back here

Each mode is one ``run_<mode>`` function registered in ``MODES``; adding one is adding a function
there. The Lightning modes need the ``lightning`` extra; ``--mode all`` skips them (saying why)
when it is missing.

Data: ``--data PATH``, else the env var ``RAYLITE_WINE_DATA``, else a cached download from UCI
(``~/.cache/raylite/winequality-red.csv``). Both ``;`` (UCI original) and ``,`` separators work.

    python examples/wine_quality.py --data ../shared/data/wine-quality/winequality-red.csv
    python examples/wine_quality.py --mode torch --steps 200 --plot loss.png
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

UCI_URL = (
    "https://archive.ics.uci.edu/ml/machine-learning-databases/wine-quality/winequality-red.csv"
)
DATA_ENV = "RAYLITE_WINE_DATA"
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "raylite"
N_FEATURES = 11


class DataError(Exception):
    """The wine data could not be found, fetched or parsed."""


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------

def resolve_data_path(path: str | os.PathLike | None = None) -> Path:
    """Where the CSV is: ``path``, else ``$RAYLITE_WINE_DATA``, else the download cache.

    An explicitly named file that does not exist is an error (never silently replaced by a
    download); only when nothing is named is the file fetched from UCI into the cache.
    """
    for source, value in (("--data", path), (DATA_ENV, os.environ.get(DATA_ENV))):
        if value:
            p = Path(value).expanduser()
            if not p.is_file():
                raise DataError(
                    f"wine-quality data not found: {p} (given by {source}); "
                    f"pass --data PATH to winequality-red.csv"
                )
            return p
    cached = CACHE_DIR / "winequality-red.csv"
    if not cached.is_file():
        download(UCI_URL, cached)
    return cached


def download(url: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(f".part{os.getpid()}")
    print(f"downloading {url} -> {dest}", file=sys.stderr)
    try:
        with urllib.request.urlopen(url, timeout=60) as r, open(tmp, "wb") as f:
            f.write(r.read())
        os.replace(tmp, dest)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise DataError(
            f"could not download the wine-quality data from {url}: {e}; "
            f"pass --data PATH (or set {DATA_ENV}) to a local winequality-red.csv"
        ) from e


def load_for_cli(data: str | os.PathLike | None):
    """(path, features, quality) for a command-line example, or None after printing the error."""
    try:
        path = resolve_data_path(data)
        X, quality = load_wine(path)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return None
    return path, X, quality


def load_wine(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Read the CSV (``;`` or ``,`` separated, header row) -> (features [n, 11], quality [n])."""
    path = Path(path)
    with open(path, newline="") as f:
        header = f.readline()
        sep = ";" if header.count(";") > header.count(",") else ","
        names = [h.strip().strip('"') for h in next(csv.reader([header], delimiter=sep))]
        if len(names) != N_FEATURES + 1 or names[-1] != "quality":
            raise DataError(
                f"{path}: expected 11 feature columns and 'quality' last, got header {names}"
            )
        rows = []
        for lineno, row in enumerate(csv.reader(f, delimiter=sep), start=2):
            if not row:
                continue
            try:
                rows.append([float(v) for v in row])
            except ValueError as e:
                raise DataError(f"{path}:{lineno}: {e}") from None
            if len(row) != N_FEATURES + 1:
                raise DataError(f"{path}:{lineno}: expected 12 fields, got {len(row)}")
    if not rows:
        raise DataError(f"{path}: no data rows")
    a = np.asarray(rows, dtype=np.float64)  # float64 until standardised: density's spread is tiny
    return a[:, :N_FEATURES], a[:, N_FEATURES]


def prepare(
    X: np.ndarray, quality: np.ndarray, test_size: float = 0.33, seed: int = 42
) -> dict[str, np.ndarray]:
    """Label quality >= 6, shuffle-split 67/33 with a fixed seed, standardise on the train split.

    Returns float32 arrays ``X_train, y_train, X_test, y_test``.
    """
    X = np.asarray(X, dtype=np.float64)
    y = (np.asarray(quality) >= 6).astype(np.float32)
    idx = np.random.default_rng(seed).permutation(len(X))
    n_test = int(round(len(X) * test_size))
    test, train = idx[:n_test], idx[n_test:]
    mean = X[train].mean(axis=0)
    std = X[train].std(axis=0)
    std[std == 0] = 1.0
    scale = lambda a: ((a - mean) / std).astype(np.float32)  # noqa: E731
    return {
        "X_train": scale(X[train]), "y_train": y[train],
        "X_test": scale(X[test]), "y_test": y[test],
    }


# --------------------------------------------------------------------------------------------
# Model and training (plain PyTorch; every mode reuses these)
# --------------------------------------------------------------------------------------------

def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(N_FEATURES, 10), nn.ReLU(),
        nn.Linear(10, 8), nn.ReLU(),
        nn.Linear(8, 1), nn.Sigmoid(),
    )


def train_fn(data: dict, steps: int = 1000, batch_size: int = 32, lr: float = 3e-3,
             seed: int = 0) -> dict:
    """Train from scratch for ``steps`` minibatch steps; self-contained so it can run remotely.

    Returns ``{"state_dict", "losses" (one per step), "seconds" (the loop alone), "pid"}``.
    """
    torch.manual_seed(seed)
    # Copies: arrays from raylite's object store are read-only views of shared memory.
    X = torch.from_numpy(np.array(data["X_train"], dtype=np.float32))
    y = torch.from_numpy(np.array(data["y_train"], dtype=np.float32)).reshape(-1, 1)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.BCELoss()
    gen = torch.Generator().manual_seed(seed)
    n = len(X)
    losses: list[float] = []
    order, pos = torch.randperm(n, generator=gen), 0
    t0 = time.perf_counter()
    model.train()
    for _ in range(steps):
        if pos + batch_size > n:  # new epoch; drop the ragged last batch
            order, pos = torch.randperm(n, generator=gen), 0
        b = order[pos:pos + batch_size]
        pos += batch_size
        opt.zero_grad()
        loss = loss_fn(model(X[b]), y[b])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - t0
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {"state_dict": state, "losses": losses, "seconds": seconds, "pid": os.getpid()}


@torch.no_grad()
def accuracy(model: nn.Module, X: np.ndarray, y: np.ndarray) -> float:
    model.eval()
    pred = (model(torch.as_tensor(X)).reshape(-1) >= 0.5).float().numpy()
    return float((pred == y).mean())


def majority_baseline(data: dict) -> float:
    """Held-out accuracy of always predicting the training set's majority class."""
    p = float(data["y_train"].mean() >= 0.5)
    return float((data["y_test"] == p).mean())


# --------------------------------------------------------------------------------------------
# Modes
# --------------------------------------------------------------------------------------------

class ModeUnavailable(Exception):
    """A mode cannot run here. ``--mode all`` skips it (saying why) when ``optional`` (a missing
    third-party extra such as Lightning); otherwise, as for raylite itself, it is an error."""

    def __init__(self, message: str, optional: bool = True):
        super().__init__(message)
        self.optional = optional


@dataclass
class Result:
    mode: str
    seconds: float          # wall time in the driver around training: one-time costs (torch's
                            # lazy imports on first optimizer use) and any remote overhead
    accuracy: float         # held-out accuracy of the weights the driver got back
    loop_seconds: float = float("nan")  # the training loop alone, where it ran
    losses: list[float] = field(default_factory=list, repr=False)
    note: str = ""


def _result(mode: str, out: dict, seconds: float, data: dict, note: str = "") -> Result:
    model = make_model()
    model.load_state_dict(out["state_dict"])
    return Result(mode, seconds, accuracy(model, data["X_test"], data["y_test"]),
                  out["seconds"], list(out["losses"]), note)


def run_torch(data: dict, steps: int = 1000, batch_size: int = 32, lr: float = 3e-3,
              seed: int = 0, **_: object) -> Result:
    t0 = time.perf_counter()
    out = train_fn(data, steps, batch_size, lr, seed)
    return _result("torch", out, time.perf_counter() - t0, data)


def run_raylite(data: dict, steps: int = 1000, batch_size: int = 32, lr: float = 3e-3,
                seed: int = 0, num_cpus: int = 2, **_: object) -> Result:
    """``train_fn`` as a raylite task with ``num_cpus=1``; the data travels once via ``put``."""
    try:
        import raylite as ray
    except ImportError as e:
        raise ModeUnavailable(f"raylite is not importable ({e}); install the project first: "
                              f"pip install -e . (from the repository root)",
                              optional=False) from e
    if __name__ != "__main__" and __name__ in sys.modules:
        # Imported as a module (tests, other examples): the workers may not be able to import
        # this file by name, so ship its functions by value, as they are when run as a script.
        import cloudpickle
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    owns_runtime = not ray.is_initialized()
    t_init = time.perf_counter()
    if owns_runtime:
        ray.init(num_cpus=num_cpus)
    t_init = time.perf_counter() - t_init
    try:
        remote_train = ray.remote(num_cpus=1)(train_fn)
        t0 = time.perf_counter()
        data_ref = ray.put(data)
        out = ray.get(remote_train.remote(data_ref, steps, batch_size, lr, seed))
        seconds = time.perf_counter() - t0
    finally:
        if owns_runtime:
            ray.shutdown()
    note = f"init {t_init:.2f} s (not counted)" if owns_runtime else ""
    if out["pid"] != os.getpid():
        note += f"; ran in worker pid {out['pid']}"
    return _result("raylite", out, seconds, data, note)


# --------------------------------------------------------------------------------------------
# Lightning modes
# --------------------------------------------------------------------------------------------

_LIGHTNING: tuple | None = None


def _lightning() -> tuple:
    """(pytorch_lightning, WineModule, LossRecorder), defined on first use: Lightning is optional.

    Defined inside a function, the classes travel to RayStrategy's workers by value (cloudpickle),
    as a notebook's would.
    """
    global _LIGHTNING
    if _LIGHTNING is not None:
        return _LIGHTNING
    try:
        import pytorch_lightning as pl
    except ImportError as e:
        raise ModeUnavailable(f"pytorch_lightning is not installed ({e}); "
                              f"pip install -e '.[lightning]' (from the repository root)") from e
    _quiet_lightning()

    class WineModule(pl.LightningModule):
        """make_model() with BCE and Adam: the same network and optimiser as train_fn."""

        def __init__(self, lr: float):
            super().__init__()
            self.lr = lr
            self.model = make_model()
            self.loss_fn = nn.BCELoss()

        def forward(self, x):
            return self.model(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = self.loss_fn(self.model(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=self.lr)

    class LossRecorder(pl.Callback):
        """Each step's loss and the training loop's own time. Callback state is what RayStrategy
        hands back from rank 0, so the curve and loop time of a distributed run reach the driver."""

        def __init__(self):
            self.losses: list[float] = []
            self.seconds = float("nan")
            self._t0 = 0.0

        def on_train_start(self, trainer, pl_module):
            self._t0 = time.perf_counter()
            if trainer.global_rank == 0:   # progress for the console (RayStrategy forwards rank 0's output)
                print(f"training started ({trainer.world_size} process(es))", file=sys.stderr, flush=True)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.losses.append(float(outputs["loss"]))

        def on_train_end(self, trainer, pl_module):
            self.seconds = time.perf_counter() - self._t0

        def state_dict(self):
            return {"losses": list(self.losses), "seconds": self.seconds}

        def load_state_dict(self, state_dict):
            self.losses, self.seconds = list(state_dict["losses"]), state_dict["seconds"]

    _LIGHTNING = (pl, WineModule, LossRecorder)
    return _LIGHTNING


def _quiet_lightning() -> None:
    """Keep Lightning's banners out of the table (also run in RayStrategy's workers)."""
    import logging
    import warnings
    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*(LeafSpec|does not have many workers|sync_dist).*")


def _lightning_run(mode: str, data: dict, steps: int, batch_size: int, lr: float, seed: int,
                   strategy="auto") -> tuple[Result, object]:
    pl, WineModule, LossRecorder = _lightning()
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(seed)
    module = WineModule(lr)
    X = torch.from_numpy(np.array(data["X_train"], dtype=np.float32))
    y = torch.from_numpy(np.array(data["y_train"], dtype=np.float32)).reshape(-1, 1)
    # shuffled, ragged last batch dropped: as train_fn (RayStrategy swaps in a DistributedSampler)
    loader = DataLoader(TensorDataset(X, y), batch_size=batch_size, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(seed))
    recorder = LossRecorder()
    trainer = pl.Trainer(max_steps=steps, strategy=strategy, accelerator="cpu",
                         devices=1 if strategy == "auto" else "auto", callbacks=[recorder], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    t0 = time.perf_counter()
    try:
        trainer.fit(module, loader)
    except SystemExit:
        if trainer.interrupted:   # Lightning's answer to a Ctrl-C: it tears down, then calls sys.exit(1)
            raise KeyboardInterrupt from None
        raise
    seconds = time.perf_counter() - t0
    out = {"state_dict": module.model.state_dict(), "losses": recorder.losses, "seconds": recorder.seconds}
    return _result(mode, out, seconds, data), trainer


def run_lightning(data: dict, steps: int = 1000, batch_size: int = 32, lr: float = 3e-3,
                  seed: int = 0, **_: object) -> Result:
    """``pl.Trainer(max_steps=steps)`` in this process, on the CPU."""
    result, _trainer = _lightning_run("lightning", data, steps, batch_size, lr, seed)
    return result


def run_ray_lightning(data: dict, steps: int = 1000, batch_size: int = 32, lr: float = 3e-3,
                      seed: int = 0, num_cpus: int = 2, num_workers: int = 2, warm_refit: bool = True,
                      **_: object) -> Result:
    """``pl.Trainer(strategy=RayStrategy(num_workers=N))``: DDP over N raylite worker actors.

    Each worker takes ``steps`` steps on its shard (so N x the samples of one process); its time
    includes starting the workers (they import torch and Lightning). With ``warm_refit`` the same
    job runs again on the warm workers, and that time goes in the note.
    """
    _lightning()
    try:
        import raylite as ray
        from raylite.plugins import RayStrategy, init_with_preload
    except ImportError as e:
        raise ModeUnavailable(f"raylite.plugins is not importable ({e}); install the project first: "
                              f"pip install -e '.[lightning]'", optional=False) from e
    if __name__ != "__main__" and __name__ in sys.modules:
        import cloudpickle   # imported as a module: ship this file's code by value (see run_raylite)
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    owns_runtime = not ray.is_initialized()
    if owns_runtime:
        # ray.init whose zygote imports torch + Lightning once: the workers fork with them loaded
        init_with_preload(num_cpus=num_cpus)
    try:
        cpus = ray.cluster_resources().get("CPU", num_cpus)
        # more workers than CPUs: an equal share each, rounded down to raylite's resource grid of 1e-4
        # (3 workers on 2 CPUs: 0.6666 each; 2/3 itself is finer than the runtime counts)
        per_worker = 1 if cpus >= num_workers else math.floor(cpus / num_workers * 10_000) / 10_000

        def strategy():
            return RayStrategy(num_workers=num_workers, num_cpus_per_worker=per_worker,
                               init_hook=_quiet_lightning)

        result, trainer = _lightning_run("ray-lightning", data, steps, batch_size, lr, seed, strategy())
        # when the first step ran: the workers' start, imports, process group and Lightning's setup
        first = trainer.strategy.worker_results.get("phases", {}).get("first_step")
        started = f", first step after {first:.2f} s" if first is not None else ""
        result.note = f"{num_workers} workers, cold (incl. their start{started})"
        if warm_refit:   # the same job again: the workers are warm now
            t0 = time.perf_counter()
            _lightning_run("ray-lightning", data, steps, batch_size, lr, seed, strategy())
            result.note += f"; warm refit {time.perf_counter() - t0:.2f} s"
    finally:
        if owns_runtime:
            ray.shutdown()
    return result


# name -> runner(data, steps=..., batch_size=..., lr=..., seed=..., num_cpus=..., num_workers=...)
# -> Result.
MODES: dict[str, Callable[..., Result]] = {
    "torch": run_torch,
    "raylite": run_raylite,
    "lightning": run_lightning,
    "ray-lightning": run_ray_lightning,
}


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------

def format_table(results: list[Result], baseline: float | None = None) -> str:
    lines = [f"{'mode':<14} {'train time (s)':>14} {'loop (s)':>9} {'accuracy':>9}  note",
             "-" * 66]
    for r in results:
        lines.append(f"{r.mode:<14} {r.seconds:>14.2f} {r.loop_seconds:>9.2f} "
                     f"{r.accuracy:>9.3f}  {r.note}".rstrip())
    if baseline is not None:
        lines.append(f"{'majority class':<14} {'':>14} {'':>9} {baseline:>9.3f}  "
                     f"(always predict the train split's majority)")
    lines.append("train time: wall time in this process around the mode's training, incl. "
                 "one-time costs and remote overhead; loop: the training loop alone")
    return "\n".join(lines)


def smooth(xs: list[float], window: int = 25) -> np.ndarray:
    a = np.asarray(xs, dtype=np.float64)
    if len(a) < window:
        return a
    c = np.cumsum(np.insert(a, 0, 0.0))
    return (c[window:] - c[:-window]) / window


def plot_losses(results: list[Result], path: str | os.PathLike) -> bool:
    """Write a loss-curve PNG; returns False (and says why) if matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no plot written to {path} "
              f"(pip install matplotlib, or the [plot] extra)", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    styles = ["-", "--", ":", "-."]  # same seed, same curve: keep overlapping modes visible
    for i, r in enumerate(results):
        if r.losses:
            s = smooth(r.losses)
            ax.plot(np.arange(len(r.losses) - len(s), len(r.losses)) + 1, s, label=r.mode,
                    linestyle=styles[i % len(styles)], linewidth=2.5 if i == 0 else 1.5)
    ax.set_xlabel("step")
    ax.set_ylabel("BCE loss (moving average, 25 steps)")
    ax.set_title("wine quality >= 6: training loss")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help=f"winequality-red.csv (';' or ','); default ${DATA_ENV}, "
                                  f"else downloaded to {CACHE_DIR}")
    p.add_argument("--mode", default="all", choices=["all", *MODES],
                   help="which training to run (default: all)")
    p.add_argument("--steps", type=int, default=1000, help="optimizer steps (default 1000)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 0.003)")
    p.add_argument("--seed", type=int, default=0, help="model init / batch order seed")
    p.add_argument("--split-seed", type=int, default=42, help="train/test split seed")
    p.add_argument("--num-cpus", type=int, default=2, help="CPUs for ray.init (raylite modes)")
    p.add_argument("--num-workers", type=int, default=2,
                   help="RayStrategy workers (ray-lightning mode, default 2)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads in this process (default 1: for a model this small "
                        "more threads only add synchronisation; RayStrategy workers use 1 per CPU)")
    p.add_argument("--plot", default="wine_quality_loss.png",
                   help="loss-curve PNG (default wine_quality_loss.png)")
    p.add_argument("--no-plot", action="store_true", help="do not write the plot")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be >= 1")
    if args.num_workers < 1:
        p.error("--num-workers must be >= 1")
    if args.threads < 1:
        p.error("--threads must be >= 1")
    return args


def _interrupted(mode: str, results: list[Result], data: dict) -> int:
    """Ctrl-C: the table of the modes that finished (nothing is written before the end), one line
    saying so, and the shell's status for SIGINT."""
    if results:
        print()
        print(format_table(results, majority_baseline(data)))
        where = f"the table above has the {len(results)} mode(s) that finished; no plot written"
    else:
        where = "no mode had finished, so there are no results (nothing was written)"
    print(f"\ninterrupted (Ctrl-C) during mode {mode}: {where}", file=sys.stderr)
    return 130


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    loaded = load_for_cli(args.data)
    if loaded is None:
        return 2
    path, X, quality = loaded
    torch.set_num_threads(args.threads)
    data = prepare(X, quality, seed=args.split_seed)
    print(f"data: {path} ({len(X)} rows; train {len(data['X_train'])}, "
          f"test {len(data['X_test'])}); steps {args.steps}, batch {args.batch_size}")

    modes = list(MODES) if args.mode == "all" else [args.mode]
    results: list[Result] = []
    for i, name in enumerate(modes, 1):
        print(f"[{i}/{len(modes)}] mode {name}: training ...", flush=True)   # no silent minutes between modes
        started = time.perf_counter()
        try:
            results.append(MODES[name](data, steps=args.steps, batch_size=args.batch_size,
                                       lr=args.lr, seed=args.seed, num_cpus=args.num_cpus,
                                       num_workers=args.num_workers))
            print(f"[{i}/{len(modes)}] mode {name}: done in {time.perf_counter() - started:.1f} s", flush=True)
        except KeyboardInterrupt:
            return _interrupted(name, results, data)
        except ModeUnavailable as e:
            if args.mode != "all" or not e.optional:
                print(f"error: mode {name}: {e}", file=sys.stderr)
                return 1
            print(f"skipping mode {name}: {e}", file=sys.stderr)

    print()
    print(format_table(results, majority_baseline(data)))
    if not args.no_plot and results and plot_losses(results, args.plot):
        print(f"\nloss curves: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
