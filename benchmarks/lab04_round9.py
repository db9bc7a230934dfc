"""Lab 4, round 9 (issue #19): K and V interleaved in the cache (the attention's access pattern),
and the MLP's GELU with the down projection's requant in the up projection's GEMM.

    python benchmarks/lab04_round9.py OUT.json [--rounds 7] [--parts attn,step,short,dot,loads]

What round 8 left (LAB04_NOTES.md): the kit's FP8 attention streams ~8% under SDPA's GB/s, and its
load-only variant (round 4) tops out at the same rate, so the loads' pattern, not the math, is what
to change. Each program reads two streams (its chunk of K, then of V, in two caches a gigabyte
apart); SDPA's few large programs read far fewer streams at once.

Part ``attn``: :func:`hwlab.labs.fp8.research.decode_attention_interleaved`, the lab's loop on one
cache whose K and V rows alternate per block of ``IB`` positions (:func:`~hwlab.labs.fp8.research.
interleave_kv`), against the same loop on two caches (the A/B's other side), the lab's kernel and
SDPA on the bf16 cache, one CUDA graph over all 8 layers' caches at the lab comparison's shapes
(T = context), each checked against the float32 reference first, replays alternated over rounds
(round 6's :func:`alternate`), medians of rounds.

Part ``step``: the fixed path's decode step (512, 4k, 32k) with the lab's MLP (GELU and the down
projection's FP8 requant in the up GEMM's epilogue, ``model.GELU_IN_GEMM``) against one pass after
the GEMM (round 8's lab), in CUDA graphs, alternated. The bf16 path has no FP8 requant to fold.

Part ``short`` (the second call, after the first measured 32 positions per step faster at 512):
the kit's kernel per :data:`TILES_SHORT` tile on the FP8 and the bf16 cache at 512-2048 x16
against SDPA, and the fixed and bf16 decode steps at 512 with the candidate tiles (a bf16 cache
there in both paths, read by the kit's kernel).

Part ``loads`` (the sixth call, :data:`LOADS`): the K/V loads' cache policy on the lab's loop, and
the lab's kernel with shorter chunks and other pipeline depths, at the three shapes.

Part ``dot`` (the third call): :data:`DOT_TILES`, the tensor-core variant with long chunks and
several warps per program, at 4k and 32k.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab04_round6 as r6  # noqa: E402
import lab04_round8 as r8  # noqa: E402

from hwlab.labs import fp8 as lab  # noqa: E402
from hwlab.labs.fp8 import attention as A  # noqa: E402
from hwlab.labs.fp8 import model  # noqa: E402
from hwlab.labs.fp8 import research as R  # noqa: E402
from hwlab.core.measure_graph import capture_graph  # noqa: E402
from hwlab.core.store import write_json_atomic  # noqa: E402

#: part ``attn``'s layouts: name -> (interleave block IB, 0 for two caches; the tile)
LAYOUTS = {
    "loop, two caches": (0, A.DEFAULT_TILE),
    "kvi 16": (16, A.DEFAULT_TILE),
    "kvi 32": (32, A.DEFAULT_TILE),
    "kvi 64": (64, A.DEFAULT_TILE),
    "kvi 256": (256, A.DEFAULT_TILE),
    "kvi 32, 32 per step": (32, A.AttnTile(block_t=32)),
}
ATTN_SHAPES = ((512, 16), (4096, 16), (32768, 4))
#: part ``short``'s tiles for a short cache (call 1 measured 32 positions per step at 512 faster
#: alone, slower at 4k and 32k): name -> keyword arguments of :func:`~hwlab.labs.fp8.research.
#: decode_attention_round8` (the lab's :func:`~hwlab.labs.fp8.attention.decode_attention` for none)
TILES_SHORT = {
    "lab": {},
    "32 per step": {"tile": A.AttnTile(block_t=32)},
    "32 per step, chunk 64": {"tile": A.AttnTile(chunk=64, block_t=32)},
    "32 per step, 2 warps": {"tile": A.AttnTile(block_t=32, num_warps=2)},
    "64 per step, 2 warps": {"tile": A.AttnTile(block_t=64, num_warps=2)},
    "64 per step, 4 warps": {"tile": A.AttnTile(block_t=64, num_warps=4)},
    "32 per step, fused": {"tile": A.AttnTile(block_t=32), "fused_combine": True},
    "32 per step, 3 stages": {"tile": A.AttnTile(block_t=32, num_stages=3)},
}
SHORT_SHAPES = ((512, 16), (1024, 16), (2048, 16))
#: part ``short``'s step choices: the decoder's attention tile at 512 (a bf16 cache there in both paths)
SHORT_STEP = {"lab": {}, "32 per step": {"attn": TILES_SHORT["32 per step"]},
              "32 per step, 2 warps": {"attn": TILES_SHORT["32 per step, 2 warps"]}}
#: part ``step``'s choices as call 1 ran them: "lab" was then GELU in the up GEMM (``model.GELU_IN_GEMM``
#: on); measured equal, it is off since, so both sides are named by their setting
STEP_CHOICES = {"lab": {"gelu_in_gemm": True}, "gelu after the GEMM": {"gelu_in_gemm": False}}
STEP_BUCKETS = tuple((ctx, batch, tuple(STEP_CHOICES), "fixed") for ctx, batch in ATTN_SHAPES)


@contextlib.contextmanager
def choice9(settings: dict):
    """:func:`lab04_round6.choice` for the lab's knobs, and ``gelu_in_gemm``
    (``model.GELU_IN_GEMM``), put back after."""
    old = model.GELU_IN_GEMM
    try:
        with r6.choice({k: v for k, v in settings.items() if k != "gelu_in_gemm"}):
            model.GELU_IN_GEMM = settings.get("gelu_in_gemm", old)
            yield
    finally:
        model.GELU_IN_GEMM = old


def attn_ab(tag: str, shapes, rounds: int, make_fns) -> list:
    """Per (ctx, batch) in ``shapes``: every layer's caches at T = context (round 6's
    :func:`attn_inputs`), each of ``make_fns(q, kf, vf, s8, kb, vb)``'s ``name -> (fn(layer), cache)``
    (``cache`` "fp8" or "bf16": what it reads, so its reference and bytes) captured over all layers
    in one CUDA graph, replayed once and checked against the float32 reference (a choice that fails
    to build or is off is reported, not timed), SDPA on the bf16 cache beside, replays alternated
    over ``rounds``, medians of rounds. A row per shape: us per layer, GB/s, share of SDPA's GB/s."""
    dev = torch.device("cuda")
    cfg = lab.H200_SIZE
    n = cfg.n_layers
    rows = []
    for ctx, batch in shapes:
        kb, vb, q, s8, kf, vf, ref8, ref16 = r6.attn_inputs(cfg, batch, ctx, dev)
        fns = make_fns(q, kf, vf, s8, kb, vb)
        graphs, errs, cache_of = {}, {}, {}
        with torch.no_grad():
            for name, (fn, cache) in fns.items():
                cache_of[name] = cache
                try:
                    cap = capture_graph(lambda fn=fn: [fn(i) for i in range(n)], dev)
                    cap.replay()
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - a choice that cannot run is a result too
                    errs[name] = f"{type(e).__name__}: {e}"[:300]
                    print(f"{tag} {ctx}: {name} failed: {errs[name]}", flush=True)
                    continue
                ref = ref8 if cache == "fp8" else ref16
                errs[name] = float((cap.out[0].float() - ref).norm() / ref.norm())
                if errs[name] < A.FP8_CACHE_MATH_REL:
                    graphs[name] = cap
                else:
                    print(f"{tag} {ctx} x{batch}: {name} wrong ({errs[name]:.2e}), not timed", flush=True)
            graphs["sdpa"], errs["sdpa"] = r6.sdpa_graph(q, kb, vb, ref16, dev)
            cache_of["sdpa"] = "bf16"
            ms = r6.alternate(graphs, rounds)
        bytes8 = 2 * kf[0].numel()
        row = {"ctx": ctx, "batch": batch, "T": ctx, "n_layers": n, "rel_err_vs_float32": errs, "ms_rounds": ms}
        row["us_per_layer"] = {k: statistics.median(v) * 1e3 / n for k, v in ms.items()}
        row["gbps"] = {k: (bytes8 if cache_of[k] == "fp8" else 2 * bytes8) / us / 1e3
                       for k, us in row["us_per_layer"].items()}
        row["over_sdpa"] = {k: g / row["gbps"]["sdpa"] for k, g in row["gbps"].items()}
        rows.append(row)
        print(f"{tag} {ctx} x{batch}: " + ", ".join(f"{k} {row['us_per_layer'][k]:.1f} us {row['gbps'][k]:.0f} GB/s "
                                                 f"({row['over_sdpa'][k]:.0%})" for k in row["gbps"]), flush=True)
        del graphs, kb, vb, kf, vf, fns
        torch.cuda.empty_cache()
    return rows


