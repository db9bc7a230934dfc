"""Lab 4's kernels: FP8 row quantization, the fallback's dequant, and a decode attention that
reads the KV cache in its stored dtype (bf16 or FP8) without a dequantized copy.

Each op has a Triton kernel (used on a GPU) and a torch reference of the same arithmetic (used
on a CPU, where the Triton interpreter computes bf16 wrongly, and by the tests, which run the
Triton kernels in the interpreter in fp16/fp32 against these references).

Byte counts per element, which is the whole lesson of Lab 4 (decode is memory-bound):

* :func:`dequant_rows`   reads 1 B (FP8) and writes 2 B (bf16); the GEMM that follows reads the
                         2 B again: 5 B per weight per step, against 2 B for a bf16 weight and
                         1 B for a weight the FP8 GEMM reads directly.
* :func:`quant_rows`     one pass per activation row (amax, then scale and cast): the requant
                         an FP8 GEMM needs in front of it.
* :func:`decode_attention` one read of K and V up to the current position, in their stored
                         dtype: an FP8 cache moves half the bytes of a bf16 one. Split over the
                         context (flash-decoding) so that a long context with a small batch
                         still fills the GPU.

Kernel names avoid the words the profiler classifier uses for GEMMs ("gemm", "fp8", "e4m3",
...), so the hit-rate count sees only real GEMM kernels.
"""
from __future__ import annotations

import math

import torch

from .. import tritonenv  # noqa: F401  (interpreter on CPU; must precede triton)
import triton
import triton.language as tl

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
#: the decode attention's tile: context positions per program (CHUNK_T), positions per loop
#: step, warps and pipeline stages per program, scores and output on the tensor cores
#: (ATTN_USE_DOT, see ``_decode_attn_partial``), the next tile's loads issued before this
#: tile's math (ATTN_PREFETCH). The best of two H200 sweeps in CUDA graphs over 8 layers'
#: caches (``benchmarks/lab04_decode_tuning.py``, LAB04_NOTES.md): the old 128 x 128 tile with 4
#: warps needs 255 registers (static sm_90a compile) and reached ~2.8-3.0 TB/s on FP8; every
#: reduction over a tile that spans warps costs a barrier. One warp per program, 32 positions
#: per step, elementwise: 3.44 TB/s at 4k x16 and 3.68 TB/s at 32k x4 on FP8 (SDPA on bf16:
#: 4.38-4.50); the tensor-core and prefetch variants did not beat it.
CHUNK_T = 256
ATTN_BLOCK_T, ATTN_WARPS, ATTN_STAGES = 32, 1, 2
ATTN_USE_DOT = False
ATTN_PREFETCH = False


# ---------------------------------------------------------------- quantize / dequantize rows
@triton.jit
def _row_amax_kernel(x_ptr, amax_ptr, n_cols, stride_x, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for c in range(0, n_cols, BLOCK):
        o = c + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + o, mask=o < n_cols, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    tl.store(amax_ptr + row, tl.max(amax, 0))


@triton.jit
def _quant_kernel(x_ptr, amax_ptr, q_ptr, s_ptr, n_amax, n_cols, stride_x, stride_q,
                  BLOCK: tl.constexpr, AMAX_BLOCK: tl.constexpr, PER_ROW: tl.constexpr):
    """Scale = amax / 448 of this row (PER_ROW) or of all rows' maxima; store it, then x / scale."""
    row = tl.program_id(0)
    if PER_ROW:
        scale = tl.maximum(tl.load(amax_ptr + row), 1e-12) / 448.0
        tl.store(s_ptr + row, scale)
    else:
        a = tl.load(amax_ptr + tl.arange(0, AMAX_BLOCK), mask=tl.arange(0, AMAX_BLOCK) < n_amax, other=0.0)
        scale = tl.maximum(tl.max(a, 0), 1e-12) / 448.0
        if row == 0:
            tl.store(s_ptr, scale)
    for c in range(0, n_cols, BLOCK):
        o = c + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + o, mask=o < n_cols, other=0.0).to(tl.float32)
        y = tl.minimum(tl.maximum(x / scale, -448.0), 448.0)
        tl.store(q_ptr + row * stride_q + o, y.to(q_ptr.dtype.element_ty), mask=o < n_cols)


