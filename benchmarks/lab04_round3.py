"""Lab 4, round 3 (issue #19): what keeps the fixed path's decode above its byte floor.

    python benchmarks/lab04_round3.py OUT.json [--budget-s 360]

Research, not a lab path: the candidates live here; a winner moves into the lab's kernels with its
before/after figure in ``LAB04_NOTES.md``. Everything is timed the way a decode step runs it: in a
CUDA graph, over as many caches or weights as it takes to exceed the 60 MB L2 by far, after a
sustained warm-up; each candidate is first checked against a float32 reference on fresh data.

1. **Attention, where the time goes.** For each Lab 4 bucket: SDPA on the bf16 cache (what a user
   would pick), then one Triton kernel in several forms that differ in one thing each:
   ``LOADONLY`` (the same loads, a trivial use: the streaming ceiling of this access pattern),
   ``F16`` (FP8 widened to fp16, products and sums in fp16, against fp32), ``EVICT`` (loads marked
   evict-first: streamed data need not stay in L2), tile (positions per step), chunk and warps.
   The difference between LOADONLY and the full kernel is the kernel's arithmetic cost.
2. **Decode GEMMs.** M = 16 and 4 rows at the decoder's shapes: cuBLAS bf16, ``_scaled_mm``
   tensor-wise FP8 with and without fast accumulation, and swap-AB (weight as the first operand,
   the few activation rows padded to 16 as the second), which changes cuBLAS's tiling.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


FP8 = torch.float8_e4m3fn
LOG2E = 1.4426950408889634
dev = torch.device("cuda")
T0 = time.time()
ATTN_BUCKETS, H, D, N_LAYERS = ((4096, 16), (32768, 4), (512, 16)), 32, 128, 8
GEMM_SHAPES = {"qkv": (12288, 4096), "out": (4096, 4096), "up": (14336, 4096), "down": (4096, 14336)}
STREAM_BYTES = 1.5e9


@triton.jit
def _attn(q_ptr, k_ptr, v_ptr, kv_scale_ptr, m_ptr, l_ptr, acc_ptr, n_ctx, max_ctx, n_splits, qk_scale,
          H, stride_qb, stride_qh, cnt_ptr, out_ptr, D: tl.constexpr, CHUNK: tl.constexpr, BLOCK_T: tl.constexpr,
          F16: tl.constexpr, EVICT: tl.constexpr, LOADONLY: tl.constexpr, FUSE: tl.constexpr, SPLITS: tl.constexpr):
    """One (row, head) query against one CHUNK of the cache: partial max (log2 domain), sum, output."""
    bh = tl.program_id(0)
    sp = tl.program_id(1)
    start = sp * CHUNK
    hi = tl.minimum(start + CHUNK, n_ctx)
    d = tl.arange(0, D)
    kv_scale = tl.load(kv_scale_ptr)
    q = tl.load(q_ptr + (bh // H) * stride_qb + (bh % H) * stride_qh + d).to(tl.float32) * (qk_scale * kv_scale)
    qh = q.to(tl.float16)
    base = bh.to(tl.int64) * max_ctx * D
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros((D,), dtype=tl.float32)
    for t0 in range(start, hi, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        tm = t < hi
        off = base + t[:, None] * D + d[None, :]
        if EVICT:
            k_raw = tl.load(k_ptr + off, mask=tm[:, None], other=0.0, eviction_policy="evict_first")
            v_raw = tl.load(v_ptr + off, mask=tm[:, None], other=0.0, eviction_policy="evict_first")
        else:
            k_raw = tl.load(k_ptr + off, mask=tm[:, None], other=0.0)
            v_raw = tl.load(v_ptr + off, mask=tm[:, None], other=0.0)
        if LOADONLY:
            acc = tl.maximum(acc, tl.max(k_raw.to(tl.float16) + v_raw.to(tl.float16), 0).to(tl.float32))
            l_i += 1.0
            m_i = 0.0
        else:
            if F16:
                s = tl.sum(k_raw.to(tl.float16) * qh[None, :], 1).to(tl.float32)
            else:
                s = tl.sum(k_raw.to(tl.float32) * q[None, :], 1)
            s = tl.where(tm, s, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, 0))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new)
            if F16:
                pv = tl.sum(p.to(tl.float16)[:, None] * v_raw.to(tl.float16), 0).to(tl.float32)
            else:
                pv = tl.sum(p[:, None] * v_raw.to(tl.float32), 0)
            acc = acc * alpha + pv
            l_i = l_i * alpha + tl.sum(p, 0)
            m_i = m_new
    o = bh * n_splits + sp
    tl.store(m_ptr + o, m_i)
    tl.store(l_ptr + o, l_i)
    tl.store(acc_ptr + o * D + d, acc * kv_scale)
    if FUSE:  # the last program of this (row, head) combines the partials: no second launch
        tl.debug_barrier()  # every thread's stores are issued before the counter's release
        if tl.atomic_add(cnt_ptr + bh, 1) == n_splits - 1:  # acq_rel: the other programs' stores are visible
            spl = tl.arange(0, SPLITS)
            sm = spl < n_splits
            mm = tl.load(m_ptr + bh * n_splits + spl, mask=sm, other=-float("inf"), cache_modifier=".cg")
            ll = tl.load(l_ptr + bh * n_splits + spl, mask=sm, other=0.0, cache_modifier=".cg")
            aa = tl.load(acc_ptr + (bh * n_splits + spl)[:, None] * D + d[None, :], mask=sm[:, None], other=0.0,
                         cache_modifier=".cg")
            w = tl.where(sm, tl.exp2(mm - tl.max(mm, 0)), 0.0)
            tl.store(out_ptr + bh * D + d, (tl.sum(w[:, None] * aa, 0) / tl.sum(w * ll, 0)).to(out_ptr.dtype.element_ty))
            tl.store(cnt_ptr + bh, 0)


@triton.jit
def _combine(m_ptr, l_ptr, acc_ptr, out_ptr, n_splits, D: tl.constexpr, SPLITS: tl.constexpr):
    bh = tl.program_id(0)
    sp = tl.arange(0, SPLITS)
    sm = sp < n_splits
    d = tl.arange(0, D)
    m = tl.load(m_ptr + bh * n_splits + sp, mask=sm, other=-float("inf"))
    l = tl.load(l_ptr + bh * n_splits + sp, mask=sm, other=0.0)
    acc = tl.load(acc_ptr + (bh * n_splits + sp)[:, None] * D + d[None, :], mask=sm[:, None], other=0.0)
    w = tl.where(sm, tl.exp2(m - tl.max(m, 0)), 0.0)
    tl.store(out_ptr + bh * D + d, (tl.sum(w[:, None] * acc, 0) / tl.sum(w * l, 0)).to(out_ptr.dtype.element_ty))


def attention(q, kc, vc, kv_scale, n_ctx, chunk=256, block_t=32, num_warps=1, f16=False, evict=False,
              loadonly=False, num_stages=1, fuse=False):
    B, Hh, _, Dd = q.shape
    n_splits = triton.cdiv(n_ctx, chunk)
    splits = max(2, triton.next_power_of_2(n_splits))
    out = torch.empty((B, Hh, 1, Dd), dtype=q.dtype, device=q.device)
    cnt = _counters(q.device, B * Hh)
    m = torch.empty((B * Hh, n_splits), dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    acc = torch.empty((B * Hh, n_splits, Dd), dtype=torch.float32, device=q.device)
    _attn[(B * Hh, n_splits)](q, kc, vc, kv_scale, m, l, acc, n_ctx, kc.shape[2], n_splits,
                              LOG2E / math.sqrt(Dd), Hh, q.stride(0), q.stride(1), cnt, out, D=Dd, CHUNK=chunk,
                              BLOCK_T=block_t, F16=f16, EVICT=evict, LOADONLY=loadonly, FUSE=fuse,
                              SPLITS=splits, num_warps=num_warps, num_stages=num_stages)
    if not fuse:
        _combine[(B * Hh,)](m, l, acc, out, n_splits, D=Dd, SPLITS=splits)
    return out


_COUNTERS: dict = {}


def _counters(device, n):
    """Zeroed int32 counters, kept per device: the kernels leave them zeroed (graph-safe)."""
    c = _COUNTERS.get(str(device))
    if c is None or c.numel() < n:
        c = _COUNTERS[str(device)] = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
    return c


@triton.jit
def _w8a8(w_ptr, x_ptr, y_ptr, ws_ptr, cnt_ptr, sw_ptr, sx_ptr, M, N, K, stride_w, stride_x, stride_y,
          BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr, STAGES: tl.constexpr):
    """y[M, N] = (x[M, K] @ w[N, K].T) * sw * sx, both FP8, on the FP8 tensor cores; the weight is
    the MMA's A operand (BN rows) and the few activation rows its B (BM columns): swap-AB."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    rm = tl.arange(0, BM)
    k_per = K // SPLIT_K
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    for k0 in tl.range(pid_k * k_per, (pid_k + 1) * k_per, BK, num_stages=STAGES):
        kk = k0 + tl.arange(0, BK)
        w = tl.load(w_ptr + rn[:, None] * stride_w + kk[None, :])
        x = tl.load(x_ptr + rm[:, None] * stride_x + kk[None, :], mask=(rm < M)[:, None], other=0.0)
        acc = tl.dot(w, tl.trans(x), acc)
    part = tl.trans(acc) * (tl.load(sw_ptr) * tl.load(sx_ptr))
    y_off = rm[:, None] * stride_y + rn[None, :]
    msk = (rm[:, None] < M) & (rn[None, :] < N)
    if SPLIT_K == 1:
        tl.store(y_ptr + y_off, part.to(y_ptr.dtype.element_ty), mask=msk)
    else:
        w_off = rm[:, None] * N + rn[None, :]
        tl.atomic_add(ws_ptr + w_off, part, mask=msk)
        tl.debug_barrier()
        if tl.atomic_add(cnt_ptr + pid_n, 1) == SPLIT_K - 1:
            total = tl.load(ws_ptr + w_off, mask=msk, other=0.0, cache_modifier=".cg")
            tl.store(y_ptr + y_off, total.to(y_ptr.dtype.element_ty), mask=msk)
            tl.store(ws_ptr + w_off, tl.zeros((BM, BN), dtype=tl.float32), mask=msk)
            tl.store(cnt_ptr + pid_n, 0)


