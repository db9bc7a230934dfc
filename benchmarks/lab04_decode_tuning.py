"""Lab 4, decode tuning on a GPU: why the fixed path's decode misses its byte floor.

    python benchmarks/lab04_decode_tuning.py OUT.json [--budget-s 420] [--skip-model]

Candidates come from ``lab04_decode_tuning_configs.json`` (now round 2's list; round 1's is kept
in its result, ``results/lab04_decode_tuning_h200_round1.json``, under ``candidates``). A result's
``best_attn`` feeds ``HWLAB_LAB04_TUNED=OUT.json refresh_gpu_evidence.py --only lab04`` (an
elementwise, non-prefetching winner only: the lab's kernel has no other variant), which records
the tile it ran; ``attention.DEFAULT_TILE`` is then set to it (a test checks). ``best_w8`` is
research (:mod:`hwlab.labs.fp8.research`, no lab path runs the W8A16 kernel).

The recorded run (2026-12-02) left the fixed path at 48-58% of the copy ceiling. A static
sm_90a compile (no GPU) showed why the kit's kernels might stream slowly: the FP8 attention's
chosen tile (128 positions x 128 dims, 4 warps) uses 255 registers and spills, so few warps
are resident to keep loads in flight; and the W8A16 GEMM's tile had been picked by
``triton.autotune``, which re-reads one weight that then sits in L2. So everything here is
timed the way a decode step runs it: in a CUDA graph, over as many weight (or KV) copies as
it takes to exceed L2 by far, after a sustained warm-up; medians and p10/p90 per candidate,
each candidate first checked against a float32 reference on fresh random data.

Parts, each bounded by a share of ``--budget-s`` (a part out of time stops and says so):
1. decode GEMMs (M = 16 and 4): cuBLAS bf16, ``_scaled_mm`` tensor-wise FP8, and W8A16 tiles;
2. FP8 decode attention at the Lab 4 buckets: SDPA on bf16 for reference, the kit's kernel
   over tile x warps x chunk, elementwise or on the tensor cores (``USE_DOT``);
3. the model: bf16 and fixed decoders at H200 size with the best tile and attention config,
   TPOT per bucket (graph) and the per-category kernel time of one step.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import dataclasses

import torch
import torch.nn.functional as F

from hwlab.labs import fp8 as L
from hwlab.labs.fp8 import kernels as K
from hwlab.labs.fp8 import research as R
from hwlab.core.measure import time_fn

dev = torch.device("cuda")
T0 = time.time()
#: the H200 decoder's decode GEMMs (N, K) and attention buckets (ctx, batch); weights are
#: rotated over at least STREAM_BYTES so that none is re-read from the 60 MB L2
GEMM_SHAPES = {"qkv": (12288, 4096), "out/connector": (4096, 4096), "up": (14336, 4096), "down": (4096, 14336)}
ATTN_BUCKETS, ATTN_HEADS = ((4096, 16), (32768, 4), (512, 16)), 32
STREAM_BYTES = 1.5e9
MODEL_BUCKETS = ((512, 16), (4096, 16), (32768, 4))
MODEL_CFG = None


def graph_us(calls, n_rep=10):
    """Median/p10/p90 microseconds per call of ``calls`` (a list of thunks) replayed in one
    CUDA graph (launch overhead as in a captured decode step)."""
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
    t = time_fn(g.replay, [()], dev, n_warmup=3, n_rep=n_rep, warmup_s=0.05, min_run_s=0.05)
    n = len(calls)
    del g
    return {"us": t.median_ms * 1e3 / n, "p10_us": t.p10_ms * 1e3 / n, "p90_us": t.p90_ms * 1e3 / n}


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def save(out, path):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1)
    os.replace(tmp, path)


def gemm_part(out, deadline, w8_configs):
    """Each decode GEMM shape of the H200 decoder, weights rotated over > 1.5 GB."""
    rows = out["gemm"] = []
    for name, (N, Kd) in GEMM_SHAPES.items():
        n_copies = max(4, min(96, math.ceil(STREAM_BYTES / (N * Kd))))
        wq = [(torch.randn(N, Kd, device=dev) * 0.02).to(K.FP8) for _ in range(n_copies)]
        ws = torch.tensor(0.01, device=dev)
        for M in (16, 4):
            x = torch.randn(M, Kd, device=dev).to(torch.bfloat16)
            xq = (x.float() / (x.abs().amax().float() / 448)).to(K.FP8)
            xs = (x.abs().amax().float() / 448)
            ref = R.fp8w_linear_ref(x, wq[0], ws)
            base = {"shape": name, "M": M, "N": N, "K": Kd, "copies": n_copies}
            # bf16 GEMM over bf16 copies of the same count of weights
            wb = [w.to(torch.bfloat16) for w in wq[: max(2, n_copies // 2)]]
            r = graph_us([lambda w=w: F.linear(x, w) for w in wb])
            rows.append({**base, "impl": "cublas bf16", **r, "gbps": N * Kd * 2 / r["us"] / 1e3,
                         "err": rel(F.linear(x, wb[0]) * 0.01, ref)})
            del wb
            r = graph_us([lambda w=w: torch._scaled_mm(xq, w.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)
                          for w in wq])
            rows.append({**base, "impl": "scaled_mm tensorwise", **r, "gbps": N * Kd / r["us"] / 1e3})
            # what the fixed path runs with static activation scales: one quant pass, then the FP8 GEMM
            r = graph_us([lambda w=w: torch._scaled_mm(K.quant_static(x, xs), w.t(), scale_a=xs, scale_b=ws,
                                                       out_dtype=torch.bfloat16) for w in wq])
            rows.append({**base, "impl": "quant_static + scaled_mm", **r, "gbps": N * Kd / r["us"] / 1e3,
                         "err": rel(torch._scaled_mm(K.quant_static(x, xs), wq[0].t(), scale_a=xs, scale_b=ws,
                                                     out_dtype=torch.bfloat16), ref)})
            cands = w8_configs if M == 16 else top_configs(rows, name, 16, 6)
            for c in cands:
                if time.time() > deadline:
                    out["notes"].append(f"gemm part out of time at {name} M={M}")
                    break
                try:
                    err = rel(R.fp8w_linear(x, wq[0], ws, config=c), ref)
                    r = graph_us([lambda w=w: R.fp8w_linear(x, w, ws, config=c) for w in wq])
                    rows.append({**base, "impl": "w8a16", "config": c, **r, "gbps": N * Kd / r["us"] / 1e3, "err": err})
                except Exception as e:  # shared memory out of range, compile failure: reported
                    rows.append({**base, "impl": "w8a16", "config": c, "error": str(e)[:160]})
            best = max((r for r in rows if r["shape"] == name and r["M"] == M and "gbps" in r), key=lambda r: r["gbps"])
            print(f"{name} M={M}: best {best['impl']} {best.get('config', '')} {best['gbps']:.0f} GB/s; "
                  f"bf16 {next(r['gbps'] for r in rows if r['shape'] == name and r['M'] == M and r['impl'] == 'cublas bf16'):.0f}",
                  flush=True)
        del wq
        torch.cuda.empty_cache()


def top_configs(rows, name, M, n):
    ok = [r for r in rows if r["shape"] == name and r["M"] == M and r["impl"] == "w8a16" and "gbps" in r]
    return [r["config"] for r in sorted(ok, key=lambda r: -r["gbps"])[:n]]


def best_w8(rows, M=16):
    """The tile with the least total time over one layer's GEMMs (qkv + out + up + down)."""
    per = {}
    for r in rows:
        if r["impl"] == "w8a16" and r["M"] == M and "us" in r:
            per.setdefault(json.dumps(r["config"], sort_keys=True), {})[r["shape"]] = r["us"]
    full = {k: sum(v.values()) for k, v in per.items() if len(v) == 4}
    k = min(full, key=full.get)
    return json.loads(k), full[k]


