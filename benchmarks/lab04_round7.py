"""Lab 4, round 7 (issue #19): the kit's own decode GEMM against cuBLAS's FP8 and bf16 GEMMs,
then the fixed path's decode step with it, and round 6's prepared small-kernel choices.

    python benchmarks/lab04_round7.py OUT.json [--rounds 7] [--parts gemm,step,logits] [--set 7|7b]

Round 6's step 9 put the 4k step's time over its byte floor in two places: cuBLAS's FP8 GEMMs
(about 4 us each of fixed cost, 33 a step) and the small kernels. This round measures:

* part ``gemm``: each decode weight shape (qkv, out, up, down of the H200-size model) at 16 and 4
  rows, 8 layers' weights per CUDA graph (far larger than L2, as a decode step streams them):
  bf16 (cuBLAS), cuBLAS FP8 in both operand orders (``torch._scaled_mm``, as :class:`QLinear`
  calls it), and the kit's :func:`decode_gemm.decode_mm` over :data:`TILES`; then the best tile
  per shape launched with PDL, with and without its weight prefetched into L2 before the wait
  (consecutive GEMMs of the graph then overlap: the upper bound of what PDL can hide). Every
  output is checked against the float32 product of the operands it read before it is timed;
  replays alternate over rounds (round 6's :func:`alternate`), medians of rounds.
* part ``step``: the fixed decoder's decode step (512 x16, 4k x16, 32k x4) with the lab's cuBLAS
  GEMMs against the kit's GEMM (the tiles part ``gemm`` picked in this process), alone, with PDL,
  and with PDL and the weight prefetch; round 6's ``--set 7`` choices (norms at 8/16 warps, the
  head writing float32 itself) on both paths.

``--set 7b`` (the second call, after 7 ran at 030bdd4): the kernel now adds its FP8 products into
the float32 sum every 128 columns (7's kit GEMM read 2.1e-3 from float32 where cuBLAS read 1.7e-3),
the tiles :data:`TILES_B`, a shape stays on cuBLAS where it measured faster, and the step's
choices :func:`step_choices_b`: PDL switched off for the attention's kernels or for all but the
GEMM (7 measured PDL 3% faster at 512 and 3-4% slower at 4k and 32k), with the norms at 8 warps
and the head's float32 output. Part ``logits``: the fixed path's logit error against bf16
(:func:`hwlab.labs.fp8.model.logit_error`, H200 size) under each kit choice.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab04_round6 as r6  # noqa: E402

from hwlab.labs import fp8 as lab  # noqa: E402
from hwlab.labs.fp8 import decode_gemm as G  # noqa: E402
from hwlab.labs.fp8 import quant as Q  # noqa: E402
from hwlab.core.measure_graph import capture_graph  # noqa: E402
from hwlab.core.store import write_json_atomic  # noqa: E402

#: the kit GEMM's tiles swept per shape (name -> decode_gemm config)
TILES = {
    "swap 64x256 s4": {"SWAP": True, "BN": 64, "BK": 256, "STAGES": 4},
    "swap 64x128 s6": {"SWAP": True, "BN": 64, "BK": 128, "STAGES": 6},
    "swap 128x128 s4": {"SWAP": True, "BN": 128, "BK": 128, "STAGES": 4},
    "swap 64x256 s4 k2": {"SWAP": True, "BN": 64, "BK": 256, "STAGES": 4, "SPLIT_K": 2},
    "swap 64x256 s4 k4": {"SWAP": True, "BN": 64, "BK": 256, "STAGES": 4, "SPLIT_K": 4},
    "plain 32x256 s4": {"SWAP": False, "BN": 32, "BK": 256, "STAGES": 4},
    "plain 32x256 s6": {"SWAP": False, "BN": 32, "BK": 256, "STAGES": 6},
    "plain 16x256 s6": {"SWAP": False, "BN": 16, "BK": 256, "STAGES": 6},
    "plain 64x256 s4": {"SWAP": False, "BN": 64, "BK": 256, "STAGES": 4},
    "plain 32x256 s4 k2": {"SWAP": False, "BN": 32, "BK": 256, "STAGES": 4, "SPLIT_K": 2},
}
#: round 7b's tiles: 7's best per shape, and their neighbours in depth and K split
TILES_B = {
    "swap 64x256 s4": TILES["swap 64x256 s4"],
    "swap 64x128 s6": TILES["swap 64x128 s6"],
    "swap 64x128 s8": {"SWAP": True, "BN": 64, "BK": 128, "STAGES": 8},
    "swap 64x128 s4": {"SWAP": True, "BN": 64, "BK": 128, "STAGES": 4},
    "swap 64x256 s3": {"SWAP": True, "BN": 64, "BK": 256, "STAGES": 3},
    "swap 64x256 s4 k2": TILES["swap 64x256 s4 k2"],
    "swap 64x256 s4 k4": TILES["swap 64x256 s4 k4"],
    "swap 64x128 s6 k4": {"SWAP": True, "BN": 64, "BK": 128, "STAGES": 6, "SPLIT_K": 4},
    "swap 64x256 s4 k8": {"SWAP": True, "BN": 64, "BK": 256, "STAGES": 4, "SPLIT_K": 8},
    "swap 64x128 s6 k2": {"SWAP": True, "BN": 64, "BK": 128, "STAGES": 6, "SPLIT_K": 2},
}
#: weight prefetch depths (columns of each weight row asked of L2 before the PDL wait)
PREFETCH = (1024, 4096)
SHAPES = {"qkv": (3 * 4096, 4096), "out": (4096, 4096), "up": (14336, 4096), "down": (4096, 14336)}


def _cfg(tile: dict, **kw) -> dict:
    return {**G.DEFAULT_CONFIG, **tile, **kw}


def gemm_inputs(rows: int, k: int, w16: torch.Tensor, w8: tuple, g: torch.Generator, dev):
    """Seeded activation rows for a decode GEMM of width ``k``: bf16 ``xb``, its static-scaled FP8
    copy ``xq`` and scale ``xs``, and the float32 products with the bf16 weight ``w16`` and the FP8
    weight ``w8`` (weight, scale) that each way is checked against: ``(xb, xq, xs, ref16, ref8)``."""
    x = torch.randn(rows, k, generator=g, device=dev)
    xs = (x.abs().amax() / Q.FP8_MAX).float()
    xq = Q.quant_static_ref(x, xs)
    xb = x.to(torch.bfloat16)
    return xb, xq, xs, xb.float() @ w16.float().t(), (xq.float() * xs) @ (w8[0].float() * w8[1]).t()


def gemm_part(rounds: int, n_layers: int = 8, tiles: dict = TILES, prefetch=PREFETCH) -> tuple[list, dict, list]:
    """Every way at each shape and row count; returns the rows, per (N, K) the kit tile with the
    least time over 16 and 4 rows, and the shapes where cuBLAS's FP8 GEMM (either order) was
    faster than that tile at both row counts."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(7)
    rows_out, best, cublas_faster = [], {}, []
    for name, (N, Kd) in SHAPES.items():
        w32 = [torch.randn(N, Kd, generator=g, device=dev) / Kd ** 0.5 for _ in range(n_layers)]
        w16 = [w.to(torch.bfloat16) for w in w32]
        w8 = [Q.quant_tensor_ref(w) for w in w32]  # (FP8 weight, scale)
        del w32
        per_shape = {}
        for rows in (16, 4):
            xb, xq, xs, ref16, ref8 = gemm_inputs(rows, Kd, w16[0], w8[0], g, dev)
            ways = {"bf16": (lambda: [F.linear(xb, w16[i]) for i in range(n_layers)], ref16, {}),
                    "cublas fp8": (lambda: [torch._scaled_mm(xq, w8[i][0].t(), scale_a=xs, scale_b=w8[i][1],
                                                             out_dtype=torch.bfloat16) for i in range(n_layers)], ref8, {})}
            if rows % 16 == 0:
                ways["cublas fp8 swap-AB"] = (lambda: [torch._scaled_mm(w8[i][0], xq.t(), scale_a=w8[i][1], scale_b=xs,
                                                                         out_dtype=torch.bfloat16).t()
                                                       for i in range(n_layers)], ref8, {})
            for tname, tile in tiles.items():
                ways[f"kit {tname}"] = (lambda c=_cfg(tile): [G.decode_mm(xq, w8[i][0], xs, w8[i][1], config=c)
                                                             for i in range(n_layers)], ref8, {})
            res = _time_ways(ways, rounds, dev, n_layers)
            kit = {k: v for k, v in res["us"].items() if k.startswith("kit ")}
            top = min(kit, key=kit.get)
            # the best tile again, launched with PDL, without and with its weight prefetched before the wait
            tile = tiles[top[4:]]
            more = {"kit best + pdl": (lambda c=_cfg(tile): [G.decode_mm(xq, w8[i][0], xs, w8[i][1], config=c)
                                                              for i in range(n_layers)], ref8, {"pdl": True})}
            for pk in prefetch:
                more[f"kit best + pdl + prefetch {pk}"] = (
                    lambda c=_cfg(tile, PREFETCH_K=_prefetch(pk, Kd, tile)):
                    [G.decode_mm(xq, w8[i][0], xs, w8[i][1], config=c) for i in range(n_layers)], ref8, {"pdl": True})
            more["cublas fp8"] = ways["cublas fp8"]  # the reference again, in the same rounds
            res2 = _time_ways(more, rounds, dev, n_layers)
            row = {"layer": name, "N": N, "K": Kd, "rows": rows, "n_layers": n_layers, "best_tile": top,
                   "us_per_layer": res["us"], "rel_err_vs_float32": res["err"], "failed": res["failed"],
                   "pdl_us_per_layer": res2["us"], "pdl_rel_err": res2["err"], "pdl_failed": res2["failed"],
                   "weight_bytes": {"bf16": 2 * N * Kd, "fp8": N * Kd}}
            row["gbps"] = {k: row["weight_bytes"]["bf16" if k == "bf16" else "fp8"] / us / 1e3 for k, us in res["us"].items()}
            row["pdl_gbps"] = {k: N * Kd / us / 1e3 for k, us in res2["us"].items()}
            rows_out.append(row)
            per_shape[rows] = res["us"]
            print(f"gemm {name} ({N}x{Kd}) x{rows}: " + ", ".join(
                f"{k} {res['us'][k]:.1f} us {row['gbps'][k]:.0f} GB/s" for k in ("bf16", "cublas fp8", top)) +
                " | " + ", ".join(f"{k} {v:.1f}" for k, v in res2["us"].items()), flush=True)
        # one tile per shape for the step: the least time over both row counts
        kit = [k for k in per_shape[16] if k.startswith("kit ") and k in per_shape[4]]
        pick = min(kit, key=lambda k: per_shape[16][k] + per_shape[4][k])
        cublas = {r: min(v for k, v in per_shape[r].items() if k.startswith("cublas")) for r in (16, 4)}
        best[(N, Kd)] = tiles[pick[4:]]
        if all(per_shape[r][pick] > cublas[r] for r in (16, 4)):
            cublas_faster.append((N, Kd))
        del w16, w8
        torch.cuda.empty_cache()
    return rows_out, best, cublas_faster