_WS: dict = {}


def w8a8(xq, w, sx, sw, bn=128, bk=128, split_k=4, stages=4, num_warps=4):
    M, Kd = xq.shape
    N = w.shape[0]
    assert Kd % (bk * split_k) == 0 and N % bn == 0
    y = torch.empty((M, N), dtype=torch.bfloat16, device=xq.device)
    key = str(xq.device)
    ws = _WS.get(key)
    if ws is None or ws.numel() < 16 * N:
        ws = _WS[key] = torch.zeros(16 * max(N, 16384), dtype=torch.float32, device=xq.device)
    cnt = _counters(xq.device, N // bn)
    _w8a8[(N // bn, split_k)](w, xq, y, ws, cnt, sw, sx, M, N, Kd, w.stride(0), xq.stride(0), y.stride(0),
                              BN=bn, BM=16, BK=bk, SPLIT_K=split_k, STAGES=stages, num_warps=num_warps)
    return y


def attention_ref(q, kc, vc, kv_scale, n_ctx):
    k = kc[:, :, :n_ctx].float() * kv_scale
    v = vc[:, :, :n_ctx].float() * kv_scale
    s = (k * q.float()).sum(-1) / math.sqrt(q.shape[-1])
    return (torch.softmax(s, dim=-1).unsqueeze(-1) * v).sum(-2, keepdim=True)


def graph_us(calls, n_rep=10):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    t_end = time.time() + 0.05
    while time.time() < t_end:  # warm-up to a sustained state
        g.replay()
        torch.cuda.synchronize()
    ms = []
    # device events around each replay: hwlab.core.measure.time_fn's protocol, inlined because the
    # script ran while the kit was being refactored (#16); results/lab04_round3*.json came from
    # this code, so it stays as it ran (the kit's own helper is hwlab.core.measure_graph.graph_time)
    for _ in range(n_rep):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    del g
    ms.sort()
    n = len(calls)
    pick = lambda f: ms[min(len(ms) - 1, round(f * (len(ms) - 1)))] * 1e3 / n  # noqa: E731
    return {"us": pick(0.5), "p10_us": pick(0.1), "p90_us": pick(0.9)}


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def save(out, path):
    with open(path + ".tmp", "w") as f:
        json.dump(out, f, indent=1)
    os.replace(path + ".tmp", path)


def attention_candidates():
    c = [{"chunk": 256, "block_t": 32, "num_warps": 1}]  # round 2's tile, fp32 math: the baseline
    c += [{"chunk": 256, "block_t": 32, "num_warps": 1, "loadonly": True},
          {"chunk": 256, "block_t": 16, "num_warps": 1, "loadonly": True},
          {"chunk": 512, "block_t": 32, "num_warps": 1, "loadonly": True, "evict": True}]
    for f16 in (False, True):
        for evict in (False, True):
            for bt, w in ((16, 1), (32, 1), (64, 1), (32, 2), (64, 2)):
                for ch in (256, 512):
                    if f16 or evict or (bt, w, ch) != (32, 1, 256):
                        c.append({"chunk": ch, "block_t": bt, "num_warps": w, "f16": f16, "evict": evict})
    c += [{"chunk": 1024, "block_t": 32, "num_warps": 1, "f16": True, "evict": True},
          {"chunk": 128, "block_t": 32, "num_warps": 1, "f16": True, "evict": True},
          {"chunk": 256, "block_t": 32, "num_warps": 1, "f16": True, "evict": True, "num_stages": 3}]
    return c


def attention_candidates_b():
    """Round 3b: round 3a's winner (fp16 math, evict-first, 1 warp), with the combine fused into the
    partial kernel (one launch per layer), over chunk and tile; the 3a winner unfused for reference."""
    c = [{"chunk": 256, "block_t": 16, "num_warps": 1, "f16": True, "evict": True}]
    for ch in (64, 128, 256, 512):
        for bt in (16, 32):
            c.append({"chunk": ch, "block_t": bt, "num_warps": 1, "f16": True, "evict": True, "fuse": True})
    c += [{"chunk": 256, "block_t": 16, "num_warps": 1, "f16": True, "evict": True, "fuse": True, "loadonly": True},
          {"chunk": 128, "block_t": 16, "num_warps": 1, "f16": False, "evict": True, "fuse": True},
          {"chunk": 256, "block_t": 16, "num_warps": 2, "f16": True, "evict": True, "fuse": True}]
    return c


def attention_part(out, deadline, candidates=None):
    candidates = candidates or attention_candidates()
    rows = out["attention"] = []
    for ctx, B in ATTN_BUCKETS:
        shape = (B, H, ctx + 1, D)
        kf = [(torch.randn(shape, device=dev) * 20).to(FP8) for _ in range(N_LAYERS)]
        vf = [(torch.randn(shape, device=dev) * 20).to(FP8) for _ in range(N_LAYERS)]
        sc = torch.tensor(0.05, device=dev)
        q = torch.randn(B, H, 1, D, device=dev).to(torch.bfloat16)
        ref = attention_ref(q, kf[0], vf[0], sc, ctx + 1)
        nb = 2 * B * H * (ctx + 1) * D
        base = {"ctx": ctx, "batch": B, "fp8_bytes": nb}
        kb = [(k.float() * 0.05).to(torch.bfloat16) for k in kf[:2]]
        vb = [(v.float() * 0.05).to(torch.bfloat16) for v in vf[:2]]
        r = graph_us([lambda i=i: F.scaled_dot_product_attention(q, kb[i % 2], vb[i % 2]) for i in range(N_LAYERS)])
        rows.append({**base, "impl": "sdpa bf16", **r, "gbps": 2 * nb / r["us"] / 1e3,
                     "err": rel(F.scaled_dot_product_attention(q, kb[0], vb[0]), ref)})
        r = graph_us([lambda i=i: attention(q, kb[i % 2], vb[i % 2], torch.ones((), device=dev), ctx + 1)
                      for i in range(N_LAYERS)])
        rows.append({**base, "impl": "kit bf16 (round-2 tile)", **r, "gbps": 2 * nb / r["us"] / 1e3,
                     "err": rel(attention(q, kb[0], vb[0], torch.ones((), device=dev), ctx + 1), ref)})
        del kb, vb
        for c in candidates:
            if time.time() > deadline:
                out["notes"].append(f"attention out of time at ctx {ctx}")
                break
            try:
                err = None if c.get("loadonly") else rel(attention(q, kf[0], vf[0], sc, ctx + 1, **c), ref)
                r = graph_us([lambda i=i: attention(q, kf[i], vf[i], sc, ctx + 1, **c) for i in range(N_LAYERS)])
                rows.append({**base, "impl": "kit fp8", "config": c, **r, "gbps": nb / r["us"] / 1e3, "err": err})
            except Exception as e:  # compile failure, resources: reported, not fatal
                rows.append({**base, "impl": "kit fp8", "config": c, "error": str(e)[:200]})
        sd = next(r["gbps"] for r in rows if r["ctx"] == ctx and r["impl"] == "sdpa bf16")
        ok = sorted((r for r in rows if r["ctx"] == ctx and "gbps" in r and r["impl"] == "kit fp8"),
                    key=lambda r: -r["gbps"])
        print(f"attention ctx {ctx} x{B}: sdpa bf16 {sd:.0f} GB/s", flush=True)
        for r in ok[:8]:
            print(f"   {r['gbps']:.0f} GB/s err {r['err']} {r['config']}", flush=True)
        base_row = next((r for r in ok if r["config"] == candidates[0]), None)
        if base_row:
            print(f"   reference candidate {candidates[0]}: {base_row['gbps']:.0f} GB/s", flush=True)
        del kf, vf
        torch.cuda.empty_cache()
        save(out, out["_path"])


W8A8_CONFIGS = [{"bn": bn, "bk": bk, "split_k": sk, "stages": st, "num_warps": w}
                for bn, bk, sk, st, w in ((128, 128, 4, 4, 4), (128, 128, 8, 4, 4), (128, 256, 4, 3, 4),
                                          (64, 128, 4, 4, 4), (64, 256, 4, 4, 4), (64, 128, 8, 6, 4),
                                          (128, 128, 2, 4, 4), (128, 256, 2, 4, 8), (256, 128, 4, 3, 8),
                                          (64, 256, 8, 3, 4), (128, 128, 1, 6, 4), (64, 128, 2, 6, 4))]


def gemm_part(out, deadline, w8a8_configs=()):
    rows = out["gemm"] = []
    for name, (N, Kd) in GEMM_SHAPES.items():
        if time.time() > deadline:
            out["notes"].append(f"gemm out of time at {name}")
            break
        n_copies = max(4, min(96, math.ceil(STREAM_BYTES / (N * Kd))))
        wq = [(torch.randn(N, Kd, device=dev) * 0.02).to(FP8) for _ in range(n_copies)]
        ws = torch.tensor(0.01, device=dev)
        for M in (16, 4):
            x = torch.randn(M, Kd, device=dev).to(torch.bfloat16)
            xs = x.abs().amax().float() / 448
            xq = (x.float() / xs).to(FP8)
            xq16 = torch.zeros(16, Kd, device=dev, dtype=FP8)
            xq16[:M] = xq
            ref = (x.float() @ (wq[0].float() * 0.01).t())
            base = {"shape": name, "M": M, "N": N, "K": Kd, "copies": n_copies}
            wb = [w.to(torch.bfloat16) for w in wq[: max(2, n_copies // 2)]]
            r = graph_us([lambda w=w: F.linear(x, w) for w in wb])
            rows.append({**base, "impl": "cublas bf16", **r, "gbps": N * Kd * 2 / r["us"] / 1e3})
            del wb
            for fast in (False, True):
                f = lambda w, fast=fast: torch._scaled_mm(xq, w.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16,  # noqa: E731
                                                          use_fast_accum=fast)
                r = graph_us([lambda w=w: f(w) for w in wq])
                rows.append({**base, "impl": f"scaled_mm{' fast' if fast else ''}", **r,
                             "gbps": N * Kd / r["us"] / 1e3, "err": rel(f(wq[0]), ref)})
                g = lambda w, fast=fast: torch._scaled_mm(w, xq16.t(), scale_a=ws, scale_b=xs,  # noqa: E731
                                                          out_dtype=torch.bfloat16, use_fast_accum=fast)
                r = graph_us([lambda w=w: g(w) for w in wq])
                rows.append({**base, "impl": f"swapAB scaled_mm{' fast' if fast else ''}", **r,
                             "gbps": N * Kd / r["us"] / 1e3, "err": rel(g(wq[0])[:, :M].t(), ref)})
            for c in w8a8_configs:
                if time.time() > deadline:
                    out["notes"].append(f"w8a8 out of time at {name} M={M}")
                    break
                try:
                    err = rel(w8a8(xq, wq[0], xs.reshape(1), ws.reshape(1), **c), ref)
                    r = graph_us([lambda w=w: w8a8(xq, w, xs.reshape(1), ws.reshape(1), **c) for w in wq])
                    rows.append({**base, "impl": "kit w8a8 swapAB", "config": c, **r, "gbps": N * Kd / r["us"] / 1e3,
                                 "err": err})
                except Exception as e:  # shapes it cannot tile, resources: reported
                    rows.append({**base, "impl": "kit w8a8 swapAB", "config": c, "error": str(e)[:200]})
            best = max((r for r in rows if r["shape"] == name and r["M"] == M and "gbps" in r), key=lambda r: r["gbps"])
            line = ", ".join(f"{r['impl']} {r['gbps']:.0f}" for r in rows if r["shape"] == name and r["M"] == M
                             and "gbps" in r and "config" not in r)
            kit = sorted((r for r in rows if r["shape"] == name and r["M"] == M and "config" in r and "gbps" in r),
                         key=lambda r: -r["gbps"])[:3]
            errs = [r for r in rows if r["shape"] == name and r["M"] == M and "error" in r]
            print(f"gemm {name} M={M}: {line} GB/s; best {best['impl']} {best.get('config', '')}; kit top "
                  + "; ".join(f"{r['gbps']:.0f} err {r['err']:.1e} {r['config']}" for r in kit)
                  + (f"; {len(errs)} failed: {errs[0]['error'][:120]}" if errs else ""), flush=True)
        del wq
        torch.cuda.empty_cache()
    save(out, out["_path"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--budget-s", type=float, default=360)
    ap.add_argument("--round", choices=("a", "b"), default="b",
                    help="a: first sweep (results/lab04_round3_h200.json); b: fused combine + the kit's W8A8")
    a = ap.parse_args()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "notes": [], "_path": a.out}
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    t = time.time()
    while time.time() - t < 1.0:  # sustained warm-up: clocks settle
        x @ x
    torch.cuda.synchronize()
    del x
    out["round"] = a.round
    if a.round == "a":
        gemm_part(out, T0 + 0.25 * a.budget_s)
        attention_part(out, T0 + a.budget_s)
    else:
        gemm_part(out, T0 + 0.6 * a.budget_s, W8A8_CONFIGS)
        attention_part(out, T0 + a.budget_s, attention_candidates_b())
    out["elapsed_s"] = time.time() - T0
    out.pop("_path")
    save(out, a.out)


if __name__ == "__main__":
    sys.exit(main())
