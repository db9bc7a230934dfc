"""Lab 4 tuning on a GPU: why the first H200 run's FP8 path barely beat bf16 in decode.

    python benchmarks/lab04_tuning.py OUT.json

First H200 run (2026-12-02): decode reached only 31-57% of the copy ceiling. Two suspects,
measured here one at a time (predictions in benchmarks/LAB04_NOTES.md):
* the decode-shaped GEMMs (M = batch = 16): cuBLASLt picked a 128x128-tile FP8 kernel for
  row-wise scales (nvjet ...qqtst_128x128...), i.e. 32 CTAs for N = 4096, against small split-K
  tiles for bf16; compare bf16, row-wise and tensor-wise ``_scaled_mm`` per layer shape;
* the kit's decode attention (1.3-2.6 TB/s against SDPA's 2.7-4.4 TB/s): sweep its chunk,
  tile and warps.
"""
from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

from hwlab.labs.fp8 import kernels as K
from hwlab.labs.fp8 import research as R
from hwlab.labs.fp8.kernels import AttnTile
from hwlab.core.measure import time_fn

dev = torch.device("cuda")
out = {"gemm": [], "quant": [], "attention": []}


def t_us(fn):
    return time_fn(fn, [()], dev, n_rep=50).median_ms * 1e3


M = 16
for N, Kd in ((12288, 4096), (4096, 4096), (14336, 4096), (4096, 14336), (131072, 4096)):
    x = torch.randn(M, Kd, device=dev).to(torch.bfloat16)
    w = torch.randn(N, Kd, device=dev) / Kd ** 0.5
    wb = w.to(torch.bfloat16)
    wq_r, ws_r = R.quant_rows_ref(w)
    ws_row = ws_r.reshape(1, -1).contiguous()
    ws_t = (w.abs().amax() / 448).float()
    wq_t = (w / ws_t).to(K.FP8)
    xq_r, xs_r = R.quant_rows(x)
    xs_t = (x.abs().amax().float() / 448)
    xq_t = (x.float() / xs_t).to(K.FP8)
    ref = x.float() @ w.t()
    rel = lambda y: float((y.float() - ref).norm() / ref.norm())  # noqa: E731
    row = {"M": M, "N": N, "K": Kd}
    row["bf16_us"] = t_us(lambda: F.linear(x, wb))
    row["rowwise_us"] = t_us(lambda: torch._scaled_mm(xq_r, wq_r.t(), scale_a=xs_r, scale_b=ws_row, out_dtype=torch.bfloat16))
    row["rowwise_err"] = rel(torch._scaled_mm(xq_r, wq_r.t(), scale_a=xs_r, scale_b=ws_row, out_dtype=torch.bfloat16))
    row["tensorwise_us"] = t_us(lambda: torch._scaled_mm(xq_t, wq_t.t(), scale_a=xs_t, scale_b=ws_t, out_dtype=torch.bfloat16))
    row["tensorwise_err"] = rel(torch._scaled_mm(xq_t, wq_t.t(), scale_a=xs_t, scale_b=ws_t, out_dtype=torch.bfloat16))
    try:
        row["tensorwise_fast_us"] = t_us(lambda: torch._scaled_mm(xq_t, wq_t.t(), scale_a=xs_t, scale_b=ws_t,
                                                                  out_dtype=torch.bfloat16, use_fast_accum=True))
    except Exception as e:
        row["tensorwise_fast_us"] = str(e)[:200]
    row["dequant_us"] = t_us(lambda: K.dequant_rows(wq_r, ws_r))
    row["quant_rows_us"] = t_us(lambda: R.quant_rows(x))
    for k in ("bf16", "rowwise", "tensorwise"):
        row[k + "_weight_gbps"] = N * Kd * (2 if k == "bf16" else 1) / row[k + "_us"] / 1e3
    out["gemm"].append(row)
    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)

for ctx, B in ((512, 16), (4096, 16), (32768, 4)):
    shape = (B, 32, ctx, 128)
    q = torch.randn(B, 32, 1, 128, device=dev).to(torch.bfloat16)
    kb = torch.randn(shape, device=dev).to(torch.bfloat16)
    vb = torch.randn(shape, device=dev).to(torch.bfloat16)
    kf, vf = kb.to(K.FP8), vb.to(K.FP8)
    one = torch.ones((), device=dev)
    sd = t_us(lambda: F.scaled_dot_product_attention(q, kb, vb))
    out["attention"].append({"ctx": ctx, "batch": B, "impl": "sdpa", "us": sd, "gbps": 2 * kb.numel() * 2 / sd / 1e3})
    print(f"ctx {ctx} x{B}: sdpa {sd:.0f} us {2 * kb.numel() * 2 / sd / 1e3:.0f} GB/s", flush=True)
    for chunk in (256, 512, 1024):
        for bt in (32, 64, 128):
            for wp in (4, 8):
                r = {"ctx": ctx, "batch": B, "chunk": chunk, "block_t": bt, "warps": wp}
                for name, kk, vv, eb in (("bf16", kb, vb, 2), ("fp8", kf, vf, 1)):
                    try:
                        us = t_us(lambda: K.decode_attention(q, kk, vv, one, ctx, tile=AttnTile(chunk, bt, wp)))
                        r[name + "_us"], r[name + "_gbps"] = us, 2 * kk.numel() * eb / us / 1e3
                    except Exception as e:
                        r[name + "_us"] = str(e)[:120]
                out["attention"].append(r)
                print(r, flush=True)
    best = {n: max((a for a in out["attention"] if a["ctx"] == ctx and isinstance(a.get(n + "_gbps"), float)),
                   key=lambda a: a[n + "_gbps"]) for n in ("bf16", "fp8")}
    print("BEST", ctx, {n: (b["chunk"], b["block_t"], b["warps"], round(b[n + "_gbps"])) for n, b in best.items()}, flush=True)
    del kb, vb, kf, vf
json.dump(out, open(sys.argv[1], "w"), indent=1)