def _time_ways(ways: dict, rounds: int, dev, n: int) -> dict:
    """Each way (a function calling ``n`` GEMMs, its reference, options) captured in a CUDA graph,
    checked, then timed by round 6's alternating replays: microseconds per GEMM."""
    graphs, err, failed = {}, {}, {}
    with torch.no_grad():
        for k, (fn, ref, opts) in ways.items():
            old = Q.set_pdl(opts.get("pdl", False))
            try:
                cap = capture_graph(fn, dev)
                cap.replay()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - a tile that cannot compile or run is a result too
                failed[k] = f"{type(e).__name__}: {e}"[:300]
                print(f"  {k} failed: {failed[k]}", flush=True)
                continue
            finally:
                Q.set_pdl(old)
            e = float((cap.out[0].float() - ref).norm() / ref.norm())
            err[k] = e
            if not e < 2e-2:  # wrong results are not timed
                failed[k] = f"rel err {e:.3g} vs float32"
                print(f"  {k}: {failed[k]}", flush=True)
                continue
            graphs[k] = cap
        ms = r6.alternate(graphs, rounds)
    return {"us": {k: statistics.median(v) * 1e3 / n for k, v in ms.items()}, "err": err, "failed": failed}


#: round 6's :func:`choice` knows every knob of the lab, these rounds' included
choice7 = r6.choice
_prefetch = r6._prefetch


