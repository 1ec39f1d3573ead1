"""GPU check for a machine with an NVIDIA GPU (issue 3): what raylite promises, on real hardware.

    python bench/gpu_check.py                # on a GPU machine (torch with CUDA, nvidia-ml-py)
    python bench/gpu_check.py --logical 1    # no GPU: the scheduling parts on a logical GPU

It prints:

1. detection: the number of GPUs and the accelerator type raylite found (NVML);
2. memory: a ``num_gpus=1`` task allocates ~1 GiB of CUDA memory with torch and never frees it;
   NVML shows the device memory before, while the task holds it, and after the task, once its
   worker was recycled (``max_calls=1``, the default for accelerator tasks) - the memory comes
   back because the process is gone;
3. sharing: four ``num_gpus=0.25`` tasks run at the same time on one device (their
   ``CUDA_VISIBLE_DEVICES``, time windows, and the processes NVML sees on the device);
4. DDP-ready: two ``num_gpus=0.5`` actors each see exactly their device as ``cuda:0``
   (``CUDA_VISIBLE_DEVICES``, ``torch.cuda.device_count()``, ``torch.cuda.current_device()``).

Without an NVIDIA GPU it says so and exits 0. torch is imported only inside tasks; the driver
never touches CUDA. NVML indices follow PCI order; set ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` on
machines with mixed GPU models so CUDA's indices match them. Runs in well under two minutes.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import raylite as ray  # noqa: E402
from raylite.core.hardware import accelerators  # noqa: E402

MiB = 1 << 20
GET_TIMEOUT_S = 90


# ----------------------------------------------------------------------------- NVML (driver side)

class NVML:
    """The few NVML queries used here; None-safe when NVML is missing."""

    def __init__(self):
        import pynvml  # nvidia-ml-py
        self.nv = pynvml
        pynvml.nvmlInit()

    def close(self):
        try:
            self.nv.nvmlShutdown()
        except Exception:
            pass

    def handle(self, device_id: str):
        if device_id.isdigit():
            return self.nv.nvmlDeviceGetHandleByIndex(int(device_id))
        return self.nv.nvmlDeviceGetHandleByUUID(device_id)

    def used_mib(self, handle) -> float:
        return self.nv.nvmlDeviceGetMemoryInfo(handle).used / MiB

    def processes(self, handle) -> dict[int, float | None]:
        try:
            procs = self.nv.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:
            return {}
        return {p.pid: (p.usedGpuMemory / MiB if p.usedGpuMemory else None) for p in procs}


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _flag(directory: str, name: str, text: str = "") -> None:
    with open(os.path.join(directory, name), "w") as f:
        f.write(text)


# ----------------------------------------------------------------------------- remote work

@ray.remote(num_gpus=1)
def torch_cuda_info() -> dict:
    """Whether torch in a GPU worker can use CUDA (a CPU build of torch cannot)."""
    info = {"pid": os.getpid(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return {**info, "cuda": False, "why": f"torch not importable: {e}"}
    if not torch.cuda.is_available():
        return {**info, "cuda": False, "why": f"torch {torch.__version__} has no CUDA here"}
    return {**info, "cuda": True, "torch": torch.__version__, "name": torch.cuda.get_device_name(0)}


@ray.remote(num_gpus=1)
def hold_cuda_memory(gib: float, flags: str) -> dict:
    """Allocate ~gib GiB and keep it, as frameworks do (their caches outlive the task)."""
    import torch
    x = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    _flag(flags, "allocated", os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    _wait_for(lambda: os.path.exists(os.path.join(flags, "release")), 60)
    return {"pid": os.getpid(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "allocated_mib": torch.cuda.memory_allocated() / MiB,
            "reserved_mib": torch.cuda.memory_reserved() / MiB}   # x is never freed on purpose


@ray.remote(num_gpus=0.25)
def quarter(i: int, use_cuda: bool, flags: str) -> dict:
    enter = time.time()
    info = {}
    if use_cuda:
        import torch
        y = torch.ones(1 << 20, device="cuda")
        torch.cuda.synchronize()
        info = {"device": torch.cuda.current_device(), "sum": float(y.sum())}
    _flag(flags, f"arrived-{i}")
    arrived = lambda: sum(n.startswith("arrived-") for n in os.listdir(flags)) == 4  # noqa: E731
    met = _wait_for(arrived, 60)   # all four at the rendezvous: they run at the same time
    _wait_for(lambda: os.path.exists(os.path.join(flags, "release")), 60)
    return {"i": i, "pid": os.getpid(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "gpu_ids": ray.get_gpu_ids(), "enter": enter, "exit": time.time(), "met": met, **info}


@ray.remote(num_gpus=0.5)
class DDPWorker:
    """What a torch.distributed worker needs: its GPU, and only its GPU, as cuda:0."""

    def device(self, use_cuda: bool) -> dict:
        info = {"pid": os.getpid(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "gpu_ids": ray.get_gpu_ids(),
                "accelerator_ids": ray.get_runtime_context().get_accelerator_ids()["GPU"]}
        if use_cuda:
            import torch
            torch.cuda.set_device(0)          # local index 0 = the first visible device
            t = torch.arange(4.0, device="cuda")
            torch.cuda.synchronize()
            info.update(device_count=torch.cuda.device_count(), current_device=torch.cuda.current_device(),
                        name=torch.cuda.get_device_name(), tensor_device=str(t.device))
        return info


# ----------------------------------------------------------------------------- checks

def check_memory(nvml: NVML | None, gib: float, use_cuda: bool) -> None:
    print(f"\n2. memory: a num_gpus=1 task allocates {gib:g} GiB with torch and never frees it")
    if not (use_cuda and nvml):
        print("   skipped: needs torch with CUDA in the worker and NVML")
        return
    with tempfile.TemporaryDirectory(prefix="raylite-gpucheck-") as flags:
        ref = hold_cuda_memory.remote(gib, flags)
        path = os.path.join(flags, "allocated")
        if not _wait_for(lambda: os.path.exists(path) or ray.wait([ref], timeout=0)[0], GET_TIMEOUT_S):
            print("   FAILED: the task did not allocate in time")
            return
        if not os.path.exists(path):
            ray.get(ref)   # raises the task's error
        device = open(path).read() or "0"
        handle = nvml.handle(device.split(",")[0])
        # Baseline: the device without this task's memory is measured after it is gone; "during"
        # is now, while the task holds the memory.
        during = nvml.used_mib(handle)
        procs = nvml.processes(handle)
        _flag(flags, "release")
        result = ray.get(ref, timeout=GET_TIMEOUT_S)
    pid = result["pid"]
    print(f"   task pid {pid}, CUDA_VISIBLE_DEVICES={result['visible']}: torch allocated "
          f"{result['allocated_mib']:.0f} MiB (reserved {result['reserved_mib']:.0f} MiB)")
    mine = procs.get(pid)
    print(f"   NVML during the task: device {device} uses {during:.0f} MiB"
          + (f"; the worker process uses {mine:.0f} MiB" if mine else
             f"; processes on the device: {sorted(procs) or 'not reported (container pid namespace?)'}"))
    recycled = _wait_for(lambda: not _pid_alive(pid), 30)
    print(f"   worker {pid} {'exited (recycled: max_calls=1 for GPU tasks)' if recycled else 'STILL ALIVE'}")
    # The driver hands the memory back just after the process is gone; poll for it a while
    # (by amount, not by pid: in a container NVML may report host pids).
    _wait_for(lambda: nvml.used_mib(handle) <= during - 0.9 * gib * 1024, 15)
    after = nvml.used_mib(handle)
    freed = during - after
    ok = recycled and freed >= 0.9 * gib * 1024
    print(f"   NVML after the task: device {device} uses {after:.0f} MiB -> {freed:.0f} MiB freed "
          f"[{'OK' if ok else 'CHECK'}]")


def check_sharing(nvml: NVML | None, use_cuda: bool) -> None:
    print("\n3. sharing: four num_gpus=0.25 tasks on one device at the same time")
    with tempfile.TemporaryDirectory(prefix="raylite-gpucheck-") as flags:
        t0 = time.time()
        refs = [quarter.remote(i, use_cuda, flags) for i in range(4)]
        arrived = lambda: sum(n.startswith("arrived-") for n in os.listdir(flags)) == 4  # noqa: E731
        all_in = _wait_for(lambda: arrived() or len(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) == 4,
                           GET_TIMEOUT_S)
        if all_in and nvml is not None and use_cuda:
            procs = nvml.processes(nvml.handle("0"))
            print(f"   NVML: {len(procs)} processes on device 0 while the four run: {sorted(procs)}")
        _flag(flags, "release")
        results = ray.get(refs, timeout=GET_TIMEOUT_S)
    for r in sorted(results, key=lambda r: r["i"]):
        extra = f", torch device cuda:{r['device']}" if "device" in r else ""
        print(f"   task {r['i']} pid {r['pid']}: CUDA_VISIBLE_DEVICES={r['visible']}, "
              f"window {r['enter'] - t0:6.2f} .. {r['exit'] - t0:6.2f} s{extra}")
    overlap = max(r["enter"] for r in results) < min(r["exit"] for r in results)
    same = len({r["visible"] for r in results}) == 1
    met = all(r["met"] for r in results)
    print(f"   one device for all: {same}; all four met at a rendezvous: {met}; windows overlap: {overlap} "
          f"[{'OK' if same and met and overlap else 'CHECK'}]")


def check_ddp(use_cuda: bool) -> None:
    print("\n4. DDP-ready: two num_gpus=0.5 actors, each with its device as cuda:0")
    workers = [DDPWorker.remote() for _ in range(2)]
    infos = ray.get([w.device.remote(use_cuda) for w in workers], timeout=GET_TIMEOUT_S)
    ok = True
    for rank, info in enumerate(infos):
        line = (f"   rank {rank} pid {info['pid']}: CUDA_VISIBLE_DEVICES={info['visible']}, "
                f"get_gpu_ids()={info['gpu_ids']}")
        if use_cuda:
            line += (f", torch.cuda.device_count()={info['device_count']}, "
                     f"current_device()={info['current_device']} ({info['name']}), tensor on {info['tensor_device']}")
            ok &= info["device_count"] == len(info["accelerator_ids"]) and info["current_device"] == 0
        ok &= info["visible"] == ",".join(info["accelerator_ids"])
        print(line)
    print(f"   each worker sees exactly its assigned device [{'OK' if ok else 'CHECK'}]")
    for w in workers:
        ray.kill(w)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="CUDA memory the task allocates (GiB)")
    parser.add_argument("--logical", type=int, default=0, metavar="N",
                        help="with no NVIDIA GPU: run the scheduling checks on N logical GPUs")
    args = parser.parse_args(argv)
    start = time.monotonic()

    vendor = accelerators.gpu_vendor()
    found = accelerators.detect().get("GPU") if vendor == "nvidia" else None
    print("1. detection")
    if found is None:
        why = f"GPU vendor is {vendor!r}" if vendor != "nvidia" else "NVML reports no device"
        print(f"   no NVIDIA GPU detected ({why})")
        if not args.logical:
            print("   nothing to check here; run with --logical 1 to exercise the scheduling parts")
            return 0
        print(f"   continuing on {args.logical} logical GPU(s): no CUDA, no NVML")
    else:
        count, accel_type = found
        print(f"   detected {count} NVIDIA GPU(s), accelerator type {accel_type}")

    ray.init(num_cpus=max(4, os.cpu_count() or 1), num_gpus=None if found else args.logical)
    nvml = None
    try:
        total = ray.cluster_resources()
        types = [k.split(":", 1)[1] for k in total if k.startswith("accelerator_type:")]
        print(f"   init(): GPU={total.get('GPU', 0):g}, accelerator_type: {types or 'none'}")
        use_cuda = False
        if found:
            info = ray.get(torch_cuda_info.remote(), timeout=GET_TIMEOUT_S)
            use_cuda = info["cuda"]
            print(f"   in a num_gpus=1 worker (pid {info['pid']}, CUDA_VISIBLE_DEVICES={info['visible']}): "
                  + (f"torch {info['torch']} sees {info['name']}" if use_cuda else info["why"]))
            try:
                nvml = NVML()
            except Exception as e:  # noqa: BLE001
                print(f"   NVML unavailable in the driver: {e}")
        check_memory(nvml, args.gib, use_cuda)
        check_sharing(nvml, use_cuda)
        check_ddp(use_cuda)
    finally:
        if nvml is not None:
            nvml.close()
        ray.shutdown()
    print(f"\ndone in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
