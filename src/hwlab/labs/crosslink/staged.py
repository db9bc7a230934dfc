"""Lab 3's collectives and its one-GPU step: gloo/NCCL all-reduce and all-to-all timed on
ranks this lab launches (:func:`collectives`, bus bandwidth by the core's nccl-tests definitions
in :mod:`hwlab.core.comms`), and the one-GPU TP step whose all-reduce is staged through pinned host
memory (what NCCL falls back to without peer-to-peer).

Route parsing, the P2P matrix and ``busbw_table`` are core (:mod:`hwlab.core.comms`); the node
baseline uses :func:`collectives`.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from hwlab.core.comms import busbw_table, needs_gpus
from hwlab.core.measure import TOL_BY_DTYPE, bench, device_of
from hwlab.labs.crosslink.block import block_partial, block_reference, make_weights, shard
from hwlab.labs.crosslink.stragglers import run_processes


def run_collectives(rank: int, world: int, init_method: str, sizes: list[int], *,
                    backend: str = "gloo", device: str = "cpu", n_rep: int = 10) -> dict[str, Any]:
    """Median time of all-reduce and all-to-all at each message size (bytes) on this rank."""
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world)
    try:
        dev = torch.device(device)
        out: dict[str, Any] = {"rank": rank, "all_reduce": {}, "all_to_all": {}}
        for size in sizes:
            n = max(world, size // 4 // world * world)
            x = torch.randn(n, device=dev)
            y = torch.empty_like(x)
            for op, fn in (("all_reduce", lambda: dist.all_reduce(x)),
                           ("all_to_all", lambda: dist.all_to_all_single(y, x))):
                ts = []
                for i in range(n_rep + 2):
                    dist.barrier()
                    if dev.type == "cuda":
                        torch.cuda.synchronize(dev)
                    t0 = time.perf_counter()
                    try:
                        fn()
                    except (RuntimeError, NotImplementedError) as e:
                        out[op][size] = {"unsupported": str(e)[:200]}
                        break
                    if dev.type == "cuda":
                        torch.cuda.synchronize(dev)
                    if i >= 2:
                        ts.append((time.perf_counter() - t0) * 1e3)
                if ts:
                    out[op][size] = statistics.median(ts)
        return out
    finally:
        dist.destroy_process_group()


def collectives(world: int, sizes=(1 << 16, 1 << 20, 1 << 24), *, nccl: bool = False,
                timeout_s: float = 300.0) -> dict[str, Any]:
    """Launch ``world`` ranks measuring all-reduce / all-to-all busbw (gloo on CPU, NCCL on GPUs)."""
    if nccl and needs_gpus(max(2, world)):
        return {"skipped": f"NCCL collectives {needs_gpus(max(2, world))}"}
    args = ["--collectives", ",".join(map(str, sizes))]
    res = sorted((r for r, _log in run_processes(world, args, nccl=nccl, timeout_s=timeout_s)),
                 key=lambda d: d["rank"])
    return {"world": world, "backend": "nccl" if nccl else "gloo", "rows": busbw_table(res, world)}




# ---------------------------------------------------------------- one GPU: device vs host-staged all-reduce
def single_gpu_tp_step(tp: int = 2, hidden: int = 8192, ffn: int = 32768, batch: int = 512,
                       staged: bool = False, device=None, n_rep: int = 30):
    """The TP block on one GPU with ``tp`` shards computed in turn; their all-reduce either sums
    the partials in device memory, or stages each through pinned host memory over PCIe (what
    NCCL falls back to without peer-to-peer: GPU -> host -> GPU), then sums. Returns a
    Measurement of the whole step; ``params['allreduce_bytes']`` is what crossed the host link."""
    dev = device_of(device)
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    w1, w2 = make_weights(hidden, ffn, seed=0, dtype=dt, device=dev)
    shards = [shard(w1, w2, r, tp) for r in range(tp)]
    pin = dev.type == "cuda"
    host_bufs = [torch.empty(batch, hidden, dtype=dt, pin_memory=pin) for _ in range(tp)]
    back = [torch.empty(batch, hidden, dtype=dt, device=dev) for _ in range(tp)]

    def step(x):
        parts = [block_partial(x, a, b) for a, b in shards]
        if staged:
            for p, h, d in zip(parts, host_bufs, back):
                h.copy_(p, non_blocking=pin)   # device -> pinned host (PCIe)
                d.copy_(h, non_blocking=pin)   # pinned host -> device (PCIe)
            parts = back
        out = parts[0].float()
        for p in parts[1:]:
            out += p.float()
        return out

    def ref(x):  # float64, on the step's own device
        return block_reference(x, w1, w2)

    n_ar = batch * hidden * torch.tensor([], dtype=dt).element_size() * tp
    flops = 2 * 2 * batch * hidden * ffn
    m = bench(f"TP step ({'PCIe-staged' if staged else 'device-memory'} all-reduce, tp={tp})", step,
              lambda: (torch.randn(batch, hidden, device=dev, dtype=dt),), n_bytes=2 * n_ar if staged else n_ar,
              n_flops=flops, reference=ref, tol=TOL_BY_DTYPE["bfloat16"] if dt == torch.bfloat16 else 1e-4,
              device=dev, n_rep=n_rep,
              params={"tp": tp, "hidden": hidden, "ffn": ffn, "batch": batch, "staged": staged,
                      "allreduce_bytes": n_ar})
    return m
