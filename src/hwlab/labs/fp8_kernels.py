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
#: context positions per attention program, positions per loop step, warps per program: the
#: best of an H200 sweep (chunk 256/512/1024 x step 32/64/128 x 4/8 warps; LAB04_NOTES.md):
#: FP8 cache ~2.9 TB/s, bf16 cache ~3.6-3.7 TB/s at 4k-32k context (SDPA on bf16: ~4.4)
CHUNK_T = 256
ATTN_BLOCK_T, ATTN_WARPS = 128, 4


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


def quant_rows_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row e4m3: (x / s) in FP8, s = amax(row) / 448 as a float32 (rows, 1) column."""
    s = (x.detach().abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX)
    return (x.float() / s).clamp(-FP8_MAX, FP8_MAX).to(FP8), s


def quant_rows(x: torch.Tensor, use_triton: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row dynamic FP8 quantization of a 2-D activation (scales (rows, 1)). Kept for the
    row-wise ``_scaled_mm`` comparison of ``benchmarks/lab04_tuning.py``; the decoder
    quantizes per tensor (:func:`quant_tensor`)."""
    return _quantize(x, per_row=True, use_triton=use_triton)


def quant_tensor_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor e4m3: (x / s) in FP8, s = amax(x) / 448 as a 0-d float32 tensor."""
    s = x.detach().abs().amax().float().clamp(min=1e-12) / FP8_MAX
    return (x.float() / s).clamp(-FP8_MAX, FP8_MAX).to(FP8), s


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
def _w8_configs():
    if tritonenv.INTERPRETED:  # the interpreter runs one config; there is no speed to tune
        return [triton.Config({"BN": 16, "BK": 64}, num_warps=4, num_stages=1)]
    return [triton.Config({"BN": bn, "BK": bk}, num_warps=4, num_stages=st)
            for bn in (16, 32, 64) for bk in (128, 256, 512) for st in (3, 4)]


@triton.autotune(configs=_w8_configs(), key=["M", "N", "K"])
@triton.jit
def _fp8w_gemm_kernel(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        x = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        w = tl.load(w_ptr + rn[:, None] * stride_wn + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0)
        acc += tl.dot(x, tl.trans(w.to(x.dtype)))
    acc = acc * tl.load(s_ptr)
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


#: decode-shaped GEMMs (at most this many rows) take the FP8-weight kernel; prefill takes
#: the FP8 tensor-core GEMM (``torch._scaled_mm``), which is compute-efficient at large M
W8_MAX_ROWS = 64


def fp8w_linear_ref(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return ((x.float() @ w.float().t()) * s).to(x.dtype)


def fp8w_linear(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, use_triton: bool | None = None) -> torch.Tensor:
    """``x @ (w * s).T`` for a 2-D activation ``x`` (M <= :data:`W8_MAX_ROWS`) and an FP8 weight
    (N, K) with one float32 scale: the weight is read once, as FP8, and widened in registers
    (weight-only FP8, "W8A16"). No activation requant and no dequantized copy: the bytes of a
    decode step are the FP8 weight's. Tile (BN x BK) and pipeline depth are tuned per shape by
    ``triton.autotune`` on first use (before any CUDA-graph capture)."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"fp8w_linear wants x (M, K) and w (N, K); got {tuple(x.shape)}, {tuple(w.shape)}")
    if not _triton(x, use_triton):
        return fp8w_linear_ref(x, w, s)
    M, Kd = x.shape
    N = w.shape[0]
    x = x if x.stride(1) == 1 else x.contiguous()
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    BM = 16
    grid = lambda meta: (triton.cdiv(N, meta["BN"]), triton.cdiv(M, BM))  # noqa: E731
    _fp8w_gemm_kernel[grid](x, w, s.reshape(1).float(), y, M, N, Kd, x.stride(0), w.stride(0), y.stride(0), BM=BM)
    return y


