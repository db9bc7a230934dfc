"""Lab 4, round 10 (issue #19): the FP8 decode attention with fewer instructions per byte.

    python benchmarks/lab04_round10.py OUT.json [--rounds 7] [--parts attn,step]

Round 9 (LAB04_NOTES.md items 10-11) measured the kit's FP8 attention slower under sustained load
with the SM clock pulled down, where SDPA is not, and counted its loop on a CPU at 122 warp
instructions per KB read; most of the excess was the output summed across the warp's threads every
step, one fp16 value per shuffle. :func:`hwlab.labs.fp8.research.decode_attention_lean` keeps the
output and the sum per position row and sums them once after the loop, sums the scores across
threads in float32, and loads the full steps unmasked: 76 per KB in the same count
(``results/round10/lab04_sass_mix_cpu.json``).

Part ``attn``: the lab's kernel, the lean loop (the lab's tile and 32 positions per step) and SDPA
on the bf16 cache, one CUDA graph over 8 layers' caches at T = context, each checked against the
float32 reference first; timed both ways round 9 compared (``lab04_timing_method.py``): each
graph's replays in one sustained block (the lab's method; twice, in opposite orders, with the SM
clock read after each block) and alternated with a sync per replay (the round scripts' A/B).

Part ``step``: the fixed path's decode step at 512, 4k and 32k with the lab's attention and with
the lean one (``model.K.decode_attention`` swapped), CUDA graphs, timed both ways as well.
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
from lab04_timing_method import sm_clock_mhz  # noqa: E402

from hwlab.labs import fp8 as lab  # noqa: E402
from hwlab.labs.fp8 import attention as A  # noqa: E402
from hwlab.labs.fp8 import model  # noqa: E402
from hwlab.labs.fp8 import research as R  # noqa: E402
from hwlab.core.measure import time_fn  # noqa: E402
from hwlab.core.measure_graph import capture_graph  # noqa: E402
from hwlab.core.store import write_json_atomic  # noqa: E402

ATTN_SHAPES = ((512, 16), (4096, 16), (32768, 4))
#: part ``attn``'s kernels: name -> the decode attention function (the lab's signature)
#: (call 1 ran the first three; call 2 all: after call 1 found the lean loop no faster, the lab's loop
#: with more programs resident per SM, its registers capped at 64 so that 32 one-warp programs fit)
KERNELS = {
    "lab": A.decode_attention,
    "lean": R.decode_attention_lean,
    "lean, 32 per step": functools.partial(R.decode_attention_lean, tile=A.AttnTile(block_t=32)),
    "lab, 64 registers": functools.partial(R.decode_attention_round8, maxnreg=64),
    "lab, 32 per step, 2 warps, 64 registers": functools.partial(R.decode_attention_round8, maxnreg=64,
                                                                 tile=A.AttnTile(block_t=32, num_warps=2)),
    "lean, 2 warps": functools.partial(R.decode_attention_lean, tile=A.AttnTile(block_t=32, num_warps=2)),
    # call 4, after the counters (lab04_attn_counters.py): the loads in flight through shared memory
    **{f"lean, {st} loop stages": functools.partial(R.decode_attention_lean, loop_stages=st,
                                                   tile=A.AttnTile(num_stages=st)) for st in (2, 3, 4)},
    "lean, 32 per step, 2 loop stages": functools.partial(R.decode_attention_lean, loop_stages=2,
                                                          tile=A.AttnTile(block_t=32)),
}


def _few_programs(fn):
    """``fn`` with the chunk rule's floor of :data:`~hwlab.labs.fp8.attention.MIN_PROGRAMS` off while
    it runs (a graph captures the chunk), so that a tile's chunk is the chunk it names."""
    def run(*a, **kw):
        old = A.MIN_PROGRAMS
        try:
            A.MIN_PROGRAMS = 0
            return fn(*a, **kw)
        finally:
            A.MIN_PROGRAMS = old
    return run


