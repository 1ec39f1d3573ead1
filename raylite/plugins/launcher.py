"""The launcher behind RayStrategy: Lightning's trainer function in N raylite actors.

Lightning calls ``strategy.launcher.launch(trainer._fit_impl, model, ..., trainer=trainer)`` from
``trainer.fit`` (and validate/test/predict). Here that call

1. takes a group of N worker actors (started with the strategy's resources: ``num_cpus``,
   ``num_gpus``, custom ``resources``) from a small pool, starting one if none is idle,
2. ships ``(strategy, trainer, function, args, kwargs)`` once with ``ray.put`` (cloudpickle: a
   LightningModule defined in ``__main__`` or a notebook travels by value),
3. runs it in every actor with its rank, the group's ``MASTER_ADDR``/``MASTER_PORT`` and rendezvous
   (a file store when every rank is on this machine: ``raylite.util.rendezvous``), the driver's
   ``PL_*`` variables, working directory, ``sys.path``, RNG and determinism flags,
4. returns rank 0's output to the driver: the trained weights (loaded into the driver's module),
   ``trainer.state``, ``callback_metrics`` / ``logged_metrics`` / ``progress_bar_metrics``, the
   callbacks' state (so ``checkpoint_callback.best_model_path`` is rank 0's), and the function's
   return value; for ``predict`` the predictions of all ranks, put back in the loader's order
   (_predictions.py).

Worker groups stay alive after a call so the next ``fit`` starts warm (torch and Lightning are
imported, the process group is up). An idle group is stopped when another group needs its
resources, after ``KEEPALIVE_S`` idle seconds, by ``release_workers()``, or by ``ray.shutdown()``.
Inside a raylite task or actor (a Tune trial, say) groups are never kept: they stop after each call.

A failing rank fails the call: the other ranks would wait in a collective forever, so the whole
group is killed and the most telling error (not a peer's "connection closed") is raised with its
own type, as Lightning would raise it in one process.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import warnings

import raylite as ray
from raylite import exceptions
from raylite.train.config import check_placeable
from raylite.plugins._phases import Phases
from raylite.util.rendezvous import Rendezvous
from raylite.util.placement import layouts
from raylite.plugins._predictions import merge_predictions
from raylite.plugins._worker import (FORWARDED_ENV_PREFIXES, _capture_global_state, _Mailbox,  # noqa: F401
                                     _Worker, callback_key, worker_session)

KEEPALIVE_S = float(os.environ.get("RAYLITE_LIGHTNING_KEEPALIVE_S", "30"))
PENDING_WARN_S = 30.0
ERROR_GRACE_S = 3.0


# ---------------------------------------------------------------------------------------------
# driver side: worker groups
# ---------------------------------------------------------------------------------------------

def _runtime_id() -> str:
    return ray.get_runtime_context().get_node_id()


def _nested() -> bool:
    ctx = ray.get_runtime_context()
    return ctx.get_task_id() is not None or ctx.get_actor_id() is not None


class _Group:
    """N worker actors with one rendezvous (a file store, or a port on rank 0's node); once started,
    rank i is always actor i (ordered so that one node's actors have consecutive ranks:
    ``raylite.util.placement``)."""

    def __init__(self, key: tuple, num_workers: int, options: dict, init_hook):
        self.key = key
        self.runtime = _runtime_id()
        self.address, self.port, self.layouts = None, None, []
        self.rendezvous = Rendezvous()
        self.init_method = "env://"   # decided once the actors are placed
        self.pids: list[int] = []   # in rank order, once started
        cls = ray.remote(_Worker)
        self.actors = [cls.options(**options).remote(init_hook) for _ in range(num_workers)]
        self.placed = [a.ready.remote(self.rendezvous.directory) for a in self.actors]   # answered once placed,
        self.warming = [a.warm.remote() for a in self.actors]   # then the imports run
        self.options = options
        self.started = False
        self.timer: threading.Timer | None = None

    def wait_started(self) -> None:
        if self.started:
            return
        placed = self.placed
        t0 = time.monotonic()
        warned = False
        while True:
            ready, _ = ray.wait(placed, num_returns=len(placed), timeout=1.0)
            if len(ready) == len(placed):
                break
            if not warned and time.monotonic() - t0 > PENDING_WARN_S:
                warned = True
                avail = {k: v for k, v in ray.available_resources().items()
                         if k in ("CPU", "GPU") or k in (self.options.get("resources") or {})}
                warnings.warn(
                    f"RayStrategy: {len(placed) - len(ready)} of {len(placed)} workers have not started after "
                    f"{PENDING_WARN_S:.0f} s; each needs {_describe(self.options)}, available now: {avail or 'none'}. "
                    f"If other tasks or actors hold those resources, this waits until they are freed: pass fewer "
                    f"num_workers / num_cpus_per_worker, or ray.init(num_cpus=...) with more.",
                    RuntimeWarning, stacklevel=4)
        places = ray.get(placed)
        order, self.layouts = layouts([node for node, _, _, _ in places])
        self.actors = [self.actors[i] for i in order]
        _, self.address, self.port, _ = places[order[0]]
        self.init_method = self.rendezvous.init_method([(node, seen) for node, _, _, seen in places])
        pids = ray.get(self.warming)   # a failed start (init_hook raised) surfaces here
        self.pids = [pids[i] for i in order]
        self.started = True

    def kill(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.rendezvous.close()
        if not ray.is_initialized() or _runtime_id() != self.runtime:
            return   # that runtime is gone, and its processes with it
        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self.actors = []


def _describe(options: dict) -> str:
    parts = [f"num_cpus={options.get('num_cpus', 0)}"]
    if options.get("num_gpus"):
        parts.append(f"num_gpus={options['num_gpus']}")
    if options.get("resources"):
        parts.append(f"resources={options['resources']}")
    return ", ".join(parts)


class _Pool:
    def __init__(self):
        self.lock = threading.Lock()
        self.idle: list[_Group] = []

    def acquire(self, key: tuple, num_workers: int, options: dict, init_hook) -> _Group:
        runtime = _runtime_id()
        with self.lock:
            for g in [g for g in self.idle if g.runtime != runtime]:   # a past session's groups
                self.idle.remove(g)
                g.kill()   # their processes are gone; this removes their rendezvous directories
            for g in self.idle:
                if g.key == key:
                    self.idle.remove(g)
                    if g.timer is not None:
                        g.timer.cancel()
                        g.timer = None
                    return g
            # Another configuration's idle workers may hold what this group needs.
            if self.idle and not _fits(num_workers, options):
                for g in list(self.idle):
                    self.idle.remove(g)
                    g.kill()
        return _Group(key, num_workers, options, init_hook)

    def release(self, group: _Group, healthy: bool) -> None:
        # is_initialized() first: _nested()'s get_runtime_context() would start a runtime
        if not healthy or not ray.is_initialized() or _nested() or KEEPALIVE_S <= 0:
            group.kill()
            return
        with self.lock:
            self.idle.append(group)
            group.timer = threading.Timer(KEEPALIVE_S, self._expire, args=(group,))
            group.timer.daemon = True
            group.timer.start()

    def _expire(self, group: _Group) -> None:
        with self.lock:
            if group not in self.idle:
                return
            self.idle.remove(group)
        group.timer = None
        try:
            group.kill()
        except Exception:  # noqa: BLE001 - runtime shutting down
            pass

    def clear(self) -> None:
        with self.lock:
            groups, self.idle = self.idle, []
        for g in groups:
            g.kill()


def _fits(num_workers: int, options: dict) -> bool:
    try:
        avail = ray.available_resources()
    except Exception:  # noqa: BLE001
        return True
    return all(avail.get(k, 0) + 1e-9 >= each * num_workers for k, each in _per_worker(options).items() if each)


def _per_worker(options: dict) -> dict:
    """A worker's actor options as resource -> amount."""
    return {"CPU": options.get("num_cpus", 0), "GPU": options.get("num_gpus", 0), **(options.get("resources") or {})}


_pool = _Pool()


def release_workers() -> None:
    """Stop every idle RayStrategy worker group now (they are otherwise kept for the next fit)."""
    _pool.clear()


# ---------------------------------------------------------------------------------------------
# the launcher
# ---------------------------------------------------------------------------------------------

def _launcher_base():
    from raylite.plugins._compat import LauncherBase
    return LauncherBase


class RayLauncher(_launcher_base()):
    """Runs Lightning's trainer function in the strategy's raylite worker actors."""

    def __init__(self, strategy) -> None:
        self._strategy = strategy
        self._group: _Group | None = None

    @property
    def is_interactive_compatible(self) -> bool:
        # Workers are forked from raylite's zygote and get the program by value (cloudpickle):
        # nothing re-runs the user's script, so notebooks and `python -i` work.
        return True

    def launch(self, function, *args, trainer=None, **kwargs):
        phases = Phases()
        phases.mark("launch")
        if not ray.is_initialized():
            from raylite.plugins._preload import init_with_preload
            init_with_preload()
        strategy = self._strategy
        num_workers = strategy.num_workers
        options = strategy._raylite_actor_options()
        check_placeable(type(strategy).__name__, num_workers, _per_worker(options), ray.cluster_resources(),
                        "num_cpus_per_worker")
        key = (num_workers, repr(sorted(options.items())), strategy.init_hook)
        group = _pool.acquire(key, num_workers, options, strategy.init_hook)
        phases.mark("group_acquired")
        self._group = group
        mailbox = None
        healthy = False
        try:
            if trainer is not None and _wants_mailbox(trainer):
                mailbox = ray.remote(_Mailbox).options(num_cpus=0).remote()
            payload = ray.put((strategy, trainer, function, args, kwargs))
            phases.mark("payload_put")
            spec = {
                "world_size": num_workers,
                "env": {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)},
                "cwd": os.getcwd(), "sys_path": list(sys.path),
                "threads": max(1, int(options.get("num_cpus") or 1)),
                "global_state": _capture_global_state(), "mailbox": mailbox,
            }
            group.wait_started()
            phases.mark("group_started")
            spec.update(address=group.address, port=group.port, init_method=group.init_method)
            refs = [actor.run.remote(payload, {**spec, "rank": rank, "layout": layout})
                    for rank, (actor, layout) in enumerate(zip(group.actors, group.layouts))]
            del payload
            outputs = self._wait(refs, mailbox, group.pids)
            phases.mark("outputs")
            healthy = True
        finally:
            self._group = None
            if mailbox is not None:
                try:
                    ray.kill(mailbox)
                except Exception:  # noqa: BLE001
                    pass
            _pool.release(group, healthy)
        phases.update(outputs[0].pop("phases", None) if outputs[0] else None)
        if trainer is None:
            strategy._raylite_last = {"phases": phases.relative()}
            return outputs[0]["results"]
        try:
            return _recover(strategy, trainer, outputs)
        finally:
            phases.mark("recovered")
            strategy._raylite_last["phases"] = phases.relative()

    def _wait(self, refs: list, mailbox, pids: list[int]) -> list:
        pending = list(refs)
        done: dict = {}
        errors: list = []   # (rank, exception) in the order they came
        rank_of = {id(r): i for i, r in enumerate(refs)}
        poll = 0.25 if mailbox is not None else None
        deadline = None
        while pending:
            timeout = poll
            if deadline is not None:
                timeout = max(0.0, deadline - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=timeout)
            if mailbox is not None:
                _deliver(ray.get(mailbox.drain.remote()))
            for ref in ready:
                try:
                    done[id(ref)] = ray.get(ref)
                except BaseException as e:  # noqa: BLE001 - judged below
                    if isinstance(e, KeyboardInterrupt):
                        raise
                    rank = rank_of[id(ref)]
                    errors.append((rank, _name_dead_worker(e, rank, len(refs), pids[rank])))
                    if not _is_peer_noise(e):
                        raise _root_cause(errors) from None   # the others wait in a collective: stop
                    if deadline is None:   # a peer's symptom: give the cause a moment to arrive
                        deadline = time.monotonic() + ERROR_GRACE_S
            if deadline is not None and (not ready and time.monotonic() >= deadline):
                break
        if errors:
            raise _root_cause(errors)
        if mailbox is not None:
            _deliver(ray.get(mailbox.drain.remote()))
        return [done[id(r)] for r in refs]

    def kill(self, signum) -> None:
        group = self._group
        if group is not None:
            group.kill()

    def __getstate__(self) -> dict:
        return {"_strategy": self._strategy, "_group": None}


