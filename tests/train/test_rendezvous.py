"""Where worker groups meet (raylite.util.rendezvous): with every rank on this machine, the
Trainer's and RayStrategy's workers form their process group in a file store in a private
directory, so no raylite process listens beyond loopback. (torch's TCP store, ``env://``, listens
on every interface, unauthenticated; gloo's own pair sockets are on loopback.)

Sockets are read from /proc: TCP sockets in LISTEN held by this process or its descendants (the
runtime's zygote and workers).
"""
from __future__ import annotations

import ipaddress
import os
import socket
import stat
import sys

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("pytorch_lightning")
cloudpickle = pytest.importorskip("cloudpickle")

from raylite import train  # noqa: E402
from raylite.train import Trainer  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

pytestmark = pytest.mark.timeout(120)
cloudpickle.register_pickle_by_value(sys.modules[__name__])   # workers need not import this module


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _ip(hex_addr: str):
    """An address from /proc/net/tcp{,6}: 32-bit words, each in the host's byte order."""
    raw = bytes.fromhex(hex_addr)
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(raw)
    return getattr(ip, "ipv4_mapped", None) or ip


def listening_beyond_loopback(root: int | None = None) -> list[str]:
    """``"address:port (pid N)"`` for each listening TCP socket on a non-loopback address held by
    ``root`` (default: this process) or its descendants."""
    listening = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            rows = f.read().splitlines()[1:]
        for row in rows:
            fields = row.split()
            hex_addr, hex_port = fields[1].split(":")
            if fields[3] == "0A" and not _ip(hex_addr).is_loopback:   # 0A: LISTEN
                listening[fields[9]] = f"{_ip(hex_addr)}:{int(hex_port, 16)}"
    found = []
    for pid in _descendants(os.getpid() if root is None else root):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                inode = os.readlink(f"/proc/{pid}/fd/{fd}").removeprefix("socket:[").rstrip("]")
            except OSError:
                continue
            if inode in listening:
                found.append(f"{listening[inode]} (pid {pid})")
    return found


def test_the_check_sees_a_listener_on_every_interface():
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        assert f"0.0.0.0:{port} (pid {os.getpid()})" in listening_beyond_loopback()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert listening_beyond_loopback() == []


def test_trainer_group_listens_on_nothing_beyond_loopback(ray_torch_preloaded, tmp_path):
    def train_func():
        import torch.distributed as dist
        t = torch.ones(1)
        dist.all_reduce(t)
        assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"   # gloo's own sockets on loopback too
        return t.item(), os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])

    trainer = Trainer(num_workers=2, logdir=tmp_path)
    try:
        out = trainer.run(train_func)
        assert [o[0] for o in out] == [2.0, 2.0]
        assert all(addr == "127.0.0.1" and port > 0 for _, addr, port in out)   # still set, for user code
        assert listening_beyond_loopback() == []
        assert trainer.run(lambda: train.get_context().get_world_rank()) == [0, 1]   # warm group
        directory = trainer._group.rendezvous.directory
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    finally:
        trainer.shutdown()
    assert not os.path.exists(directory)


class _Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def test_ray_strategy_group_listens_on_nothing_beyond_loopback(ray_torch_preloaded, tmp_path):
    from raylite.plugins import RayStrategy, launcher, release_workers

    x = torch.randn(32, 4)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)
    for _ in range(2):   # the second fit reuses the warm group and its process group
        trainer = pl.Trainer(strategy=RayStrategy(num_workers=2), max_steps=2, default_root_dir=str(tmp_path),
                             logger=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(_Net(), loader)
        assert trainer.state.finished
        assert listening_beyond_loopback() == []   # the group is kept warm, its process group up
    [group] = launcher._pool.idle
    directory = group.rendezvous.directory
    assert group.init_method == f"file://{directory}/store"
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    release_workers()
    assert not os.path.exists(directory)


_KILLED_DRIVER = """
import sys, time
import raylite as ray
from raylite import train
from raylite.train.torch import TorchTrainer

def loop():
    import torch.distributed as dist
    dist.barrier()   # the group is up: its rendezvous directory is in use
    if train.get_context().get_world_rank() == 0:
        print("TRAINING", flush=True)
    while True:
        time.sleep(0.05)

ray.init(num_cpus=2)
TorchTrainer(loop, scaling_config=train.ScalingConfig(num_workers=2),
             run_config=train.RunConfig(storage_path=sys.argv[1], name="killed")).fit()
"""


def test_a_driver_sigkilled_mid_fit_leaves_no_rendezvous_directory(tmp_path, wait_until):
    import glob
    import shutil
    import signal
    import subprocess
    import tempfile
    import threading

    sessions_root = tempfile.mkdtemp(prefix="rl-sessions-")   # short: the control socket's path has a limit
    env = {**os.environ, "TMPDIR": str(tmp_path), "RAYLITE_SESSIONS_DIR": sessions_root}

    def rendezvous_dirs():
        return (glob.glob(os.path.join(sessions_root, "*", "rdzv-*"))
                + glob.glob(os.path.join(str(tmp_path), "raylite-rdzv-*")))

    driver = subprocess.Popen([sys.executable, "-c", _KILLED_DRIVER, str(tmp_path / "results")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(driver.stdout), daemon=True)
    reader.start()
    try:
        wait_until(lambda: any("TRAINING" in ln for ln in lines) or driver.poll() is not None,
                   timeout=90, what="the workers to start training")
        assert driver.poll() is None, "".join(lines)
        found = rendezvous_dirs()
        assert len(found) == 1 and found[0].startswith(sessions_root), found   # in the session's directory
        driver.send_signal(signal.SIGKILL)
        driver.wait(10)
        # the session's directory goes with it (removed bottom-up: the rendezvous directory first)
        wait_until(lambda: not rendezvous_dirs() and os.listdir(sessions_root) == [], timeout=30,
                   what="the rendezvous and session directories to be removed")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        shutil.rmtree(sessions_root, ignore_errors=True)