#: call 5, after the load-only probes' question (part ``pattern``): the running max per position row,
#: so that several warps stream one program's long steps with no exchange inside the loop
ROWS_TILES = {
    "rows, lab tile": (A.AttnTile(), 0),
    "rows, lab tile, 3 loop stages": (A.AttnTile(num_stages=3), 3),
    "rows, 2 warps, 32 per step, chunk 512, 3 loop stages": (A.AttnTile(512, 32, 2, 3), 3),
    "rows, 4 warps, 64 per step, chunk 1024, 3 loop stages": (A.AttnTile(1024, 64, 4, 3), 3),
    "rows, 4 warps, 64 per step, chunk 2048, 3 loop stages": (A.AttnTile(2048, 64, 4, 3), 3),
    "rows, 8 warps, 128 per step, chunk 2048, 3 loop stages": (A.AttnTile(2048, 128, 8, 3), 3),
}
KERNELS.update({name: _few_programs(functools.partial(R.decode_attention_lean, rows=True, tile=t, loop_stages=st))
                for name, (t, st) in ROWS_TILES.items()})
#: call 8, after the counters put the partial kernel alone nearer SDPA than the lab's comparison
#: (which times the combine too): the combine launched with PDL
KERNELS["lab, combine with PDL"] = functools.partial(R.decode_attention_round8, pdl_combine=True)
#: part ``pattern``'s load-only probes (:func:`~hwlab.labs.fp8.research.stream_kv`): name -> (warps,
#: positions per step, chunk (0: the whole row), loop stages)
PROBES = {
    "1 warp, 16 per step, chunk 256": (1, 16, 256, 0),
    "1 warp, 16 per step, chunk 256, 3 stages": (1, 16, 256, 3),
    "2 warps, 32 per step, chunk 512, 3 stages": (2, 32, 512, 3),
    "4 warps, 64 per step, chunk 1024": (4, 64, 1024, 0),
    "4 warps, 64 per step, chunk 1024, 3 stages": (4, 64, 1024, 3),
    "4 warps, 64 per step, chunk 1024, 4 stages": (4, 64, 1024, 4),
    "4 warps, 64 per step, whole row, 3 stages": (4, 64, 0, 3),
    "4 warps, 128 per step, chunk 2048, 3 stages": (4, 128, 2048, 3),
    "8 warps, 128 per step, chunk 2048, 3 stages": (8, 128, 2048, 3),
}
#: part ``step``'s choices: name -> the decoder's attention function
STEP_CHOICES = {"lab": A.decode_attention, "lean": R.decode_attention_lean,
                "lab, 64 registers": KERNELS["lab, 64 registers"],
                "lean, 32 per step": KERNELS["lean, 32 per step"],
                **{f"lean, {st} loop stages": KERNELS[f"lean, {st} loop stages"] for st in (2, 3, 4)},
                "lab, combine with PDL": KERNELS["lab, combine with PDL"],
                "rows, lab tile, 3 loop stages": KERNELS["rows, lab tile, 3 loop stages"]}
BLOCK_REPS = 20


@contextlib.contextmanager
def attention_as(fn):
    """The decoder's attention calls go to ``fn`` (``model.K.decode_attention``), put back after."""
    old = model.K.decode_attention
    try:
        model.K.decode_attention = fn
        yield
    finally:
        model.K.decode_attention = old


def both_methods(graphs: dict, rounds: int, per: int) -> dict:
    """Each graph timed as one sustained block (:func:`hwlab.core.measure.time_fn`, twice, in opposite
    orders, the SM clock read after each block) and alternated with a sync per replay
    (:func:`lab04_round6.alternate`); ``per``: replays' units per graph (layers, or 1 for a step).
    Medians in us per unit."""
    names = list(graphs)
    blocks = []
    for order in (names, names[::-1]):
        for name in order:
            t = time_fn(graphs[name].replay, [()], torch.device("cuda"), n_rep=BLOCK_REPS)
            blocks.append({"way": name, "us": t.median_ms * 1e3 / per,
                           "p10_p90_us": [t.p10_ms * 1e3 / per, t.p90_ms * 1e3 / per], "sm_mhz_after": sm_clock_mhz()})
    ms = r6.alternate(graphs, rounds)
    return {"sustained_us": {k: statistics.median(b["us"] for b in blocks if b["way"] == k) for k in names},
            "blocks": blocks,
            "alternate_us": {k: statistics.median(v) * 1e3 / per for k, v in ms.items()},
            "alternate_ms_rounds": ms}