def attention_part(out, deadline, attn_configs):
    rows = out["attention"] = []
    H, D, n_layers = ATTN_HEADS, 128, 8
    for ctx, B in ATTN_BUCKETS:
        shape = (B, H, ctx + 1, D)
        kf = [(torch.randn(shape, device=dev) * 20).to(K.FP8) for _ in range(n_layers)]
        vf = [(torch.randn(shape, device=dev) * 20).to(K.FP8) for _ in range(n_layers)]
        sc = torch.tensor(0.05, device=dev)
        q = torch.randn(B, H, 1, D, device=dev).to(torch.bfloat16)
        ref = K.decode_attention_ref(q, kf[0], vf[0], sc, ctx + 1)
        nb = 2 * B * H * (ctx + 1) * D
        base = {"ctx": ctx, "batch": B}
        kb = [(k.float() * 0.05).to(torch.bfloat16)[:, :, : ctx + 1] for k in kf[:2]]
        vb = [(v.float() * 0.05).to(torch.bfloat16)[:, :, : ctx + 1] for v in vf[:2]]
        r = graph_us([lambda i=i: F.scaled_dot_product_attention(q, kb[i % 2], vb[i % 2]) for i in range(n_layers)])
        rows.append({**base, "impl": "sdpa bf16", **r, "gbps": 2 * nb / r["us"] / 1e3,
                     "err": rel(F.scaled_dot_product_attention(q, kb[0], vb[0]), ref)})
        del kb, vb
        for c in attn_configs:
            if time.time() > deadline:
                out["notes"].append(f"attention part out of time at ctx {ctx}")
                break
            try:
                tile, dot, pf = R.split_attn_config(c)
                fn = lambda i: R.decode_attention_variant(q, kf[i], vf[i], sc, ctx + 1, tile=tile,  # noqa: E731
                                                          use_dot=dot, prefetch=pf)
                err = rel(fn(0), ref)
                r = graph_us([lambda i=i: fn(i) for i in range(n_layers)])
                rows.append({**base, "impl": "kit fp8", "config": c, **r, "gbps": nb / r["us"] / 1e3, "err": err})
            except Exception as e:
                rows.append({**base, "impl": "kit fp8", "config": c, "error": str(e)[:160]})
        ok = [r for r in rows if r["ctx"] == ctx and r["impl"] == "kit fp8" and "gbps" in r]
        if ok:
            b = max(ok, key=lambda r: r["gbps"])
            sd = next(r["gbps"] for r in rows if r["ctx"] == ctx and r["impl"] == "sdpa bf16")
            print(f"attention ctx {ctx} x{B}: best {b['config']} {b['gbps']:.0f} GB/s err {b['err']:.1e}; "
                  f"sdpa bf16 {sd:.0f} GB/s", flush=True)
        del kf, vf
        torch.cuda.empty_cache()


