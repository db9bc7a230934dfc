"""Lab 4, round 8 (issue #19): the FP8 decode attention's grid sized to the GPU, and its combine
folded into the partial kernel, alone against SDPA and in the decode step.

    python benchmarks/lab04_round8.py OUT.json [--rounds 7] [--parts attn,step] [--set 8|8b]

What round 7 left (LAB04_NOTES.md): the kit's FP8 attention at 80 / 92 / 92% of SDPA's GB/s at
512 / 4k / 32k. Fitted from the lab's 4k and 32k comparison (the same kernels on twice the bytes),
the kit's attention pays ~3.4 us per layer fixed and streams at ~4.3 TB/s, SDPA ~7.5 us and ~4.7
TB/s. Two changes aimed at the streaming rate and the fixed part, each then an :class:`AttnTile` field
(since round 9 keyword arguments of :func:`hwlab.labs.fp8.research.decode_attention_round8`):

* ``programs_per_sm``: the splits sized so the grid is about that many programs per SM. The
  runtime-specialised kernel (16-byte aligned pointers, as Triton's launcher compiles it) holds
  71 registers at one warp, so about 28 programs stay resident per SM; the lab's chunks give 2.2
  (4k) or 1.1 (chunk 512) waves, whose last partial wave streams with few loads in flight.
* ``fused_combine``: the last program of a (batch, head) combines the splits (a counter, one split
  at a time so the registers stay the partial's: 72 against 71 in the static compile), one launch
  per layer fewer. Round 4 fused a combine that loaded every split at once and lost residency.

Part ``attn``: the kit's kernel on an FP8 cache per tile, SDPA on the bf16 cache, one CUDA graph
over all 8 layers' caches at the lab comparison's shapes (T = context), each output checked against
the float32 reference first; replays alternated over rounds (round 6's :func:`alternate`), medians
of rounds. Part ``step``: the decode step of the fixed path (512, 4k, 32k) and of the bf16 path at
512 (the kit's kernel reads a short bf16 cache in both paths, so the baseline takes the change too)
per choice (:data:`STEP_CHOICES`: a tile, and PDL for the attention's kernels too).

``--set 8b`` (the second call, after 8 found neither change faster): the kit's decode GEMM with
split-K reduced serially (``decode_gemm`` ``SERIAL_K``: each K slice stores its partials to a slab
of its own and the last to arrive sums them, in place of one float32 atomic add per element and
slice; round 7's sweep saw every split cost 2-6 us on qkv and up). Part ``gemm``: round 7's
:func:`lab04_round7.gemm_part` over :data:`TILES_8B`; part ``step``: the fixed path's step with the
lab's tiles, the lab's tiles reduced serially, and the sweep's best tile per shape.
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
import lab04_round7 as r7  # noqa: E402

from hwlab.labs import fp8 as lab  # noqa: E402
from hwlab.labs.fp8 import attention as A  # noqa: E402
from hwlab.labs.fp8 import model  # noqa: E402
from hwlab.labs.fp8 import research as R  # noqa: E402
from hwlab.core.measure_graph import capture_graph  # noqa: E402
from hwlab.core.store import write_json_atomic  # noqa: E402

LAB = A.DEFAULT_TILE
#: part ``attn``'s choices (name -> keyword arguments of :func:`hwlab.labs.fp8.research.decode_attention_round8`,
#: where round 8's two switches live since round 9 took them out of the lab's AttnTile), the lab's first
TILES = {
    "lab": {},
    "fused": {"fused_combine": True},
    "ppsm 14": {"programs_per_sm": 14},
    "ppsm 28": {"programs_per_sm": 28},
    "ppsm 56": {"programs_per_sm": 56},
    "fused + ppsm 14": {"programs_per_sm": 14, "fused_combine": True},
    "fused + ppsm 28": {"programs_per_sm": 28, "fused_combine": True},
    "ppsm 28, 32 per step": {"tile": A.AttnTile(block_t=32), "programs_per_sm": 28},
}
#: part ``step``'s choices: round 6's :func:`lab04_round6.choice` settings (the lab's own where left
#: out) plus ``attn`` (round 8's switches given to every call of the decoder's attention); ``pdl`` on
#: with nothing off: the attention's kernels launch with PDL too (round 7b measured that 1% faster
#: at 512, slower at 4k and 32k)
STEP_CHOICES = {
    "lab": {},
    "fused": {"attn": TILES["fused"]},
    "ppsm 28": {"attn": TILES["ppsm 28"]},
    "fused + ppsm 28": {"attn": TILES["fused + ppsm 28"]},
    "fused + ppsm 14": {"attn": TILES["fused + ppsm 14"]},
    "pdl attention": {"pdl": True},
    "pdl attention + fused": {"pdl": True, "attn": TILES["fused"]},
}
ATTN_SHAPES = ((512, 16), (4096, 16), (32768, 4))
_SW = {"SWAP": True, "BN": 64}
#: ``--set 8b``'s GEMM tiles: the lab's (BK 128, 6 stages; split in 4 by atomics for out and down)
#: and the serial reduction at 2-16 slices
TILES_8B = {
    "swap 64x128 s6": {**_SW, "BK": 128, "STAGES": 6},
    "swap 64x128 s6 k4": {**_SW, "BK": 128, "STAGES": 6, "SPLIT_K": 4},
    "swap 64x128 s6 k2 serial": {**_SW, "BK": 128, "STAGES": 6, "SPLIT_K": 2, "SERIAL_K": True},
    "swap 64x128 s6 k4 serial": {**_SW, "BK": 128, "STAGES": 6, "SPLIT_K": 4, "SERIAL_K": True},
    "swap 64x128 s6 k8 serial": {**_SW, "BK": 128, "STAGES": 6, "SPLIT_K": 8, "SERIAL_K": True},
    "swap 64x128 s4 k4 serial": {**_SW, "BK": 128, "STAGES": 4, "SPLIT_K": 4, "SERIAL_K": True},
    "swap 64x128 s4 k16 serial": {**_SW, "BK": 128, "STAGES": 4, "SPLIT_K": 16, "SERIAL_K": True},
    "swap 64x256 s4 k2 serial": {**_SW, "BK": 256, "STAGES": 4, "SPLIT_K": 2, "SERIAL_K": True},
}


def step_choices_8b(best: dict) -> dict:
    """The fixed step's GEMM choices: the lab's tiles, the same reduced serially where split, and
    ``best`` (the sweep's tile per shape)."""
    from hwlab.labs.fp8 import decode_gemm as G
    serial = {nk: ({**t, "SERIAL_K": True} if t.get("SPLIT_K", 1) > 1 else t) for nk, t in G.CONFIGS.items()}
    return {"lab": {}, "lab tiles, serial split-K": {"configs": serial}, "sweep's best": {"configs": best}}


def _json(kw: dict) -> dict:
    return {k: (vars(v) if isinstance(v, A.AttnTile) else v) for k, v in kw.items()}


@contextlib.contextmanager
def choice8(settings: dict):
    """:func:`lab04_round6.choice` for the lab's knobs, and round 8's attention switches
    ``settings["attn"]`` given to every call of the decoder's attention (``model.K.decode_attention``,
    which :func:`lab04_round6.choice` puts back), through :func:`~hwlab.labs.fp8.research.decode_attention_round8`."""
    with r6.choice({k: v for k, v in settings.items() if k != "attn"}):
        if "attn" in settings:
            switches = settings["attn"]

            def round8_attention(*a, **kw):
                return R.decode_attention_round8(*a, **{**kw, **switches})
            model.K.decode_attention = round8_attention
        yield


def attn_part(rounds: int) -> list:
    dev = torch.device("cuda")
    cfg = lab.H200_SIZE
    n = cfg.n_layers
    rows = []
    for ctx, batch in ATTN_SHAPES:
        kb, vb, q, s8, kf, vf, ref8, ref16 = r6.attn_inputs(cfg, batch, ctx, dev)  # T = context, as the lab
        graphs, errs, splits = {}, {}, {}
        sms = R.sm_count(dev)
        with torch.no_grad():
            for name, kw in TILES.items():
                fn = functools.partial(R.decode_attention_round8, **kw) if kw else A.decode_attention
                cap = capture_graph(lambda fn=fn: [fn(q, kf[i], vf[i], s8, ctx) for i in range(n)], dev)
                cap.replay()
                torch.cuda.synchronize()
                errs[name] = float((cap.out[0].float() - ref8).norm() / ref8.norm())
                if not errs[name] < A.FP8_CACHE_MATH_REL:
                    print(f"attn {ctx} x{batch}: {name} wrong ({errs[name]:.2e}), not timed", flush=True)
                    continue
                splits[name] = A.split_count(ctx, R.chunk_for_gpu(kw.get("tile", LAB), batch * cfg.n_heads, ctx,
                                                                  kw.get("programs_per_sm", 0), sms))
                graphs[name] = cap
            graphs["sdpa"], errs["sdpa"] = r6.sdpa_graph(q, kb, vb, ref16, dev)
            ms = r6.alternate(graphs, rounds)
        bytes8 = 2 * kf[0].numel()
        row = {"ctx": ctx, "batch": batch, "T": ctx, "n_layers": n, "sm_count": sms, "splits": splits,
               "programs": {k: s * batch * cfg.n_heads for k, s in splits.items()},
               "rel_err_vs_float32": errs, "ms_rounds": ms}
        row["us_per_layer"] = {k: statistics.median(v) * 1e3 / n for k, v in ms.items()}
        row["gbps"] = {k: (2 * bytes8 if k == "sdpa" else bytes8) / us / 1e3 for k, us in row["us_per_layer"].items()}
        row["over_sdpa"] = {k: g / row["gbps"]["sdpa"] for k, g in row["gbps"].items()}
        rows.append(row)
        print(f"attn {ctx} x{batch}: " + ", ".join(f"{k} {row['us_per_layer'][k]:.1f} us {row['gbps'][k]:.0f} GB/s "
                                                 f"({row['over_sdpa'][k]:.0%})" + (f" [{splits[k]} splits]" if k in splits else "")
                                                 for k in row["gbps"]), flush=True)
        del graphs, kb, vb, kf, vf
        torch.cuda.empty_cache()
    return rows


STEP_BUCKETS = ((512, 16, tuple(STEP_CHOICES), "fixed"),
                (4096, 16, ("lab", "fused", "ppsm 28", "fused + ppsm 28", "fused + ppsm 14"), "fixed"),
                (32768, 4, ("lab", "fused", "ppsm 28", "fused + ppsm 28", "fused + ppsm 14"), "fixed"),
                (512, 16, tuple(STEP_CHOICES), "bf16"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--parts", default="attn,step")
    ap.add_argument("--set", default="8", choices=("8", "8b"))
    a = ap.parse_args()
    t0 = time.time()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "rounds": a.rounds,
           "tiles": {k: _json(t) for k, t in TILES.items()},
           "step_choices": {k: {kk: (_json(vv) if kk == "attn" else vv) for kk, vv in v.items()}
                            for k, v in STEP_CHOICES.items()}}
    parts = a.parts.split(",")
    if a.set == "8b":
        res["set"], res["tiles"] = "8b", TILES_8B
        res["gemm"], best, _ = r7.gemm_part(a.rounds, tiles=TILES_8B, prefetch=())
        res["step_tiles"] = {f"{n}x{k}": t for (n, k), t in best.items()}
        ch = step_choices_8b(best)
        res["step_choices"] = {k: {kk: {f"{n}x{kk2}": t for (n, kk2), t in vv.items()} for kk, vv in v.items()}
                               for k, v in ch.items()}
        res["step"] = r6.step_part(a.rounds, tuple((c, b, tuple(ch), "fixed") for c, b in ATTN_SHAPES), ch,
                                   choose=r6.choice)
        parts = []
    if "attn" in parts:
        res["attn"] = attn_part(a.rounds)
    if "step" in parts:
        res["step"] = r6.step_part(a.rounds, STEP_BUCKETS, STEP_CHOICES, choose=choice8)
    res["elapsed_s"] = time.time() - t0
    write_json_atomic(a.out, res, overwrite=True)  # a re-run replaces its own output


if __name__ == "__main__":
    sys.exit(main())