def add_rates(row: dict, bytes8: int, tag: str) -> None:
    """GB/s and share of SDPA's per way and timing method into ``row`` (its ``*_us`` medians per
    layer): the kit's ways read ``bytes8`` (one layer's FP8 K and V), SDPA twice that (bf16); printed."""
    for method in ("sustained", "alternate"):
        us = row[f"{method}_us"]
        gbps = {k: (2 * bytes8 if k == "sdpa" else bytes8) / v / 1e3 for k, v in us.items()}
        row[f"{method}_gbps"] = gbps
        row[f"{method}_over_sdpa"] = {k: g / gbps["sdpa"] for k, g in gbps.items()}
        print(f"{tag} {row['ctx']} x{row['batch']} {method}: " + ", ".join(
            f"{k} {us[k]:.1f} us {gbps[k]:.0f} GB/s ({row[f'{method}_over_sdpa'][k]:.1%})" for k in us), flush=True)


def attn_part(rounds: int, names, shapes=ATTN_SHAPES, extra_positions=(0,), tag: str = "attn",
              new_kv: bool = False) -> list:
    """:data:`KERNELS` ``names`` and SDPA at each (context, batch) of ``shapes``, on caches of T =
    context + each of ``extra_positions`` positions, every position read (round 11 adds 1: the
    decode step's length). ``new_kv``: the kit's kernels also write the last position first, as the
    decode step's do (``new_kv``: its own K and V, read back from the FP8 cache, so the result and
    the check stay the same)."""
    dev = torch.device("cuda")
    cfg = lab.H200_SIZE
    n = cfg.n_layers
    rows = []
    for (ctx, batch), T in (((c, b), c + e) for c, b in shapes for e in extra_positions):
        kb, vb, q, s8, kf, vf, ref8, ref16 = r6.attn_inputs(cfg, batch, T, dev)
        kw = [{"new_kv": ((kf[i][:, :, T - 1:].float() * s8).to(torch.bfloat16),
                          (vf[i][:, :, T - 1:].float() * s8).to(torch.bfloat16))} if new_kv else {} for i in range(n)]
        graphs, errs = {}, {}
        with torch.no_grad():
            for name in names:
                fn = KERNELS[name]
                cap = capture_graph(lambda fn=fn: [fn(q, kf[i], vf[i], s8, T, **kw[i]) for i in range(n)], dev)
                cap.replay()
                torch.cuda.synchronize()
                errs[name] = float((cap.out[0].float() - ref8).norm() / ref8.norm())
                if errs[name] < A.FP8_CACHE_MATH_REL:
                    graphs[name] = cap
                else:
                    print(f"attn {ctx} x{batch}: {name} wrong ({errs[name]:.2e}), not timed", flush=True)
            graphs["sdpa"], errs["sdpa"] = r6.sdpa_graph(q, kb, vb, ref16, dev)
            t = both_methods(graphs, rounds, n)
        row = {"ctx": ctx, "batch": batch, "T": T, "new_kv": new_kv, "n_layers": n, "rel_err_vs_float32": errs, **t}
        add_rates(row, 2 * kf[0].numel(), tag)
        print("  clocks after blocks:", [(b["way"], b["sm_mhz_after"]) for b in t["blocks"]], flush=True)
        rows.append(row)
        del graphs, kb, vb, kf, vf
        torch.cuda.empty_cache()
    return rows


