"""The worker group: N runtime actors, joined in one torch.distributed process group unless the
backend is a plain BackendConfig (DataParallelTrainer), and the reporter actor that carries
``train.report`` calls from the workers to the driver.

Reports: every worker sends each report, fire-and-forget, to one small ``_Reporter`` actor
(0 CPUs) that buffers them; the driver drains it while it waits on the workers. Reports and
checkpoint registrations so survive a worker's death, and the driver never needs a second call
into a busy worker (actor calls run one at a time). The same actor is where ranks meet in
``report``'s barrier (and ``train.collective``). Checkpoint files do not travel through it: each
rank copies its files into the run directory itself, so on a Ray cluster of several machines the
run directory (``RunConfig.storage_path``) must be on storage every node mounts, as Ray Train asks too.

Ranks follow ``raylite.util.placement``: one node's workers get consecutive ranks. The process
group meets in a file store when every worker is on the driver's machine (nothing listens), else
in the TCP store on rank 0's node (``raylite.util.rendezvous``).
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
from datetime import timedelta

import raylite as ray
from raylite import exceptions
from raylite.train import session
from raylite.train.config import TorchConfig
from raylite.util.rendezvous import Rendezvous, use_loopback
from raylite.util.placement import Layout, assigned_cuda_index, layouts, node_address
from raylite.util.placement_group import placement_group, remove_placement_group
from raylite.util.scheduling_strategies import PlacementGroupSchedulingStrategy

logger = logging.getLogger("raylite.train")

PENDING_WARNING_S = 30.0        # say which resources block the workers after this long
COLLECTIVE_WARN_S = 60.0        # say which ranks a collective still waits for after this long (Ray's interval)


class _Reporter:
    """Buffers (attempt, rank, seq, metrics, checkpoint name, time) tuples until the driver drains
    them, and is the ranks' meeting point: ``gather`` is the barrier of ``train.report`` and of
    ``train.collective`` (an async actor, so ranks can wait in it side by side)."""

    def __init__(self):
        self.items: list = []
        self.attempt, self.world_size, self.next_index = -1, 1, 0
        self.rounds: dict[int, tuple[dict, asyncio.Future]] = {}

    async def begin(self, attempt: int, world_size: int, next_index: int) -> None:
        """A new attempt: ranks of earlier ones still waiting (already killed) are let go."""
        for _, waiter in self.rounds.values():
            if not waiter.done():
                waiter.set_exception(RuntimeError(f"raylite.train: attempt {self.attempt} was torn down"))
        self.attempt, self.world_size, self.next_index, self.rounds = attempt, world_size, next_index, {}

    async def report(self, *item) -> None:
        self.items.append(item)

    async def drain(self) -> list:
        items, self.items = self.items, []
        return items

    async def allocate(self, attempt: int) -> str:
        """A checkpoint name for one rank's own checkpoint (Ray 1.x's save_checkpoint, rank 0 only)."""
        self._check(attempt)
        return self._next_name()

    async def gather(self, attempt: int, rank: int, seq: int, value, name_if_any: bool = False) -> tuple:
        """Every rank's ``value`` for collective ``seq`` (in rank order) once all have called, and,
        with ``name_if_any``, the checkpoint name of this round if any rank's value is true."""
        self._check(attempt)
        values, waiter = self.rounds.setdefault(seq, ({}, asyncio.get_running_loop().create_future()))
        values[rank] = value
        if len(values) == self.world_size:
            ordered = [values[r] for r in range(self.world_size)]
            waiter.set_result((ordered, self._next_name() if name_if_any and any(ordered) else None))
            del self.rounds[seq]
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(waiter), COLLECTIVE_WARN_S)
            except asyncio.TimeoutError:
                missing = sorted(set(range(self.world_size)) - set(values))
                logger.warning("raylite.train: rank %d has waited %.0f s more in a collective (train.report or "
                               "train.collective) for ranks %s: every rank must make the same calls",
                               rank, COLLECTIVE_WARN_S, missing)

    def _check(self, attempt: int) -> None:
        if attempt != self.attempt:
            raise RuntimeError(f"raylite.train: attempt {attempt} is over (now {self.attempt})")

    def _next_name(self) -> str:
        self.next_index += 1
        return f"checkpoint_{self.next_index - 1:06d}"


