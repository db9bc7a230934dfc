"""NCCL facts the launcher needs: the environment kept safe on shared hosts, the transport
NCCL reports choosing, and whether this machine has the GPUs a run asks for."""
from __future__ import annotations

import re

import torch


ROUTE_PATTERNS = [("P2P/IPC", "NVLink or PCIe peer-to-peer (IPC)"), ("P2P/CUMEM", "peer-to-peer (cuMem)"),
                  ("P2P/direct", "peer-to-peer (direct pointer)"), ("SHM", "staged through host shared memory"),
                  ("NET/IB", "InfiniBand"), ("NET/Socket", "TCP sockets")]


def nccl_routes(log: str) -> dict[str, int]:
    """Count NCCL's chosen transports from an ``NCCL_DEBUG=INFO`` log ('Channel 00/0 : 0[0] ->
    1[1] via P2P/IPC' lines)."""
    counts: dict[str, int] = {}
    for m in re.finditer(r"Channel \d+/\d+ : \d+\[\w+\] -> \d+\[\w+\] via (\S+)", log):
        via = m.group(1)
        key = next((k for k, _ in ROUTE_PATTERNS if via.startswith(k)), via)
        counts[key] = counts.get(key, 0) + 1
    return counts


#: environment that forces NCCL off the peer-to-peer route (through host memory instead)
FORCE_SLOW_ROUTE = {"NCCL_P2P_DISABLE": "1"}
#: keep NVLink multicast off on shared multi-GPU hosts (the device tool's rule)
NCCL_SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def needs_gpus(n: int) -> str | None:
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return None if have >= n else f"needs >= {n} GPUs (this machine has {have})"
