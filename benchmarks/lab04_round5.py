"""Lab 4, round 5 (issue #19): TMA bulk loads for the FP8 decode attention, and where an FP8
decode GEMM's bytes/s is lost.

    python benchmarks/lab04_round5.py OUT.json [--budget-s 300]

Research, not a lab path (a winner moves into ``hwlab.labs.fp8`` with its before/after figure in
``LAB04_NOTES.md``). Timed as in round 3 (``lab04_round3.graph_us``: CUDA graphs over as many
caches or weights as it takes to exceed the 60 MB L2 by far, after a sustained warm-up); each
candidate is checked against the float32 reference on fresh data first.

1. **Attention through the Tensor Memory Accelerator.** Round 4 left the kit's FP8 attention at
   the load-only ceiling of its access pattern (per-thread vector loads into registers, ~96% of
   SDPA's GB/s). Here each K and V tile is one bulk copy (a host-built ``TensorDescriptor`` over
   the (B*H*T, D) cache) into shared memory, multi-buffered by Triton's pipeliner
   (``tl.range(num_stages=...)``): the bytes in flight no longer cost registers. Swept over
   positions per tile, warps, stages and chunk, beside the lab's kernel and SDPA on bf16.
2. **An FP8 GEMM's fixed cost.** For each decode GEMM shape, cuBLAS bf16, ``_scaled_mm``
   tensor-wise FP8 and its swap-AB form at the full and half output width: two sizes give each
   kernel's fixed cost (ramp, tail, epilogue) and its streaming rate, t = fixed + bytes / rate.
   With equal fixed costs and rates, FP8 (half the bytes) can only reach a lower bytes/s than
   bf16; the fit says by how much.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lab04_round3 import (ATTN_BUCKETS, D, FP8, GEMM_SHAPES, H, LOG2E, N_LAYERS, STREAM_BYTES,  # noqa: E402
                          attention_ref, graph_us, rel, save)

T0 = time.time()


@triton.jit
def _attn_tma(q_ptr, k_desc, v_desc, kv_scale_ptr, m_ptr, l_ptr, acc_ptr, n_ctx, nctx_ptr, max_ctx, n_splits,
              qk_scale, H, stride_qb, stride_qh, D: tl.constexpr, CHUNK: tl.constexpr, BLOCK_T: tl.constexpr,
              PER_ROW: tl.constexpr, F16: tl.constexpr, STAGES: tl.constexpr):
    """The lab's partial kernel (``_decode_attn_partial``) with K and V tiles fetched by TMA:
    one bulk copy of BLOCK_T x D per tile, ``STAGES`` tiles in flight. Rows past ``hi`` belong to
    later positions or the next (batch, head) (or lie past the cache, zero-filled): their
    scores are masked and their V zeroed (unwritten FP8 bytes may be NaN)."""
    bh = tl.program_id(0)
    sp = tl.program_id(1)
    start = sp * CHUNK
    if PER_ROW:
        n_ctx = tl.load(nctx_ptr + bh // H)
    hi = tl.minimum(start + CHUNK, n_ctx)
    d = tl.arange(0, D)
    kv_scale = tl.load(kv_scale_ptr)
    q = tl.load(q_ptr + (bh // H) * stride_qb + (bh % H) * stride_qh + d).to(tl.float32) * (qk_scale * kv_scale)
    q16 = q.to(tl.float16)
    row0 = bh * max_ctx
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros((D,), dtype=tl.float32)
    for t0 in tl.range(start, hi, BLOCK_T, num_stages=STAGES):
        k_raw = k_desc.load([row0 + t0, 0])
        v_raw = v_desc.load([row0 + t0, 0])
        tm = t0 + tl.arange(0, BLOCK_T) < hi
        if F16:
            s = tl.sum(k_raw.to(tl.float16) * q16[None, :], 1).to(tl.float32)
        else:
            s = tl.sum(k_raw.to(tl.float32) * q[None, :], 1)
        s = tl.where(tm, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new)
        if F16:
            vv = tl.where(tm[:, None], v_raw.to(tl.float16), 0.0)
            pv = tl.sum(p.to(tl.float16)[:, None] * vv, 0).to(tl.float32)
        else:
            vv = tl.where(tm[:, None], v_raw.to(tl.float32), 0.0)
            pv = tl.sum(p[:, None] * vv, 0)
        acc = acc * alpha + pv
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    o = bh * n_splits + sp
    tl.store(m_ptr + o, m_i * 0.6931471805599453)
    tl.store(l_ptr + o, l_i)
    tl.store(acc_ptr + o * D + d, acc * kv_scale)


def attention_tma(q, kc, vc, kv_scale, n_ctx, chunk=256, block_t=64, num_warps=4, stages=3, descs=None):
    """Split decode attention through :func:`_attn_tma` and the lab's combine; ``descs``: the two
    descriptors, built once per cache (a CUDA graph bakes them in; eager calls may reuse them)."""
    from hwlab.labs.fp8.attention import combine_splits
    B, Hh, T, Dd = kc.shape
    n_splits = triton.cdiv(n_ctx, chunk)
    if descs is None:
        descs = tma_descs(kc, vc, block_t)
    m = torch.empty((B * Hh, n_splits), dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    acc = torch.empty((B * Hh, n_splits, Dd), dtype=torch.float32, device=q.device)
    _attn_tma[(B * Hh, n_splits)](q, descs[0], descs[1], kv_scale.reshape(1).float(), m, l, acc, n_ctx, m, T, n_splits,
                                  LOG2E / math.sqrt(Dd), Hh, q.stride(0), q.stride(1), D=Dd, CHUNK=chunk,
                                  BLOCK_T=block_t, PER_ROW=False, F16=kc.dtype == FP8, STAGES=stages,
                                  num_warps=num_warps)
    return combine_splits(m, l, acc, q)


def tma_descs(kc, vc, block_t):
    B, Hh, T, Dd = kc.shape
    return tuple(TensorDescriptor.from_tensor(c.view(B * Hh * T, Dd), block_shape=[block_t, Dd]) for c in (kc, vc))


@triton.jit
def _attn_v2(q_ptr, k_ptr, v_ptr, kv_scale_ptr, m_ptr, l_ptr, acc_ptr, n_ctx, max_ctx, n_splits, qk_scale, H,
             stride_qb, stride_qh, D: tl.constexpr, CHUNK: tl.constexpr, BLOCK_T: tl.constexpr,
             PREFETCH: tl.constexpr, SPLIT_MAJOR: tl.constexpr):
    """The lab's FP8 partial kernel (fp16 math, evict-first loads) with two variants.
    ``PREFETCH``: the next tile's raw FP8 loads issued before this tile's math (register
    double-buffering: 16 more registers per tensor at 16 positions x 128, one warp).
    ``SPLIT_MAJOR``: the grid's fastest axis is the split, so programs launched together read
    neighbouring chunks of one (batch, head) instead of the same chunk of many."""
    if SPLIT_MAJOR:
        sp = tl.program_id(0)
        bh = tl.program_id(1)
    else:
        bh = tl.program_id(0)
        sp = tl.program_id(1)
    start = sp * CHUNK
    hi = tl.minimum(start + CHUNK, n_ctx)
    d = tl.arange(0, D)
    kv_scale = tl.load(kv_scale_ptr)
    q = tl.load(q_ptr + (bh // H) * stride_qb + (bh % H) * stride_qh + d).to(tl.float32) * (qk_scale * kv_scale)
    q16 = q.to(tl.float16)
    base = bh.to(tl.int64) * max_ctx * D
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros((D,), dtype=tl.float32)
    if PREFETCH:
        t = start + tl.arange(0, BLOCK_T)
        k_nx = tl.load(k_ptr + base + t[:, None] * D + d[None, :], mask=(t < hi)[:, None], other=0.0,
                       eviction_policy="evict_first")
        v_nx = tl.load(v_ptr + base + t[:, None] * D + d[None, :], mask=(t < hi)[:, None], other=0.0,
                       eviction_policy="evict_first")
    for t0 in range(start, hi, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        tm = t < hi
        off = base + t[:, None] * D + d[None, :]
        if PREFETCH:
            k_raw, v_raw = k_nx, v_nx
            mn = (t + BLOCK_T < hi)[:, None]
            k_nx = tl.load(k_ptr + off + BLOCK_T * D, mask=mn, other=0.0, eviction_policy="evict_first")
            v_nx = tl.load(v_ptr + off + BLOCK_T * D, mask=mn, other=0.0, eviction_policy="evict_first")
        else:
            k_raw = tl.load(k_ptr + off, mask=tm[:, None], other=0.0, eviction_policy="evict_first")
            v_raw = tl.load(v_ptr + off, mask=tm[:, None], other=0.0, eviction_policy="evict_first")
        s = tl.sum(k_raw.to(tl.float16) * q16[None, :], 1).to(tl.float32)
        s = tl.where(tm, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new)
        pv = tl.sum(p.to(tl.float16)[:, None] * v_raw.to(tl.float16), 0).to(tl.float32)
        acc = acc * alpha + pv
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    o = bh * n_splits + sp
    tl.store(m_ptr + o, m_i * 0.6931471805599453)
    tl.store(l_ptr + o, l_i)
    tl.store(acc_ptr + o * D + d, acc * kv_scale)


def attention_v2(q, kc, vc, kv_scale, n_ctx, chunk=256, block_t=16, num_warps=1, num_stages=2, prefetch=False,
                 split_major=False):
    from hwlab.labs.fp8.attention import combine_splits
    B, Hh, T, Dd = kc.shape
    n_splits = triton.cdiv(n_ctx, chunk)
    m = torch.empty((B * Hh, n_splits), dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    acc = torch.empty((B * Hh, n_splits, Dd), dtype=torch.float32, device=q.device)
    grid = (n_splits, B * Hh) if split_major else (B * Hh, n_splits)
    _attn_v2[grid](q, kc, vc, kv_scale.reshape(1).float(), m, l, acc, n_ctx, T, n_splits, LOG2E / math.sqrt(Dd), Hh,
                   q.stride(0), q.stride(1), D=Dd, CHUNK=chunk, BLOCK_T=block_t, PREFETCH=prefetch,
                   SPLIT_MAJOR=split_major, num_warps=num_warps, num_stages=num_stages)
    return combine_splits(m, l, acc, q)


def v2_candidates(chunk0):
    c = []
    for ch in sorted({chunk0, 2 * chunk0}):
        for pf in (False, True):
            for sm in (False, True):
                c.append({"chunk": ch, "block_t": 16, "prefetch": pf, "split_major": sm})
    c += [{"chunk": chunk0, "block_t": 32, "prefetch": True, "split_major": False},
          {"chunk": chunk0, "block_t": 16, "num_warps": 2, "prefetch": True, "split_major": False}]
    return c


def attention2_part(out, deadline, rounds=3):
    """Round 5b: register prefetch and grid order against the lab's kernel, interleaved over
    ``rounds`` rounds (each candidate timed once per round; medians over rounds), since
    run-to-run differences of a few % are the size of what is sought."""
    from hwlab.labs.fp8.attention import DEFAULT_TILE, chunk_for, decode_attention
    rows = out["attention_b"] = []
    for ctx, B in ATTN_BUCKETS:
        shape = (B, H, ctx, D)
        kf = [(torch.randn(shape, device="cuda") * 20).to(FP8) for _ in range(N_LAYERS)]
        vf = [(torch.randn(shape, device="cuda") * 20).to(FP8) for _ in range(N_LAYERS)]
        sc = torch.tensor(0.05, device="cuda")
        q = torch.randn(B, H, 1, D, device="cuda").to(torch.bfloat16)
        ref = attention_ref(q, kf[0], vf[0], sc, ctx)
        nb = 2 * B * H * ctx * D
        chunk0 = chunk_for(DEFAULT_TILE, B * H, ctx)
        cands = [("lab", None)] + [("v2", c) for c in v2_candidates(chunk0)]
        fns, errs = {}, {}
        for name, c in cands:
            key = name + (str(sorted(c.items())) if c else "")
            if name == "lab":
                f = lambda i: decode_attention(q, kf[i], vf[i], sc, ctx)  # noqa: E731
            else:
                f = lambda i, c=c: attention_v2(q, kf[i], vf[i], sc, ctx, **c)  # noqa: E731
            try:
                errs[key] = rel(f(0), ref)
                fns[key] = (f, c)
            except Exception as e:
                rows.append({"ctx": ctx, "batch": B, "config": c, "error": f"{type(e).__name__}: {str(e)[:200]}"})
        times = {k: [] for k in fns}
        for _ in range(rounds):
            for k, (f, c) in fns.items():
                if time.time() > deadline:
                    break
                times[k].append(graph_us([lambda i=i, f=f: f(i) for i in range(N_LAYERS)])["us"])
        for k, (f, c) in fns.items():
            if times[k]:
                us = sorted(times[k])[len(times[k]) // 2]
                rows.append({"ctx": ctx, "batch": B, "impl": k.split("[")[0], "config": c, "us_rounds": times[k],
                             "gbps": nb / us / 1e3, "err": errs[k]})
        here = sorted((r for r in rows if r["ctx"] == ctx and "gbps" in r), key=lambda r: -r["gbps"])
        lab = next((r["gbps"] for r in here if r["impl"] == "lab"), float("nan"))
        print(f"attention b ctx {ctx} x{B}: lab fp8 {lab:.0f} GB/s (chunk {chunk0}); medians of {rounds} rounds", flush=True)
        for r in here[:8]:
            spread = [nb / u / 1e3 for u in r["us_rounds"]]
            print(f"   {r['gbps']:.0f} GB/s ({min(spread):.0f}-{max(spread):.0f}) {r['impl']} {r['config']} "
                  f"err {r['err']:.1e}", flush=True)
        del kf, vf
        torch.cuda.empty_cache()
        save(out, out["_path"])


def tma_candidates():
    c = []
    for bt in (32, 64, 128):
        for w in (1, 2, 4):
            for st in (2, 3, 4):
                for ch in (256, 512):
                    if bt * 2 <= ch and not (bt == 128 and w == 1):
                        c.append({"chunk": ch, "block_t": bt, "num_warps": w, "stages": st})
    return c


def attention_part(out, deadline):
    from hwlab.labs.fp8.attention import DEFAULT_TILE, chunk_for, decode_attention
    rows = out["attention"] = []
    cands = tma_candidates()
    for ctx, B in ATTN_BUCKETS:
        shape = (B, H, ctx + 1, D)
        kf = [(torch.randn(shape, device="cuda") * 20).to(FP8) for _ in range(N_LAYERS)]
        vf = [(torch.randn(shape, device="cuda") * 20).to(FP8) for _ in range(N_LAYERS)]
        sc = torch.tensor(0.05, device="cuda")
        q = torch.randn(B, H, 1, D, device="cuda").to(torch.bfloat16)
        ref = attention_ref(q, kf[0], vf[0], sc, ctx + 1)
        nb = 2 * B * H * (ctx + 1) * D
        base = {"ctx": ctx, "batch": B, "fp8_bytes": nb}
        kb = [(k.float() * 0.05).to(torch.bfloat16) for k in kf[:4]]
        vb = [(v.float() * 0.05).to(torch.bfloat16) for v in vf[:4]]
        r = graph_us([lambda i=i: F.scaled_dot_product_attention(q, kb[i % 4], vb[i % 4]) for i in range(N_LAYERS)])
        rows.append({**base, "impl": "sdpa bf16", **r, "gbps": 2 * nb / r["us"] / 1e3,
                     "err": rel(F.scaled_dot_product_attention(q, kb[0], vb[0]), ref)})
        del kb, vb
        r = graph_us([lambda i=i: decode_attention(q, kf[i], vf[i], sc, ctx + 1) for i in range(N_LAYERS)])
        rows.append({**base, "impl": "lab fp8", "config": {"chunk": chunk_for(DEFAULT_TILE, B * H, ctx + 1)}, **r,
                     "gbps": nb / r["us"] / 1e3, "err": rel(decode_attention(q, kf[0], vf[0], sc, ctx + 1), ref)})
        for c in cands:
            if time.time() > deadline:
                out["notes"].append(f"attention out of time at ctx {ctx}")
                break
            try:
                descs = [tma_descs(kf[i], vf[i], c["block_t"]) for i in range(N_LAYERS)]
                err = rel(attention_tma(q, kf[0], vf[0], sc, ctx + 1, descs=descs[0], **c), ref)
                r = graph_us([lambda i=i: attention_tma(q, kf[i], vf[i], sc, ctx + 1, descs=descs[i], **c)
                              for i in range(N_LAYERS)])
                rows.append({**base, "impl": "tma fp8", "config": c, **r, "gbps": nb / r["us"] / 1e3, "err": err})
            except Exception as e:  # compile failure, resources: reported, not fatal
                rows.append({**base, "impl": "tma fp8", "config": c, "error": f"{type(e).__name__}: {str(e)[:200]}"})
        here = [r for r in rows if r["ctx"] == ctx]
        sd = next(r["gbps"] for r in here if r["impl"] == "sdpa bf16")
        lab = next(r["gbps"] for r in here if r["impl"] == "lab fp8")
        ok = sorted((r for r in here if r["impl"] == "tma fp8" and "gbps" in r), key=lambda r: -r["gbps"])
        bad = [r for r in here if "error" in r]
        print(f"attention ctx {ctx} x{B}: sdpa bf16 {sd:.0f} GB/s, lab fp8 {lab:.0f}"
              + (f", {len(bad)} failed: {bad[0]['error'][:160]}" if bad else ""), flush=True)
        for r in ok[:8]:
            print(f"   tma {r['gbps']:.0f} GB/s (p10-p90 {nb / r['p90_us'] / 1e3:.0f}-{nb / r['p10_us'] / 1e3:.0f}) "
                  f"err {r['err']:.1e} {r['config']}", flush=True)
        del kf, vf
        torch.cuda.empty_cache()
        save(out, out["_path"])


def gemm_part(out, deadline):
    rows = out["gemm"] = []
    for name, (N, Kd) in GEMM_SHAPES.items():
        for frac in (1, 2):
            if time.time() > deadline:
                out["notes"].append(f"gemm out of time at {name}")
                save(out, out["_path"])
                return
            n = N // frac
            n_copies = max(4, min(96, math.ceil(STREAM_BYTES / (n * Kd))))
            wq = [(torch.randn(n, Kd, device="cuda") * 0.02).to(FP8) for _ in range(n_copies)]
            ws = torch.tensor(0.01, device="cuda")
            for M in (16, 4):
                x = torch.randn(M, Kd, device="cuda").to(torch.bfloat16)
                xs = x.abs().amax().float() / 448
                xq = (x.float() / xs).to(FP8)
                xq16 = torch.zeros(16, Kd, device="cuda", dtype=FP8)
                xq16[:M] = xq
                ref = x.float() @ (wq[0].float() * 0.01).t()
                base = {"shape": name, "M": M, "N": n, "K": Kd, "width": f"1/{frac}", "copies": n_copies}
                wb = [w.to(torch.bfloat16) for w in wq[: max(2, n_copies // 2)]]
                r = graph_us([lambda w=w: F.linear(x, w) for w in wb])
                rows.append({**base, "impl": "cublas bf16", **r, "bytes": n * Kd * 2})
                del wb
                f = lambda w: torch._scaled_mm(xq, w.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)  # noqa: E731
                g = lambda w: torch._scaled_mm(w, xq16.t(), scale_a=ws, scale_b=xs, out_dtype=torch.bfloat16)  # noqa: E731
                for impl, fn, err in (("scaled_mm", f, rel(f(wq[0]), ref)),
                                      ("swapAB scaled_mm", g, rel(g(wq[0])[:, :M].t(), ref))):
                    r = graph_us([lambda w=w: fn(w) for w in wq])
                    rows.append({**base, "impl": impl, **r, "bytes": n * Kd, "err": err})
            del wq
            torch.cuda.empty_cache()
    for r in rows:
        r["gbps"] = r["bytes"] / r["us"] / 1e3
    fits = out["gemm_fit"] = []
    for name in GEMM_SHAPES:
        for M in (16, 4):
            for impl in ("cublas bf16", "scaled_mm", "swapAB scaled_mm"):
                pair = [r for r in rows if r["shape"] == name and r["M"] == M and r["impl"] == impl]
                if len(pair) != 2:
                    continue
                full, half = sorted(pair, key=lambda r: -r["bytes"])
                rate = (full["bytes"] - half["bytes"]) / (full["us"] - half["us"]) / 1e3  # GB/s
                fixed = full["us"] - full["bytes"] / rate / 1e3
                fits.append({"shape": name, "M": M, "impl": impl, "fixed_us": fixed, "stream_gbps": rate,
                             "full_gbps": full["gbps"], "full_us": full["us"]})
                print(f"gemm {name} M={M} {impl}: {full['us']:.1f} us at full width ({full['gbps']:.0f} GB/s); "
                      f"fit: fixed {fixed:.1f} us + bytes at {rate:.0f} GB/s", flush=True)
    save(out, out["_path"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--part", choices=("a", "b"), default="a",
                    help="a: TMA attention and the GEMM fit (results/round5/lab04_round5_h200.json); "
                         "b: register prefetch and grid order, interleaved rounds")
    a = ap.parse_args()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "notes": [], "_path": a.out}
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t = time.time()
    while time.time() - t < 1.0:  # sustained warm-up: clocks settle
        x @ x
    torch.cuda.synchronize()
    del x
    out["part"] = a.part
    if a.part == "a":
        attention_part(out, T0 + 0.7 * a.budget_s)
        gemm_part(out, T0 + a.budget_s)
    else:
        attention2_part(out, T0 + a.budget_s)
    out["elapsed_s"] = time.time() - T0
    out.pop("_path")
    save(out, a.out)


if __name__ == "__main__":
    sys.exit(main())
