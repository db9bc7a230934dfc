"""Communication probes and facts any floor may use: NCCL's chosen transports from its log,
the environment that keeps NCCL safe on shared hosts (or forces it off peer-to-peer), bus
bandwidth by nccl-tests' definitions, and the GPU peer-to-peer copy matrix.

* **Routes.** NCCL prints each channel's transport with ``NCCL_DEBUG=INFO`` ("Channel 00/0 :
  0[0] -> 1[1] via P2P/IPC"); :func:`nccl_routes` counts them by :data:`ROUTE_PATTERNS`. SHM
  (staged through host memory) where P2P was expected is the signature of a missing NVLink/PCIe
  peer route.
* **Bus bandwidth** (nccl-tests ``doc/PERFORMANCE.md``): algbw = bytes / time of the slowest
  rank; all-reduce busbw = algbw * 2(n-1)/n, all-to-all busbw = algbw * (n-1)/n, so one figure
  compares with the link rate whatever the rank count.
* **P2P matrix.** Every ordered GPU pair copies ``size_mib`` MiB, timed with device events
  (:func:`hwlab.core.measure.time_fn`) and checked equal after the copy.

Lab 3 (:mod:`hwlab.labs.crosslink`) launches the ranks that measure collectives; the node
baseline and ``hwlab ranks`` use this module directly.
"""
from __future__ import annotations

import re
from typing import Any

# torch is imported by the probes that run collectives; the log and table readers need none
from hwlab.core.measure import time_fn

#: NCCL transport prefixes, and what each means for the data's path
ROUTE_PATTERNS = [("P2P/IPC", "NVLink or PCIe peer-to-peer (IPC)"), ("P2P/CUMEM", "peer-to-peer (cuMem)"),
                  ("P2P/direct", "peer-to-peer (direct pointer)"), ("SHM", "staged through host shared memory"),
                  ("NET/IB", "InfiniBand"), ("NET/Socket", "TCP sockets")]
#: environment that forces NCCL off the peer-to-peer route (through host memory instead)
FORCE_SLOW_ROUTE = {"NCCL_P2P_DISABLE": "1"}
#: keep NVLink multicast off on shared multi-GPU hosts (the device tool's rule)
NCCL_SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
#: nccl-tests' bus-bandwidth factor per collective (doc/PERFORMANCE.md there), as a function of the
#: rank count n; keys without underscores (``allreduce``), as :func:`busbw_factor` normalises them
BUSBW_FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
                "reducescatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n,
                "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "sendrecv": lambda n: 1.0}


def busbw_factor(op: str, n: int) -> float | None:
    """nccl-tests' busbw / algbw factor of collective ``op`` (``all_reduce`` or ``allreduce``) over
    ``n`` ranks; None for a collective nccl-tests defines no factor for (its busbw is not stated)."""
    f = BUSBW_FACTOR.get(op.replace("_", "").lower())
    return f(n) if f is not None else None


def nccl_routes(log: str) -> dict[str, int]:
    """Count NCCL's chosen transports from an ``NCCL_DEBUG=INFO`` log ('Channel 00/0 : 0[0] ->
    1[1] via P2P/IPC' lines), keyed by the :data:`ROUTE_PATTERNS` prefix (else the raw word)."""
    counts: dict[str, int] = {}
    for m in re.finditer(r"Channel \d+/\d+ : \d+\[\w+\] -> \d+\[\w+\] via (\S+)", log):
        via = m.group(1)
        key = next((k for k, _ in ROUTE_PATTERNS if via.startswith(k)), via)
        counts[key] = counts.get(key, 0) + 1
    return counts


def needs_gpus(n: int) -> str | None:
    """None when this machine has ``n`` GPUs, else the sentence saying why a probe cannot run."""
    import torch
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return None if have >= n else f"needs >= {n} GPUs (this machine has {have})"


def busbw_table(rank_results: list[dict[str, Any]], world: int) -> list[dict[str, Any]]:
    """nccl-tests' bus bandwidth (GB/s) from the slowest rank's median time (ms) at each size:
    ``rank_results[i][op][size]`` is a time in ms, or a dict saying the op is unsupported."""
    rows = []
    ops = ("all_reduce", "all_to_all")
    sizes = sorted({int(s) for r in rank_results for op in ops for s in r[op]})
    for op in ops:
        factor = busbw_factor(op, world)
        for size in sizes:
            vals = [r[op].get(str(size), r[op].get(size)) for r in rank_results]
            if any(v is None or isinstance(v, dict) for v in vals):
                rows.append({"op": op, "bytes": size, "unsupported": True})
                continue
            t_ms = max(vals)
            algbw = size / (t_ms * 1e-3) / 1e9
            rows.append({"op": op, "bytes": size, "t_ms": t_ms, "algbw_gbps": algbw,
                         "busbw_gbps": algbw * factor})
    return rows


def p2p_matrix_gbps(size_mib: int = 256) -> dict[str, Any]:
    """GPU-to-GPU copy bandwidth for every ordered pair (GB/s), or why it cannot run."""
    import torch
    why = needs_gpus(2)
    if why:
        return {"skipped": why}
    n = torch.cuda.device_count()
    out: dict[str, Any] = {"size_mib": size_mib, "gbps": {}}
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            src = torch.randn(size_mib * 2**18, device=f"cuda:{a}")
            dst = torch.empty_like(src, device=f"cuda:{b}")
            t = time_fn(lambda: dst.copy_(src), [()], torch.device(f"cuda:{a}"), n_rep=10)
            out["gbps"][f"{a}->{b}"] = src.numel() * 4 / (t.median_ms * 1e-3) / 1e9
            assert torch.equal(dst.cpu(), src.cpu())
    return out
