"""Lab 4, round 13 (issue #19): the two step-level choices rounds 7-12 left unmeasured.

    python benchmarks/lab04_round13.py OUT.json [--rounds 7] [--parts gemm,final512]

Part ``gemm``: round 7 put every decode weight shape on the kit's GEMM after an A/B of the whole
step, but measured the (4096, 4096) weights (``out``, the connector) on cuBLAS only without PDL,
and every lab run since times cuBLAS's FP8 GEMM faster than the kit's alone for ``out`` (and for
``down`` at 16 rows in the committed record). The fixed path's decode step at 512, 4k and 32k,
with those shapes taken out of :data:`hwlab.labs.fp8.decode_gemm.CONFIGS` while the step is
captured (so they run cuBLAS's FP8 GEMM, swap-AB where the layer is), against the lab's step.

Part ``final512``: round 12 measured one split per (batch, head) row whose program writes the
output itself (no combine launched) 2.1 us per layer faster than the same tile with its combine,
alone, on an FP8 cache. At 512 both paths' steps read a bf16 cache with the kit's kernel
(``model.KIT_BF16_BELOW_CTX``), which also writes this step's K and V and the out projection's
FP8 input: the same loop with one split per row (``research.decode_attention_lean(final=True)``,
now writing FP8 with ``out_scale`` as the combine does) in the fixed and the bf16 steps at 512 x16.

Each step is captured as a CUDA graph, its logits compared with the lab step's, then timed both
ways rounds 10-12 did (one sustained block per way, twice in opposite orders, and alternating
with a sync per replay). The results file is written after each part.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab04_round10 as r10  # noqa: E402
import lab04_round6 as r6  # noqa: E402

from hwlab.labs import fp8 as lab  # noqa: E402
from hwlab.labs.fp8 import attention as A  # noqa: E402
from hwlab.labs.fp8 import decode_gemm as G  # noqa: E402
from hwlab.labs.fp8 import quant as Q  # noqa: E402
from hwlab.labs.fp8 import research as R  # noqa: E402
from hwlab.core.measure_graph import capture_graph  # noqa: E402
from hwlab.core.store import write_json_atomic  # noqa: E402

STEP_SHAPES = ((512, 16), (4096, 16), (32768, 4))
OUT, DOWN = (4096, 4096), (4096, 14336)
#: part ``gemm``'s choices: name -> the weight shapes sent to cuBLAS
GEMM_CHOICES = {"lab": (), "out on cuBLAS": (OUT,), "down on cuBLAS": (DOWN,), "out and down on cuBLAS": (OUT, DOWN)}
#: part ``final512``'s tiles (one split per row: the chunk covers the step's 513 positions with the
#: lab's merge of a short remainder): name -> tile
FINAL_TILES = {"final, 1 warp, 16 per step, 2 stages": A.AttnTile(512, 16, 1, 2),
               "final, 2 warps, 32 per step, 3 stages": A.AttnTile(512, 32, 2, 3),
               "final, 4 warps, 64 per step, 3 stages": A.AttnTile(512, 64, 4, 3)}


@contextlib.contextmanager
def on_cublas(shapes):
    """The kit's decode GEMM leaves ``shapes`` to cuBLAS while the block runs (a graph keeps what
    it captured)."""
    saved = {s: G.CONFIGS.pop(s) for s in shapes}
    try:
        yield
    finally:
        G.CONFIGS.update(saved)


def final_attention(own: A.AttnTile):
    """The decoder's attention call (the lab's signature) with one split per row at tile ``own``
    (the step's own tile ignored)."""
    def attend(q, k, v, scale, n, use_triton=None, tile=None, out_scale=None, new_kv=None):
        return R.decode_attention_lean(q, k, v, scale, n, use_triton=use_triton, tile=own, out_scale=out_scale,
                                       new_kv=new_kv, final=True)
    return attend


def step_rows(rounds: int, path: str, shapes, choices: dict) -> list:
    """The ``path`` step per bucket under each choice (name -> context manager factory)."""
    dev = torch.device("cuda")
    m = lab.Decoder(lab.H200_SIZE, path)
    rows = []
    for ctx, batch in shapes:
        decode, cache = r6.prefilled_decode(m, ctx, batch, dev)
        with torch.no_grad():
            graphs = {}
            for name, ctxm in choices.items():
                with ctxm():
                    graphs[name] = capture_graph(decode, dev)
            diff = r6.logits_diff_vs_lab(graphs)
            t = r10.both_methods(graphs, rounds, 1)
        row = {"ctx": ctx, "batch": batch, "path": path, "logits_rel_diff_vs_lab": diff, **t}
        rows.append(row)
        for method in ("sustained", "alternate"):
            us = t[f"{method}_us"]
            print(f"step {path} {ctx} x{batch} {method}: " + ", ".join(
                f"{k} {v / 1e3:.4f} ms ({v / us['lab'] - 1:+.1%})" for k, v in us.items()), flush=True)
        del graphs, cache
        torch.cuda.empty_cache()
    return rows


def bits_part() -> dict:
    """Why a step's logits can come out bit-identical under two choices: each choice's kernel on
    the step's own inputs, outputs compared element by element. The (4096, 4096) and (4096, 14336)
    FP8 GEMMs at 16 rows, the kit's against cuBLAS's (swap-AB, as the step's layers call it); the
    attention at 512 x16 on a bf16 cache writing FP8 with the out projection's scale, the lab's
    split kernel against one split per row. Counts of differing elements, and the largest
    difference in units of the output's own rounding step (bf16 or FP8)."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(13)
    res = {"gemm": [], "attention": []}
    for name, (N, Kd) in (("out", OUT), ("down", DOWN)):
        w = torch.randn(N, Kd, generator=g, device=dev) / Kd ** 0.5
        w8, ws = Q.quant_tensor_ref(w)
        x = torch.randn(16, Kd, generator=g, device=dev)
        xs = (x.abs().amax() / Q.FP8_MAX).float()
        xq = Q.quant_static_ref(x, xs)
        kit = G.decode_mm(xq, w8, xs, ws)
        cub = torch._scaled_mm(w8, xq.t(), scale_a=ws, scale_b=xs, out_dtype=torch.bfloat16).t()
        res["gemm"].append({"layer": name, "N": N, "K": Kd, "rows": 16, "elements": kit.numel(),
                            "differ": int((kit != cub).sum()), "max_abs_diff": float((kit.float() - cub.float()).abs().max())})
        print(f"bits gemm {name}: {res['gemm'][-1]}", flush=True)
    cfg = lab.H200_SIZE
    shape = (16, cfg.n_heads, 513, cfg.d_head)
    kb, vb = (torch.randn(shape, generator=g, device=dev).bfloat16() for _ in range(2))
    q = torch.randn(16, cfg.n_heads, 1, cfg.d_head, generator=g, device=dev).bfloat16()
    one = torch.ones((), device=dev)
    ref = A.decode_attention_ref(q, kb, vb, one, 513).float()
    os_ = (ref.abs().amax() / Q.FP8_MAX).float()
    lab_out = A.decode_attention(q, kb, vb, one, 513, out_scale=os_)
    for name, tile in FINAL_TILES.items():
        fin = R.decode_attention_lean(q, kb, vb, one, 513, tile=tile, out_scale=os_, final=True)
        res["attention"].append({"way": name, "elements": fin.numel(), "differ": int((fin.float() != lab_out.float()).sum()),
                                 "max_abs_diff_over_scale": float((fin.float() - lab_out.float()).abs().max())})
        print(f"bits attention {res['attention'][-1]}", flush=True)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--parts", default="gemm,final512", help="gemm, final512, bits")
    a = ap.parse_args()
    parts = a.parts.split(",")
    t0 = time.time()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "rounds": a.rounds, "block_reps": r10.BLOCK_REPS,
           "gemm_choices": {k: [list(s) for s in v] for k, v in GEMM_CHOICES.items()},
           "final_tiles": {k: vars(t) for k, t in FINAL_TILES.items()}}
    if "gemm" in parts:
        res["gemm"] = step_rows(a.rounds, "fixed", STEP_SHAPES,
                                {k: (lambda s=s: on_cublas(s)) for k, s in GEMM_CHOICES.items()})
        res["elapsed_s"] = time.time() - t0
        write_json_atomic(a.out, res, overwrite=True)
    if "bits" in parts:
        res["bits"] = bits_part()
        write_json_atomic(a.out, res, overwrite=True)
    if "final512" in parts:
        choices = {"lab": contextlib.nullcontext,
                   **{k: (lambda t=t: r10.attention_as(final_attention(t))) for k, t in FINAL_TILES.items()}}
        res["final512"] = [row for path in ("fixed", "bf16") for row in step_rows(a.rounds, path, ((512, 16),), choices)]
        res["elapsed_s"] = time.time() - t0
        write_json_atomic(a.out, res, overwrite=True)


if __name__ == "__main__":
    main()