class _TrainWorker:
    """One training process. Lives as long as the worker group (kept warm between runs)."""

    def __init__(self):
        self.rank = None

    def node(self, rendezvous_dir: str) -> tuple[str, str, int, bool]:
        """Node id, IP and a free port there (if this worker becomes rank 0 on a cluster, its TCP
        store's), and whether it sees the driver's rendezvous directory (same machine)."""
        return (*node_address(), os.path.isdir(rendezvous_dir))

    def setup(self, rank: int, world_size: int, layout: Layout, use_gpu: bool, num_threads: int,
              dist_args: tuple | None, init_hook=None) -> dict:
        """Rank variables and threads; then, with ``dist_args`` (master address and port, init
        method, backend, timeout), the torch process group. None: no torch (DataParallelTrainer)."""
        self.rank = rank
        os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size)})
        os.environ.update(layout.env())
        if num_threads > 0:   # as Ray does: one intra-op thread per CPU the worker holds
            os.environ["OMP_NUM_THREADS"] = str(num_threads)
        device, backend = (f"cuda:{assigned_cuda_index()}" if use_gpu else "cpu"), None
        if dist_args is not None:
            device, backend = self._join(rank, world_size, use_gpu, num_threads, *dist_args)
        if init_hook is not None:
            init_hook()
        return {"rank": rank, "pid": os.getpid(), "device": device, "backend": backend,
                "gpu_ids": ray.get_runtime_context().get_accelerator_ids().get("GPU", [])}

    def _join(self, rank: int, world_size: int, use_gpu: bool, num_threads: int, master_addr: str,
              master_port: int, init_method: str, backend: str | None, timeout_s: float) -> tuple[str, str]:
        os.environ.update({"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)})
        import torch
        import torch.distributed as dist
        if num_threads > 0:
            torch.set_num_threads(num_threads)
        device = "cpu"
        if use_gpu:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            if not torch.cuda.is_available():
                raise RuntimeError(
                    f"use_gpu=True but CUDA is not usable in worker rank {rank} "
                    f"(CUDA_VISIBLE_DEVICES={visible!r}, torch {torch.__version__}, "
                    f"torch.cuda.is_available() is False). Pass use_gpu='auto' to fall back to CPU workers.")
            index = assigned_cuda_index()   # 0 where the runtime made the assigned GPU the only one visible
            torch.cuda.set_device(index)
            device = f"cuda:{index}"
        backend = backend or ("nccl" if use_gpu else "gloo")
        # DistributedDataParallel imports torch._dynamo on first use (~3 s): pay it here, while the
        # other workers start too, rather than in the first run of a warm group. A single worker is
        # never wrapped in DDP by prepare_model, so it does not need it. (Preloaded with
        # raylite.train.init_with_preload, it is already imported: the zygote did it once.)
        if world_size > 1:
            import torch._dynamo  # noqa: F401
        if dist.is_initialized():
            dist.destroy_process_group()
        use_loopback(init_method)
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
        return device, backend

    def run(self, train_func, config, info: session.SessionInfo):
        session._start(info)
        try:
            if takes_config(train_func):
                return train_func({} if config is None else config)
            return train_func()
        finally:
            session._end()

    def pid(self) -> int:
        return os.getpid()


def takes_config(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)


ReporterActor = ray.remote(num_cpus=0, max_restarts=0)(_Reporter)
WorkerActor = ray.remote(_TrainWorker)


def is_death(err: BaseException) -> bool:
    """A worker process (or its node) died, as opposed to user code raising."""
    if isinstance(err, exceptions.RayTaskError):
        return False
    return isinstance(err, (exceptions.RayActorError, exceptions.WorkerCrashedError, exceptions.NodeDiedError))


def wait_all(refs: list, what: str, request: dict | None = None) -> list:
    """``ray.get`` on refs, failing fast on the first error; warns periodically while they are
    pending, naming the resources asked for and those free (workers waiting to be placed)."""
    pending, values = list(refs), {}
    started = last_warning = time.monotonic()
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=5.0)
        for r in ready:
            values[r] = ray.get(r)   # raises the worker's error
        now = time.monotonic()
        if pending and now - last_warning >= PENDING_WARNING_S:
            last_warning = now
            logger.warning("raylite.train: still waiting after %.0f s for %s (%d of %d pending); each worker "
                           "asks for %s, the runtime has %s available", now - started, what, len(pending),
                           len(refs), request, ray.available_resources())
    return [values[r] for r in refs]


class WorkerGroup:
    """``num_workers`` actors, each with ``request`` ({num_cpus, num_gpus, resources}), joined in a
    torch process group when ``torch_config`` is given."""

    def __init__(self, num_workers: int, request: dict, use_gpu: bool, torch_config: TorchConfig | None):
        self.num_workers = num_workers
        self.request = request
        self.use_gpu = use_gpu
        self.torch_config = torch_config
        self.workers: list = []          # in rank order once started
        self.group = None                # the placement group reserving their resources
        self.rendezvous: Rendezvous | None = None
        self.layouts: list[Layout] = []
        self.infos: list[dict] = []

    def start(self, init_hook=None) -> list[dict]:
        for attempt in range(3):
            try:
                return self._start(init_hook)
            except Exception as e:   # a port taken between choosing and binding it: try another
                self.kill()
                if attempt == 2 or "in use" not in str(e).lower():
                    raise
                logger.info("raylite.train: master port was taken (%s); retrying", e)
        raise AssertionError("unreachable")

    def _start(self, init_hook) -> list[dict]:
        opts = {"num_cpus": self.request["num_cpus"], "max_restarts": 0}
        if self.request["num_gpus"]:
            opts["num_gpus"] = self.request["num_gpus"]
        if self.request["resources"]:
            opts["resources"] = self.request["resources"]
        what = f"{self.num_workers} raylite.train workers"
        bundle = {k: v for k, v in {"CPU": self.request["num_cpus"], "GPU": self.request["num_gpus"],
                                    **(self.request["resources"] or {})}.items() if v}
        places = [{} for _ in range(self.num_workers)]
        if bundle:   # a gang: every worker's resources are reserved before any starts, as in Ray Train
            self.group = placement_group([bundle] * self.num_workers, strategy="PACK")
            wait_all([self.group.ready()], f"resources for {what}", self.request)
            places = [{"scheduling_strategy": PlacementGroupSchedulingStrategy(self.group, i)}
                      for i in range(self.num_workers)]
        workers = [WorkerActor.options(**opts, **place).remote() for place in places]
        self.workers = workers
        tc = self.torch_config
        self.rendezvous = Rendezvous() if tc is not None else None
        places = wait_all([w.node.remote(self.rendezvous.directory if tc is not None else "") for w in workers],
                          what, self.request)
        order, self.layouts = layouts([node for node, _, _, _ in places])
        self.workers = [workers[i] for i in order]
        dist_args = None
        if tc is not None:
            _, addr, port, _ = places[order[0]]
            init_method = self.rendezvous.init_method([(node, seen) for node, _, _, seen in places])
            dist_args = (addr, port, init_method, tc.backend, tc.timeout_s)
        threads = max(1, int(self.request["num_cpus"]))
        refs = [w.setup.remote(rank, self.num_workers, layout, self.use_gpu, threads, dist_args, init_hook)
                for rank, (w, layout) in enumerate(zip(self.workers, self.layouts))]
        self.infos = wait_all(refs, what, self.request)
        gpus = [tuple(i["gpu_ids"]) for i in self.infos]
        if self.use_gpu and self.infos[0]["backend"] == "nccl" and len(set(gpus)) < len(gpus):
            raise ValueError(f"NCCL needs a distinct GPU per worker, but the workers share GPUs {gpus} "
                             f"(fractional resources_per_worker['GPU']); use one GPU per worker or "
                             f"TorchConfig(backend='gloo')")
        return self.infos

    def run(self, train_func, config, infos: list) -> list:
        return [w.run.remote(train_func, config, info) for w, info in zip(self.workers, infos)]

    def kill(self) -> None:
        workers, self.workers = self.workers, []
        group, self.group = self.group, None
        if self.rendezvous is not None:
            self.rendezvous.close()
        if not ray.is_initialized():
            return
        for w in workers:
            try:
                ray.kill(w)
            except Exception:   # already gone, or the runtime is shutting down
                pass
        if group is not None:
            try:
                remove_placement_group(group)
            except Exception:   # the runtime is shutting down
                pass