def _wants_mailbox(trainer) -> bool:
    from raylite.plugins.callbacks import _ReportCallback
    return any(isinstance(cb, _ReportCallback) for cb in trainer.callbacks)


def _deliver(items: list) -> None:
    from raylite.plugins.callbacks import _deliver_report
    for item in items:
        _deliver_report(item)


_PEER_HINTS = ("gloo", "nccl", "connection closed", "connection reset", "broken pipe", "peer", "timed out")


def _is_peer_noise(e: BaseException) -> bool:
    """A rank failing because another one went away, rather than for a reason of its own."""
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    text = f"{type(e).__name__} {lines[-1] if lines else ''}".lower()   # the error's own line, not its traceback
    return "distbackenderror" in text or any(h in text for h in _PEER_HINTS)


def _name_dead_worker(e: BaseException, rank: int, world_size: int, pid: int) -> BaseException:
    """A worker process that died (killed, out of memory, crashed) says which rank and pid it was:
    the runtime's own message names only the actor class. The type stays, for ``except`` clauses."""
    if isinstance(e, (exceptions.RayActorError, exceptions.WorkerCrashedError)) and \
            not isinstance(e, exceptions.RayTaskError):
        e.args = (f"RayStrategy worker rank {rank} of {world_size} (pid {pid}) died: {e}",)
    return e