def pattern_part(rounds: int) -> list:
    """Load-only reads of the FP8 caches in each :data:`PROBES` pattern at 4k x16 and 32k x4 (every
    layer's caches in one graph, each probe's result checked against torch's XOR of layer 0 first),
    SDPA on the bf16 caches beside: which access pattern reads at SDPA's rate."""
    dev = torch.device("cuda")
    cfg = lab.H200_SIZE
    n = cfg.n_layers
    rows = []
    for ctx, batch in ATTN_SHAPES[1:]:
        kb, vb, q, s8, kf, vf, ref8, ref16 = r6.attn_inputs(cfg, batch, ctx, dev)
        graphs, ok = {}, {}
        with torch.no_grad():
            for name, (w, bt, chunk, st) in PROBES.items():
                chunk = chunk or ctx
                want = R.stream_kv(kf[0], vf[0], chunk, bt, use_triton=False)
                cap = capture_graph(lambda w=w, bt=bt, chunk=chunk, st=st: [
                    R.stream_kv(kf[i], vf[i], chunk, bt, num_warps=w, loop_stages=st) for i in range(n)], dev)
                cap.replay()
                torch.cuda.synchronize()
                ok[name] = bool(torch.equal(cap.out[0], want))
                if ok[name]:
                    graphs[name] = cap
                else:
                    print(f"pattern {ctx} x{batch}: {name} read wrong bytes, not timed", flush=True)
            graphs["sdpa"], _ = r6.sdpa_graph(q, kb, vb, ref16, dev)
            t = both_methods(graphs, rounds, n)
        row = {"ctx": ctx, "batch": batch, "checked": ok, **t}
        add_rates(row, 2 * kf[0].numel(), "pattern")
        rows.append(row)
        del graphs, kb, vb, kf, vf
        torch.cuda.empty_cache()
    return rows


def step_part(rounds: int, names) -> list:
    dev = torch.device("cuda")
    m = lab.Decoder(lab.H200_SIZE, "fixed")
    rows = []
    for ctx, batch in ATTN_SHAPES:
        decode, cache = r6.prefilled_decode(m, ctx, batch, dev)
        with torch.no_grad():
            graphs = {}
            for name in names:
                with attention_as(STEP_CHOICES[name]):
                    graphs[name] = capture_graph(decode, dev)
            diff = r6.logits_diff_vs_lab(graphs)
            t = both_methods(graphs, rounds, 1)
        row = {"ctx": ctx, "batch": batch, "path": "fixed", "logits_rel_diff_vs_lab": diff, **t}
        rows.append(row)
        for method in ("sustained", "alternate"):
            print(f"step fixed {ctx} x{batch} {method}: " + ", ".join(f"{k} {v / 1e3:.4f} ms"
                                                                     for k, v in t[f"{method}_us"].items()), flush=True)
        del graphs, cache
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--parts", default="attn,step", help="attn, step, pattern")
    ap.add_argument("--kernels", default=";".join(KERNELS), help="part attn's kernels, by name, separated by ;")
    ap.add_argument("--step-choices", default=";".join(STEP_CHOICES), help="part step's choices, by name, separated by ;")
    a = ap.parse_args()
    t0 = time.time()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "rounds": a.rounds, "block_reps": BLOCK_REPS,
           "kernels": a.kernels.split(";"), "step_choices": a.step_choices.split(";")}
    parts = a.parts.split(",")
    if "attn" in parts:
        res["attn"] = attn_part(a.rounds, a.kernels.split(";"))
    if "pattern" in parts:
        res["probes"] = {k: dict(zip(("warps", "block_t", "chunk", "loop_stages"), v)) for k, v in PROBES.items()}
        res["pattern"] = pattern_part(a.rounds)
    if "step" in parts:
        res["step"] = step_part(a.rounds, a.step_choices.split(";"))
    res["elapsed_s"] = time.time() - t0
    write_json_atomic(a.out, res, overwrite=True)  # a re-run replaces its own output


if __name__ == "__main__":
    sys.exit(main())
