"""The one module that names Lightning.

ray_lightning broke on every Lightning minor release because it reached into Lightning's
internals all over the place. Here everything raylite.plugins takes from Lightning is imported
once, from its public 2.x module paths, so a Lightning upgrade that moves something breaks in one
place with one clear message. What we rely on:

* ``Trainer``/``LightningModule`` behaviour through ``strategies.DDPStrategy`` and
  ``strategies.FSDPStrategy`` (subclassed: ``_configure_launcher`` and ``root_device``; the workers
  join the process group themselves with both strategies' ``_get_process_group_backend()`` and
  ``_timeout``, after which Lightning's own init sees it up and skips),
* ``plugins.environments.ClusterEnvironment`` (the abstract interface),
* ``callbacks.Callback`` and ``trainer.states.TrainerFn``,
* ``strategies.launchers.launcher._Launcher``: the launcher interface (``launch``, ``kill``,
  ``is_interactive_compatible``). It is private, so when it is missing the launcher is
  duck-typed instead; Lightning only calls those three members.
* for the same-host fast path (``raylite.util.shm_collectives``), two private members of Lightning
  >= 2.5's SIGTERM handling: ``trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor`` and
  ``trainer._signal_connector._sigterm_notifier_fn`` (replaced per trainer instance), and
  ``utilities.exceptions.SIGTERMException``. Where any is missing the fast path leaves Lightning's
  SIGTERM handling alone.
* for RayStrategy without DDP's wrapper, ``DDPStrategy``'s ``pre_backward`` / ``post_backward`` /
  ``block_backward_sync`` (overridden) and the options it keeps (``_ddp_kwargs``, ``_ddp_comm_hook``,
  ``_ddp_comm_state``, ``_ddp_comm_wrapper``, ``_model_averaging_period``, ``_layer_sync``): any of
  them set means DDP runs.

Flavour: ``pytorch_lightning`` (2.x) if importable, else ``lightning.pytorch`` (2.x). Set
``RAYLITE_LIGHTNING=lightning.pytorch`` (or ``pytorch_lightning``) to choose explicitly; when only
``lightning.pytorch`` has been imported already, that one is used. Strategies of one flavour are
only accepted by that flavour's ``Trainer``.
"""
from __future__ import annotations

import importlib

from raylite.plugins._preload import candidates as _candidates


def _import():
    tried = []
    for name in _candidates():
        try:
            pl = importlib.import_module(name)
        except ImportError as e:
            tried.append(f"{name} ({e})")
            continue
        major = str(getattr(pl, "__version__", "0")).split(".")[0]
        if major != "2":
            tried.append(f"{name} {pl.__version__} (raylite.plugins needs 2.x)")
            continue
        return name, pl
    raise ImportError("raylite.plugins needs PyTorch Lightning 2.x: pip install 'pytorch-lightning>=2.1,<3' "
                      "(the [lightning] extra). Tried: " + "; ".join(tried))


PL_NAME, pl = _import()


def _sub(path: str):
    return importlib.import_module(f"{PL_NAME}.{path}")


ClusterEnvironment = _sub("plugins.environments").ClusterEnvironment
DDPStrategy = _sub("strategies").DDPStrategy
FSDPStrategy = _sub("strategies").FSDPStrategy
Callback = _sub("callbacks").Callback
TrainerFn = _sub("trainer.states").TrainerFn
rank_zero_only = _sub("utilities.rank_zero").rank_zero_only

try:   # Lightning >= 2.5: raised on every rank when a SIGTERM stops a distributed fit
    SIGTERMException = _sub("utilities.exceptions").SIGTERMException
except (ImportError, AttributeError):
    SIGTERMException = None

try:
    LauncherBase = _sub("strategies.launchers.launcher")._Launcher
except (ImportError, AttributeError):   # private in Lightning: fall back to duck typing
    LauncherBase = object
