"""``RayStrategy`` (DDP) and ``RayShardedStrategy`` (FSDP): Lightning 2.x strategies whose
processes are raylite actors.

The Lightning surface is two overrides per strategy class: ``_configure_launcher`` (our launcher
instead of Lightning's subprocess launcher) and ``root_device`` (each worker's own device). The
rest is Lightning's own DDP / FSDP code running unchanged in every worker, except that the process
group is joined at the launcher's rendezvous (``setup_environment``: a file store when every rank is
on this machine, where Lightning's ``env://`` would open a TCP store on every interface) and the
same-host fast path of a CPU fit (``raylite.util.shm_collectives``: ``setup_environment``,
``configure_ddp``, the backward hooks and ``teardown``): the per-step SIGTERM check and the
gradient averaging go through shared memory instead of gloo, and where nothing needs DDP's own
behaviour RayStrategy averages gradients without DDP's wrapper (``FlatGradients``).
``RAYLITE_LIGHTNING_FASTPATH=0`` turns it all off, ``=ddp`` keeps DDP's wrapper.
"""
from __future__ import annotations

import contextlib
import logging
import os
import warnings

import torch

from raylite.util import shm_collectives as _fastpath
from raylite.plugins._compat import PL_NAME, DDPStrategy, FSDPStrategy, SIGTERMException, TrainerFn
from raylite.plugins.environment import _LaunchedEnvironment
from raylite.plugins.launcher import RayLauncher
from raylite.train.config import check_num_workers
from raylite.util.rendezvous import use_loopback

_RESERVED = ("parallel_devices", "cluster_environment", "start_method")


