"""Lab 4's KV-cache kernels: write one decode position into the cache (quantizing for an FP8
cache), and the decode attention that reads the cache in its stored dtype (bf16 or FP8)
without a dequantized copy.

:func:`decode_attention` reads each K and V element once, up to the current position: an FP8
cache moves half the bytes of a bf16 one. It is split over the context (flash-decoding): one
program per (batch x head, chunk of ``AttnTile.chunk`` positions) computes a partial max, sum
and output, and a second kernel combines the chunks, so that a long context with a small batch
still fills the GPU. The tile travels as an :class:`AttnTile` (a frozen value, passed by the
caller: the decoder holds one); how the default was chosen, and the variants that measured
slower, is ``docs/lab04-tuning.md``.

Kernel names avoid the profiler's GEMM words; :mod:`.profile` files ``_decode_attn*`` under
"attention".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hwlab.core import tritonenv  # interpreter on CPU; must precede triton
import triton
import triton.language as tl

from hwlab.labs.fp8.quant import FP8, pdl_args, pdl_enter, quant_static_ref, use_triton_for


@dataclass(frozen=True)
class AttnTile:
    """The decode attention's launch shape.

    ``chunk``: context positions per program (one split of flash-decoding; more splits fill the
    GPU at a small batch, fewer leave less to combine); ``block_t``: positions per loop step (a
    power of two dividing ``chunk``); ``num_warps`` and ``num_stages`` per program. A larger
    ``block_t`` x ``num_warps`` holds more loads in flight but more registers per thread: at
    255 the compiler spills and fewer warps stay resident."""
    #: positions per program: long enough that starting a program and storing its partial is a
    #: small share, short enough that a batch of 4 at 16k context still gives thousands of programs
    chunk: int = 256
    #: positions per loop step: 16 rows of 128 elements per warp keep registers well under 255
    block_t: int = 16
    #: one warp per program: many small programs resident per SM streamed faster than few large ones
    num_warps: int = 1
    #: two stages: the next step's loads in flight while this step's math runs
    num_stages: int = 2

    def __post_init__(self):
        pow2 = lambda n: isinstance(n, int) and n > 0 and n & (n - 1) == 0  # noqa: E731
        if not (pow2(self.block_t) and isinstance(self.chunk, int) and self.chunk > 0
                and self.chunk % self.block_t == 0 and pow2(self.num_warps) and self.num_warps <= 32
                and isinstance(self.num_stages, int) and self.num_stages >= 1):
            raise ValueError(f"{self}: block_t a power of two dividing chunk, num_warps a power of two "
                             "up to 32, num_stages >= 1")


#: whether the attention's kernels launch with programmatic dependent launch where
#: :func:`.quant.set_pdl` has it on: off. The attention's thousands of programs, launched early,
#: wait on SMs that the kernel before them still needs; the decode step measured slower with it at
#: 4k and 32k context, faster only at 512
PDL_ATTENTION = False


def _pdl_args(t: torch.Tensor) -> dict:
    """:func:`.quant.pdl_args` where :data:`PDL_ATTENTION` is on; PDL off otherwise."""
    return pdl_args(t) if PDL_ATTENTION else {"PDL": False}


#: fewest programs a launch should have: about two one-warp programs per resident slot of an
#: H100/H200-class GPU (132 SMs x 16 warps), so that no SM idles while another's loads wait
MIN_PROGRAMS = 2048
#: relative error of the FP8-cache attention against its float32 reference on the same FP8
#: values, from fp16 products and sums alone (the FP8 rounding of the cache is not in it): a
#: few 1e-3; a kernel past this bound has a bug, not rounding
FP8_CACHE_MATH_REL = 5e-3
LOG2E = 1.4426950408889634

#: the tile the lab runs: one warp per program, 16 positions per step, elementwise (the best of
#: the H200 sweeps: ``docs/lab04-tuning.md``; chunks shrink by :func:`chunk_for`)
DEFAULT_TILE = AttnTile()


# ---------------------------------------------------------------- KV write
@triton.jit
def _kv_store_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, s_ptr, pos, pos_ptr, H, stride_kb, stride_kh, stride_vb,
                     stride_vh, max_ctx, D: tl.constexpr, QUANT: tl.constexpr, PER_ROW: tl.constexpr,
                     PDL: tl.constexpr = False):
    pdl_enter(PDL)
    bh = tl.program_id(0)
    if PER_ROW:  # each batch row writes at its own position (continuous batching)
        pos = tl.load(pos_ptr + bh // H)
    _write_new_kv(k_ptr, v_ptr, kc_ptr, vc_ptr, (bh.to(tl.int64) * max_ctx + pos) * D, bh, H, stride_kb, stride_kh,
                  stride_vb, stride_vh, tl.load(s_ptr), D, QUANT)


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
    if not use_triton_for(k, use_triton):
        return kv_store_ref(k, v, k_cache, v_cache, scale, pos)
    if k.stride(3) != 1 or v.stride(3) != 1 or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("kv_store wants unit-stride head dimensions and contiguous caches")
    _kv_store_kernel[(B * H,)](k, v, k_cache, v_cache, scale.reshape(1).float(), 0 if per_row else pos,
                               pos if per_row else k_cache, H,
                               k.stride(0), k.stride(1), v.stride(0), v.stride(1), k_cache.shape[2],
                               D=D, QUANT=k_cache.dtype == FP8, PER_ROW=per_row, **_pdl_args(k))


# ---------------------------------------------------------------- decode attention
@triton.jit
def _decode_attn_partial(
        q_ptr, stride_qb, stride_qh, qk_scale,  # the query (B, H, 1, D) and 1/sqrt(D) * log2(e)
        k_ptr, v_ptr, kv_scale_ptr, max_ctx,  # the caches (B * H, max_ctx, D) and their one scale
        n_ctx, nctx_ptr, H, n_splits,  # the length: one for all rows, or per row (PER_ROW)
        m_ptr, l_ptr, acc_ptr,  # out: each split's partial max, sum and output
        kn_ptr, vn_ptr, stride_kb, stride_kh, stride_vb, stride_vh,  # this step's K, V (NEW_KV)
        D: tl.constexpr, CHUNK: tl.constexpr, BLOCK_T: tl.constexpr, PER_ROW: tl.constexpr,
        F16: tl.constexpr, NEW_KV: tl.constexpr, PDL: tl.constexpr):
    """One (batch, head) query against one CHUNK of its cache: the online softmax over BLOCK_T
    positions a step, elementwise. ``F16`` (an FP8 cache): widened to fp16, which holds every e4m3
    value exactly, and multiplied and summed in fp16 (packed math; ~1e-3 rounding, far below the
    cache's own). ``NEW_KV``: the last split first stores this step's K and V at ``n_ctx - 1``."""
    pdl_enter(PDL)
    sp = tl.program_id(0)  # split fastest: programs launched together read neighbouring chunks
    bh = tl.program_id(1)
    if PER_ROW:
        n_ctx = tl.load(nctx_ptr + bh // H)
    start = sp * CHUNK
    hi = tl.where(sp == n_splits - 1, n_ctx, tl.minimum(start + CHUNK, n_ctx))  # the last split runs to the end
    d = tl.arange(0, D)
    kv_scale = tl.load(kv_scale_ptr)
    # the cache scale and the softmax scale folded into q once: a score is one dot product, in log2 units
    q = tl.load(q_ptr + (bh // H) * stride_qb + (bh % H) * stride_qh + d).to(tl.float32) * (qk_scale * kv_scale)
    q16 = q.to(tl.float16)
    base = bh.to(tl.int64) * max_ctx * D
    if NEW_KV:
        if sp == n_splits - 1:
            _write_new_kv(kn_ptr, vn_ptr, k_ptr, v_ptr, base + (n_ctx - 1) * D, bh, H, stride_kb, stride_kh,
                          stride_vb, stride_vh, kv_scale, D, F16)
        tl.debug_barrier()  # its own stores visible to all its threads before the loop reads them
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros((D,), dtype=tl.float32)
    for t0 in range(start, hi, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        tm = t < hi
        off = base + t[:, None] * D + d[None, :]
        # each element is read once: evict-first keeps it from pushing out what is read again
        k = tl.load(k_ptr + off, mask=tm[:, None], other=0.0, eviction_policy="evict_first")
        v = tl.load(v_ptr + off, mask=tm[:, None], other=0.0, eviction_policy="evict_first")
        if F16:
            s = tl.sum(k.to(tl.float16) * q16[None, :], 1).to(tl.float32)
        else:
            s = tl.sum(k.to(tl.float32) * q[None, :], 1)
        s = tl.where(tm, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new)
        if F16:  # at most BLOCK_T * 448 per sum: fp16 holds it for BLOCK_T <= 128
            pv = tl.sum(p.to(tl.float16)[:, None] * v.to(tl.float16), 0).to(tl.float32)
        else:
            pv = tl.sum(p[:, None] * v.to(tl.float32), 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        acc = acc * alpha + pv
        m_i = m_new
    o = bh * n_splits + sp
    tl.store(m_ptr + o, m_i * 0.6931471805599453)  # log2 units -> natural log, as the combine reads it
    tl.store(l_ptr + o, l_i)
    tl.store(acc_ptr + o * D + d, acc * kv_scale)


@triton.jit
def _write_new_kv(kn_ptr, vn_ptr, k_ptr, v_ptr, dst, bh, H, stride_kb, stride_kh, stride_vb, stride_vh, kv_scale,
                  D: tl.constexpr, F16: tl.constexpr):
    """This step's K and V of one (batch, head) (the QKV projection's output) stored at offset
    ``dst`` of the caches; an FP8 cache (``F16``) gets (x / scale) clamped to +-448, as
    :func:`kv_store` writes it."""
    d = tl.arange(0, D)
    kn = tl.load(kn_ptr + (bh // H) * stride_kb + (bh % H) * stride_kh + d).to(tl.float32)
    vn = tl.load(vn_ptr + (bh // H) * stride_vb + (bh % H) * stride_vh + d).to(tl.float32)
    if F16:
        inv = 1.0 / kv_scale
        kn = tl.minimum(tl.maximum(kn * inv, -448.0), 448.0)
        vn = tl.minimum(tl.maximum(vn * inv, -448.0), 448.0)
    tl.store(k_ptr + dst + d, kn.to(k_ptr.dtype.element_ty))
    tl.store(v_ptr + dst + d, vn.to(v_ptr.dtype.element_ty))


@triton.jit
def _decode_attn_combine(m_ptr, l_ptr, acc_ptr, out_ptr, s_ptr, n_splits,
                         D: tl.constexpr, SPLITS: tl.constexpr, QUANT: tl.constexpr, PDL: tl.constexpr = False):
    """The chunks' partial (max, sum, output) of one (batch, head) rescaled to the common max
    and summed: the softmax over the whole context. ``QUANT``: written as FP8 with the next
    GEMM's static scale (``s_ptr``), the requant that would otherwise be a kernel of its own."""
    pdl_enter(PDL)
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
    if QUANT:
        out = tl.minimum(tl.maximum(out / tl.load(s_ptr), -448.0), 448.0)
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


