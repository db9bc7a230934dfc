"""The TP block one rank computes, its deliberately regressed variant, and the single-device
baseline that answers the flowchart's first question for Lab 3.

The block is Megatron-style: a column-parallel linear (each rank holds ``ffn/tp`` columns of
W1), GELU, a row-parallel linear (``ffn/tp`` rows of W2); the TP group all-reduces the partial
outputs. ``kernel="regressed"`` computes the same block one row at a time (a GEMV per token,
as a decode path that lost its batching): every weight shard is re-read once per row, so the
block moves ``batch`` times the weight bytes a GEMM needs. That is the seed's counter-example:
every rank slows by the same amount, no rank tail.

:func:`single_device_baseline` times one rank's block compute alone in one process against this
machine's floor (required bytes / measured copy rate, FLOPs / measured GEMM rate, whichever is
larger) and returns ``slowdown_vs_floor`` (the flowchart's B) plus the memory-path and
GEMM-rate figures the walk needs after a "yes". On a CPU one rank's device is one core: the
block and the ceilings both run with one thread, measured in short rounds of one call each so
load from other tenants lands on all three alike.
"""
from __future__ import annotations

import time
from typing import Any

import torch

from hwlab.core.measure import TOL_BY_DTYPE, bench, quantile
from hwlab.core import probes

KERNELS = ("healthy", "regressed")


def make_weights(hidden: int, ffn: int, seed: int = 0, dtype=torch.float32, device=None):
    """The block's two weights from ``seed``. On the CPU (default) every rank draws the same
    values; ``device`` draws them there instead (seeded too, other values: for one process that
    needs them on its GPU and would wait seconds for the host to draw a few GiB)."""
    g = torch.Generator(device=device or "cpu").manual_seed(seed)
    w1 = torch.randn(hidden, ffn, generator=g, dtype=torch.float32, device=device) / hidden ** 0.5
    w2 = torch.randn(ffn, hidden, generator=g, dtype=torch.float32, device=device) / ffn ** 0.5
    return w1.to(dtype), w2.to(dtype)


def shard(w1, w2, tp_rank: int, tp: int):
    """Column shard of W1 and the matching row shard of W2 for TP rank ``tp_rank`` of ``tp``."""
    ffn = w1.shape[1]
    if ffn % tp:
        raise ValueError(f"ffn={ffn} must divide by tp={tp}")
    k = ffn // tp
    return w1[:, tp_rank * k:(tp_rank + 1) * k].contiguous(), w2[tp_rank * k:(tp_rank + 1) * k].contiguous()


def block_reference(x, w1, w2):
    """The unsharded block in float64."""
    return torch.nn.functional.gelu(x.double() @ w1.double()) @ w2.double()


def block_partial(x, w1s, w2s):
    """This rank's partial output; the sum over the TP group is the block's output."""
    return torch.nn.functional.gelu(x @ w1s) @ w2s


def block_partial_regressed(x, w1s, w2s):
    """The same partial, one row at a time: each row re-reads both weight shards."""
    h = torch.cat([x[i:i + 1] @ w1s for i in range(x.shape[0])])
    h = torch.nn.functional.gelu(h)
    return torch.cat([h[i:i + 1] @ w2s for i in range(h.shape[0])])


def partial_fn(kernel: str):
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, not {kernel!r}")
    return block_partial if kernel == "healthy" else block_partial_regressed


def block_work(batch: int, hidden: int, k: int, kernel: str = "healthy", item: int = 4) -> dict[str, int]:
    """FLOPs, the bytes the block needs (each operand once) and the bytes ``kernel`` moves.

    required: x, W1 shard, the hidden activation written and read, W2 shard, the output.
    regressed: the weight shards once per row instead of once."""
    flops = 2 * 2 * batch * hidden * k
    act = (batch * hidden + 2 * batch * k + batch * hidden) * item
    weights = 2 * hidden * k * item
    moved = act + weights * (batch if kernel == "regressed" else 1)
    return {"n_flops": flops, "required_bytes": act + weights, "moved_bytes": moved}


#: the one-thread ceilings' operations (the same as :func:`cpu_ceilings_one_core`'s probes)
COPY_MIB, GEMM_SIZE = 64, 512