class _RayWorkers:
    """What RayStrategy and RayShardedStrategy share: the worker group's shape and resources."""

    def _raylite_init(self, num_workers, num_cpus_per_worker, use_gpu, resources_per_worker, init_hook, kwargs):
        for key in _RESERVED:
            if key in kwargs:
                raise TypeError(f"{type(self).__name__} sets {key} itself; it cannot be passed")
        check_num_workers(num_workers, type(self).__name__)
        if resources_per_worker is not None and not isinstance(resources_per_worker, dict):
            raise TypeError(f"resources_per_worker must be a dict such as {{'CPU': 1, 'accel': 1}}, "
                            f"got {resources_per_worker!r}")
        if not isinstance(use_gpu, bool):
            raise TypeError(f"use_gpu must be True or False, got {use_gpu!r}")
        if init_hook is not None and not callable(init_hook):
            raise TypeError(f"init_hook must be a function (run once in each worker), got {init_hook!r}")
        resources = dict(resources_per_worker or {})
        cpus = resources.pop("CPU", num_cpus_per_worker)   # Ray's convention: CPU/GPU keys override
        gpus = resources.pop("GPU", 1 if use_gpu else 0)
        for what, value in (("num_cpus_per_worker", cpus), ("resources_per_worker['GPU']", gpus),
                            *((f"resources_per_worker[{k!r}]", v) for k, v in resources.items())):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < float("inf"):
                raise ValueError(f"{what} must be a number >= 0, got {value!r}")
        if gpus and not use_gpu:
            use_gpu = True
        if use_gpu and not gpus:
            raise ValueError("use_gpu=True with resources_per_worker={'GPU': 0}: give each worker a GPU share")
        self.num_workers = num_workers
        self.num_cpus_per_worker = cpus
        self.num_gpus_per_worker = gpus
        self.use_gpu = bool(use_gpu)
        self.resources_per_worker = resources
        self.init_hook = init_hook
        self._raylite_worker = False
        self._raylite_last: dict = {}
        self._raylite_trainer = None
        self._raylite_init_method: str | None = None   # the group's rendezvous, in a worker
        self._raylite_local = None   # the same-host fast path's LocalGroup, in a worker during fit
        self._raylite_flat = None    # RayStrategy without DDP's wrapper: its FlatGradients, during fit
        self._raylite_blocked = False   # inside block_backward_sync (gradient accumulation)
        self._raylite_fastpath = _fastpath.wanted()
        self._raylite_keep_ddp = os.environ.get(_fastpath.ENV) == "ddp"   # decided in the driver, as above
        self._raylite_phases = None   # in a worker during a call: its raylite.plugins._phases.Phases
        # One entry per worker (Lightning counts processes from it); every worker's own device is
        # device 0 of what raylite made visible to it, see root_device.
        device = torch.device("cuda", 0) if self.use_gpu else torch.device("cpu")
        return device, [device] * num_workers

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_workers={self.num_workers})"

    def __str__(self) -> str:
        # Lightning 2.x refuses a strategy in plugins=[...] (ray_lightning's `plugins=[RayPlugin(...)]`)
        # with "Found invalid type for plugin {plugin}": the fix then reads in its message.
        return (f"{self!r} (a Lightning strategy: pass it as pl.Trainer(strategy={self!r}); Lightning 2.x "
                f"takes strategies only through strategy=, not plugins=[...])")

    def _raylite_actor_options(self) -> dict:
        options = {"num_cpus": self.num_cpus_per_worker}
        if self.num_gpus_per_worker:
            options["num_gpus"] = self.num_gpus_per_worker
        if self.resources_per_worker:
            options["resources"] = dict(self.resources_per_worker)
        return options

    def _raylite_assign(self, *, rank: int, world_size: int, layout, address: str, port: int,
                        init_method: str, trainer=None) -> None:
        """In a worker, before Lightning runs: who this process is (``layout``: where it sits among
        the nodes, a ``raylite.util.placement.Layout``) and where its group meets."""
        self._raylite_worker = True
        self._raylite_trainer = trainer
        self._raylite_init_method = init_method
        self.cluster_environment.assign(rank=rank, world_size=world_size, local_rank=layout.local_rank,
                                        local_world_size=layout.local_world_size, node_rank=layout.node_rank,
                                        address=address, port=port)

    def _raylite_mark(self, name: str) -> None:
        phases = getattr(self, "_raylite_phases", None)
        if phases is not None:
            phases.mark(name)

    def setup_environment(self) -> None:
        self._raylite_mark("setup_environment")
        self._raylite_join_group()
        self._raylite_mark("process_group")
        super().setup_environment()   # Lightning's own init finds the process group up and keeps it
        self._raylite_connect_local()
        self._raylite_mark("environment_ready")

    def setup(self, trainer) -> None:
        super().setup(trainer)
        self._raylite_mark("model_ready")

    def training_step(self, *args, **kwargs):
        self._raylite_mark("first_step")
        return super().training_step(*args, **kwargs)

    def _raylite_join_group(self) -> None:
        """Lightning's process group init (``_init_dist_connection``: same backend, ranks, timeout
        and device), at the launcher's rendezvous instead of ``env://``. Once per worker: the group
        stays up for the worker's next calls."""
        if self._raylite_init_method is None or torch.distributed.is_initialized():
            return
        env, device = self.cluster_environment, self.root_device
        use_loopback(self._raylite_init_method)
        torch.distributed.init_process_group(
            self._get_process_group_backend(), init_method=self._raylite_init_method, rank=env.global_rank(),
            world_size=env.world_size(), timeout=self._timeout, device_id=device if device.type != "cpu" else None)

    def _raylite_connect_local(self) -> None:
        """In a worker fitting on CPU: the same-host fast path (see ``raylite.util.shm_collectives``)
        for the per-step SIGTERM check and, in RayStrategy, the gradient allreduce. The same
        decision on every rank (``LocalGroup.connect`` is a collective)."""
        self._raylite_local = None
        trainer = self._raylite_trainer
        if not (self._raylite_worker and self._raylite_fastpath and trainer is not None
                and self.world_size > 1 and self.root_device.type == "cpu"
                and trainer.state.fn == TrainerFn.FITTING and torch.distributed.is_initialized()):
            return
        connector = getattr(trainer, "_signal_connector", None)
        epoch_loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
        if (SIGTERMException is None or not hasattr(connector, "_sigterm_notifier_fn")
                or not hasattr(epoch_loop, "_broadcast_sigterm_tensor")):
            return   # a Lightning without the per-step SIGTERM broadcast (or a changed one)
        timeout = getattr(self, "_timeout", None)
        local = _fastpath.LocalGroup.connect(timeout.total_seconds() if timeout is not None else 1800.0)
        if local is None:
            return
        self._raylite_local = local
        log = logging.getLogger(f"{PL_NAME}.trainer.connectors.signal_connector")
        rank = self.global_rank

        def sigterm_check() -> None:
            # Lightning: rank 0 broadcasts whether it got a SIGTERM, every rank stops if so. Here:
            # rank 0 publishes the same decision (a SIGTERM to any rank counts) in shared memory.
            if local.sigterm_check(connector.received_sigterm):
                connector.received_sigterm = True
                with contextlib.suppress(Exception):
                    torch.distributed.barrier()
                raise SIGTERMException()

        def sigterm_notifier(signum, frame) -> None:
            # Lightning's handler broadcasts from inside the signal handler (a collective that can
            # deadlock when it interrupts one); here it only raises the group's flag.
            log.info(f"[rank: {rank}] Received SIGTERM: {signum}")
            local.note_sigterm()

        epoch_loop._broadcast_sigterm_tensor = sigterm_check
        connector._sigterm_notifier_fn = sigterm_notifier   # registered later in Trainer._run

    def _raylite_disconnect_local(self) -> None:
        flat, self._raylite_flat = self._raylite_flat, None
        if flat is not None:
            flat.close()
        local, self._raylite_local = self._raylite_local, None
        trainer, self._raylite_trainer = self._raylite_trainer, None
        if local is None:
            return
        epoch_loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
        connector = getattr(trainer, "_signal_connector", None)
        for owner, name in ((epoch_loop, "_broadcast_sigterm_tensor"), (connector, "_sigterm_notifier_fn")):
            if owner is not None and name in vars(owner):
                delattr(owner, name)
        local.close()

    def teardown(self) -> None:
        self._raylite_mark("loop_end")
        try:
            super().teardown()
        finally:
            self._raylite_disconnect_local()
            self._raylite_mark("teardown_done")

    def _raylite_root_device(self) -> torch.device:
        if not self.use_gpu:
            return torch.device("cpu")
        # In a worker: the GPU the runtime assigned it (device 0 of what it made visible, on both
        # backends by default). In the driver: device 0.
        if not self._raylite_worker:
            return torch.device("cuda", 0)
        from raylite.util.placement import assigned_cuda_index
        return torch.device("cuda", assigned_cuda_index())

    def _configure_launcher(self) -> None:
        self._launcher = RayLauncher(self)

    @property
    def worker_results(self) -> dict:
        """``global_step`` and ``current_epoch`` of rank 0 after the last call (the driver's
        ``trainer.global_step`` stays 0: its loops never ran), and ``phases``: when the call's steps
        happened, in seconds after it began (the driver's and rank 0's, see raylite.plugins._phases)."""
        return dict(self._raylite_last)


