"""The read floor of Lab 4's decode kernels: how fast this machine reads the very bytes a kernel
reads, by a kernel that only reads them, timed beside the kernel in the same run.

A target such as "the FP8 attention at SDPA's GB/s" or "each FP8 GEMM at the bf16 GEMM's bytes/s"
can sit at or near what a kernel that only reads those bytes achieves; a fix cannot then be
expected to meet it, and the lab must show that with a measurement, not assert it. :func:`stream_kv` reads a KV cache pair in
the decode attention's grid (one program per split of a (batch, head) row), :func:`stream_matrix`
a GEMM's (N, K) weight in tiles of rows; each XORs what it reads into one number per program, so
the loads cannot be dropped, and is checked byte for byte against torch's XOR before it is timed.
:func:`fastest_read` times a few read shapes (:data:`KV_READS`, :data:`MATRIX_READS`) and keeps the
fastest. The shapes are the fastest of the load-only sweeps in ``benchmarks/LAB04_NOTES.md``
(rounds 10-12). A shape those sweeps did not try could read faster, so the floor is what the
kit's reads reach on this machine, not a bound on every kernel: a target within a few percent of
it asks a kernel that also computes to match a kernel that only reads, which the lab reports as
such, and does not call impossible.

Why a kernel of our own and not torch: torch has no read-only operation, and its reduction over the
same bytes (``sum``) ran slower than these reads in the same sweeps, on the weights and on the
caches, so a floor from torch would flatter every kernel measured against it.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from hwlab.core.measure import time_fn
from hwlab.core.measure_graph import graph_time
from hwlab.labs.fp8.quant import use_triton_for

import triton
import triton.language as tl

#: the KV reads the lab times as the attention's floor: name -> (warps, positions per step, chunk,
#: loop stages); among the fastest of the sweeps at 512 (the first), 4k and 32k (the last two)
KV_READS = {
    "1 warp, 16 per step, chunk 256, 3 stages": (1, 16, 256, 3),
    "4 warps, 64 per step, chunk 1024, 3 stages": (4, 64, 1024, 3),
    "4 warps, 128 per step, chunk 2048, 3 stages": (4, 128, 2048, 3),
}
#: the weight reads the lab times as a GEMM's floor: name -> (rows per program, bytes of a row per
#: step, warps, loop stages, K split); among them the sweep's fastest for each of qkv, out, up and down
MATRIX_READS = {
    "16 rows x 256 B, 1 warp, K split 8": (16, 256, 1, 0, 8),
    "16 rows x 256 B, 1 warp, K split 4": (16, 256, 1, 0, 4),
    "16 rows x 256 B, 1 warp, 3 stages, K split 8": (16, 256, 1, 3, 8),
    "16 rows x 256 B, 1 warp, 3 stages, K split 4": (16, 256, 1, 3, 4),
    "64 rows x 256 B, 4 warps, K split 8": (64, 256, 4, 0, 8),
    "64 rows x 256 B, 4 warps, K split 4": (64, 256, 4, 0, 4),
}


@triton.jit
def _stream_kv_kernel(k_ptr, v_ptr, out_ptr, max_ctx, n_splits, D: tl.constexpr, CHUNK: tl.constexpr,
                      BLOCK_T: tl.constexpr, LOOP_STAGES: tl.constexpr = 0):
    """Load-only: the decode attention's grid and steps over a (B, H, T, D) byte cache pair, read
    as int32 words (``D`` words a row: the caller's D / 4), each program XOR-ing its chunk into one
    number (so the loads stay), for the read rate of an access pattern without the attention's
    arithmetic. ``CHUNK`` divides T, ``BLOCK_T`` divides ``CHUNK``; ``LOOP_STAGES``: 0, or the depth of
    Triton's software pipeline over the loop (the loads copied ahead through shared memory)."""
    sp = tl.program_id(0)
    bh = tl.program_id(1)
    d = tl.arange(0, D)
    rows = tl.arange(0, BLOCK_T)[:, None] * D + d[None, :]
    base = bh.to(tl.int64) * max_ctx * D
    x = tl.zeros((BLOCK_T, D), dtype=tl.int32)
    for t0 in tl.range(sp * CHUNK, sp * CHUNK + CHUNK, BLOCK_T, num_stages=LOOP_STAGES if LOOP_STAGES > 0 else None):
        k = tl.load(k_ptr + base + t0 * D + rows, eviction_policy="evict_first")
        v = tl.load(v_ptr + base + t0 * D + rows, eviction_policy="evict_first")
        x = x ^ k ^ v
    tl.store(out_ptr + bh * n_splits + sp, tl.xor_sum(tl.reshape(x, (BLOCK_T * D,)), 0))


def stream_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, chunk: int, block_t: int, num_warps: int = 1,
              loop_stages: int = 0, use_triton: bool | None = None) -> torch.Tensor:
    """:func:`_stream_kv_kernel` over whole (B, H, T, D) caches of one-byte elements (an FP8 cache;
    D a multiple of 4): per (batch x head, split) the XOR of its chunk's K and V bytes, (B * H,
    T // chunk) int32; on the CPU (or ``use_triton`` False) the same from torch."""
    B, H, T, D = k_cache.shape
    if (v_cache.shape != k_cache.shape or k_cache.element_size() != 1 or D % 4 or T % chunk or chunk % block_t
            or not (k_cache.is_contiguous() and v_cache.is_contiguous())):
        raise ValueError(f"stream_kv reads two contiguous (B, H, T, D) one-byte caches, chunk dividing T and block_t "
                         f"dividing chunk; got {tuple(k_cache.shape)}, {tuple(v_cache.shape)}, {k_cache.dtype}, "
                         f"chunk {chunk}, block_t {block_t}")
    k32, v32 = k_cache.view(torch.int32), v_cache.view(torch.int32)  # D / 4 words a row
    n_splits = T // chunk
    if not use_triton_for(k_cache, use_triton):
        x = (k32 ^ v32).reshape(B * H, n_splits, chunk // block_t, block_t * D // 4)
        out = torch.zeros(B * H, n_splits, block_t * D // 4, dtype=torch.int32, device=k_cache.device)
        for i in range(chunk // block_t):
            out ^= x[:, :, i]
        return functools.reduce(torch.bitwise_xor, out.unbind(-1))
    out = torch.empty((B * H, n_splits), dtype=torch.int32, device=k_cache.device)
    _stream_kv_kernel[(n_splits, B * H)](k32, v32, out, T, n_splits, D=D // 4, CHUNK=chunk, BLOCK_T=block_t,
                                         LOOP_STAGES=loop_stages, num_warps=num_warps,
                                         num_stages=max(loop_stages, 1))
    return out


@triton.jit
def _stream_matrix_kernel(w_ptr, out_ptr, stride_w, n_split, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          K_SLICE: tl.constexpr, LOOP_STAGES: tl.constexpr = 0):
    """Load-only, for a decode GEMM's weight: a (N, K) matrix read as int32 words, one program per
    ``BLOCK_N`` rows and slice of ``K_SLICE`` words, ``BLOCK_K`` words a step, each program XOR-ing
    what it reads into one number (so the loads stay). The read time of a weight in one launch,
    without a GEMM's arithmetic."""
    pn = tl.program_id(0)
    pk = tl.program_id(1)
    offs = (pn * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)[:, None] * stride_w + tl.arange(0, BLOCK_K)[None, :]
    x = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.int32)
    for k0 in tl.range(pk * K_SLICE, pk * K_SLICE + K_SLICE, BLOCK_K,
                       num_stages=LOOP_STAGES if LOOP_STAGES > 0 else None):
        x = x ^ tl.load(w_ptr + offs + k0, eviction_policy="evict_first")
    tl.store(out_ptr + pn * n_split + pk, tl.xor_sum(tl.reshape(x, (BLOCK_N * BLOCK_K,)), 0))


def stream_matrix(w: torch.Tensor, block_n: int, block_k_bytes: int, split: int = 1, num_warps: int = 4,
                  loop_stages: int = 0, use_triton: bool | None = None) -> torch.Tensor:
    """:func:`_stream_matrix_kernel` over a contiguous (N, K) weight of any element size: per
    (block of ``block_n`` rows, K slice of ``split``) the XOR of its bytes as int32 words,
    (N // block_n, split) int32; on the CPU (or ``use_triton`` False) the same from torch.
    ``block_k_bytes``: bytes of each row a step (a multiple of 16, dividing the slice)."""
    if w.dim() != 2 or not w.is_contiguous():
        raise ValueError(f"stream_matrix reads a contiguous (N, K) matrix; got {tuple(w.shape)}")
    N = w.shape[0]
    row_bytes = w.shape[1] * w.element_size()
    if (N % block_n or block_k_bytes % 16 or row_bytes % (split * block_k_bytes)
            or not (isinstance(loop_stages, int) and 0 <= loop_stages <= 8)):
        raise ValueError(f"stream_matrix: block_n {block_n} must divide the {N} rows, block_k_bytes {block_k_bytes} "
                         f"be a multiple of 16 and split {split} x block_k_bytes divide a row's {row_bytes} bytes; "
                         f"loop_stages 0..8 (got {loop_stages!r})")
    w32 = w.view(torch.uint8).view(N, row_bytes).view(torch.int32)  # (N, row_bytes / 4) words
    words = row_bytes // 4
    if not use_triton_for(w32, use_triton):  # words: any element type reads alike
        x = w32.reshape(N // block_n, block_n, split, words // split).transpose(1, 2).reshape(N // block_n, split, -1)
        while x.shape[-1] > 1:  # XOR in halves: log2(words) ops, not one per word
            if x.shape[-1] % 2:
                x = torch.cat([x, torch.zeros_like(x[..., :1])], -1)
            x = x[..., 0::2] ^ x[..., 1::2]
        return x[..., 0]
    out = torch.empty((N // block_n, split), dtype=torch.int32, device=w.device)
    _stream_matrix_kernel[(N // block_n, split)](w32, out, words, split, BLOCK_N=block_n, BLOCK_K=block_k_bytes // 4,
                                                 K_SLICE=words // split, LOOP_STAGES=loop_stages,
                                                 num_warps=num_warps, num_stages=max(loop_stages, 1))
    return out


def kv_read_plans(k_caches: list[torch.Tensor], v_caches: list[torch.Tensor]) -> dict[str, tuple[Callable, torch.Tensor]]:
    """:data:`KV_READS` that fit these (B, H, T, D) caches (chunk dividing T, D bytes a multiple of
    4; a 16-bit cache is read as its bytes): name -> (one call reading every layer's pair, what
    the first layer's read must return)."""
    ks = [k.view(torch.uint8) for k in k_caches]
    vs = [v.view(torch.uint8) for v in v_caches]
    T, D = ks[0].shape[2], ks[0].shape[3]
    plans = {}
    for name, (warps, bt, chunk, stages) in KV_READS.items():
        if T % chunk or D % 4:
            continue
        plans[name] = (functools.partial(_read_all, stream_kv, ks, vs, chunk, bt, num_warps=warps, loop_stages=stages),
                       stream_kv(ks[0], vs[0], chunk, bt, use_triton=False))
    return plans


def matrix_read_plans(weights: list[torch.Tensor]) -> dict[str, tuple[Callable, torch.Tensor]]:
    """:data:`MATRIX_READS` that fit these contiguous (N, K) weights: name -> (one call reading
    every layer's weight, what the first layer's read must return); none for a weight stored
    otherwise."""
    if not all(w.dim() == 2 and w.is_contiguous() for w in weights):
        return {}
    N, row_bytes = weights[0].shape[0], weights[0].shape[1] * weights[0].element_size()
    plans = {}
    for name, (bn, bk, warps, stages, split) in MATRIX_READS.items():
        if N % bn or row_bytes % (split * bk):
            continue
        plans[name] = (functools.partial(_read_all, stream_matrix, weights, None, bn, bk, split, num_warps=warps,
                                         loop_stages=stages),
                       stream_matrix(weights[0], bn, bk, split, use_triton=False))
    return plans


def _read_all(read, firsts, seconds, *args, **kw) -> list[torch.Tensor]:
    return [read(a, *args, **kw) if seconds is None else read(a, seconds[i], *args, **kw)
            for i, a in enumerate(firsts)]


def fastest_read(plans: dict[str, tuple[Callable, torch.Tensor]], bytes_per_layer: int, n_layers: int,
                 device: torch.device, n_rep: int = 20) -> dict[str, Any] | None:
    """Each plan captured and timed as the lab times its kernels (:func:`~hwlab.core.measure_graph.graph_time`:
    one CUDA graph over every layer; eager where there are none), after its first layer's result
    equalled the expected XOR (a read of the wrong bytes raises: it would be a bug, not a floor),
    then timed once more with the plans in the reverse order, keeping each plan's faster median.

    Why twice: a floor is the least time the bytes take, so one block that a clock dip slowed
    must not stand for it (benchmarks/LAB04_NOTES.md round 13, item 5); the reverse order gives
    each plan one pass early and one late. The fastest: ``us`` per layer, ``gbps``, ``way``, every
    plan's ``us_by_way`` (the faster pass) and ``us_by_pass`` (both); None without a plan that fits."""
    if not plans:
        return None
    passes, caps, graphed = {}, {}, True
    for name, (call, want) in plans.items():
        def check(res, name=name, want=want):
            if not torch.equal(res[0].cpu(), want.cpu()):
                raise RuntimeError(f"read floor: {name} did not read the bytes it was given")
        t, caps[name] = graph_time(call, device, check=check, n_rep=n_rep)
        passes[name] = [t.median_ms * 1e3 / n_layers]
        graphed = graphed and caps[name].graphed
    for name in reversed(list(plans)):
        passes[name].append(time_fn(caps[name].replay, [()], device, n_rep=n_rep).median_ms * 1e3 / n_layers)
    del caps
    us = {k: min(v) for k, v in passes.items()}
    way = min(us, key=us.get)
    return {"us": us[way], "gbps": bytes_per_layer / us[way] / 1e3, "way": way, "us_by_way": us,
            "us_by_pass": passes, "graphed": graphed}