def cpu_ceilings_one_core(n_rep: int = 10) -> dict[str, float]:
    """This CPU's copy (GB/s) and fp32 GEMM (TFLOP/s) rate on one thread: one rank's device."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        c = probes.hbm_copy(size_mib=COPY_MIB, device="cpu", impl="torch", n_rep=n_rep)
        g = probes.gemm(size=GEMM_SIZE, dtype="fp32", device="cpu", n_rep=n_rep)
    finally:
        torch.set_num_threads(prev)
    return {"copy_gbps": c.gbps, "gemm_fp32_tflops": g.tflops}


def _timed_ms(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - t0) * 1e3


def single_device_baseline(kernel: str = "healthy", *, hidden: int = 1024, ffn: int = 2048,
                           batch: int = 256, tp: int = 2, n_rounds: int = 24,
                           n_rep: int = 8) -> dict[str, Any]:
    """One rank's block compute alone in one process (one thread on a CPU) against this
    machine's floor.

    The block is first checked against its float64 reference and warmed up (the kit's
    :func:`~hwlab.core.measure.bench`, ``n_rep`` timed calls). Then, after one untimed round,
    ``n_rounds`` rounds each time one copy, one GEMM (the operations of
    :func:`cpu_ceilings_one_core`) and one block call back to back: a round's slowdown is its
    block time over the floor that round's own copy and GEMM rates give. Why rounds this short:
    on a shared CPU another tenant's load comes and goes (two busy processes on two cores leave
    this thread a whole core or half of one, switching every so often); rounds of a whole
    benchmark each let the ceilings and the block land in different halves, where one round's
    three calls see the same share (the CPU-hog test in tests/test_lab03.py holds this). The round with the
    median slowdown is reported (its block time and its ceilings); every round's slowdown is
    kept, and ``t_p10_ms``/``t_p90_ms`` are the spread of the block's time over the rounds.

    Returns ``t_ms``, ``floor_ms``, ``slowdown_vs_floor`` (flowchart B: >= 1.5x is slow),
    ``dram_pct_estimated`` (the bytes ``kernel`` moves by :func:`block_work` over its time,
    against the measured copy rate) and ``tensor_pct_of_peak`` (achieved FLOP/s over the
    measured GEMM rate)."""
    if n_rounds < 1:
        raise ValueError(f"n_rounds must be at least 1, not {n_rounds}")
    k = ffn // tp
    w1, w2 = make_weights(hidden, ffn)
    w1s, w2s = shard(w1, w2, 0, tp)
    fn = partial_fn(kernel)
    work = block_work(batch, hidden, k, kernel)
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        m = bench(f"TP block compute ({kernel}, one rank alone)", lambda x: fn(x, w1s, w2s),
                  lambda: (torch.randn(batch, hidden),), n_bytes=work["required_bytes"],
                  n_flops=work["n_flops"], reference=lambda x: block_reference(x, w1s, w2s),
                  tol=TOL_BY_DTYPE["float32"] * 10, device="cpu", n_rep=n_rep,
                  params={"kernel": kernel, "hidden": hidden, "k": k, "batch": batch})
        n_copy = COPY_MIB * 2**20 // 4
        src, dst = torch.randn(n_copy), torch.empty(n_copy)
        a, b = torch.randn(GEMM_SIZE, GEMM_SIZE), torch.randn(GEMM_SIZE, GEMM_SIZE)
        x = torch.randn(batch, hidden)
        rounds = []
        for i in range(n_rounds + 1):  # the first round warms the copy and the GEMM; not kept
            t_copy = _timed_ms(dst.copy_, src)
            t_gemm = _timed_ms(torch.mm, a, b)
            t_block = _timed_ms(fn, x, w1s, w2s)
            ceil = {"copy_gbps": 2 * n_copy * 4 / (t_copy * 1e-3) / 1e9,
                    "gemm_fp32_tflops": 2 * GEMM_SIZE ** 3 / (t_gemm * 1e-3) / 1e12}
            if i:
                rounds.append((t_block / _floor_ms(work, ceil), t_block, ceil))
    finally:
        torch.set_num_threads(prev)
    slowdowns = [r[0] for r in rounds]
    _, t_ms, ceil = sorted(rounds, key=lambda r: r[0])[n_rounds // 2]  # the median round
    floor_ms = _floor_ms(work, ceil)
    times = [r[1] for r in rounds]
    return {"kernel": kernel, "t_ms": t_ms, "t_p10_ms": quantile(times, 0.1), "t_p90_ms": quantile(times, 0.9),
            "rel_err": m.rel_err, "floor_ms": floor_ms, "slowdown_vs_floor": t_ms / floor_ms,
            "slowdown_by_round": slowdowns,
            "dram_pct_estimated": 100.0 * work["moved_bytes"] / (t_ms * 1e-3) / 1e9 / ceil["copy_gbps"],
            "tensor_pct_of_peak": 100.0 * work["n_flops"] / (t_ms * 1e-3) / 1e12 / ceil["gemm_fp32_tflops"],
            "ceilings": {**ceil, "threads": 1,
                         "source": "measured on this CPU, one thread, in the same round as the block "
                                   "(the median round)"},
            **work}


def _floor_ms(work: dict[str, int], ceil: dict[str, float]) -> float:
    return max(work["required_bytes"] / (ceil["copy_gbps"] * 1e9),
               work["n_flops"] / (ceil["gemm_fp32_tflops"] * 1e12)) * 1e3