class RayStrategy(_RayWorkers, DDPStrategy):
    """Distributed data parallel training on ``num_workers`` raylite actors.

    ``pl.Trainer(strategy=RayStrategy(num_workers=4))``: every ``fit`` / ``validate`` / ``test`` /
    ``predict`` runs in 4 worker actors (``num_cpus_per_worker`` CPUs each; a GPU each with
    ``use_gpu=True``; plus ``resources_per_worker``, where ``"CPU"`` / ``"GPU"`` keys override the
    first two). The process group is gloo on CPU, NCCL on GPU. Afterwards the driver's module holds
    the trained weights and the trainer rank 0's ``state``, ``callback_metrics``,
    ``logged_metrics`` and callback state (``checkpoint_callback.best_model_path``). Data loaders
    get distributed samplers; ``predict`` returns every sample's prediction, in order.

    ``init_hook`` runs once in each worker when it starts. Other keyword arguments go to
    ``DDPStrategy`` (``find_unused_parameters``, ``static_graph``, ``timeout``,
    ``process_group_backend``, ...).

    Workers stay up after a call, so a second ``fit`` (even from a new Trainer with an equal
    RayStrategy) skips their start; see ``raylite.plugins.release_workers``.

    On CPU the workers average gradients through shared memory (sums taken in rank order, so
    every rank gets the same bits) and Lightning's per-step "SIGTERM received?" broadcast is a
    shared-memory flag: a SIGTERM to any worker stops every rank at the same step with
    Lightning's ``SIGTERMException``. A module without buffers whose gradients fit 1 MiB, with no
    DDP keyword argument, comm hook, ``sync_batchnorm`` or manual optimization, trains without
    DDP's wrapper: rank 0's weights are broadcast once, and each synchronised backward ends with
    one exchange of every gradient (the same averages as DDP, before ``on_after_backward``; a
    gradient only some ranks have is averaged with zeros, one no rank has stays None). Otherwise
    DDP runs, its buckets averaged through shared memory up to 1 MiB. ``RAYLITE_LIGHTNING_FASTPATH``
    (set in the driver): ``ddp`` keeps DDP's wrapper, ``0`` gloo for everything.

    Args:
        num_workers: training processes (worker actors).
        num_cpus_per_worker: CPUs each worker holds.
        use_gpu: a GPU for each worker, NCCL (else CPU, gloo).
        resources_per_worker: more resources each holds; ``"CPU"`` / ``"GPU"`` keys override the two above.
        init_hook: a function run once in each worker when it starts.
        **ddp_kwargs: ``DDPStrategy``'s arguments (``find_unused_parameters``, ``static_graph``, ``timeout``, ...).
    """

    strategy_name = "raylite_ddp"

    def __init__(self, num_workers: int = 1, num_cpus_per_worker: float = 1, use_gpu: bool = False,
                 resources_per_worker: dict | None = None, init_hook=None, **ddp_kwargs):
        _, devices = self._raylite_init(num_workers, num_cpus_per_worker, use_gpu, resources_per_worker,
                                        init_hook, ddp_kwargs)
        super().__init__(parallel_devices=devices, cluster_environment=_LaunchedEnvironment(num_workers),
                         **ddp_kwargs)

    @property
    def root_device(self) -> torch.device:
        return self._raylite_root_device()

    def determine_ddp_device_ids(self):
        if self.root_device.type == "cpu":
            return None
        return [self.root_device.index]

    def configure_ddp(self) -> None:
        if self.world_size == 1 and not self._raylite_wants_ddp():
            return   # one process has nothing to average: DDP's wrapper would allreduce each bucket with itself
        params = self._raylite_flat_params()
        if params is not None:
            # DDP's wrapper without DDP: its start (rank 0's weights everywhere), then one
            # exchange of every gradient per synchronised backward (see FlatGradients).
            _broadcast_from_rank0(list(self.lightning_module.parameters()))
            self._raylite_flat = _fastpath.FlatGradients(self._raylite_local, params)
            return
        super().configure_ddp()
        # Lightning registers communication hooks on CUDA only; on CPU with the same-host fast
        # path, gradients are averaged through shared memory unless the user chose a hook.
        local = self._raylite_local
        if (local is not None and self._ddp_comm_hook is None and self._ddp_comm_state is None
                and self._model_averaging_period is None
                and isinstance(self.model, torch.nn.parallel.DistributedDataParallel)):
            self.model.register_comm_hook(local, _fastpath.allreduce_hook)

    def _raylite_flat_params(self) -> list | None:
        """The parameters to average without DDP's wrapper, or None to keep DDP: where the
        same-host path is on, nothing asks for DDP's own behaviour (any DDP keyword argument, a
        comm hook, model averaging, sync_batchnorm, manual optimization), the module has no buffers
        (DDP broadcasts them every forward) and no sparse gradients, and every gradient fits one
        slot. ``RAYLITE_LIGHTNING_FASTPATH=ddp`` keeps DDP (with the shared-memory comm hook).
        The same answer on every rank: each has the same module and options."""
        local, module = self._raylite_local, self.lightning_module
        if (local is None or module is None or self._raylite_wants_ddp() or self._layer_sync
                or not module.automatic_optimization
                or next(module.buffers(), None) is not None
                or any(getattr(m, "sparse", False) is True for m in module.modules())):
            return None
        params = [p for p in module.parameters() if p.requires_grad]
        return params if _fastpath.FlatGradients.fits(local, params) else None

    def _raylite_wants_ddp(self) -> bool:
        """Whether the user asked for DDP's wrapper: the fast path off or set to keep DDP, a DDP
        keyword argument, a comm hook or model averaging."""
        return (not self._raylite_fastpath or self._raylite_keep_ddp or bool(self._ddp_kwargs)
                or self._ddp_comm_hook is not None or self._ddp_comm_state is not None
                or self._ddp_comm_wrapper is not None or self._model_averaging_period is not None)

    def pre_backward(self, closure_loss) -> None:
        flat = self._raylite_flat
        if flat is not None:
            flat.arm(not self._raylite_blocked)
        super().pre_backward(closure_loss)

    def post_backward(self, closure_loss) -> None:
        flat = self._raylite_flat
        if flat is not None:
            flat.finish()   # only when no parameter got a gradient here: the peers still wait for it
        super().post_backward(closure_loss)

    @contextlib.contextmanager
    def block_backward_sync(self):
        if self._raylite_flat is None:
            with super().block_backward_sync():
                yield
            return
        self._raylite_blocked = True
        try:
            yield
        finally:
            self._raylite_blocked = False


