"""Lab 2's Triton kernels and their launchers: a GEMM whose tile is a knob, the over-fused
``softmax(A @ B)``, the split version, and an elementwise kernel whose compile time grows with
its block (the compile guard's test case). float64 references on the CPU for each.
"""
from __future__ import annotations

import torch

from hwlab.core import tritonenv  # noqa: F401  (must precede kernel definitions)
from hwlab.core.measure import InputError
from hwlab.labs.registers.tiles import SANE, TileConfig

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  stride_cm, stride_cn, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """C = A @ B with an fp32 accumulator; K must be a multiple of BK (no masks in the loop,
    which would stop the loads from being pipelined)."""
    pid = tl.program_id(0)
    n_pid_n = tl.cdiv(N, BN)
    pid_m = pid // n_pid_n
    pid_n = pid % n_pid_n
    rm = (pid_m * BM + tl.arange(0, BM)) % M
    rn = (pid_n * BN + tl.arange(0, BN)) % N
    rk = tl.arange(0, BK)
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K // BK):
        acc = tl.dot(tl.load(a_ptrs), tl.load(b_ptrs), acc)
        a_ptrs += BK * stride_ak
        b_ptrs += BK * stride_bk
    cm = pid_m * BM + tl.arange(0, BM)
    cn = pid_n * BN + tl.arange(0, BN)
    tl.store(c_ptr + cm[:, None] * stride_cm + cn[None, :] * stride_cn,
             acc.to(c_ptr.dtype.element_ty), mask=(cm[:, None] < M) & (cn[None, :] < N))


@triton.jit
def matmul_softmax_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                          stride_bn, stride_cm, stride_cn, BM: tl.constexpr, BN: tl.constexpr,
                          BK: tl.constexpr):
    """softmax(A @ B, dim=1) in one kernel: the over-fused version. BN must cover all of N."""
    pid_m = tl.program_id(0)
    rm = (pid_m * BM + tl.arange(0, BM)) % M
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K // BK):
        acc = tl.dot(tl.load(a_ptrs), tl.load(b_ptrs), acc)
        a_ptrs += BK * stride_ak
        b_ptrs += BK * stride_bk
    acc = acc - tl.max(acc, axis=1)[:, None]
    e = tl.exp(acc)
    p = e / tl.sum(e, axis=1)[:, None]
    cm = pid_m * BM + tl.arange(0, BM)
    tl.store(c_ptr + cm[:, None] * stride_cm + rn[None, :] * stride_cn,
             p.to(c_ptr.dtype.element_ty), mask=(cm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def wide_block_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """An elementwise kernel; its compile time grows with BLOCK on one warp, so a huge BLOCK
    (32768) compiles for longer than any sane limit: the compile guard's test case."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    tl.store(y_ptr + offs, tl.exp(x) / tl.sum(tl.exp(x), axis=0), mask=m)


KERNELS = {"matmul": matmul_kernel, "matmul_softmax": matmul_softmax_kernel,
           "wide_block": wide_block_kernel}


def _check_shapes(a, b, cfg: TileConfig):
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise InputError(f"shapes {tuple(a.shape)} @ {tuple(b.shape)} do not multiply")
    if a.shape[1] % cfg.bk:
        raise InputError(f"K={a.shape[1]} must be a multiple of BK={cfg.bk} for this kernel")


def matmul(a, b, cfg: TileConfig = SANE, out=None):
    """``a @ b`` with the Triton kernel at tile ``cfg``; returns (c, compiled kernel)."""
    _check_shapes(a, b, cfg)
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty(M, N, device=a.device, dtype=a.dtype) if out is None else out
    grid = (triton.cdiv(M, cfg.bm) * triton.cdiv(N, cfg.bn),)
    k = matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                            c.stride(0), c.stride(1), BM=cfg.bm, BN=cfg.bn, BK=cfg.bk,
                            num_warps=cfg.warps, num_stages=cfg.stages)
    return c, k


def matmul_softmax_fused(a, b, bm: int = 64, bk: int = 64, warps: int = 4, stages: int = 2):
    """Over-fused: softmax(a @ b) in one kernel, the whole row of the product in registers."""
    M, K = a.shape
    N = b.shape[1]
    if N & (N - 1):
        raise InputError(f"N={N} must be a power of two (one tile spans the row)")
    cfg = TileConfig(bm, N, bk, warps, stages)
    _check_shapes(a, b, cfg)
    c = torch.empty(M, N, device=a.device, dtype=a.dtype)
    k = matmul_softmax_kernel[(triton.cdiv(M, bm),)](
        a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
        c.stride(1), BM=bm, BN=N, BK=bk, num_warps=warps, num_stages=stages)
    return c, k


def matmul_softmax_split(a, b, cfg: TileConfig = SANE):
    """Split: the GEMM at a sane tile, then softmax as its own kernel."""
    c, k = matmul(a, b, cfg)
    return torch.softmax(c.float(), dim=1).to(a.dtype), k


def reference_matmul(a, b):
    """float64 product, on the inputs' device."""
    return a.double() @ b.double()


def reference_matmul_softmax(a, b):
    return torch.softmax(reference_matmul(a, b), dim=1)
