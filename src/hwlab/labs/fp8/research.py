"""RESEARCH, not a lab path: the tuning variants measured against Lab 4's teaching kernels.

No lab path, notebook or exercise runs these; ``benchmarks/lab04_decode_tuning.py``,
``lab04_tuning.py`` and ``lab04_static_registers.py`` do, and their results and what was
learnt from them are the tuning diary ``benchmarks/LAB04_NOTES.md``. Kept (and tested in the
interpreter) so a finding there can be re-measured with the code that produced it.

* :func:`fp8w_linear`: a weight-only FP8 GEMM for decode shapes ("W8A16": the FP8 weight read
  once and widened in registers, no activation requant), split over K through a float32
  workspace; :func:`w8a16_decoder` is a decoder whose FP8 layers use it for decode.
* :func:`decode_attention_variant`: the decode attention with its tensor-core (``use_dot``)
  and register-prefetch (``prefetch``) variants, which did not beat the elementwise kernel.
* :func:`quant_rows`: per-row dynamic scales (the row-wise ``_scaled_mm`` comparison).
* :func:`decode_attention_round8`: the lab's decode attention with round 8's two switches, the
  splits sized from the SM count (``programs_per_sm``) and the combine folded into the partial
  kernel (``fused_combine``), both measured slower in the decode step (LAB04_NOTES.md round 8).
* :func:`decode_attention_interleaved`: the lab's decode attention on a cache whose K and V are
  interleaved per block of positions (:func:`interleave_kv`), one stream per program instead of
  two (LAB04_NOTES.md round 9).
* :func:`decode_attention_lean`: the lab's decode attention whose loop on an FP8 cache issues
  fewer instructions per byte (output and sum kept per position row, unmasked full steps;
  LAB04_NOTES.md round 10). Its load-only probes, :func:`stream_kv` and :func:`stream_matrix`
  (rounds 10-12), are now the lab's read floor (:mod:`.floor`); re-exported here for the benchmarks.
"""
from __future__ import annotations

import functools
import math

import torch

from hwlab.core import tritonenv
from hwlab.labs.fp8 import workspace as W
from hwlab.labs.fp8 import attention as _attention
from hwlab.labs.fp8.attention import (
    DEFAULT_TILE, LOG2E, AttnTile, _attend_chunk, _decode_attn_combine, _decode_attn_partial,
    _partial_begin, _partial_end, _pdl_args, _softmax_step, check_decode_args, chunk_for, combine_splits,
    decode_attention_ref, kv_store_ref, new_kv_args, split_buffers, split_count)
from hwlab.labs.fp8.floor import _stream_kv_kernel, _stream_matrix_kernel, stream_kv, stream_matrix  # noqa: F401 (rounds 10-12)
from hwlab.labs.fp8.kernels import rel_err
from hwlab.labs.fp8.model import Decoder, ModelConfig, QLinear
from hwlab.labs.fp8.quant import (
    BLOCK, FP8, FP8_MAX, _row_amax_kernel, fence_gpu, pdl_args, pdl_enter, quant_static_ref,
    quant_tensor_ref, use_triton_for)
import triton
import triton.language as tl


# ---------------------------------------------------------------- per-row dynamic quantization
@triton.jit
def _quant_rows_kernel(x_ptr, amax_ptr, q_ptr, s_ptr, n_cols, stride_x, stride_q, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    scale = tl.maximum(tl.load(amax_ptr + row), 1e-12) / 448.0
    tl.store(s_ptr + row, scale)
    for c in range(0, n_cols, BLOCK):
        o = c + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + o, mask=o < n_cols, other=0.0).to(tl.float32)
        y = tl.minimum(tl.maximum(x / scale, -448.0), 448.0)
        tl.store(q_ptr + row * stride_q + o, y.to(q_ptr.dtype.element_ty), mask=o < n_cols)


def quant_rows_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row e4m3: (x / s) in FP8, s = amax(row) / 448 as a float32 (rows, 1) column."""
    s = (x.detach().abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX)
    return quant_static_ref(x, s), s


def quant_rows(x: torch.Tensor, use_triton: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row dynamic FP8 quantization of a 2-D activation (scales (rows, 1)): a row-amax
    kernel, then one that scales and casts each row."""
    if x.dim() != 2:
        raise ValueError(f"FP8 quantization wants a 2-D (rows, cols) tensor, got shape {tuple(x.shape)}")
    if not use_triton_for(x, use_triton):
        return quant_rows_ref(x)
    x = x if x.stride(-1) == 1 else x.contiguous()
    rows, cols = x.shape
    amax = torch.empty((rows,), dtype=torch.float32, device=x.device)
    _row_amax_kernel[(rows,)](x, amax, cols, x.stride(0), BLOCK=BLOCK)
    q = torch.empty((rows, cols), dtype=FP8, device=x.device)
    s = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    _quant_rows_kernel[(rows,)](x, amax, q, s, cols, x.stride(0), q.stride(0), BLOCK=BLOCK)
    return q, s


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
    all) still fill the GPU, with no extra launch for the reduction. ``PREFETCH``: the next
    tile's loads issued before this tile's MMA (two in flight)."""
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
    if PREFETCH:
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


#: decode-shaped GEMMs (at most this many rows) take the W8A16 kernel in :class:`W8Linear`
W8_MAX_ROWS = 64
#: the W8A16 tile: BN weight rows x BK columns per step, pipeline depth, warps, operand order,
#: K split, register prefetch. Picked by a sweep in CUDA graphs over weights larger than L2 (the
#: way a decode step streams them), not by ``triton.autotune``, which re-reads one weight that
#: then sits in L2 (LAB04_NOTES.md, round 1)
W8_CONFIG = {"BN": 64, "BK": 256, "num_warps": 8, "num_stages": 3, "SWAP": False, "SPLIT_K": 4, "PREFETCH": False}
#: the interpreter runs any tile; a small one keeps CPU tests quick
W8_CONFIG_CPU = {"BN": 16, "BK": 64, "num_warps": 4, "num_stages": 1, "SWAP": False, "SPLIT_K": 1, "PREFETCH": False}


def fp8w_linear_ref(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return ((x.float() @ w.float().t()) * s).to(x.dtype)


def fp8w_linear(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, use_triton: bool | None = None,
                config: dict | None = None) -> torch.Tensor:
    """``x @ (w * s).T`` for a 2-D activation ``x`` and an FP8 weight (N, K) with one float32
    scale: the weight is read once, as FP8, and widened in registers. ``config``: the tile
    (keys of :data:`W8_CONFIG`; default that, or :data:`W8_CONFIG_CPU` in the interpreter)."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"fp8w_linear wants x (M, K) and w (N, K); got {tuple(x.shape)}, {tuple(w.shape)}")
    if not use_triton_for(x, use_triton):
        return fp8w_linear_ref(x, w, s)
    M, Kd = x.shape
    N = w.shape[0]
    c = {"SPLIT_K": 1, "PREFETCH": False, **(config or (W8_CONFIG_CPU if tritonenv.INTERPRETED else W8_CONFIG))}
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