def _root_cause(errors: list) -> BaseException:
    """The lowest rank's error that is not a peer noticing that another rank went away."""
    for _, e in sorted(errors, key=lambda x: x[0]):
        if not _is_peer_noise(e):
            return e
    return errors[0][1]


def _recover(strategy, trainer, outputs: list):
    """Put rank 0's results into the driver's trainer and module; return the call's value."""
    from raylite.plugins._compat import TrainerFn
    out = outputs[0]
    if out is None:
        raise RuntimeError("RayStrategy: rank 0 returned nothing")
    if out.get("weights") is not None:
        # Non-strict, like Lightning's spawn launcher: the module may have changed in the worker.
        trainer.lightning_module.load_state_dict(out["weights"], strict=False)
    trainer.state = out["state"]
    trainer.callback_metrics.update(out["callback_metrics"])
    trainer.logged_metrics.update(out["logged_metrics"])
    trainer.progress_bar_metrics.update(out["progress_bar_metrics"])
    strategy._raylite_last = {"global_step": out["global_step"], "current_epoch": out["current_epoch"]}
    states = out["callbacks"]
    for cb in trainer.callbacks:
        sd = states.get(callback_key(cb))
        if not sd:
            continue
        try:
            if "dirpath" in sd and getattr(cb, "dirpath", sd["dirpath"]) is None:
                cb.dirpath = sd["dirpath"]   # resolved in the worker; lets ModelCheckpoint take it all
            cb.load_state_dict(sd)
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"RayStrategy: could not restore the state of callback {cb.state_key} from rank 0: "
                          f"{type(e).__name__}: {e}", RuntimeWarning, stacklevel=3)
    if trainer.state.fn == TrainerFn.PREDICTING:
        return merge_predictions(outputs)
    return out["results"]
