"""Where a group's workers landed: ranks grouped by node, and the rendezvous on rank 0's node.

Used by ``raylite.train`` and ``raylite.plugins`` alike. On the local runtime every worker is on
one node and the rendezvous is on loopback; on a Ray cluster workers on one node get consecutive
ranks (nodes in the order their first worker was placed, as Ray Train numbers them), and rank 0's
node IP with a port free there hosts torch.distributed's TCP store.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import raylite as ray
from raylite.core.api.runtime import get_node_ip_address


@dataclass(frozen=True)
class Layout:
    """Where one rank sits: its node's rank, its rank on that node, and how many share the node."""
    node_rank: int = 0
    local_rank: int = 0
    local_world_size: int = 1

    def env(self) -> dict[str, str]:
        return {"LOCAL_RANK": str(self.local_rank), "NODE_RANK": str(self.node_rank),
                "LOCAL_WORLD_SIZE": str(self.local_world_size)}


def node_address() -> tuple[str, str, int]:
    """Run in a worker: its node id, the address other nodes reach it at, and a port free there."""
    ip = get_node_ip_address()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return ray.get_runtime_context().get_node_id(), ip, s.getsockname()[1]


def layouts(node_ids: list[str]) -> tuple[list[int], list[Layout]]:
    """Rank order (indices into node_ids) grouping each node's workers, and each rank's layout."""
    nodes = list(dict.fromkeys(node_ids))
    order = sorted(range(len(node_ids)), key=lambda i: nodes.index(node_ids[i]))
    seen: dict[str, int] = {}
    out = []
    for i in order:
        node = node_ids[i]
        out.append(Layout(nodes.index(node), seen.get(node, 0), node_ids.count(node)))
        seen[node] = seen.get(node, 0) + 1
    return order, out


def assigned_cuda_index() -> int:
    """Run in a GPU worker: the index, among the devices CUDA sees, of the first GPU the runtime
    assigned it. Both backends normally make the assigned GPUs the only visible ones (so 0), but
    Ray can be told to leave CUDA_VISIBLE_DEVICES alone; then the assigned id is looked up in it."""
    ids = [str(i) for i in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if not ids:
        return 0
    if not visible:          # everything visible: CUDA's index is the physical id
        return int(ids[0]) if ids[0].isdigit() else 0
    return visible.index(ids[0]) if ids[0] in visible else 0