def _broadcast_from_rank0(tensors: list) -> None:
    """Rank 0's values into ``tensors`` on every rank (what DDP does when it wraps a module),
    one gloo broadcast per dtype."""
    groups: dict = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    with torch.no_grad():
        for group in groups.values():
            flat = torch.cat([t.detach().reshape(-1) for t in group])
            torch.distributed.broadcast(flat, src=0)
            for t, value in zip(group, flat.split([t.numel() for t in group])):
                t.copy_(value.view_as(t))


class RayShardedStrategy(_RayWorkers, FSDPStrategy):
    """Fully sharded data parallel (torch FSDP) on ``num_workers`` raylite actors.

    The modern form of ray_lightning's FairScale ``RayShardedPlugin``: parameters, gradients and
    optimizer state are sharded across the workers. Same arguments as ``RayStrategy``; other
    keyword arguments go to Lightning's ``FSDPStrategy`` (``sharding_strategy``,
    ``auto_wrap_policy``, ``cpu_offload``, ``mixed_precision``, ``state_dict_type``, ...).

    On CPU (gloo) torch's FSDP runs with ``device_id=cpu``: FULL_SHARD, SHARD_GRAD_OP and NO_SHARD
    train; mixed precision, ``cpu_offload`` and HYBRID_SHARD are GPU features. Full state dicts
    are gathered without ``offload_to_cpu`` on CPU (torch 2.x crashes offloading CPU tensors
    "to CPU"). Lightning's own FSDPStrategy refuses CPU; this subclass does not.
    """

    strategy_name = "raylite_fsdp"

    def __init__(self, num_workers: int = 1, num_cpus_per_worker: float = 1, use_gpu: bool = False,
                 resources_per_worker: dict | None = None, init_hook=None, **fsdp_kwargs):
        _, devices = self._raylite_init(num_workers, num_cpus_per_worker, use_gpu, resources_per_worker,
                                        init_hook, fsdp_kwargs)
        if not use_gpu and not self.use_gpu:
            for key in ("cpu_offload", "mixed_precision"):
                if fsdp_kwargs.get(key):
                    warnings.warn(f"RayShardedStrategy: {key} is a GPU feature; on CPU it is not supported by "
                                  f"torch FSDP", UserWarning, stacklevel=2)
        super().__init__(parallel_devices=devices, cluster_environment=_LaunchedEnvironment(num_workers),
                         **fsdp_kwargs)

    @property
    def root_device(self) -> torch.device:
        return self._raylite_root_device()

    def _setup_model(self, model):
        if self.root_device.type != "cpu":
            return super()._setup_model(model)
        # torch FSDP looks for an accelerator unless it is told the device, and Lightning passes
        # device_id=root_device.index (None on CPU). So on CPU wrap here with device_id=cpu, then
        # let Lightning's already-wrapped path do the rest (torchmetrics, activation checkpointing).
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        if not any(isinstance(m, FSDP) for m in model.modules()):
            model = FSDP(module=model, cpu_offload=self.cpu_offload, mixed_precision=self.mixed_precision_config,
                         sharding_strategy=self.sharding_strategy, device_id=torch.device("cpu"), **self.kwargs)
        policy = self.kwargs.pop("auto_wrap_policy", None)   # used above; Lightning would warn and drop it
        try:
            return super()._setup_model(model)
        finally:
            if policy is not None:
                self.kwargs["auto_wrap_policy"] = policy

    # Full state dicts on CPU: same as Lightning's, without offload_to_cpu (see class docstring).
    def _full_state_dict_context(self):
        from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        return FSDP.state_dict_type(self.model, StateDictType.FULL_STATE_DICT,
                                    FullStateDictConfig(offload_to_cpu=False, rank0_only=True),
                                    FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=True))

    def _cpu_full(self) -> bool:
        return self.root_device.type == "cpu" and getattr(self, "_state_dict_type", "full") == "full"

    def lightning_module_state_dict(self):
        if not self._cpu_full():
            return super().lightning_module_state_dict()
        with self._full_state_dict_context():
            return self.model.state_dict()

    def optimizer_state(self, optimizer):
        if not self._cpu_full():
            return super().optimizer_state(optimizer)
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import OptimStateKeyType
        optimizer = getattr(optimizer, "_optimizer", optimizer)   # LightningOptimizer -> torch optimizer
        with self._full_state_dict_context():
            state = FSDP.optim_state_dict(self.model, optimizer)
            if self.global_rank == 0:
                state = FSDP.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_ID, self.model)
            return state


# ray_lightning's names. In Lightning 2.x strategies are no longer accepted in `plugins=[...]`:
# the seed's `pl.Trainer(plugins=[RayPlugin(num_workers=4)])` becomes
# `pl.Trainer(strategy=RayPlugin(num_workers=4))` (or `strategy=RayStrategy(...)`).
RayPlugin = RayStrategy
RayShardedPlugin = RayShardedStrategy