def check_decode_args(q, k_cache, v_cache, n_ctx) -> bool:
    """Shapes, dtypes and lengths of a decode-attention call (ValueError saying what is wrong);
    returns whether ``n_ctx`` holds per-row lengths."""
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
    return per_row


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     kv_scale: torch.Tensor, n_ctx: int | torch.Tensor, use_triton: bool | None = None,
                     tile: AttnTile = DEFAULT_TILE, out_scale: torch.Tensor | None = None,
                     new_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """One decode query per (batch, head) against a (B, H, max_ctx, D) cache of any dtype.

    ``q``: (B, H, 1, D), may be a strided view; ``kv_scale``: a 0-d float32 tensor (1.0 for a
    bf16 cache). Reads each K/V element once, in its stored dtype; returns (B, H, 1, D) in q's
    dtype. ``n_ctx``: an int, or an int32 tensor (B,) of per-row lengths on the cache's device
    (continuous batching: read on the device so a CUDA graph can replay it; each must be in
    1..T, the caller's to keep; the grid then covers all T positions and empty chunks exit at
    once). ``tile``: the launch shape (:class:`AttnTile`). ``out_scale``: return FP8, (out /
    scale) clamped to +-448, for a GEMM that takes static-scaled FP8 input (the requant done by
    the combine kernel, no launch of its own). ``new_kv``: this step's (k, v), each (B, H, 1, D)
    (may be strided views), written at position ``n_ctx - 1`` first, as :func:`kv_store` would,
    by the attention kernel itself (an int ``n_ctx`` only)."""
    per_row = check_decode_args(q, k_cache, v_cache, n_ctx)
    if new_kv is not None:
        k_new, v_new = new_kv
        if per_row or k_new.shape != q.shape or v_new.shape != q.shape:
            raise ValueError("new_kv is this step's (k, v), each shaped as q (B, H, 1, D), with one length for "
                             f"all rows; got {tuple(k_new.shape)}, {tuple(v_new.shape)}, per-row lengths {per_row}")
        if not use_triton_for(q, use_triton):
            kv_store_ref(k_new, v_new, k_cache, v_cache, kv_scale, n_ctx - 1)
    if not use_triton_for(q, use_triton):
        out = decode_attention_ref(q, k_cache, v_cache, kv_scale, n_ctx)
        return out if out_scale is None else quant_static_ref(out, out_scale)
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("decode_attention reads contiguous (B, H, T, D) caches")
    B, H, _, D = q.shape
    if k_cache.dtype == FP8 and tile.block_t > 128:
        raise ValueError(f"{tile}: an FP8 cache sums block_t products of up to 448 in fp16; keep block_t <= 128")
    n_positions = k_cache.shape[2] if per_row else n_ctx
    chunk = chunk_for(tile, B * H, n_positions)
    n_splits = split_count(n_positions, chunk)
    m, l, acc = split_buffers(q, n_splits)
    if q.stride(3) != 1:
        q = q.contiguous()
    _decode_attn_partial[(n_splits, B * H)](
        q, q.stride(0), q.stride(1), LOG2E / math.sqrt(D),
        k_cache, v_cache, kv_scale.reshape(1).float(), k_cache.shape[2],
        0 if per_row else n_ctx, n_ctx if per_row else m, H, n_splits,
        m, l, acc,
        *new_kv_args(new_kv, q),
        D=D, CHUNK=chunk, BLOCK_T=tile.block_t, PER_ROW=per_row, F16=k_cache.dtype == FP8,
        NEW_KV=new_kv is not None, num_warps=tile.num_warps, num_stages=tile.num_stages, **_pdl_args(q))
    return combine_splits(m, l, acc, q, out_scale)


