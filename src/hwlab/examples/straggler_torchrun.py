"""A torchrun job with one slow rank, instrumented the way your own job should be.

    torchrun --standalone --nproc-per-node 4 examples/straggler_torchrun.py --run-dir runs/demo --slow-rank 2
    hwlab ranks runs/demo

On a CPU machine the ranks speak gloo; on GPUs (one per rank) the same script uses NCCL. Each
step: a chain of ``--layers`` matmuls (the rank's own work), an all-reduce inside its TP group,
and a small all-reduce over every rank (the data-parallel sync each step ends with). The slow
rank sleeps ``--slow-ms`` inside its own work each step: it stands in for a rank whose card,
host or NUMA placement is slow; every other rank then waits for it in a collective.

What the job records, and where (see ``hwlab.capture`` and ``hwlab.steplog``):
* at startup, ``capture()``: topology (``--topo-file`` injects a saved ``nvidia-smi topo -m``,
  labelled "injected"; a CPU machine has none), rank -> GPU mapping, NUMA node, CPU affinity,
  versions, NCCL's route log (NCCL runs only), a probe baseline on each rank's device, and a
  warning when a TP group crosses a slower link than the node offers;
* every step, ``StepLog``: host-clock step start/end and the time in each collective, with
  CUDA events read lazily on GPUs (no synchronisation added).
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

from hwlab.core.capture import capture
from hwlab.core.steplog import StepLog


def parse_groups(text: str, world: int) -> list[list[int]]:
    groups = [[int(r) for r in g.split(",") if r.strip()] for g in text.split(";") if g.strip()]
    if sorted(r for g in groups for r in g) != list(range(world)):
        raise SystemExit(f"--tp-groups {text!r} must name ranks 0..{world - 1} once each")
    return groups


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", required=True, help="a new folder for this run's capture and step logs")
    p.add_argument("--slow-rank", type=int, default=-1, help="the rank to slow down (-1: none)")
    p.add_argument("--slow-ms", type=float, default=40.0, help="extra ms per step on the slow rank")
    p.add_argument("--spike-every", type=int, default=0, help="every N steps the slow rank spikes (0: never)")
    p.add_argument("--spike-ms", type=float, default=80.0)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--size", type=int, default=256, help="batch = hidden size of the matmul chain")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tp-groups", default="", help="e.g. '0,1;2,3' (default: consecutive pairs)")
    p.add_argument("--infer-groups", action="store_true",
                   help="let the capture infer the TP groups from the process groups instead of passing them")
    p.add_argument("--topo-file", help="a saved `nvidia-smi topo -m` to use instead of this node's")
    p.add_argument("--no-capture", action="store_true", help="skip the startup capture (to see what is lost)")
    a = p.parse_args(argv)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    gpu = torch.cuda.is_available() and torch.cuda.device_count() > local_rank
    if gpu:
        torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank) if gpu else torch.device("cpu")
    dist.init_process_group("nccl" if gpu else "gloo")
    pairs = ";".join(",".join(str(r) for r in range(i, min(i + 2, world))) for i in range(0, world, 2))
    groups = parse_groups(a.tp_groups or pairs, world)  # default: consecutive pairs (one rank alone if odd)
    pgs = [dist.new_group(g) for g in groups]  # every rank creates every group, in the same order
    tp_pg = pgs[next(i for i, g in enumerate(groups) if rank in g)]
    if not a.no_capture:
        capture(a.run_dir, tp_groups=None if a.infer_groups else groups, topo_file=a.topo_file, probe=True, nccl_log=gpu,
                device=local_rank if gpu else None)

    n, L = a.size, a.layers
    dtype = torch.bfloat16 if gpu else torch.float32  # the dtype the capture's GEMM probe measures
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(n, n, generator=gen).to(dev, dtype)
    ws = [(torch.randn(n, n, generator=gen) / n ** 0.5).to(dev, dtype) for _ in range(L)]
    sync = torch.ones(1024, device=dev)
    # the step's work, declared so the report can hold it against the probe baseline (B)
    log = StepLog(a.run_dir, rank=rank, n_flops=L * 2 * n ** 3, n_bytes=L * 3 * n * n * x.element_size(),
                  cuda_events=gpu)
    for i in range(a.steps):
        with log.step(i):
            y = x
            for w in ws:
                y = y @ w
            if rank == a.slow_rank:
                time.sleep(a.slow_ms / 1e3)
                if a.spike_every and i % a.spike_every == a.spike_every - 1:
                    time.sleep(a.spike_ms / 1e3)
            with log.collective("tp_allreduce"):
                dist.all_reduce(y, group=tp_pg)
            with log.collective("dp_sync"):
                dist.all_reduce(sync)
    log.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