def attn_part(rounds: int) -> list:
    def fns(q, kf, vf, s8, kb, vb):
        ctx = kf[0].shape[2]
        out = {"lab": (lambda i: A.decode_attention(q, kf[i], vf[i], s8, ctx), "fp8")}
        for name, (ib, tile) in LAYOUTS.items():
            if ib == 0:
                out[name] = (lambda i, tile=tile: R.decode_attention_interleaved(q, kf[i], s8, ctx, tile=tile,
                                                                                v_cache=vf[i]), "fp8")
            else:
                kvi = [R.interleave_kv(kf[i], vf[i], ib) for i in range(len(kf))]
                out[name] = (lambda i, kvi=kvi, tile=tile: R.decode_attention_interleaved(q, kvi[i], s8, ctx, tile=tile),
                             "fp8")
        return out
    return attn_ab("attn", ATTN_SHAPES, rounds, fns)


def short_part(rounds: int) -> list:
    """The kit's kernel per :data:`TILES_SHORT` tile on the FP8 and on the bf16 cache, and SDPA on
    the bf16 one, at short contexts (T = context)."""
    def fns(q, kf, vf, s8, kb, vb):
        ctx, one = kf[0].shape[2], torch.ones((), device=q.device)
        out = {}
        for name, kw in TILES_SHORT.items():
            fn = functools.partial(R.decode_attention_round8, **kw) if kw else A.decode_attention
            out[f"{name} [fp8]"] = (lambda i, fn=fn: fn(q, kf[i], vf[i], s8, ctx), "fp8")
            out[f"{name} [bf16]"] = (lambda i, fn=fn: fn(q, kb[i], vb[i], one, ctx), "bf16")
        return out
    return attn_ab("short", SHORT_SHAPES, rounds, fns)