def step_choices(best: dict) -> dict:
    """Round 7's step choices (run at 030bdd4), on the lab as it was then (:data:`r6.PRE7`)."""
    kit = {**r6.PRE7, "kit_gemm": True, "configs": best}
    return {**r6.CHOICES_7,
            "kit gemm": kit,
            "kit gemm + pdl": {**kit, "pdl": True},
            "kit gemm + pdl + prefetch 1024": {**kit, "pdl": True, "prefetch_k": 1024},
            "kit gemm + pdl + prefetch 4096": {**kit, "pdl": True, "prefetch_k": 4096},
            "kit gemm + pdl + prefetch 1024 + norms 8 warps + head fp32": {
                **kit, "pdl": True, "prefetch_k": 1024, "row_warps": 8, "head_fp32": True}}


def step_choices_b(best: dict, cublas_faster=()) -> dict:
    """Round 7b's step choices (the fixed path; the bf16 path takes the ``pdl``/``norms`` ones).
    ``cublas_faster``: the shapes part ``gemm`` measured faster on cuBLAS."""
    kit = {**r6.PRE7, "kit_gemm": True, "configs": best}
    small = {"row_warps": 8, "head_fp32": True}
    out_cublas = {"cublas": ((4096, 4096),)}
    pre7 = r6.PRE7
    return {"lab": pre7,
            "kit": kit,
            "kit, cuBLAS where faster": {**kit, "cublas": tuple(cublas_faster)},
            "kit, out on cuBLAS": {**kit, **out_cublas},
            "kit + norms 8 + head fp32": {**kit, **small},
            "kit, out on cuBLAS + norms 8 + head fp32": {**kit, **out_cublas, **small},
            "kit + pdl": {**kit, "pdl": True},
            "kit + pdl, not attention": {**kit, "pdl": True, "pdl_off": ("attention",)},
            "kit + pdl, GEMMs only": {**kit, "pdl": True, "pdl_off": ("attention", "quant")},
            "kit + pdl + norms 8 + head fp32": {**kit, "pdl": True, **small},
            "kit + pdl, not attention + norms 8 + head fp32": {**kit, "pdl": True, "pdl_off": ("attention",), **small},
            "pdl": {**pre7, "pdl": True},
            "pdl, not attention": {**pre7, "pdl": True, "pdl_off": ("attention",)},
            "norms 8 + head fp32": {**pre7, **small},
            "pdl + norms 8 + head fp32": {**pre7, "pdl": True, **small}}