# ---------------------------------------------------------------- decode attention (split over context)
@triton.jit
def _decode_attn_partial(q_ptr, k_ptr, v_ptr, kv_scale_ptr, m_ptr, l_ptr, acc_ptr,
                         n_ctx, max_ctx, n_splits, sm_scale,
                         D: tl.constexpr, CHUNK: tl.constexpr, BLOCK_T: tl.constexpr):
    bh = tl.program_id(0)
    sp = tl.program_id(1)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + bh * D + d).to(tl.float32) * sm_scale
    kv_scale = tl.load(kv_scale_ptr)
    base = bh.to(tl.int64) * max_ctx * D
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros((D,), dtype=tl.float32)
    start = sp * CHUNK
    for t0 in range(start, start + CHUNK, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        tm = t < n_ctx
        off = base + t[:, None] * D + d[None, :]
        k = tl.load(k_ptr + off, mask=tm[:, None], other=0.0).to(tl.float32) * kv_scale
        s = tl.sum(k * q[None, :], 1)
        s = tl.where(tm, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        v = tl.load(v_ptr + off, mask=tm[:, None], other=0.0).to(tl.float32) * kv_scale
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    o = bh * n_splits + sp
    tl.store(m_ptr + o, m_i)
    tl.store(l_ptr + o, l_i)
    tl.store(acc_ptr + o * D + d, acc)


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
    k = k_cache[:, :, :n_ctx].float() * kv_scale
    v = v_cache[:, :, :n_ctx].float() * kv_scale
    s = (k * q.float()).sum(-1) / math.sqrt(q.shape[-1])  # (B, H, T)
    return (torch.softmax(s, dim=-1).unsqueeze(-1) * v).sum(-2, keepdim=True).to(q.dtype)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     kv_scale: torch.Tensor, n_ctx: int, use_triton: bool | None = None,
                     chunk: int | None = None, block_t: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """One decode query per (batch, head) against a (B, H, max_ctx, D) cache of any dtype.

    ``q``: (B, H, 1, D); ``kv_scale``: a 0-d float32 tensor (1.0 for a bf16 cache). Reads each
    K/V element once, in its stored dtype; returns (B, H, 1, D) in q's dtype.
    """
    B, H, one, D = q.shape
    if one != 1 or k_cache.shape != v_cache.shape or k_cache.shape[:2] != (B, H) or k_cache.shape[3] != D:
        raise ValueError(f"decode_attention wants q (B, H, 1, D) and caches (B, H, T, D); got "
                         f"{tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    if not 0 < n_ctx <= k_cache.shape[2]:
        raise ValueError(f"n_ctx={n_ctx} must be in 1..{k_cache.shape[2]} (the cache length)")
    if not _triton(q, use_triton):
        return decode_attention_ref(q, k_cache, v_cache, kv_scale, n_ctx)
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("decode_attention reads contiguous (B, H, T, D) caches")
    chunk, block_t, num_warps = chunk or CHUNK_T, block_t or ATTN_BLOCK_T, num_warps or ATTN_WARPS
    n_splits = triton.cdiv(n_ctx, chunk)
    dev = q.device
    m = torch.empty((B * H, n_splits), dtype=torch.float32, device=dev)
    l = torch.empty_like(m)
    acc = torch.empty((B * H, n_splits, D), dtype=torch.float32, device=dev)
    qc = q.contiguous()
    _decode_attn_partial[(B * H, n_splits)](qc, k_cache, v_cache, kv_scale.reshape(1).float(), m, l, acc,
                                            n_ctx, k_cache.shape[2], n_splits, 1.0 / math.sqrt(D),
                                            D=D, CHUNK=chunk, BLOCK_T=block_t, num_warps=num_warps)
    out = torch.empty_like(qc)
    _decode_attn_combine[(B * H,)](m, l, acc, out, n_splits, D=D,
                                   SPLITS=max(2, triton.next_power_of_2(n_splits)))
    return out


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
    out_w8 = {"fp8w_linear": rel(fp8w_linear(xs16, wq, wsc, use_triton=True), fp8w_linear_ref(xs16.float(), wq, wsc))}
    out = {**out_w8, "quant_rows_roundtrip": rel(q.float() * s, x), "quant_rows_scale": rel(s, sr),
           "quant_tensor_roundtrip": rel(qt.float() * st, x), "quant_tensor_scale": rel(st, str_),
           "dequant_rows": rel(w, dequant_rows_ref(qr, sr, torch.float32))}
    for name, dt, sc in (("decode_attention_16bit", act, 1.0), ("decode_attention_fp8", FP8, 0.01)):
        kk, vv = (kc / sc).to(dt), (vc / sc).to(dt)
        scale = torch.tensor(sc, device=dev)
        out[name] = max(rel(decode_attention(qq, kk, vv, scale, n, use_triton=True),
                            decode_attention_ref(qq, kk, vv, scale, n)) for n in (1, 255, 257, T))
    return out