def _splitk_workspace(device, rows: int, n: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A zeroed float32 (rows, n) workspace and int32 tile counters for this kernel's split-K
    (:func:`.workspace.zeroed`, names of its own): the kernel leaves both zeroed, so calls (and
    CUDA-graph replays, which must not allocate) reuse them."""
    return (W.zeroed(device, "research_splitk_ws", rows * n, torch.float32),
            W.zeroed(device, "research_splitk_cnt", tiles, torch.int32))


class W8Linear(QLinear):
    """An ``fp8_mm`` layer whose decode-shaped calls (at most :data:`W8_MAX_ROWS` rows) on a GPU
    run :func:`fp8w_linear` with tile ``config`` (None: :data:`W8_CONFIG`); prefill and CPU
    calls stay ``fp8_mm``. The bytes a step moves are ``fp8_mm``'s (1 B per weight), so the
    lab's byte model holds unchanged."""

    config: dict | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        if x.is_cuda and x2.shape[0] <= W8_MAX_ROWS:
            return fp8w_linear(x2, self.w, self.w_scale, config=self.config).reshape(*x.shape[:-1], self.out_features)
        return super().forward(x)


#: the W8A16 decoder's path: FP8 main matmuls and connector, bf16 head, FP8 KV from 4k
W8A16_PATH = {"main": "fp8_mm", "connector": "fp8_mm", "head": "bf16", "kv_fp8_from_ctx": 4096}


def w8a16_decoder(cfg: ModelConfig, device=None, seed: int = 0, attn_tile: AttnTile = DEFAULT_TILE,
                  config: dict | None = None) -> Decoder:
    """A :class:`.model.Decoder` on :data:`W8A16_PATH` whose FP8 layers are :class:`W8Linear`
    with W8A16 tile ``config`` (same weights as any decoder of this seed)."""
    m = Decoder(cfg, W8A16_PATH, seed=seed, device=device, attn_tile=attn_tile)
    for mod in m.modules():
        if type(mod) is QLinear and mod.mode == "fp8_mm":
            mod.__class__ = W8Linear  # same buffers and state; only the decode-shaped forward differs
            mod.config = config
    return m


# ---------------------------------------------------------------- decode attention variants
@triton.jit
def _decode_attn_partial_variants(q_ptr, k_ptr, v_ptr, kv_scale_ptr, m_ptr, l_ptr, acc_ptr,
                                  n_ctx, nctx_ptr, max_ctx, n_splits, sm_scale, H, stride_qb, stride_qh,
                                  D: tl.constexpr, CHUNK: tl.constexpr, BLOCK_T: tl.constexpr,
                                  USE_DOT: tl.constexpr, PREFETCH: tl.constexpr, PER_ROW: tl.constexpr):
    """:func:`.attention._decode_attn_partial` with two variants. ``USE_DOT``: scores and
    output on the tensor cores (the query padded to 16 rows of which one is non-zero; FP8 tiles
    widened to fp16, which holds every e4m3 value exactly), leaving the loop to loads and
    conversions. ``PREFETCH``: the next tile's loads issued before this tile's math."""
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
    rows = tl.arange(0, 16)
    dt = tl.float16 if k_ptr.dtype.element_ty == tl.float8e4nv else k_ptr.dtype.element_ty
    qm = tl.where(rows[:, None] == 0, q[None, :], 0.0).to(dt)
    acc2 = tl.zeros((16, D), dtype=tl.float32)
    acc = tl.zeros((D,), dtype=tl.float32)
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
        if USE_DOT:
            s = tl.sum(tl.dot(qm, tl.trans(k_raw.to(dt))), 0) * kv_scale
        else:
            s = tl.sum(k_raw.to(tl.float32) * q[None, :], 1) * kv_scale
        s = tl.where(tm, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        if USE_DOT:
            pm = tl.where(rows[:, None] == 0, p[None, :], 0.0).to(dt)
            acc2 = acc2 * alpha + tl.dot(pm, v_raw.to(dt))
        else:
            acc = acc * alpha + tl.sum(p[:, None] * v_raw.to(tl.float32), 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    if USE_DOT:
        acc = tl.sum(acc2, 0)
    o = bh * n_splits + sp
    tl.store(m_ptr + o, m_i)
    tl.store(l_ptr + o, l_i)
    tl.store(acc_ptr + o * D + d, acc * kv_scale)


def decode_attention_variant(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             kv_scale: torch.Tensor, n_ctx: int | torch.Tensor, use_triton: bool | None = None,
                             tile: AttnTile = DEFAULT_TILE, use_dot: bool = False,
                             prefetch: bool = False) -> torch.Tensor:
    """:func:`.attention.decode_attention` (same arguments and checks) through the variant
    kernel: ``use_dot`` (tensor cores), ``prefetch`` (next tile's loads first)."""
    per_row = check_decode_args(q, k_cache, v_cache, n_ctx)
    if not use_triton_for(q, use_triton):
        return decode_attention_ref(q, k_cache, v_cache, kv_scale, n_ctx)
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("decode_attention reads contiguous (B, H, T, D) caches")
    B, H, _, D = q.shape
    n_splits = triton.cdiv(k_cache.shape[2] if per_row else n_ctx, tile.chunk)
    m, l, acc = split_buffers(q, n_splits)
    if q.stride(3) != 1:
        q = q.contiguous()
    _decode_attn_partial_variants[(B * H, n_splits)](
        q, k_cache, v_cache, kv_scale.reshape(1).float(), m, l, acc, 0 if per_row else n_ctx,
        n_ctx if per_row else m, k_cache.shape[2], n_splits, 1.0 / math.sqrt(D), H, q.stride(0), q.stride(1),
        D=D, CHUNK=tile.chunk, BLOCK_T=tile.block_t, USE_DOT=use_dot, PREFETCH=prefetch, PER_ROW=per_row,
        num_warps=tile.num_warps, num_stages=tile.num_stages)
    return combine_splits(m, l, acc, q)


# ---------------------------------------------------------------- round 8: grid from the SM count, fused combine
#: splits the fused combine (:func:`_combine_row`) reads per step: 8 x 128 float32 over one warp
#: is 32 registers a thread, under what the partial's loop holds
COMBINE_BLOCK = tl.constexpr(8)
#: fewest per-row counters the fused combine allocates, so that a decoder's first call covers the
#: batch sizes after it (a buffer cannot grow inside a CUDA-graph capture)
MIN_COUNTERS = 4096
#: the SM count :func:`sm_count` gives for a CPU tensor (the interpreter): a small GPU's
CPU_SM_COUNT = 4


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (:data:`CPU_SM_COUNT` for a CPU), read once per
    device: reading the device properties on every call slowed the eager attention by 16 us per
    layer (round 8's superseded call 4)."""
    if device.type != "cuda":
        return CPU_SM_COUNT
    return _sm_count_cuda(torch.cuda.current_device() if device.index is None else device.index)


@functools.lru_cache(maxsize=None)
def _sm_count_cuda(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def chunk_for_gpu(tile: AttnTile, n_rows_heads: int, n_positions: int, programs_per_sm: int,
                  n_sm: int = CPU_SM_COUNT) -> int:
    """With ``programs_per_sm`` > 0: the positions shared evenly by about ``programs_per_sm * n_sm /
    n_rows_heads`` splits (at least one), rounded up to whole ``block_t`` steps, so that the grid
    is about that many programs per SM; 0: the lab's :func:`.attention.chunk_for`."""
    if programs_per_sm:
        splits = max(1, programs_per_sm * n_sm // n_rows_heads)
        return max(tile.block_t, triton.cdiv(triton.cdiv(n_positions, splits), tile.block_t) * tile.block_t)
    return chunk_for(tile, n_rows_heads, n_positions)


@triton.jit
def _combine_row(m_ptr, l_ptr, acc_ptr, out_ptr, s_ptr, bh, n_splits, D: tl.constexpr, SPLITS: tl.constexpr,
                 QUANT: tl.constexpr):
    """:func:`.attention._decode_attn_combine`'s sum for one (batch, head), read :data:`COMBINE_BLOCK` splits
    at a time: it runs at the end of a partial program, and a few splits' D values at a time keep
    its registers near the partial's own (round 4 fused a combine that loaded every split at once:
    the registers it added cut how many partial programs stay resident), while each step's loads
    are still issued together. Loads skip L1 (``.cg``): other SMs wrote the partials in this launch."""
    d = tl.arange(0, D)
    sp = tl.arange(0, SPLITS)
    row = bh * n_splits
    m = tl.load(m_ptr + row + sp, mask=sp < n_splits, other=-float("inf"), cache_modifier=".cg")
    l = tl.load(l_ptr + row + sp, mask=sp < n_splits, other=0.0, cache_modifier=".cg")
    m_all = tl.max(m, 0)
    den = tl.sum(tl.where(sp < n_splits, tl.exp(m - m_all) * l, 0.0), 0)
    num = tl.zeros((D,), dtype=tl.float32)
    for s0 in range(0, n_splits, COMBINE_BLOCK):
        s = s0 + tl.arange(0, COMBINE_BLOCK)
        sm = s < n_splits
        w = tl.where(sm, tl.exp(tl.load(m_ptr + row + s, mask=sm, other=0.0, cache_modifier=".cg") - m_all), 0.0)
        a = tl.load(acc_ptr + (row + s)[:, None] * D + d[None, :], mask=sm[:, None], other=0.0, cache_modifier=".cg")
        num += tl.sum(w[:, None] * a, 0)
    out = num / den
    if QUANT:
        out = tl.minimum(tl.maximum(out / tl.load(s_ptr), -448.0), 448.0)
    tl.store(out_ptr + bh * D + d, out.to(out_ptr.dtype.element_ty))


@triton.jit
def _decode_attn_partial_r8(q_ptr, k_ptr, v_ptr, kv_scale_ptr, m_ptr, l_ptr, acc_ptr,
                            n_ctx, nctx_ptr, max_ctx, n_splits, qk_scale, H, stride_qb, stride_qh,
                            D: tl.constexpr, CHUNK: tl.constexpr, BLOCK_T: tl.constexpr, PER_ROW: tl.constexpr,
                            F16: tl.constexpr, PDL: tl.constexpr = False, kn_ptr=None, vn_ptr=None,
                            stride_kb=0, stride_kh=0, stride_vb=0, stride_vh=0, NEW_KV: tl.constexpr = False,
                            cnt_ptr=None, out_ptr=None, os_ptr=None, COMBINE: tl.constexpr = False,
                            SPLITS: tl.constexpr = 2, QUANT: tl.constexpr = False, FENCE: tl.constexpr = False):
    """:func:`.attention._decode_attn_partial` (called as it is: the lab's program, unchanged) and,
    with ``COMBINE``, the combine: after storing its partial, each program counts itself in
    (``cnt_ptr``, one counter per (batch, head), zero before the call); the one that counts last
    combines the row's splits into ``out_ptr`` (:func:`_combine_row`) and zeroes the counter
    again. Its loads of the other programs' partials skip L1 (``.cg``); ``FENCE``: every thread's
    stores are made visible GPU-wide before the count (a compiled kernel; the interpreter runs
    programs one by one)."""
    _decode_attn_partial(q_ptr, k_ptr, v_ptr, kv_scale_ptr, m_ptr, l_ptr, acc_ptr, n_ctx, nctx_ptr, max_ctx, n_splits,
                         qk_scale, H, stride_qb, stride_qh, D, CHUNK, BLOCK_T, PER_ROW, F16, PDL, kn_ptr, vn_ptr,
                         stride_kb, stride_kh, stride_vb, stride_vh, NEW_KV)
    if COMBINE:
        bh = tl.program_id(1)
        d = tl.arange(0, D)
        if FENCE:
            fence_gpu(d)
        tl.debug_barrier()  # every thread past its fence before the count (acq_rel) releases them
        if tl.atomic_add(cnt_ptr + bh, 1) == n_splits - 1:  # the last of the row: all partials are in
            _combine_row(m_ptr, l_ptr, acc_ptr, out_ptr, os_ptr, bh, n_splits, D, SPLITS, QUANT)
            tl.store(cnt_ptr + bh, 0)


def decode_attention_round8(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_scale: torch.Tensor,
                            n_ctx: int | torch.Tensor, use_triton: bool | None = None, tile: AttnTile = DEFAULT_TILE,
                            out_scale: torch.Tensor | None = None,
                            new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
                            programs_per_sm: int = 0, fused_combine: bool = False,
                            maxnreg: int | None = None, pdl_combine: bool = False) -> torch.Tensor:
    """:func:`.attention.decode_attention` (same arguments, checks and result) with round 8's
    switches: ``programs_per_sm`` > 0 sizes the splits from the SM count (:func:`chunk_for_gpu`),
    ``fused_combine`` lets the last program of each (batch, head) combine the splits; and round
    10's ``maxnreg``, the registers per thread the compiler may use (:func:`launch_limits`), and
    ``pdl_combine``: the combine kernel (not the partial one) launched with PDL where
    :func:`.quant.set_pdl` has it on, so that its launch overlaps the partial kernel's last programs."""
    if not (isinstance(programs_per_sm, int) and programs_per_sm >= 0 and isinstance(fused_combine, bool)):
        raise ValueError(f"programs_per_sm >= 0 (0: the lab's chunk rule) and fused_combine a bool; got "
                         f"{programs_per_sm!r}, {fused_combine!r}")
    per_row, ref = _checks_or_reference(q, k_cache, v_cache, kv_scale, n_ctx, use_triton, out_scale, new_kv)
    if ref is not None:
        return ref
    B, H, _, D = q.shape
    n_positions = k_cache.shape[2] if per_row else n_ctx
    chunk = chunk_for_gpu(tile, B * H, n_positions, programs_per_sm, sm_count(q.device))
    extra = new_kv_args(new_kv)
    out = None
    if fused_combine:
        n_splits = split_count(n_positions, chunk)
        out = torch.empty((B, H, 1, D), dtype=q.dtype if out_scale is None else FP8, device=q.device)
        extra.update(cnt_ptr=W.zeroed(q.device, "attn_rows", max(B * H, MIN_COUNTERS), torch.int32), out_ptr=out,
                     os_ptr=out if out_scale is None else out_scale.reshape(1).float(), COMBINE=True,
                     SPLITS=max(2, triton.next_power_of_2(n_splits)), QUANT=out_scale is not None,
                     FENCE=not tritonenv.INTERPRETED)
    m, l, acc, n_splits = _launch_partial(_decode_attn_partial_r8, q, k_cache, v_cache, kv_scale, n_ctx, per_row, chunk,
                                          tile, **extra, **launch_limits(maxnreg))
    if fused_combine:
        return out
    if pdl_combine:
        out = torch.empty((B, H, 1, D), dtype=q.dtype if out_scale is None else FP8, device=q.device)
        _decode_attn_combine[(B * H,)](m, l, acc, out, out if out_scale is None else out_scale.reshape(1).float(),
                                       n_splits, D=D, SPLITS=max(2, triton.next_power_of_2(n_splits)),
                                       QUANT=out_scale is not None, **pdl_args(q))
        return out
    return combine_splits(m, l, acc, q, out_scale)


def _checks_or_reference(q, k_cache, v_cache, kv_scale, n_ctx, use_triton, out_scale, new_kv):
    """:func:`.attention.decode_attention`'s checks for research's split attentions: ``(per_row,
    None)`` where a kernel is to run, or ``(per_row, result)`` from the reference (on a CPU, or
    ``use_triton`` False), this step's ``new_kv`` written first as :func:`.attention.kv_store` would."""
    per_row = check_decode_args(q, k_cache, v_cache, n_ctx)
    if new_kv is not None and (per_row or new_kv[0].shape != q.shape or new_kv[1].shape != q.shape):
        raise ValueError("new_kv is this step's (k, v), each shaped as q (B, H, 1, D), with one length for all rows")
    if not use_triton_for(q, use_triton):
        if new_kv is not None:
            kv_store_ref(new_kv[0], new_kv[1], k_cache, v_cache, kv_scale, n_ctx - 1)
        out = decode_attention_ref(q, k_cache, v_cache, kv_scale, n_ctx)
        return per_row, (out if out_scale is None else quant_static_ref(out, out_scale))
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("decode_attention reads contiguous (B, H, T, D) caches")
    return per_row, None


def _launch_partial(kernel, q, k_cache, v_cache, kv_scale, n_ctx, per_row, chunk, tile, out=None, **extra):
    """One launch of a partial kernel with :func:`.attention._decode_attn_partial`'s arguments over
    chunks of ``chunk`` positions (``extra``: its further arguments and launch options): the
    partial max, sum and output buffers and the split count. ``out``: the buffer a ``FINAL``
    kernel stores the output in, passed in the partial output's place."""
    B, H, _, D = q.shape
    n_splits = split_count(k_cache.shape[2] if per_row else n_ctx, chunk)
    m, l, acc = split_buffers(q, n_splits)
    acc = acc if out is None else out
    q = q if q.stride(3) == 1 else q.contiguous()
    kernel[(n_splits, B * H)](q, k_cache, v_cache, kv_scale.reshape(1).float(), m, l, acc, 0 if per_row else n_ctx,
                              n_ctx if per_row else m, k_cache.shape[2], n_splits, LOG2E / math.sqrt(D), H,
                              q.stride(0), q.stride(1), D=D, CHUNK=chunk, BLOCK_T=tile.block_t, PER_ROW=per_row,
                              F16=k_cache.dtype == FP8, num_warps=tile.num_warps, num_stages=tile.num_stages,
                              **extra, **_pdl_args(q))
    return m, l, acc, n_splits


def launch_limits(maxnreg: int | None) -> dict:
    """Triton's ``maxnreg`` launch option (a register cap per thread, as ``__launch_bounds__``
    or ``-maxrregcount`` in CUDA C++) where a compiled kernel runs; the interpreter takes none."""
    if maxnreg is not None and not (isinstance(maxnreg, int) and 16 <= maxnreg <= 255):
        raise ValueError(f"maxnreg is None or a register count in 16..255; got {maxnreg!r}")
    return {"maxnreg": maxnreg} if maxnreg and not tritonenv.INTERPRETED else {}


# ---------------------------------------------------------------- K and V interleaved per block
def interleave_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, block: int) -> torch.Tensor:
    """Two (B, H, T, D) caches as one (B, H, T // block, 2, block, D): for each ``block``
    positions, their K rows and then their V rows, so that a program streams one region."""
    B, H, T, D = k_cache.shape
    if v_cache.shape != k_cache.shape or block < 1 or T % block:
        raise ValueError(f"interleave_kv wants two (B, H, T, D) caches of one shape and T a multiple of the block; "
                         f"got {tuple(k_cache.shape)}, {tuple(v_cache.shape)}, block {block}")
    return torch.stack((k_cache.reshape(B, H, T // block, block, D), v_cache.reshape(B, H, T // block, block, D)),
                       dim=3).contiguous()


@triton.jit
def _decode_attn_partial_kvi(q_ptr, k_ptr, v_ptr, kv_scale_ptr, m_ptr, l_ptr, acc_ptr, n_ctx, max_ctx, n_splits,
                             qk_scale, H, stride_qb, stride_qh, D: tl.constexpr, CHUNK: tl.constexpr,
                             BLOCK_T: tl.constexpr, F16: tl.constexpr, IB: tl.constexpr,
                             EVICT: tl.constexpr = "evict_first", CACHE: tl.constexpr = ""):
    """:func:`.attention._decode_attn_partial`'s loop (its :func:`~.attention._softmax_step`: fp16
    math on FP8, exp2; evict-first loads, the split fastest, the last split to the row's end) with
    one change, the layout (and, for call 6, the loads' cache policy). ``IB`` = 0:
    separate (B, H, T, D) caches, as the lab; ``IB`` > 0: ``k_ptr`` is :func:`interleave_kv`'s
    (.., T // IB, 2, IB, D) and each step's K and V rows are neighbours (``BLOCK_T`` divides ``IB``
    and every step starts on a multiple of ``BLOCK_T``, so a step stays inside one block).
    ``EVICT``, ``CACHE``: the loads' L2 eviction policy (the lab's: evict-first) and cache
    modifier (the lab's: none; ``.cg`` skips L1, ``.cs`` marks the lines streaming)."""
    sp = tl.program_id(0)
    bh = tl.program_id(1)
    start = sp * CHUNK
    hi = tl.where(sp == n_splits - 1, n_ctx, tl.minimum(start + CHUNK, n_ctx))
    d = tl.arange(0, D)
    kv_scale = tl.load(kv_scale_ptr)
    q = tl.load(q_ptr + (bh // H) * stride_qb + (bh % H) * stride_qh + d).to(tl.float32) * (qk_scale * kv_scale)
    q16 = q.to(tl.float16)
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros((D,), dtype=tl.float32)
    for t0 in range(start, hi, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        tm = t < hi
        if IB > 0:  # block t0 // IB: IB rows of K, then IB rows of V
            row0 = bh.to(tl.int64) * max_ctx * 2 + (t0 // IB) * (2 * IB) + t0 % IB
            off_k = (row0 + tl.arange(0, BLOCK_T))[:, None] * D + d[None, :]
            off_v = off_k + IB * D
            k_raw = tl.load(k_ptr + off_k, mask=tm[:, None], other=0.0, eviction_policy=EVICT, cache_modifier=CACHE)
            v_raw = tl.load(k_ptr + off_v, mask=tm[:, None], other=0.0, eviction_policy=EVICT, cache_modifier=CACHE)
        else:
            off = bh.to(tl.int64) * max_ctx * D + t[:, None] * D + d[None, :]
            k_raw = tl.load(k_ptr + off, mask=tm[:, None], other=0.0, eviction_policy=EVICT, cache_modifier=CACHE)
            v_raw = tl.load(v_ptr + off, mask=tm[:, None], other=0.0, eviction_policy=EVICT, cache_modifier=CACHE)
        m_i, l_i, acc = _softmax_step(k_raw, v_raw, tm, q, q16, m_i, l_i, acc, F16)
    o = bh * n_splits + sp
    tl.store(m_ptr + o, m_i * 0.6931471805599453)
    tl.store(l_ptr + o, l_i)
    tl.store(acc_ptr + o * D + d, acc * kv_scale)


def decode_attention_interleaved(q: torch.Tensor, kv: torch.Tensor, kv_scale: torch.Tensor, n_ctx: int,
                                 tile: AttnTile = DEFAULT_TILE, v_cache: torch.Tensor | None = None,
                                 use_triton: bool | None = None, eviction_policy: str = "evict_first",
                                 cache_modifier: str = "") -> torch.Tensor:
    """:func:`.attention.decode_attention` (one length ``n_ctx`` for all rows, the lab's tile
    rules and combine) on ``kv`` from :func:`interleave_kv`, (B, H, T // IB, 2, IB, D); or, with
    ``v_cache``, on two separate (B, H, T, D) caches ``kv`` and ``v_cache`` through the same loop
    (the A/B's other side). ``eviction_policy`` and ``cache_modifier``: the K/V loads' (Triton's
    ``tl.load`` arguments; the lab's are evict-first and none). What compiles for sm_90 (round 9,
    call 6): ``.cs`` is no load modifier in Triton, and ptxas refuses an eviction policy beside
    ``.cg`` or ``.cv``, which skip L1."""
    if eviction_policy not in ("", "evict_first", "evict_last") or cache_modifier not in ("", ".ca", ".cg", ".cv"):
        raise ValueError(f"eviction_policy in '', evict_first, evict_last and cache_modifier in '', .ca, .cg, .cv; "
                         f"got {eviction_policy!r}, {cache_modifier!r}")
    if cache_modifier in (".cg", ".cv") and eviction_policy:
        raise ValueError(f"cache_modifier {cache_modifier} skips L1 and takes no eviction_policy "
                         f"(ptxas refuses {eviction_policy!r} beside it); pass eviction_policy=''")
    if v_cache is None:
        B, H, nb, two, IB, D = kv.shape
        if two != 2:
            raise ValueError(f"kv is interleave_kv's (B, H, T // IB, 2, IB, D); got {tuple(kv.shape)}")
        T = nb * IB
    else:
        B, H, T, D = kv.shape
        IB = 0
    if q.shape != (B, H, 1, D) or not 0 < n_ctx <= T:
        raise ValueError(f"q (B, H, 1, D) = {(B, H, 1, D)} and n_ctx in 1..{T}; got {tuple(q.shape)}, {n_ctx}")
    if IB and (IB % tile.block_t or tile.chunk % tile.block_t):
        raise ValueError(f"{tile}: block_t must divide the interleave block {IB}")
    if not use_triton_for(q, use_triton):
        if v_cache is not None:
            return decode_attention_ref(q, kv, v_cache, kv_scale, n_ctx)
        return decode_attention_ref(q, kv[:, :, :, 0].reshape(B, H, T, D), kv[:, :, :, 1].reshape(B, H, T, D),
                                    kv_scale, n_ctx)
    chunk = chunk_for(tile, B * H, n_ctx)
    n_splits = split_count(n_ctx, chunk)
    m, l, acc = split_buffers(q, n_splits)
    q = q if q.stride(3) == 1 else q.contiguous()
    _decode_attn_partial_kvi[(n_splits, B * H)](q, kv, kv if v_cache is None else v_cache, kv_scale.reshape(1).float(),
                                                m, l, acc, n_ctx, T, n_splits, LOG2E / math.sqrt(D), H, q.stride(0),
                                                q.stride(1), D=D, CHUNK=chunk, BLOCK_T=tile.block_t,
                                                F16=kv.dtype == FP8, IB=IB, EVICT=eviction_policy,
                                                CACHE=cache_modifier, num_warps=tile.num_warps,
                                                num_stages=tile.num_stages)
    return combine_splits(m, l, acc, q)


def split_attn_config(c: dict) -> tuple[AttnTile, bool, bool]:
    """A sweep's attention candidate ``{chunk, block_t, num_warps, num_stages, use_dot,
    prefetch}`` as (tile, use_dot, prefetch)."""
    return (AttnTile(c["chunk"], c["block_t"], c["num_warps"], c["num_stages"]),
            bool(c.get("use_dot", False)), bool(c.get("prefetch", False)))


def self_check(device=None, act_dtype: torch.dtype | None = None, seed: int = 0) -> dict[str, float]:
    """The research kernels against their references on fresh random data (relative errors):
    per-row quantization (round trip and scale), the W8A16 GEMM in its default tile and in the
    other operand order with split-K (twice: the workspace must come back zeroed) and prefetch,
    and each attention variant at lengths 1, 255, 257 and 700 (chunk 256)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    act = act_dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float16)
    g = torch.Generator(device=dev).manual_seed(seed)
    x = (torch.randn(37, 1500, generator=g, device=dev) * 3).to(act)
    q, s = quant_rows(x, use_triton=True)
    qr, sr = quant_rows_ref(x)
    out = {"quant_rows_roundtrip": rel_err(q.float() * s, x), "quant_rows_scale": rel_err(s, sr)}
    wq, wsc = quant_tensor_ref(torch.randn(96, 1500, generator=g, device=dev))
    xs16 = x[:16]
    w8_ref = fp8w_linear_ref(xs16.float(), wq, wsc)
    out["fp8w_linear"] = rel_err(fp8w_linear(xs16, wq, wsc, use_triton=True), w8_ref)
    c = {**(W8_CONFIG_CPU if tritonenv.INTERPRETED else W8_CONFIG), "BN": 32, "SWAP": True, "SPLIT_K": 3, "PREFETCH": True}
    out["fp8w_linear_splitk"] = max(rel_err(fp8w_linear(xs16, wq, wsc, use_triton=True, config=c), w8_ref)
                                    for _ in range(2))
    B, H, T, D = 2, 3, 700, 64
    qq = torch.randn(B, H, 1, D, generator=g, device=dev).to(act)
    kc = torch.randn(B, H, T, D, generator=g, device=dev)
    vc = torch.randn(B, H, T, D, generator=g, device=dev)
    for name, dt, sc in (("decode_attention_16bit", act, 1.0), ("decode_attention_fp8", FP8, 0.01)):
        kk, vv = (kc / sc).to(dt), (vc / sc).to(dt)
        scale = torch.tensor(sc, device=dev)
        for dot, pf in ((True, False), (False, True), (True, True)):
            key = name + ("_dot" if dot else "") + ("_prefetch" if pf else "")
            out[key] = max(rel_err(decode_attention_variant(qq, kk, vv, scale, n, use_triton=True, use_dot=dot,
                                                            prefetch=pf), decode_attention_ref(qq, kk, vv, scale, n))
                           for n in (1, 255, 257, T))
    return out


# ---------------------------------------------------------------- fewer instructions per byte (round 10)
@triton.jit
def _lean_step(k_raw, v_raw, tm, q16, m_i, l2, acc2, MASK: tl.constexpr, BLOCK_T: tl.constexpr, D: tl.constexpr):
    """One step of round 10's online softmax on an FP8 cache (:func:`_attend_chunk_lean`): the
    scores summed in fp16 within a thread and in float32 across threads; the running output
    ``acc2`` (BLOCK_T, D) in fp16 and the running sum ``l2`` (BLOCK_T,) kept per position row, so
    that no step sums across the warp; both rescaled only when the running max ``m_i`` grows."""
    prod = k_raw.to(tl.float16) * q16[None, :]
    s = tl.sum(tl.sum(tl.reshape(prod, (BLOCK_T, D // 16, 16)), 2).to(tl.float32), 1)
    if MASK:
        s = tl.where(tm, s, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    p = tl.exp2(s - m_new)
    if m_new > m_i:  # rare after the first steps: most steps skip the rescale
        alpha = tl.exp2(m_i - m_new)
        acc2 = acc2 * alpha.to(tl.float16)
        l2 = l2 * alpha
    acc2 += p.to(tl.float16)[:, None] * v_raw.to(tl.float16)
    return m_new, l2 + p, acc2


@triton.jit
def _last_step_kv(k_ptr, v_ptr, base, full, hi, D: tl.constexpr, BLOCK_T: tl.constexpr):
    """The masked last step of round 10's loops: K and V of positions ``full`` to ``hi`` (fewer
    than ``BLOCK_T``; zeros past ``hi``) and the mask of the positions that are real."""
    t = full + tl.arange(0, BLOCK_T)
    tm = t < hi
    off = base + t[:, None] * D + tl.arange(0, D)[None, :]
    k_raw = tl.load(k_ptr + off, mask=tm[:, None], other=0.0, eviction_policy="evict_first")
    v_raw = tl.load(v_ptr + off, mask=tm[:, None], other=0.0, eviction_policy="evict_first")
    return k_raw, v_raw, tm


@triton.jit
def _attend_chunk_lean(q, k_ptr, v_ptr, base, start, hi, D: tl.constexpr, BLOCK_T: tl.constexpr,
                       PREFETCH: tl.constexpr = 0, LOOP_STAGES: tl.constexpr = 0):
    """:func:`.attention._attend_chunk` on an FP8 cache with fewer instructions per byte (LAB04_NOTES.md
    round 10): the output and sum accumulate per position row (summed over the rows once, after
    the loop, instead of across the warp's threads every step), the full steps load unmasked and
    one masked step reads the remainder. Same results: partial max (log2 units), sum, output.
    ``PREFETCH``: 1 loads the next step's V, 2 its K and V, while this step computes (registers
    carried by the loop: more bytes in flight per warp; the compiler otherwise issues a step's V
    loads only after its K is used). ``LOOP_STAGES`` > 0: the loop is Triton's software pipeline of
    that depth (``tl.range(num_stages=...)``): the full steps' loads go through shared memory as
    asynchronous copies (``cp.async``), issued that many steps ahead, in flight without registers."""
    d = tl.arange(0, D)
    tr = tl.arange(0, BLOCK_T)
    q16 = q.to(tl.float16)
    m_i = -float("inf")
    l2 = tl.zeros((BLOCK_T,), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_T, D), dtype=tl.float16)
    full = start + tl.maximum(hi - start, 0) // BLOCK_T * BLOCK_T
    rows = tr[:, None] * D + d[None, :]
    first = (start < full) & (tr < BLOCK_T)
    if PREFETCH == 2:
        k_next = tl.load(k_ptr + base + start * D + rows, mask=first[:, None], other=0.0, eviction_policy="evict_first")
    if PREFETCH >= 1:
        v_next = tl.load(v_ptr + base + start * D + rows, mask=first[:, None], other=0.0, eviction_policy="evict_first")
    for t0 in tl.range(start, full, BLOCK_T, num_stages=LOOP_STAGES if LOOP_STAGES > 0 else None):
        off = base + t0 * D + rows
        more = (t0 + BLOCK_T < full) & (tr < BLOCK_T)
        if PREFETCH == 2:
            k_raw = k_next
            k_next = tl.load(k_ptr + off + BLOCK_T * D, mask=more[:, None], other=0.0, eviction_policy="evict_first")
        else:
            k_raw = tl.load(k_ptr + off, eviction_policy="evict_first")
        if PREFETCH >= 1:
            v_raw = v_next
            v_next = tl.load(v_ptr + off + BLOCK_T * D, mask=more[:, None], other=0.0, eviction_policy="evict_first")
        else:
            v_raw = tl.load(v_ptr + off, eviction_policy="evict_first")
        m_i, l2, acc2 = _lean_step(k_raw, v_raw, tr < BLOCK_T, q16, m_i, l2, acc2, False, BLOCK_T, D)
    if full < hi:
        k_raw, v_raw, tm = _last_step_kv(k_ptr, v_ptr, base, full, hi, D, BLOCK_T)
        m_i, l2, acc2 = _lean_step(k_raw, v_raw, tm, q16, m_i, l2, acc2, True, BLOCK_T, D)
    return m_i, tl.sum(l2, 0), tl.sum(acc2.to(tl.float32), 0)


@triton.jit
def _rows_step(k_raw, v_raw, tm, q16, m2, l2, acc2, MASK: tl.constexpr, BLOCK_T: tl.constexpr, D: tl.constexpr):
    """One step of :func:`_attend_chunk_rows`: each of the ``BLOCK_T`` position rows keeps its own
    running max ``m2``, sum ``l2`` and output ``acc2`` (fp16), so no value crosses a warp (or the
    warps of a program) inside the loop; only the dot product's sum over D crosses threads."""
    prod = k_raw.to(tl.float16) * q16[None, :]
    s = tl.sum(tl.sum(tl.reshape(prod, (BLOCK_T, D // 16, 16)), 2).to(tl.float32), 1)
    if MASK:
        s = tl.where(tm, s, -float("inf"))
    m_new = tl.maximum(m2, s)
    # maxima floored at -1e30 so that a row with no position yet (-inf) never computes -inf - -inf:
    # alpha is 1 where the row's max holds, 0 for a row's first position; masked positions add nothing
    alpha = tl.exp2(tl.maximum(m2, -1e30) - tl.maximum(m_new, -1e30))
    p = tl.where(s == -float("inf"), 0.0, tl.exp2(tl.maximum(s, -1e30) - tl.maximum(m_new, -1e30)))
    acc2 = acc2 * alpha.to(tl.float16)[:, None] + p.to(tl.float16)[:, None] * v_raw.to(tl.float16)
    return m_new, l2 * alpha + p, acc2


@triton.jit
def _attend_chunk_rows(q, k_ptr, v_ptr, base, start, hi, D: tl.constexpr, BLOCK_T: tl.constexpr,
                       LOOP_STAGES: tl.constexpr = 0):
    """:func:`_attend_chunk_lean` with a running max per position row (:func:`_rows_step`), merged
    once after the loop: a program of several warps, each streaming its own rows of a long step,
    never waits on the others inside the loop (round 10, after the counters). ``LOOP_STAGES``: as
    :func:`_attend_chunk_lean`'s."""
    d = tl.arange(0, D)
    tr = tl.arange(0, BLOCK_T)
    q16 = q.to(tl.float16)
    m2 = tl.full((BLOCK_T,), -float("inf"), tl.float32)
    l2 = tl.zeros((BLOCK_T,), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_T, D), dtype=tl.float16)
    full = start + tl.maximum(hi - start, 0) // BLOCK_T * BLOCK_T
    rows = tr[:, None] * D + d[None, :]
    for t0 in tl.range(start, full, BLOCK_T, num_stages=LOOP_STAGES if LOOP_STAGES > 0 else None):
        off = base + t0 * D + rows
        k_raw = tl.load(k_ptr + off, eviction_policy="evict_first")
        v_raw = tl.load(v_ptr + off, eviction_policy="evict_first")
        m2, l2, acc2 = _rows_step(k_raw, v_raw, tr < BLOCK_T, q16, m2, l2, acc2, False, BLOCK_T, D)
    if full < hi:
        k_raw, v_raw, tm = _last_step_kv(k_ptr, v_ptr, base, full, hi, D, BLOCK_T)
        m2, l2, acc2 = _rows_step(k_raw, v_raw, tm, q16, m2, l2, acc2, True, BLOCK_T, D)
    m_i = tl.max(m2, 0)
    w = tl.where(m2 == -float("inf"), 0.0, tl.exp2(tl.maximum(m2, -1e30) - tl.maximum(m_i, -1e30)))
    return m_i, tl.sum(l2 * w, 0), tl.sum(acc2.to(tl.float32) * w[:, None], 0)


@triton.jit
def _decode_attn_partial_lean(q_ptr, k_ptr, v_ptr, kv_scale_ptr, m_ptr, l_ptr, acc_ptr,
                              n_ctx, nctx_ptr, max_ctx, n_splits, qk_scale, H, stride_qb, stride_qh,
                              D: tl.constexpr, CHUNK: tl.constexpr, BLOCK_T: tl.constexpr, PER_ROW: tl.constexpr,
                              F16: tl.constexpr, PDL: tl.constexpr = False, kn_ptr=None, vn_ptr=None,
                              stride_kb=0, stride_kh=0, stride_vb=0, stride_vh=0, NEW_KV: tl.constexpr = False,
                              PREFETCH: tl.constexpr = 0, LOOP_STAGES: tl.constexpr = 0, ROWS: tl.constexpr = False,
                              FINAL: tl.constexpr = False, out_s_ptr=None, QUANT: tl.constexpr = False):
    """:func:`.attention._decode_attn_partial` (its arguments, grid and stores) whose loop on an
    FP8 cache is :func:`_attend_chunk_lean` (``PREFETCH``, ``LOOP_STAGES`` its); a 16-bit cache
    keeps the lab's loop. ``FINAL`` (one split per row): the program stores the row's output
    itself, normalized, at ``acc_ptr`` in that buffer's dtype, and no combine runs (round 12);
    with ``QUANT`` as FP8 with the next GEMM's static scale (``out_s_ptr``), as the lab's combine
    writes it (round 13)."""
    pdl_enter(PDL)
    o, start, hi, q, base, kv_scale = _partial_begin(q_ptr, k_ptr, v_ptr, kv_scale_ptr, n_ctx, nctx_ptr, max_ctx,
                                                     n_splits, qk_scale, H, stride_qb, stride_qh, kn_ptr, vn_ptr,
                                                     stride_kb, stride_kh, stride_vb, stride_vh, D, CHUNK, PER_ROW,
                                                     F16, NEW_KV)
    if F16 and ROWS:
        m_i, l_i, acc = _attend_chunk_rows(q, k_ptr, v_ptr, base, start, hi, D, BLOCK_T, LOOP_STAGES)
    elif F16:
        m_i, l_i, acc = _attend_chunk_lean(q, k_ptr, v_ptr, base, start, hi, D, BLOCK_T, PREFETCH, LOOP_STAGES)
    else:
        m_i, l_i, acc = _attend_chunk(q, k_ptr, v_ptr, base, start, hi, D, BLOCK_T, F16)
    if FINAL:
        out = acc * (kv_scale / l_i)
        if QUANT:
            out = tl.minimum(tl.maximum(out / tl.load(out_s_ptr), -448.0), 448.0)
        tl.store(acc_ptr + o * D + tl.arange(0, D), out.to(acc_ptr.dtype.element_ty))
    else:
        _partial_end(m_ptr, l_ptr, acc_ptr, o, m_i, l_i, acc, kv_scale, D)


def lean_steps_fit(tile: AttnTile, chunk: int) -> bool:
    """Whether :func:`_attend_chunk_lean`'s fp16 output rows cannot overflow: each row adds one
    position per step, each term at most 448 (p <= 1 times an e4m3 value), over at most
    ``(1 + attention.MERGE_TAIL_FRACTION) * chunk / block_t`` steps (the last split runs to the row's end)."""
    return (1 + _attention.MERGE_TAIL_FRACTION) * chunk / tile.block_t * FP8_MAX <= torch.finfo(torch.float16).max


def decode_attention_lean(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_scale: torch.Tensor,
                          n_ctx: int | torch.Tensor, use_triton: bool | None = None, tile: AttnTile = DEFAULT_TILE,
                          out_scale: torch.Tensor | None = None,
                          new_kv: tuple[torch.Tensor, torch.Tensor] | None = None, prefetch: int = 0,
                          maxnreg: int | None = None, loop_stages: int = 0, rows: bool = False,
                          final: bool = False) -> torch.Tensor:
    """:func:`.attention.decode_attention` (same arguments, checks, splits and combine) whose
    partial kernel is :func:`_decode_attn_partial_lean`: round 10's loop on an FP8 cache.
    ``prefetch``: 0, or 1 (the next step's V) or 2 (its K and V) loaded while a step computes;
    ``maxnreg``: :func:`launch_limits`; ``loop_stages``: 0, or the depth of Triton's software
    pipeline over the loop (:func:`_attend_chunk_lean`; with ``prefetch`` 0 only); ``rows``: a
    running max per position row (:func:`_attend_chunk_rows`; with ``prefetch`` 0 only); ``final``:
    one split per row (the tile's chunk covering the context) whose program writes the output
    itself, no combine launched (round 12, at short context; with ``out_scale`` it writes FP8 as the
    lab's combine does, round 13)."""
    if prefetch not in (0, 1, 2):
        raise ValueError(f"prefetch is 0 (none), 1 (the next step's V) or 2 (its K and V); got {prefetch!r}")
    if not (isinstance(loop_stages, int) and 0 <= loop_stages <= 8) or ((loop_stages or rows) and prefetch):
        raise ValueError(f"loop_stages is 0..8, and 0 with a prefetch; got {loop_stages!r} (prefetch {prefetch})")
    per_row, ref = _checks_or_reference(q, k_cache, v_cache, kv_scale, n_ctx, use_triton, out_scale, new_kv)
    if ref is not None:
        return ref
    B, H, _, D = q.shape
    # final: the tile's chunk as it is (one split per row, however few programs that makes)
    chunk = tile.chunk if final else chunk_for(tile, B * H, k_cache.shape[2] if per_row else n_ctx)
    if k_cache.dtype == FP8 and not lean_steps_fit(tile, chunk):
        raise ValueError(f"{tile}: chunk {chunk} over block_t {tile.block_t} steps could overflow the fp16 output rows")
    if final and split_count(k_cache.shape[2] if per_row else n_ctx, chunk) != 1:
        raise ValueError(f"final wants one split per row (chunk {chunk} covering the context)")
    out = (torch.empty(q.shape, dtype=q.dtype if out_scale is None else FP8, device=q.device) if final else None)
    quant = dict(out_s_ptr=out_scale.reshape(1).float(), QUANT=True) if final and out_scale is not None else {}
    m, l, acc, _ = _launch_partial(_decode_attn_partial_lean, q, k_cache, v_cache, kv_scale, n_ctx, per_row, chunk,
                                   tile, out=out, PREFETCH=prefetch, LOOP_STAGES=loop_stages, ROWS=rows,
                                   FINAL=final, **quant, **new_kv_args(new_kv), **launch_limits(maxnreg))
    return out if final else combine_splits(m, l, acc, q, out_scale)