#: part ``dot``: round 2's tensor-core variant (:func:`~hwlab.labs.fp8.research.decode_attention_variant`,
#: ``use_dot``) as flash-decoding libraries run it: a few programs of several warps, each streaming
#: a long chunk through a pipelined loop (Triton's pipeliner stages the loads that feed a dot
#: through shared memory), against the lab's many one-warp programs on short chunks
DOT_TILES = {f"dot chunk {c}, {bt} per step, {w} warps, {st} stages": A.AttnTile(c, bt, w, st)
             for c in (512, 1024, 2048) for bt in (64, 128) for w in (4, 8) for st in (2, 3, 4)}


def dot_part(rounds: int) -> list:
    def fns(q, kf, vf, s8, kb, vb):
        ctx = kf[0].shape[2]
        out = {"lab": (lambda i: A.decode_attention(q, kf[i], vf[i], s8, ctx), "fp8")}
        for name, tile in DOT_TILES.items():
            out[name] = (lambda i, tile=tile: R.decode_attention_variant(q, kf[i], vf[i], s8, ctx, tile=tile,
                                                                        use_dot=True), "fp8")
        return out
    return attn_ab("dot", ((4096, 16), (32768, 4)), max(3, rounds // 2), fns)


#: part ``loads`` (the sixth call): the lab's loop on two caches (:func:`~hwlab.labs.fp8.research.
#: decode_attention_interleaved` with ``v_cache``) with other load policies, and the lab's kernel with
#: shorter chunks (round 8: more, shorter programs streamed faster) and other pipeline depths:
#: name -> (keyword arguments of the research loop, or None for the lab's kernel; the tile)
LOADS = {
    "lab": (None, A.DEFAULT_TILE),
    "lab, chunk 128": (None, A.AttnTile(chunk=128)),
    "lab, chunk 64": (None, A.AttnTile(chunk=64)),
    "lab, 1 stage": (None, A.AttnTile(num_stages=1)),
    "lab, 3 stages": (None, A.AttnTile(num_stages=3)),
    "loop, no eviction hint": ({"eviction_policy": ""}, A.DEFAULT_TILE),
    "loop, .cg": ({"cache_modifier": ".cg"}, A.DEFAULT_TILE),
    "loop, .cs": ({"cache_modifier": ".cs"}, A.DEFAULT_TILE),
    "loop, .cg, no eviction hint": ({"cache_modifier": ".cg", "eviction_policy": ""}, A.DEFAULT_TILE),
}


def loads_part(rounds: int) -> list:
    def fns(q, kf, vf, s8, kb, vb):
        ctx = kf[0].shape[2]
        out = {}
        for name, (kw, tile) in LOADS.items():
            if kw is None:
                out[name] = (lambda i, tile=tile: A.decode_attention(q, kf[i], vf[i], s8, ctx, tile=tile), "fp8")
            else:
                out[name] = (lambda i, tile=tile, kw=kw: R.decode_attention_interleaved(q, kf[i], s8, ctx, tile=tile,
                                                                                       v_cache=vf[i], **kw), "fp8")
        return out
    return attn_ab("loads", ATTN_SHAPES, rounds, fns)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--parts", default="attn,step")
    a = ap.parse_args()
    t0 = time.time()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "rounds": a.rounds,
           "layouts": {k: {"ib": ib, "tile": vars(t)} for k, (ib, t) in LAYOUTS.items()},
           "step_choices": STEP_CHOICES}
    parts = a.parts.split(",")
    if "attn" in parts:
        res["attn"] = attn_part(a.rounds)
    if "step" in parts:
        res["step"] = r6.step_part(a.rounds, STEP_BUCKETS, STEP_CHOICES, choose=choice9)
    if "loads" in parts:
        res["loads"] = loads_part(a.rounds)
        res["loads_choices"] = {k: {"research": kw, "tile": vars(t)} for k, (kw, t) in LOADS.items()}
    if "dot" in parts:
        res["dot_tiles"] = {k: vars(t) for k, t in DOT_TILES.items()}
        res["dot"] = dot_part(a.rounds)
    if "short" in parts:
        res["tiles_short"] = {k: r8._json(kw) for k, kw in TILES_SHORT.items()}
        res["short"] = short_part(a.rounds)
        res["short_step"] = r6.step_part(a.rounds, ((512, 16, tuple(SHORT_STEP), "fixed"),
                                                    (512, 16, tuple(SHORT_STEP), "bf16")), SHORT_STEP, choose=r8.choice8)
    res["elapsed_s"] = time.time() - t0
    write_json_atomic(a.out, res, overwrite=True)  # a re-run replaces its own output


if __name__ == "__main__":
    sys.exit(main())