def split_buffers(q: torch.Tensor, n_splits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The partial max, sum (B * H, n_splits) and output (B * H, n_splits, D), float32, that a
    split decode attention's programs write and :func:`combine_splits` reads."""
    B, H, _, D = q.shape
    m = torch.empty((B * H, n_splits), dtype=torch.float32, device=q.device)
    return m, torch.empty_like(m), torch.empty((B * H, n_splits, D), dtype=torch.float32, device=q.device)


def new_kv_args(new_kv: tuple[torch.Tensor, torch.Tensor] | None, q: torch.Tensor) -> tuple:
    """The partial kernel's arguments that write this step's (k, v) into the cache (``NEW_KV``):
    the two tensors and their batch and head strides; without them, ``q`` in their place (never
    read) and zero strides."""
    if new_kv is None:
        return (q, q, 0, 0, 0, 0)
    k_new, v_new = (t if t.stride(3) == 1 else t.contiguous() for t in new_kv)
    return (k_new, v_new, k_new.stride(0), k_new.stride(1), v_new.stride(0), v_new.stride(1))


def chunk_for(tile: AttnTile, n_rows_heads: int, n_positions: int) -> int:
    """The chunk a launch uses: ``tile.chunk``, halved (down to ``2 * block_t``) while the grid
    would hold fewer than :data:`MIN_PROGRAMS` programs. A short context with few splits leaves
    SMs idle while each program's loads wait; more, shorter chunks keep the loads in flight."""
    chunk = tile.chunk
    while n_rows_heads * triton.cdiv(n_positions, chunk) < MIN_PROGRAMS and chunk >= 4 * tile.block_t:
        chunk //= 2
    return chunk


#: fold a last split of at most this fraction of a chunk into the split before it (see
#: :func:`split_count`; 0 gives every remainder a split of its own): the last program then reads
#: up to 1.25 chunks, a small imbalance next to a program that starts, reads a position and
#: stores a partial result the combine must read back
MERGE_TAIL_FRACTION = 0.25


def split_count(n_positions: int, chunk: int) -> int:
    """How many splits cover ``n_positions`` in chunks of ``chunk``: one per chunk, except that a
    remainder of at most :data:`MERGE_TAIL_FRACTION` of a chunk joins the last full one (a decode
    step at context 4k reads 4097 positions: without this, 1 in 17 programs reads one position,
    and the combine reads 17 splits). The partial kernel's last split runs to the row's end."""
    n = triton.cdiv(n_positions, chunk)
    if n > 1 and n_positions - (n - 1) * chunk <= MERGE_TAIL_FRACTION * chunk:
        n -= 1
    return n


def combine_splits(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, q: torch.Tensor,
                   out_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The (B * H, n_splits) partial maxima ``m``, sums ``l`` and outputs ``acc`` (.., D) of a
    split decode attention, combined into (B, H, 1, D) in q's dtype (one program per row), or
    in FP8 with ``out_scale`` (:func:`decode_attention`)."""
    B, H, _, D = q.shape
    n_splits = m.shape[1]
    out = torch.empty((B, H, 1, D), dtype=q.dtype if out_scale is None else FP8, device=q.device)
    s = out if out_scale is None else out_scale.reshape(1).float()
    _decode_attn_combine[(B * H,)](m, l, acc, out, s, n_splits, D=D, SPLITS=max(2, triton.next_power_of_2(n_splits)),
                                   QUANT=out_scale is not None, **_pdl_args(q))
    return out