def best_attn(rows):
    per = {}
    for r in rows:
        if r["impl"] == "kit fp8" and "us" in r and r["ctx"] in [c for c, _ in ATTN_BUCKETS[:2]]:
            per.setdefault(json.dumps(r["config"], sort_keys=True), {})[r["ctx"]] = r["us"] / (r["ctx"] * r["batch"])
    full = {k: sum(v.values()) for k, v in per.items() if len(v) == 2}
    return json.loads(min(full, key=full.get))


def model_part(out, deadline, w8_config, attn_config):
    """bf16, fixed and the W8A16 decoder with ``w8_config`` and the tile of ``attn_config``
    (the decoders run the lab's elementwise attention kernel: a winning tensor-core or
    prefetch variant is timed with its tile only, and a note says so)."""
    cfg = MODEL_CFG or L.H200_SIZE
    tile, dot, pf = R.split_attn_config(attn_config)
    if dot or pf:
        out["notes"].append(f"model part: best attention {attn_config} is a research variant; the decoders "
                            f"run the lab's elementwise kernel with its tile {tile}")
    res = out["model"] = {"w8_config": w8_config, "attn": dataclasses.asdict(tile), "paths": {}}
    builders = (("bf16", lambda: L.Decoder(cfg, "bf16", device=dev, attn_tile=tile)),
                ("fixed", lambda: L.Decoder(cfg, "fixed", device=dev, attn_tile=tile)),
                ("w8a16", lambda: R.w8a16_decoder(cfg, device=dev, attn_tile=tile, config=w8_config)))
    for p, build in builders:
        m = build()
        rows = []
        for ctx, B in MODEL_BUCKETS:
            if time.time() > deadline:
                out["notes"].append(f"model part out of time at {p} ctx {ctx}")
                break
            t = L.time_prefill_decode(m, B, ctx, n_rep=3)
            nb = L.decode_bytes(m, B, ctx)
            rows.append({"ctx": ctx, "batch": B, "tpot_ms": t["tpot_ms"], "tpot_p10_ms": t["tpot_p10_ms"],
                         "tpot_p90_ms": t["tpot_p90_ms"], "ttft_ms": t["ttft_ms"], "decode_bytes": nb,
                         "decode_gbps": nb / t["tpot_ms"] / 1e6, "kv_fp8": t["kv_fp8"]})
            print(p, rows[-1], flush=True)
            torch.cuda.empty_cache()
        res["paths"][p] = {"buckets": rows, "breakdown": [L.decode_breakdown(m, b, c) for c, b in MODEL_BUCKETS[:2]]}
        del m
        torch.cuda.empty_cache()
    for p in ("fixed", "w8a16"):
        for a, b in zip(res["paths"][p]["buckets"], res["paths"]["bf16"]["buckets"]):
            a["tpot_change_pct"] = 100 * (a["tpot_ms"] / b["tpot_ms"] - 1)
            print(f"{p} vs bf16 ctx {a['ctx']}: {a['tpot_change_pct']:+.1f}%", flush=True)
        res["paths"][p]["logit_error"] = None
    ms = {"bf16": L.Decoder(cfg, "bf16", device=dev), "fixed": L.Decoder(cfg, "fixed", device=dev)}
    res["logit_error"] = L.logit_error(ms)
    print("logit error", res["logit_error"], flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--skip-model", action="store_true", help="sweeps only (the lab04 refresh times the model)")
    a = ap.parse_args()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "notes": [],
           "kernel_checks": {**K.self_check(), **{"research_" + k: v for k, v in R.self_check().items()}}}
    print("self-check", out["kernel_checks"], flush=True)
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)  # sustained warm-up: clocks settle
    t = time.time()
    while time.time() - t < 1.0:
        x @ x
    torch.cuda.synchronize()
    del x
    cf = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "lab04_decode_tuning_configs.json")))
    w8 = [{"SWAP": sw, "BN": bn, "BK": bk, "num_warps": w, "num_stages": st, "SPLIT_K": sk, "PREFETCH": pf}
          for sw, bn, bk, w, st, sk, pf in cf["w8"]]
    attn = [{"use_dot": d, "block_t": bt, "num_warps": w, "chunk": ch, "num_stages": st, "prefetch": pf}
            for d, bt, w, ch, st, pf in cf["attn"]]
    out["candidates"] = {"w8": w8, "attn": attn}
    b = a.budget_s
    gemm_part(out, T0 + (0.3 if a.skip_model else 0.38) * b, w8)
    save(out, a.out)
    cfg, us = best_w8(out["gemm"])
    out["best_w8"] = {"config": cfg, "layer_us": us}
    print("best W8A16 tile", cfg, f"{us:.0f} us per layer", flush=True)
    attention_part(out, T0 + (0.9 if a.skip_model else 0.62) * b, attn)
    save(out, a.out)
    ac = best_attn(out["attention"])
    out["best_attn"] = ac
    print("best attention", ac, flush=True)
    if not a.skip_model:
        model_part(out, T0 + b, cfg, ac)
    out["elapsed_s"] = time.time() - T0
    save(out, a.out)


if __name__ == "__main__":
    sys.exit(main())