@triton.jit
def _dequant_rows_kernel(q_ptr, s_ptr, out_ptr, n_cols, s_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    o = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = o < n_cols
    s = tl.load(s_ptr + row * s_stride)
    x = tl.load(q_ptr + row * n_cols + o, mask=m).to(tl.float32) * s
    tl.store(out_ptr + row * n_cols + o, x.to(out_ptr.dtype.element_ty), mask=m)


def quant_static_ref(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(x / scale) clamped to +-448, in e4m3: quantization with a fixed (calibrated) scale."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def quant_rows_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row e4m3: (x / s) in FP8, s = amax(row) / 448 as a float32 (rows, 1) column."""
    s = (x.detach().abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX)
    return quant_static_ref(x, s), s


def quant_rows(x: torch.Tensor, use_triton: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row dynamic FP8 quantization of a 2-D activation (scales (rows, 1)). Kept for the
    row-wise ``_scaled_mm`` comparison of ``benchmarks/lab04_tuning.py``; the decoder
    quantizes per tensor (:func:`quant_tensor`)."""
    return _quantize(x, per_row=True, use_triton=use_triton)


def quant_tensor_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor e4m3: (x / s) in FP8, s = amax(x) / 448 as a 0-d float32 tensor."""
    s = x.detach().abs().amax().float().clamp(min=1e-12) / FP8_MAX
    return quant_static_ref(x, s), s


def quant_tensor(x: torch.Tensor, use_triton: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor dynamic FP8 quantization of a 2-D activation: a row-amax kernel, then one
    kernel that reduces the row maxima and quantizes (decode: 2 launches, no host sync). The
    scale feeds ``torch._scaled_mm``'s tensor-wise mode, whose small-batch H200 kernels read
    the weight at ~3.9 TB/s where the row-wise mode managed ~2.6 (benchmarks/LAB04_NOTES.md)."""
    return _quantize(x, per_row=False, use_triton=use_triton)


def _quantize(x: torch.Tensor, per_row: bool, use_triton: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A row-amax kernel, then one kernel that forms the scale (this row's, or the maximum of
    all rows') and quantizes: 2 launches, no host sync, so a decode step can be graph-captured."""
    if x.dim() != 2:
        raise ValueError(f"FP8 quantization wants a 2-D (rows, cols) tensor, got shape {tuple(x.shape)}")
    if not _triton(x, use_triton):
        return quant_rows_ref(x) if per_row else quant_tensor_ref(x)
    x = x if x.stride(-1) == 1 else x.contiguous()
    rows, cols = x.shape
    amax = torch.empty((rows,), dtype=torch.float32, device=x.device)
    _row_amax_kernel[(rows,)](x, amax, cols, x.stride(0), BLOCK=1024)
    if not per_row and rows > 1024:  # prefill: reduce the row maxima first, so each program reads one value
        amax = amax.amax().reshape(1)
    q = torch.empty((rows, cols), dtype=FP8, device=x.device)
    s = torch.empty((rows, 1) if per_row else (), dtype=torch.float32, device=x.device)
    _quant_kernel[(rows,)](x, amax, q, s, amax.numel(), cols, x.stride(0), q.stride(0), BLOCK=1024,
                           AMAX_BLOCK=16 if per_row else max(16, triton.next_power_of_2(amax.numel())),
                           PER_ROW=per_row)
    return q, s


def dequant_rows_ref(q: torch.Tensor, s: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    return (q.float() * s).to(dtype)


def dequant_rows(q: torch.Tensor, s: torch.Tensor, dtype=torch.bfloat16, use_triton: bool | None = None) -> torch.Tensor:
    """``q * s`` to ``dtype`` (s: one float32 per row, (rows, 1), or one for the tensor), one
    read of q and one write."""
    if not _triton(q, use_triton):
        return dequant_rows_ref(q, s, dtype)
    rows, cols = q.shape
    out = torch.empty((rows, cols), dtype=dtype, device=q.device)
    block = 1024
    s = s.float().contiguous()
    if s.numel() not in (1, rows):
        raise ValueError(f"dequant_rows: {s.numel()} scales for {rows} rows; give one per row or one")
    _dequant_rows_kernel[(rows, triton.cdiv(cols, block))](q.contiguous(), s, out, cols,
                                                          0 if s.numel() == 1 else 1, BLOCK=block)
    return out


# ---------------------------------------------------------------- FP8-weight GEMM for decode (W8A16)
@triton.jit
def _fp8w_gemm_kernel(x_ptr, w_ptr, s_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SWAP: tl.constexpr,
                      SPLIT_K: tl.constexpr, PREFETCH: tl.constexpr):
    """y[M, N] = x[M, K] @ (w[N, K] * s).T with the FP8 tile widened to x's dtype in registers.

    ``SWAP``: compute the transposed product (w tile as the MMA's A operand, BN rows; x as B,
    BM columns), the usual layout for a small M ("swap AB"); otherwise x is A and w is B.
    ``SPLIT_K`` > 1: each program sums one K slice into a float32 workspace (atomic adds); the
    last program of an N tile (a counter) reads the sum, writes y and zeroes workspace and
    counter for the next call. It lets wide N tiles (each re-reads x from L2: N / BN times in
    all) still fill the GPU, with no extra launch for the reduction."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    if SWAP:
        acc = tl.zeros((BN, BM), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    k_len = tl.cdiv(tl.cdiv(K, SPLIT_K), BK) * BK
    k_lo = pid_k * k_len
    k_hi = tl.minimum(k_lo + k_len, K)
    if PREFETCH:  # the next tile's loads are issued before this tile's MMA: two in flight
        kk = k_lo + rk
        w_next = tl.load(w_ptr + rn[:, None] * stride_wn + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < k_hi), other=0.0)
    for k0 in range(k_lo, k_hi, BK):
        kk = k0 + rk
        x = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        if PREFETCH:
            w = w_next
            kn = kk + BK
            w_next = tl.load(w_ptr + rn[:, None] * stride_wn + kn[None, :], mask=(rn[:, None] < N) & (kn[None, :] < k_hi), other=0.0)
        else:
            w = tl.load(w_ptr + rn[:, None] * stride_wn + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0)
        if SWAP:
            acc += tl.dot(w.to(x.dtype), tl.trans(x))
        else:
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))
    if SWAP:
        part = tl.trans(acc)
    else:
        part = acc
    out_mask = (rm[:, None] < M) & (rn[None, :] < N)
    y_off = rm[:, None] * stride_ym + rn[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptr + y_off, (part * tl.load(s_ptr)).to(y_ptr.dtype.element_ty), mask=out_mask)
    else:
        tile = pid_m * tl.num_programs(0) + pid_n
        w_off = rm[:, None] * N + rn[None, :]
        tl.atomic_add(ws_ptr + w_off, part, mask=out_mask)
        tl.debug_barrier()  # every thread's adds are issued before the counter's release
        if tl.atomic_add(cnt_ptr + tile, 1) == SPLIT_K - 1:  # acq_rel: the other slices' adds are visible
            total = tl.load(ws_ptr + w_off, mask=out_mask, other=0.0, cache_modifier=".cg")  # from L2
            tl.store(y_ptr + y_off, (total * tl.load(s_ptr)).to(y_ptr.dtype.element_ty), mask=out_mask)
            tl.store(ws_ptr + w_off, tl.zeros((BM, BN), dtype=tl.float32), mask=out_mask)
            tl.store(cnt_ptr + tile, 0)


#: decode-shaped GEMMs (at most this many rows) take the FP8-weight kernel; prefill takes
#: the FP8 tensor-core GEMM (``torch._scaled_mm``), which is compute-efficient at large M
W8_MAX_ROWS = 64
#: the W8A16 tile: BN weight rows x BK columns per step, pipeline depth, warps, operand order,
#: K split, register prefetch. Chosen from a sweep on the H200 in CUDA graphs over weights
#: larger than L2 (the way a decode step streams them), not by ``triton.autotune``: autotuning
#: re-reads one weight, which then sits in the 60 MB L2, and picked a tile (16 x 512) that
#: streams HBM at 1.1-1.4 TB/s; this one reaches 2.3-2.4 (benchmarks/LAB04_NOTES.md)
W8_CONFIG = {"BN": 64, "BK": 256, "num_warps": 8, "num_stages": 3, "SWAP": False, "SPLIT_K": 4, "PREFETCH": False}
#: the interpreter runs any tile; a small one keeps CPU tests quick
_W8_CONFIG_CPU = {"BN": 16, "BK": 64, "num_warps": 4, "num_stages": 1, "SWAP": False, "SPLIT_K": 1, "PREFETCH": False}


def fp8w_linear_ref(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return ((x.float() @ w.float().t()) * s).to(x.dtype)


def fp8w_linear(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, use_triton: bool | None = None,
                config: dict | None = None) -> torch.Tensor:
    """``x @ (w * s).T`` for a 2-D activation ``x`` (M <= :data:`W8_MAX_ROWS`) and an FP8 weight
    (N, K) with one float32 scale: the weight is read once, as FP8, and widened in registers
    (weight-only FP8, "W8A16"). No activation requant and no dequantized copy: the bytes of a
    decode step are the FP8 weight's. ``config`` overrides :data:`W8_CONFIG` (sweeps)."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"fp8w_linear wants x (M, K) and w (N, K); got {tuple(x.shape)}, {tuple(w.shape)}")
    if not _triton(x, use_triton):
        return fp8w_linear_ref(x, w, s)
    M, Kd = x.shape
    N = w.shape[0]
    c = {"SPLIT_K": 1, "PREFETCH": False, **(config or (_W8_CONFIG_CPU if tritonenv.INTERPRETED else W8_CONFIG))}
    x = x if x.stride(1) == 1 else x.contiguous()
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    BM = 16
    grid = (triton.cdiv(N, c["BN"]), triton.cdiv(M, BM), c["SPLIT_K"])
    ws, cnt = _splitk_workspace(x.device, grid[1] * BM, N, grid[0] * grid[1]) if c["SPLIT_K"] > 1 else (y, y)
    _fp8w_gemm_kernel[grid](
        x, w, s.reshape(1).float(), y, ws, cnt, M, N, Kd, x.stride(0), w.stride(0), y.stride(0), BM=BM,
        BN=c["BN"], BK=c["BK"], SWAP=c["SWAP"], SPLIT_K=c["SPLIT_K"], PREFETCH=c["PREFETCH"], num_warps=c["num_warps"],
        num_stages=c["num_stages"])
    return y


_WORKSPACES: dict = {}


def _splitk_workspace(device, rows: int, n: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A zeroed float32 (rows, n) workspace and int32 tile counters for split-K, kept per
    device and grown as needed: the kernel leaves both zeroed, so calls (and CUDA-graph
    replays, which must not allocate) reuse them. Calls on one stream run one at a time."""
    key = (str(device), "splitk")
    ws, cnt = _WORKSPACES.get(key, (None, None))
    if ws is None or ws.numel() < rows * n or cnt.numel() < tiles:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("split-K workspace first needed inside a CUDA-graph capture: run the "
                               "step once eagerly before capturing it")
        ws = torch.zeros(max(rows * n, 0 if ws is None else ws.numel()), dtype=torch.float32, device=device)
        cnt = torch.zeros(max(tiles, 0 if cnt is None else cnt.numel()), dtype=torch.int32, device=device)
        _WORKSPACES[key] = (ws, cnt)
    return ws, cnt


# ---------------------------------------------------------------- decode-step glue: norm, KV write
@triton.jit
def _rmsnorm_kernel(x_ptr, y_ptr, s_ptr, n_cols, stride_x, stride_y, eps, BLOCK: tl.constexpr, QUANT: tl.constexpr):
    row = tl.program_id(0)
    o = tl.arange(0, BLOCK)
    m = o < n_cols
    x = tl.load(x_ptr + row * stride_x + o, mask=m, other=0.0).to(tl.float32)
    y = x * (1.0 / tl.sqrt(tl.sum(x * x, 0) / n_cols + eps))
    if QUANT:  # the consumer's static FP8 scale: the next GEMM reads 1 B per activation
        y = tl.minimum(tl.maximum(y / tl.load(s_ptr), -448.0), 448.0)
    tl.store(y_ptr + row * stride_y + o, y.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _quant_static_kernel(x_ptr, s_ptr, q_ptr, n, BLOCK: tl.constexpr, GELU: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    x = tl.load(x_ptr + o, mask=m, other=0.0).to(tl.float32)
    if GELU:  # exact (erf) GELU first, as F.gelu: the MLP's activation and the requant in one pass
        x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    q = tl.minimum(tl.maximum(x / tl.load(s_ptr), -448.0), 448.0)
    tl.store(q_ptr + o, q.to(q_ptr.dtype.element_ty), mask=m)


def rmsnorm_ref(x: torch.Tensor, eps: float = 1e-6, out_scale: torch.Tensor | None = None) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dimension, computed in float32; with
    ``out_scale``, quantized to FP8 with that (static) scale."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y.to(x.dtype) if out_scale is None else quant_static_ref(y, out_scale)


def rmsnorm(x: torch.Tensor, eps: float = 1e-6, use_triton: bool | None = None,
            out_scale: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm (no weight) in one kernel: one program per row (rows up to 16k wide). In torch
    it is ~6 small kernels; a decode step runs it 2 x layers + 1 times, so each launch counts.
    ``out_scale``: write FP8 (x / scale) for a GEMM that takes static-scaled FP8 input."""
    if not _triton(x, use_triton) or x.shape[-1] > 16384:
        return rmsnorm_ref(x, eps, out_scale)
    x2 = x.reshape(-1, x.shape[-1])
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    y = torch.empty(x2.shape, dtype=x.dtype if out_scale is None else FP8, device=x.device)
    s = y if out_scale is None else out_scale.reshape(1).float()
    _rmsnorm_kernel[(x2.shape[0],)](x2, y, s, x2.shape[1], x2.stride(0), y.stride(0), eps,
                                    BLOCK=triton.next_power_of_2(x2.shape[1]), QUANT=out_scale is not None)
    return y.reshape(x.shape)


def quant_static(x: torch.Tensor, scale: torch.Tensor, use_triton: bool | None = None,
                 gelu: bool = False) -> torch.Tensor:
    """FP8 quantization with a static scale: one elementwise pass (no amax, so no reduction
    and no second kernel, unlike :func:`quant_tensor`). ``gelu``: apply exact GELU first (the
    MLP's activation fused into the requant of the down projection's input)."""
    if not _triton(x, use_triton):
        return quant_static_ref(torch.nn.functional.gelu(x.float()) if gelu else x, scale)
    xc = x.contiguous()
    q = torch.empty(xc.shape, dtype=FP8, device=x.device)
    n = xc.numel()
    _quant_static_kernel[(triton.cdiv(n, 2048),)](xc, scale.reshape(1).float(), q, n, BLOCK=2048, GELU=gelu)
    return q


@triton.jit
def _kv_store_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, s_ptr, pos, pos_ptr, H, stride_kb, stride_kh, stride_vb,
                     stride_vh, max_ctx, D: tl.constexpr, QUANT: tl.constexpr, PER_ROW: tl.constexpr):
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    d = tl.arange(0, D)
    if PER_ROW:  # each batch row writes at its own position (continuous batching)
        pos = tl.load(pos_ptr + b)
    k = tl.load(k_ptr + b * stride_kb + h * stride_kh + d).to(tl.float32)
    v = tl.load(v_ptr + b * stride_vb + h * stride_vh + d).to(tl.float32)
    if QUANT:
        inv = 1.0 / tl.load(s_ptr)
        k = tl.minimum(tl.maximum(k * inv, -448.0), 448.0)
        v = tl.minimum(tl.maximum(v * inv, -448.0), 448.0)
    dst = (bh.to(tl.int64) * max_ctx + pos) * D + d
    tl.store(kc_ptr + dst, k.to(kc_ptr.dtype.element_ty))
    tl.store(vc_ptr + dst, v.to(vc_ptr.dtype.element_ty))


def kv_store_ref(k, v, k_cache, v_cache, scale, pos: int | torch.Tensor) -> None:
    """Write one position's K and V (B, H, 1, D) into (B, H, T, D) caches at ``pos`` (an int,
    or one position per batch row as an integer tensor (B,)); an FP8 cache stores (x / scale)
    clamped to +-448."""
    if k_cache.dtype == FP8:
        k, v = quant_static_ref(k, scale), quant_static_ref(v, scale)
    if isinstance(pos, torch.Tensor):
        rows = torch.arange(k.shape[0], device=k.device)
        p = pos.long()
        k_cache[rows, :, p] = k[:, :, 0].to(k_cache.dtype)
        v_cache[rows, :, p] = v[:, :, 0].to(v_cache.dtype)
        return
    k_cache[:, :, pos:pos + 1] = k.to(k_cache.dtype)
    v_cache[:, :, pos:pos + 1] = v.to(v_cache.dtype)


def kv_store(k, v, k_cache, v_cache, scale, pos: int | torch.Tensor, use_triton: bool | None = None) -> None:
    """One decode position's K and V into the caches, quantized if the cache is FP8: one kernel
    (in torch, 2 copies for a bf16 cache and ~8 kernels for an FP8 one). ``k``/``v`` may be
    strided views (B, H, 1, D) of the QKV projection's output. ``pos``: an int, or an int32
    tensor (B,) of per-row positions on the cache's device (continuous batching; read on the
    device, so a CUDA graph can replay it; the caller keeps each in range)."""
    B, H, one, D = k.shape
    if one != 1 or v.shape != k.shape or k_cache.shape[:2] != (B, H) or k_cache.shape[3] != D:
        raise ValueError(f"kv_store writes one position: k, v (B, H, 1, D) into (B, H, T, D) caches; got "
                         f"{tuple(k.shape)}, {tuple(v.shape)}, {tuple(k_cache.shape)}")
    per_row = isinstance(pos, torch.Tensor)
    if per_row and (pos.shape != (B,) or pos.dtype != torch.int32 or pos.device != k_cache.device):
        raise ValueError(f"per-row positions are an int32 tensor of shape ({B},) on {k_cache.device}; got "
                         f"{pos.dtype} {tuple(pos.shape)} on {pos.device}")
    if not per_row and not 0 <= pos < k_cache.shape[2]:
        raise ValueError(f"position {pos} is outside the cache (length {k_cache.shape[2]})")
    if not _triton(k, use_triton):
        return kv_store_ref(k, v, k_cache, v_cache, scale, pos)
    if k.stride(3) != 1 or v.stride(3) != 1 or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("kv_store wants unit-stride head dimensions and contiguous caches")
    _kv_store_kernel[(B * H,)](k, v, k_cache, v_cache, scale.reshape(1).float(), 0 if per_row else pos,
                               pos if per_row else k_cache, H,
                               k.stride(0), k.stride(1), v.stride(0), v.stride(1), k_cache.shape[2],
                               D=D, QUANT=k_cache.dtype == FP8, PER_ROW=per_row)


# ---------------------------------------------------------------- decode attention (split over context)
@triton.jit
def _decode_attn_partial(q_ptr, k_ptr, v_ptr, kv_scale_ptr, m_ptr, l_ptr, acc_ptr,
                         n_ctx, nctx_ptr, max_ctx, n_splits, sm_scale, H, stride_qb, stride_qh,
                         D: tl.constexpr, CHUNK: tl.constexpr, BLOCK_T: tl.constexpr,
                         USE_DOT: tl.constexpr, PREFETCH: tl.constexpr, PER_ROW: tl.constexpr):
    """One (batch, head) query against one CHUNK of the cache: partial max, sum and output.

    The cache's scale is applied once per score and once to the output, not per element.
    ``USE_DOT``: scores and output on the tensor cores (the query padded to 16 rows of which
    one is non-zero; FP8 tiles widened to fp16, which holds every e4m3 value exactly), which
    leaves the loop to loads and conversions; otherwise elementwise products and sums.
    ``PER_ROW``: each batch row's length is read from ``nctx_ptr``; the grid covers the whole
    cache and a chunk past its row's length runs no iteration (partial max -inf, sum 0)."""
    bh = tl.program_id(0)
    sp = tl.program_id(1)
    start = sp * CHUNK
    hi = start + CHUNK
    if PER_ROW:
        n_ctx = tl.load(nctx_ptr + bh // H)
        hi = tl.minimum(hi, n_ctx)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (bh // H) * stride_qb + (bh % H) * stride_qh + d).to(tl.float32) * sm_scale
    kv_scale = tl.load(kv_scale_ptr)
    base = bh.to(tl.int64) * max_ctx * D
    m_i = -float("inf")
    l_i = 0.0
    if USE_DOT:
        rows = tl.arange(0, 16)
        dt = tl.float16 if k_ptr.dtype.element_ty == tl.float8e4nv else k_ptr.dtype.element_ty
        qm = tl.where(rows[:, None] == 0, q[None, :], 0.0).to(dt)
        acc2 = tl.zeros((16, D), dtype=tl.float32)
        if PREFETCH:
            t = start + tl.arange(0, BLOCK_T)
            k_nx = tl.load(k_ptr + base + t[:, None] * D + d[None, :], mask=(t < n_ctx)[:, None], other=0.0)
            v_nx = tl.load(v_ptr + base + t[:, None] * D + d[None, :], mask=(t < n_ctx)[:, None], other=0.0)
        for t0 in range(start, hi, BLOCK_T):
            t = t0 + tl.arange(0, BLOCK_T)
            tm = t < n_ctx
            off = base + t[:, None] * D + d[None, :]
            if PREFETCH:  # this tile was loaded last iteration; issue the next one's loads now
                k_raw, v_raw = k_nx, v_nx
                tn = t + BLOCK_T
                mn = ((tn < n_ctx) & (tn < start + CHUNK))[:, None]
                k_nx = tl.load(k_ptr + off + BLOCK_T * D, mask=mn, other=0.0)
                v_nx = tl.load(v_ptr + off + BLOCK_T * D, mask=mn, other=0.0)
            else:
                k_raw = tl.load(k_ptr + off, mask=tm[:, None], other=0.0)
                v_raw = tl.load(v_ptr + off, mask=tm[:, None], other=0.0)
            k = k_raw.to(dt)
            s = tl.sum(tl.dot(qm, tl.trans(k)), 0) * kv_scale
            s = tl.where(tm, s, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, 0))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new)
            v = v_raw.to(dt)
            pm = tl.where(rows[:, None] == 0, p[None, :], 0.0).to(dt)
            acc2 = acc2 * alpha + tl.dot(pm, v)
            l_i = l_i * alpha + tl.sum(p, 0)
            m_i = m_new
        acc = tl.sum(acc2, 0)
    else:
        acc = tl.zeros((D,), dtype=tl.float32)
        if PREFETCH:
            t = start + tl.arange(0, BLOCK_T)
            k_nx = tl.load(k_ptr + base + t[:, None] * D + d[None, :], mask=(t < n_ctx)[:, None], other=0.0)
            v_nx = tl.load(v_ptr + base + t[:, None] * D + d[None, :], mask=(t < n_ctx)[:, None], other=0.0)
        for t0 in range(start, hi, BLOCK_T):
            t = t0 + tl.arange(0, BLOCK_T)
            tm = t < n_ctx
            off = base + t[:, None] * D + d[None, :]
            if PREFETCH:
                k_raw, v_raw = k_nx, v_nx
                tn = t + BLOCK_T
                mn = ((tn < n_ctx) & (tn < start + CHUNK))[:, None]
                k_nx = tl.load(k_ptr + off + BLOCK_T * D, mask=mn, other=0.0)
                v_nx = tl.load(v_ptr + off + BLOCK_T * D, mask=mn, other=0.0)
            else:
                k_raw = tl.load(k_ptr + off, mask=tm[:, None], other=0.0)
                v_raw = tl.load(v_ptr + off, mask=tm[:, None], other=0.0)
            k = k_raw.to(tl.float32)
            s = tl.sum(k * q[None, :], 1) * kv_scale
            s = tl.where(tm, s, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, 0))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new)
            v = v_raw.to(tl.float32)
            acc = acc * alpha + tl.sum(p[:, None] * v, 0)
            l_i = l_i * alpha + tl.sum(p, 0)
            m_i = m_new
    o = bh * n_splits + sp
    tl.store(m_ptr + o, m_i)
    tl.store(l_ptr + o, l_i)
    tl.store(acc_ptr + o * D + d, acc * kv_scale)


@triton.jit
def _decode_attn_combine(m_ptr, l_ptr, acc_ptr, out_ptr, n_splits,
                         D: tl.constexpr, SPLITS: tl.constexpr):
    bh = tl.program_id(0)
    sp = tl.arange(0, SPLITS)
    sm = sp < n_splits
    d = tl.arange(0, D)
    m = tl.load(m_ptr + bh * n_splits + sp, mask=sm, other=-float("inf"))
    l = tl.load(l_ptr + bh * n_splits + sp, mask=sm, other=0.0)
    acc = tl.load(acc_ptr + (bh * n_splits + sp)[:, None] * D + d[None, :], mask=sm[:, None], other=0.0)
    m_all = tl.max(m, 0)
    w = tl.where(sm, tl.exp(m - m_all), 0.0)
    out = tl.sum(w[:, None] * acc, 0) / tl.sum(w * l, 0)
    tl.store(out_ptr + bh * D + d, out.to(out_ptr.dtype.element_ty))


def decode_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         kv_scale: torch.Tensor, n_ctx: int) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v over the first ``n_ctx`` cache positions, in float32.

    Written with elementwise products and sums, not matmuls, so that a CPU profile of the
    decoder counts only the weight GEMMs (on a GPU the Triton kernel is no GEMM either)."""
    if isinstance(n_ctx, torch.Tensor):  # per-row lengths: positions past a row's length never read
        t = torch.arange(k_cache.shape[2], device=q.device)
        past = (t[None, :] >= n_ctx.to(q.device).long()[:, None])[:, None, :, None]  # (B, 1, T, 1)
        k = torch.where(past, 0.0, k_cache.float() * kv_scale)
        v = torch.where(past, 0.0, v_cache.float() * kv_scale)
        s = (k * q.float()).sum(-1) / math.sqrt(q.shape[-1])  # (B, H, T)
        s = s.masked_fill(past[..., 0], float("-inf"))
        return (torch.softmax(s, dim=-1).unsqueeze(-1) * v).sum(-2, keepdim=True).to(q.dtype)
    k = k_cache[:, :, :n_ctx].float() * kv_scale
    v = v_cache[:, :, :n_ctx].float() * kv_scale
    s = (k * q.float()).sum(-1) / math.sqrt(q.shape[-1])  # (B, H, T)
    return (torch.softmax(s, dim=-1).unsqueeze(-1) * v).sum(-2, keepdim=True).to(q.dtype)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     kv_scale: torch.Tensor, n_ctx: int, use_triton: bool | None = None,
                     chunk: int | None = None, block_t: int | None = None, num_warps: int | None = None,
                     use_dot: bool | None = None, num_stages: int | None = None,
                     prefetch: bool | None = None) -> torch.Tensor:
    """One decode query per (batch, head) against a (B, H, max_ctx, D) cache of any dtype.

    ``q``: (B, H, 1, D); ``kv_scale``: a 0-d float32 tensor (1.0 for a bf16 cache). Reads each
    K/V element once, in its stored dtype; returns (B, H, 1, D) in q's dtype. ``n_ctx``: an
    int, or an int32 tensor (B,) of per-row lengths on the cache's device (continuous
    batching: read on the device so a CUDA graph can replay it; each must be in 1..T, the
    caller's to keep; the grid then covers all T positions and empty chunks exit at once).
    """
    B, H, one, D = q.shape
    if one != 1 or k_cache.shape != v_cache.shape or k_cache.shape[:2] != (B, H) or k_cache.shape[3] != D:
        raise ValueError(f"decode_attention wants q (B, H, 1, D) and caches (B, H, T, D); got "
                         f"{tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    per_row = isinstance(n_ctx, torch.Tensor)
    if per_row and (n_ctx.shape != (B,) or n_ctx.dtype != torch.int32 or n_ctx.device != k_cache.device):
        raise ValueError(f"per-row lengths are an int32 tensor of shape ({B},) on {k_cache.device}; got "
                         f"{n_ctx.dtype} {tuple(n_ctx.shape)} on {n_ctx.device}")
    if not per_row and not 0 < n_ctx <= k_cache.shape[2]:
        raise ValueError(f"n_ctx={n_ctx} must be in 1..{k_cache.shape[2]} (the cache length)")
    if not _triton(q, use_triton):
        return decode_attention_ref(q, k_cache, v_cache, kv_scale, n_ctx)
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("decode_attention reads contiguous (B, H, T, D) caches")
    chunk, block_t, num_warps = chunk or CHUNK_T, block_t or ATTN_BLOCK_T, num_warps or ATTN_WARPS
    use_dot = ATTN_USE_DOT if use_dot is None else use_dot
    prefetch = ATTN_PREFETCH if prefetch is None else prefetch
    num_stages = num_stages or ATTN_STAGES
    n_splits = triton.cdiv(k_cache.shape[2] if per_row else n_ctx, chunk)
    dev = q.device
    m = torch.empty((B * H, n_splits), dtype=torch.float32, device=dev)
    l = torch.empty_like(m)
    acc = torch.empty((B * H, n_splits, D), dtype=torch.float32, device=dev)
    if q.stride(3) != 1:
        q = q.contiguous()
    _decode_attn_partial[(B * H, n_splits)](q, k_cache, v_cache, kv_scale.reshape(1).float(), m, l, acc,
                                            0 if per_row else n_ctx, n_ctx if per_row else m,
                                            k_cache.shape[2], n_splits, 1.0 / math.sqrt(D),
                                            H, q.stride(0), q.stride(1), D=D, CHUNK=chunk, BLOCK_T=block_t,
                                            USE_DOT=use_dot, PREFETCH=prefetch, PER_ROW=per_row,
                                            num_warps=num_warps, num_stages=num_stages)
    out = torch.empty((B, H, 1, D), dtype=q.dtype, device=dev)
    _decode_attn_combine[(B * H,)](m, l, acc, out, n_splits, D=D,
                                   SPLITS=max(2, triton.next_power_of_2(n_splits)))
    return out


_ATTN_KEYS = {"chunk": "CHUNK_T", "block_t": "ATTN_BLOCK_T", "num_warps": "ATTN_WARPS",
              "num_stages": "ATTN_STAGES", "use_dot": "ATTN_USE_DOT", "prefetch": "ATTN_PREFETCH"}


def kernel_config() -> dict:
    """The tiles this module runs with now (recorded next to Lab 4's GPU evidence)."""
    g = globals()
    return {"w8": dict(W8_CONFIG), "attn": {k: g[v] for k, v in _ATTN_KEYS.items()}}


def apply_kernel_config(cfg: dict) -> dict:
    """Set the tiles from a sweep's result: ``{"w8": {...}, "attn": {...}}`` (either part may
    be missing; keys as :func:`kernel_config` returns them). Returns the config now in use."""
    global W8_CONFIG
    bad = set(cfg) - {"w8", "attn"} | set(cfg.get("attn", {})) - set(_ATTN_KEYS) | set(cfg.get("w8", {})) - set(W8_CONFIG)
    if bad:
        raise ValueError(f"unknown kernel config keys {sorted(bad)}; expected those of kernel_config(): {kernel_config()}")
    if "w8" in cfg:
        W8_CONFIG = {**W8_CONFIG, **cfg["w8"]}
    for k, v in cfg.get("attn", {}).items():
        globals()[_ATTN_KEYS[k]] = v
    return kernel_config()


def _triton(t: torch.Tensor, use_triton: bool | None) -> bool:
    """Triton on a GPU; on a CPU only when asked (the interpreter: fp16/fp32, never bf16)."""
    if use_triton is None:
        return t.device.type == "cuda"
    if use_triton and t.device.type == "cpu":
        tritonenv.check_dtype(t.dtype)
    return use_triton


def self_check(device=None, act_dtype: torch.dtype | None = None, seed: int = 0) -> dict[str, float]:
    """Each kernel against its torch reference on fresh random data: relative errors.

    A GPU checks bf16 activations; the CPU interpreter fp16 (bf16 is wrong there). The FP8
    kernels differ from torch's rounding by at most one FP8 step in a few elements (the
    interpreter truncates), so quantization is judged by its round-trip error instead.
    """
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    act = act_dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float16)
    g = torch.Generator(device=dev).manual_seed(seed)
    rel = lambda a, b: float(torch.linalg.vector_norm(a.float() - b.float()) / torch.linalg.vector_norm(b.float()))  # noqa: E731
    x = (torch.randn(37, 1500, generator=g, device=dev) * 3).to(act)
    q, s = quant_rows(x, use_triton=True)
    qr, sr = quant_rows_ref(x)
    w = dequant_rows(qr, sr, act, use_triton=True)
    B, H, T, D = 2, 3, 700, 64
    qq = torch.randn(B, H, 1, D, generator=g, device=dev).to(act)
    kc = torch.randn(B, H, T, D, generator=g, device=dev)
    vc = torch.randn(B, H, T, D, generator=g, device=dev)
    qt, st = quant_tensor(x, use_triton=True)
    qtr, str_ = quant_tensor_ref(x)
    wq, wsc = quant_tensor_ref(torch.randn(96, 1500, generator=g, device=dev))
    xs16 = x[:16]
    w8_ref = fp8w_linear_ref(xs16.float(), wq, wsc)
    out_w8 = {"fp8w_linear": rel(fp8w_linear(xs16, wq, wsc, use_triton=True), w8_ref)}
    # the other operand order, split-K (twice: the workspace must come back zeroed) and prefetch
    c = {**(_W8_CONFIG_CPU if tritonenv.INTERPRETED else W8_CONFIG), "BN": 32, "SWAP": True, "SPLIT_K": 3, "PREFETCH": True}
    out_w8["fp8w_linear_splitk"] = max(rel(fp8w_linear(xs16, wq, wsc, use_triton=True, config=c), w8_ref) for _ in range(2))
    out_w8["rmsnorm"] = rel(rmsnorm(x, use_triton=True), rmsnorm_ref(x.float()))
    out = {**out_w8, "quant_rows_roundtrip": rel(q.float() * s, x), "quant_rows_scale": rel(s, sr),
           "quant_tensor_roundtrip": rel(qt.float() * st, x), "quant_tensor_scale": rel(st, str_),
           "dequant_rows": rel(w, dequant_rows_ref(qr, sr, torch.float32))}
    for name, dt, sc in (("decode_attention_16bit", act, 1.0), ("decode_attention_fp8", FP8, 0.01)):
        kk, vv = (kc / sc).to(dt), (vc / sc).to(dt)
        scale = torch.tensor(sc, device=dev)
        for dot in (False, True):
            out[name + ("_dot" if dot else "")] = max(
                rel(decode_attention(qq, kk, vv, scale, n, use_triton=True, use_dot=dot),
                    decode_attention_ref(qq, kk, vv, scale, n)) for n in (1, 255, 257, T))
        # one decode position written through the kernel, read back against the reference write
        kn, vn = (torch.randn(B, H, 1, D, generator=g, device=dev) * 3).to(act), (torch.randn(B, H, 1, D, generator=g, device=dev) * 3).to(act)
        k2, v2, k3, v3 = (t.clone() for t in (kk, vv, kk, vv))
        kv_store(kn, vn, k2, v2, scale, 5, use_triton=True)
        kv_store_ref(kn, vn, k3, v3, scale, 5)
        out[name.replace("decode_attention", "kv_store")] = max(rel(a[:, :, 5].float(), b[:, :, 5].float()) for a, b in ((k2, k3), (v2, v3)))
    return out