def logits_part(choices: dict) -> dict:
    """The fixed path's logit error against bf16 (H200 size) under each choice that changes its
    arithmetic (the kit GEMM; PDL and warps do not), and the lab's."""
    models = lab.make_models(lab.H200_SIZE, paths=("bf16", "fixed"))
    out = {}
    with torch.no_grad():
        for name, c in choices.items():
            if name == "lab" or (c.get("kit_gemm") and not c.get("pdl") and c.get("row_warps") == 4):
                with choice7(c):
                    out[name] = lab.logit_error(models)["fixed"]
                print(f"logit error, fixed against bf16, {name}: {out[name]:.4f}", flush=True)
    del models
    torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--parts", default="gemm,step")
    ap.add_argument("--set", default="7", choices=("7", "7b"))
    a = ap.parse_args()
    t0 = time.time()
    tiles = TILES_B if a.set == "7b" else TILES
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "set": a.set,
           "triton": __import__("triton").__version__, "rounds": a.rounds, "tiles": tiles}
    parts = a.parts.split(",")
    best, cublas_faster = {nk: tiles["swap 64x256 s4"] for nk in SHAPES.values()}, []
    if "gemm" in parts:
        res["gemm"], best, cublas_faster = gemm_part(a.rounds, tiles=tiles, prefetch=(1024,) if a.set == "7b" else PREFETCH)
    res["step_tiles"] = {f"{n}x{k}": t for (n, k), t in best.items()}
    res["cublas_faster"] = [f"{n}x{k}" for n, k in cublas_faster]
    if a.set == "7b":
        ch = step_choices_b(best, cublas_faster)
        res["step_choices"] = {k: {kk: vv for kk, vv in v.items() if kk != "configs"} for k, v in ch.items()}
        if "logits" in parts:
            res["logit_error_fixed"] = logits_part(ch)
        if "step" in parts:
            fixed = tuple(k for k in ch if k == "lab" or k.startswith("kit"))
            base = ("lab", "pdl", "pdl, not attention", "norms 8 + head fp32", "pdl + norms 8 + head fp32")
            buckets = ((512, 16, fixed, "fixed"), (4096, 16, fixed, "fixed"), (32768, 4, fixed, "fixed"),
                       (512, 16, base, "bf16"), (4096, 16, base, "bf16"))
            res["step"] = r6.step_part(a.rounds, buckets, ch, choose=choice7)
    elif "step" in parts:
        ch = step_choices(best)
        res["step_choices"] = {k: {kk: vv for kk, vv in v.items() if kk != "configs"} for k, v in ch.items()}
        kit_names = tuple(k for k in ch if k.startswith("kit"))
        buckets = ((512, 16, ("lab", *kit_names, *r6.CHOICES_7), "fixed"),
                   (4096, 16, ("lab", *kit_names, *r6.CHOICES_7), "fixed"),
                   (32768, 4, ("lab", *kit_names), "fixed"),
                   (512, 16, tuple(r6.CHOICES_7), "bf16"),
                   (4096, 16, tuple(r6.CHOICES_7), "bf16"))
        res["step"] = r6.step_part(a.rounds, buckets, ch, choose=choice7)
    res["elapsed_s"] = time.time() - t0
    write_json_atomic(a.out, res, overwrite=True)  # a re-run replaces its own output


if __name__ == "__main__":
    sys.exit(main())
