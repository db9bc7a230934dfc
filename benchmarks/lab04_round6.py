"""Lab 4, round 6 (issue #19): the decode attention at the step's own cache shapes, and the
fixed path's decode step, each A/B'd in one process over the launch choices the lab now has
switches for.

    python benchmarks/lab04_round6.py OUT.json [--rounds 7] [--parts attn,step] [--set 6|6b|7]

``--set 6b`` and ``--set 7`` (decode step only) are the follow-ups: see :data:`CHOICES_B` and
:data:`CHOICES_7` (round 7's small-kernel choices, run by ``lab04_round7.py``). Each table spells out the
lab it ran on (:data:`PRE7`: the lab before round 7's changes), so a re-run measures what it did.

The choices (each a module setting of the lab, so the step runs the lab's own kernels):

* ``order``: the grid with the split fastest (the lab's, since round 5) or (batch x head)
  fastest (round 5's copy of the kernel before it, ``lab04_round5._attn_v2``).
* ``merge``: ``attention.MERGE_TAIL_FRACTION`` 0 (a split of its own for the remainder: at the
  step's 4097 positions, one program in 17 reads one position) or 0.25 (the remainder joins the
  last full split). "lab" was 0 when this ran (commit 760eace); the lab adopted 0.25 after it.
* ``pdl``: ``quant.set_pdl``: the step's Triton kernels launched with programmatic dependent
  launch (each waits for the previous kernel, then lets the next one launch).
* ``min_programs``: ``attention.MIN_PROGRAMS`` (the chunk halves while the grid is smaller).
* ``swap_ab_max_rows``: ``model.SWAP_AB_MAX_ROWS`` (0: the down projection in the plain operand
  order, so ``add_rmsnorm`` reads a row-major result; round 5 saw swap-AB's saving eaten there).

Part ``attn``: the FP8-cache attention alone, one CUDA graph over all 8 layers' caches (as the
lab's ``attention_vs_sdpa``), at the cache shape a decode step reads (T = context + 1, all of it
attended), with SDPA on the bf16 cache in the same rounds; each output checked against the float32
reference first. Part ``step``: the fixed decoder (H200 size), one prefill per bucket, one CUDA
graph of the decode step per choice, outputs compared with the lab's, replays alternated over
``--rounds`` rounds of 20, device events around each replay. Every figure is a median of rounds.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lab04_grid_order_ab import bh_major  # noqa: E402

from hwlab.labs import fp8 as lab  # noqa: E402
from hwlab.labs.fp8 import attention as A  # noqa: E402
from hwlab.labs.fp8 import decode_gemm as G  # noqa: E402
from hwlab.labs.fp8 import model  # noqa: E402
from hwlab.labs.fp8 import quant as Q  # noqa: E402
from hwlab.core.measure_graph import capture_graph  # noqa: E402

#: the lab's settings before round 7 adopted its changes (the kit's decode GEMM, PDL for all but
#: the attention, norms at 8 warps, the head writing float32): every choice of rounds 6 and 7 ran
#: on this base, so each table below spells it out and re-runs what it measured
PRE7 = {"kit_gemm": False, "pdl": False, "row_warps": 4, "head_fp32": False}
#: the lab as it was when round 6 ran (760eace): a split of its own for every remainder, this
#: step's K and V written by a kv_store kernel before the attention, every bf16 cache to SDPA
ROUND6_LAB = {"merge": 0.0, "kv": "separate", "kit_bf16_below": 0, **PRE7}
#: round 6 (``--set 6``): name -> settings; "lab" is :data:`ROUND6_LAB`
CHOICES = {name: {**ROUND6_LAB, **c} for name, c in {
    "lab": {},
    "bh_major": {"order": "bh"},
    "merge": {"merge": 0.25},
    "pdl": {"pdl": True},
    "merge+pdl": {"merge": 0.25, "pdl": True},
    "min_programs 4096": {"min_programs": 4096},
    "min_programs 4096+merge+pdl": {"min_programs": 4096, "merge": 0.25, "pdl": True},
    "no swap-AB": {"swap_ab_max_rows": 0},
    "no swap-AB+merge+pdl": {"swap_ab_max_rows": 0, "merge": 0.25, "pdl": True},
}.items()}
#: round 6b (``--set 6b``, the decode step only, run at 36c39d9): the lab as committed after round 6
#: (merged last split, this step's K and V written by the attention kernel, every bf16 cache read
#: by SDPA) against the same with a kv_store kernel, against round 6's lab, and with the kit's
#: kernel reading a bf16 cache too (adopted after it below 4096 positions: ``KIT_BF16_BELOW_CTX``)
CHOICES_B = {name: {**PRE7, **c} for name, c in {
    "lab": {"kit_bf16_below": 0},
    "kv_store separate": {"kv": "separate", "kit_bf16_below": 0},
    "round-6 lab": ROUND6_LAB,
    "kit on bf16 cache": {"kit_bf16_below": 1 << 30},
}.items()}
#: round 7's small-kernel choices (``--set 7``, prepared in the fifth session, run by
#: ``lab04_round7.py`` at 030bdd4): round 6's step 9 put the 4k step's time over its byte floor in
#: the GEMMs' fixed cost and the small kernels; these are the small kernels' cheap choices: more
#: warps per norm program (one program per row), and the head writing float32 logits itself
#: (``torch.mm(..., out_dtype=float32)``) instead of a cast kernel
CHOICES_7 = {name: {**PRE7, **c} for name, c in {
    "lab": {},
    "norms 8 warps": {"row_warps": 8},
    "norms 16 warps": {"row_warps": 16},
    "head fp32 out": {"head_fp32": True},
}.items()}
#: the lab's own settings, read before any choice changes them
LAB_MERGE, LAB_STEP, LAB_KIT_BF16 = A.MERGE_TAIL_FRACTION, model.KVCache.step, model.KIT_BF16_BELOW_CTX
LAB_ROW_WARPS, LAB_HEAD_FP32, LAB_PDL, LAB_PDL_ATTENTION = Q.ROW_WARPS, model.HEAD_FP32, Q._PDL["on"], A.PDL_ATTENTION
LAB_KIT_GEMM, LAB_GEMM_CONFIGS = G.USE_KIT_GEMM, dict(G.CONFIGS)


def _step_separate(self, layer, q, k, v, pos, tile=A.DEFAULT_TILE, out_scale=None):
    """``KVCache.step`` before round 6b: the kv_store kernel, then the attention."""
    self.write(layer, k, v, pos)
    return self.attend(layer, q, pos + 1, tile, out_scale)


def _no_pdl(t):
    return {"PDL": False}


def _prefetch(pk: int, k: int, tile: dict) -> int:
    """``pk`` columns, at most one K slice's, rounded down to a power of two (a ``tl.arange``)."""
    n = min(pk, k // tile.get("SPLIT_K", 1))
    return 1 << (n.bit_length() - 1) if n >= 128 else 0


@contextlib.contextmanager
def choice(settings: dict):
    """Set the lab's knobs as ``settings`` says (a knob it leaves out keeps the lab's value), and
    put every one back after. Knobs: ``order`` ("bh": round 5's grid), ``merge``, ``min_programs``,
    ``kv`` ("separate": a kv_store kernel), ``kit_bf16_below``, ``swap_ab_max_rows``, ``row_warps``,
    ``head_fp32``, ``pdl`` (with the attention too unless ``pdl_off`` names "attention"; rounds 6
    and 7 ran it that way), ``pdl_off`` (modules whose kernels launch without PDL: "attention",
    "quant"), ``kit_gemm`` with ``configs`` (the tiles; default the lab's), ``prefetch_k`` and
    ``cublas`` (shapes left on cuBLAS)."""
    old = (model.K.decode_attention, A.MERGE_TAIL_FRACTION, A.MIN_PROGRAMS, Q._PDL["on"], model.SWAP_AB_MAX_ROWS,
           model.KVCache.step, model.KIT_BF16_BELOW_CTX, Q.ROW_WARPS, model.HEAD_FP32, A.PDL_ATTENTION,
           Q.pdl_args, G.USE_KIT_GEMM, dict(G.CONFIGS))
    try:
        Q.ROW_WARPS = settings.get("row_warps", LAB_ROW_WARPS)
        model.HEAD_FP32 = settings.get("head_fp32", LAB_HEAD_FP32)
        model.KIT_BF16_BELOW_CTX = settings.get("kit_bf16_below", LAB_KIT_BF16)
        if settings.get("order") == "bh":
            model.K.decode_attention = bh_major
        model.KVCache.step = _step_separate if settings.get("kv") == "separate" else LAB_STEP
        A.MERGE_TAIL_FRACTION = settings.get("merge", LAB_MERGE)
        A.MIN_PROGRAMS = settings.get("min_programs", A.MIN_PROGRAMS)
        pdl_off = settings.get("pdl_off", ())
        Q.set_pdl(settings.get("pdl", LAB_PDL))
        A.PDL_ATTENTION = "attention" not in pdl_off if "pdl" in settings else LAB_PDL_ATTENTION
        if "quant" in pdl_off:
            Q.pdl_args = _no_pdl
        G.USE_KIT_GEMM = settings.get("kit_gemm", LAB_KIT_GEMM)
        if G.USE_KIT_GEMM and {"configs", "prefetch_k", "cublas"} & set(settings):  # else the lab's tiles
            pk = settings.get("prefetch_k", 0)
            G.CONFIGS.clear()
            G.CONFIGS.update({nk: {**G.DEFAULT_CONFIG, **t, "PREFETCH_K": _prefetch(pk, nk[1], t)}
                              for nk, t in settings.get("configs", LAB_GEMM_CONFIGS).items()
                              if nk not in settings.get("cublas", ())})
        model.SWAP_AB_MAX_ROWS = settings.get("swap_ab_max_rows", model.SWAP_AB_MAX_ROWS)
        yield
    finally:
        (model.K.decode_attention, A.MERGE_TAIL_FRACTION, A.MIN_PROGRAMS, Q._PDL["on"],
         model.SWAP_AB_MAX_ROWS, model.KVCache.step, model.KIT_BF16_BELOW_CTX, Q.ROW_WARPS,
         model.HEAD_FP32, A.PDL_ATTENTION, Q.pdl_args, G.USE_KIT_GEMM) = old[:-1]
        G.CONFIGS.clear()
        G.CONFIGS.update(old[-1])


def alternate(graphs: dict, rounds: int, reps: int = 20) -> dict:
    """Median ms per replay of each graph, per round, the graphs alternating within each round."""
    for _ in range(3):  # sustained state
        for g in graphs.values():
            for _ in range(reps):
                g.replay()
    torch.cuda.synchronize()
    ms = {k: [] for k in graphs}
    for _ in range(rounds):
        for k, g in graphs.items():
            t = []
            for _ in range(reps):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                g.replay()
                e1.record()
                e1.synchronize()
                t.append(e0.elapsed_time(e1))
            ms[k].append(statistics.median(t))
    return ms


def attn_inputs(cfg, batch: int, T: int, dev):
    """Every layer's bf16 K and V caches of ``T`` positions (seeded), a query, the FP8 copies with
    a scale nothing saturates under, and the float32 references of both on layer 0:
    ``(kb, vb, q, s8, kf, vf, ref8, ref16)`` (rounds 6 and 8 time the attention on these)."""
    shape = (batch, cfg.n_heads, T, cfg.d_head)
    n = cfg.n_layers
    g = torch.Generator(device=dev).manual_seed(5)
    kb = [torch.randn(shape, generator=g, device=dev, dtype=torch.bfloat16) for _ in range(n)]
    vb = [torch.randn(shape, generator=g, device=dev, dtype=torch.bfloat16) for _ in range(n)]
    q = torch.randn(batch, cfg.n_heads, 1, cfg.d_head, generator=g, device=dev, dtype=torch.bfloat16)
    s8 = torch.tensor(4.0 / Q.FP8_MAX, device=dev)
    kf = [Q.quant_static_ref(t, s8) for t in kb]
    vf = [Q.quant_static_ref(t, s8) for t in vb]
    ref8 = A.decode_attention_ref(q, kf[0], vf[0], s8, T).float()
    ref16 = A.decode_attention_ref(q, kb[0], vb[0], torch.ones((), device=dev), T).float()
    return kb, vb, q, s8, kf, vf, ref8, ref16


def sdpa_graph(q, kb, vb, ref16, dev):
    """SDPA over every layer's bf16 cache in one CUDA graph, replayed once and checked: the graph
    and its first layer's error against the float32 reference."""
    cap = capture_graph(lambda: [F.scaled_dot_product_attention(q, kb[i], vb[i]) for i in range(len(kb))], dev)
    cap.replay()
    torch.cuda.synchronize()
    return cap, float((cap.out[0].float() - ref16).norm() / ref16.norm())


def attn_part(rounds: int) -> list:
    dev = torch.device("cuda")
    cfg = lab.H200_SIZE
    n = cfg.n_layers
    rows = []
    for ctx, batch, names in ((512, 16, ("lab", "merge", "pdl", "min_programs 4096", "min_programs 4096+merge+pdl")),
                              (4096, 16, ("lab", "bh_major", "merge", "pdl", "merge+pdl")),
                              (32768, 4, ("lab", "bh_major", "merge", "pdl", "merge+pdl"))):
        T = ctx + 1  # what a decode step reads: the prompt and this step's position
        kb, vb, q, s8, kf, vf, ref8, ref16 = attn_inputs(cfg, batch, T, dev)
        graphs, errs = {}, {}
        with torch.no_grad():
            for name in names:
                try:
                    with choice(CHOICES[name]):
                        fn = model.K.decode_attention
                        cap = capture_graph(lambda fn=fn: [fn(q, kf[i], vf[i], s8, T) for i in range(n)], dev)
                        cap.replay()
                        torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - a choice that cannot run is a result too
                    errs[name] = f"{type(e).__name__}: {e}"[:300]
                    print(f"attn {ctx} x{batch}: {name} failed: {errs[name]}", flush=True)
                    continue
                errs[name] = float((cap.out[0].float() - ref8).norm() / ref8.norm())
                graphs[name] = cap
            graphs["sdpa"], errs["sdpa"] = sdpa_graph(q, kb, vb, ref16, dev)
            ms = alternate(graphs, rounds)
        bytes8 = 2 * kf[0].numel()
        row = {"ctx": ctx, "batch": batch, "T": T, "n_layers": n, "rel_err_vs_float32": errs, "ms_rounds": ms}
        row["us_per_layer"] = {k: statistics.median(v) * 1e3 / n for k, v in ms.items()}
        row["gbps"] = {k: (2 * bytes8 if k == "sdpa" else bytes8) / us / 1e3 for k, us in row["us_per_layer"].items()}
        rows.append(row)
        print(f"attn {ctx} x{batch} (T {T}): " + ", ".join(f"{k} {row['us_per_layer'][k]:.1f} us "
              f"{row['gbps'][k]:.0f} GB/s" for k in row["gbps"]), flush=True)
        del graphs, kb, vb, kf, vf
        torch.cuda.empty_cache()
    return rows


#: round 6's decode-step buckets and choices
STEP_6 = ((512, 16, ("lab", "pdl", "no swap-AB", "no swap-AB+merge+pdl", "merge+pdl")),
          (4096, 16, ("lab", "bh_major", "merge", "pdl", "merge+pdl", "no swap-AB", "no swap-AB+merge+pdl")),
          (32768, 4, ("lab", "merge", "pdl", "merge+pdl")))
#: round 6b: (ctx, batch, choices, path); at 512 the fixed path keeps a bf16 cache, so the bf16
#: path (the baseline) is A/B'd too: a change the baseline can use must be measured on it as well
STEP_6B = ((512, 16, ("lab", "kit on bf16 cache"), "fixed"), (512, 16, ("lab", "kit on bf16 cache"), "bf16"),
           (4096, 16, ("lab", "kv_store separate", "round-6 lab"), "fixed"),
           (32768, 4, ("lab", "kv_store separate", "round-6 lab"), "fixed"),
           (4096, 16, ("lab", "kit on bf16 cache"), "bf16"))
#: round 7: both paths, since the baseline would take either change too
STEP_7 = tuple((ctx, batch, tuple(CHOICES_7), path) for path in ("fixed", "bf16")
               for ctx, batch in ((512, 16), (4096, 16)))


def prefilled_decode(m, ctx: int, batch: int, dev):
    """A seeded prompt of ``ctx`` tokens prefilled into a new cache of decoder ``m``, and the one-token
    decode step at position ``ctx`` as a closure a CUDA graph can capture (it resets the cache's
    length first, so every replay is the same step): ``(decode, cache)``."""
    g = torch.Generator().manual_seed(2)
    toks = torch.randint(0, m.cfg.vocab, (batch, ctx + 1), generator=g).to(dev)
    cache = m.new_cache(batch, ctx + 1)
    with torch.no_grad():
        m(toks[:, :ctx], cache)

    def decode():
        cache.len = ctx
        return m(toks[:, ctx:ctx + 1], cache)
    return decode, cache


def logits_diff_vs_lab(graphs: dict) -> dict:
    """Each captured decode step replayed once: its logits' relative difference from the "lab" graph's."""
    outs = {}
    for k, c in graphs.items():
        c.replay()
        torch.cuda.synchronize()
        outs[k] = c.out.float().clone()
    return {k: float((o - outs["lab"]).norm() / outs["lab"].norm()) for k, o in outs.items()}


def step_part(rounds: int, buckets=STEP_6, choices=CHOICES, choose=None) -> list:
    """``choose``: the context manager that applies a choice's settings (default :func:`choice`)."""
    choose = choose or choice
    dev = torch.device("cuda")
    models = {}
    rows = []
    for ctx, batch, names, *path in buckets:
        path = path[0] if path else "fixed"
        if path not in models:
            models[path] = lab.Decoder(lab.H200_SIZE, path)
        m = models[path]
        decode, cache = prefilled_decode(m, ctx, batch, dev)
        with torch.no_grad():
            graphs = {}
            for name in names:
                try:
                    with choose(choices[name]):
                        graphs[name] = capture_graph(decode, dev)
                except Exception as e:  # noqa: BLE001
                    print(f"step {ctx} x{batch}: {name} failed: {type(e).__name__}: {e}"[:400], flush=True)
            diff = logits_diff_vs_lab(graphs)
            ms = alternate(graphs, rounds)
        row = {"ctx": ctx, "batch": batch, "path": path, "failed": [k for k in names if k not in graphs],
               "logits_rel_diff_vs_lab": diff, "tpot_ms_rounds": ms,
               "tpot_ms": {k: statistics.median(v) for k, v in ms.items()},
               "tpot_ms_min_max": {k: [min(v), max(v)] for k, v in ms.items()}}
        rows.append(row)
        print(f"step {path} {ctx} x{batch}: " + ", ".join(f"{k} {v:.4f} ms ({min(ms[k]):.4f}-{max(ms[k]):.4f})"
                                                  for k, v in row["tpot_ms"].items()), flush=True)
        del graphs, cache
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--parts", default="attn,step")
    ap.add_argument("--set", default="6", choices=("6", "6b", "7"),
                    help="6b, 7: the decode step only, with CHOICES_B / CHOICES_7")
    a = ap.parse_args()
    t0 = time.time()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "rounds": a.rounds, "set": a.set,
           "choices": {"6": CHOICES, "6b": CHOICES_B, "7": CHOICES_7}[a.set]}
    if a.set in ("6b", "7"):
        res["step"] = step_part(a.rounds, *{"6b": (STEP_6B, CHOICES_B), "7": (STEP_7, CHOICES_7)}[a.set])
        a.parts = ""
    parts = a.parts.split(",")
    if "attn" in parts:
        res["attn"] = attn_part(a.rounds)
    if "step" in parts:
        res["step"] = step_part(a.rounds)
    res["elapsed_s"] = time.time() - t0
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=1)
    os.replace(tmp, a.out)


if __name__ == "__main__":
    sys.exit(main())
