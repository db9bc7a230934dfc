"""Lab 4, round 11 (issue #19): how fast a decode GEMM's weight can be read at all, and the lean
attention loop at full residency.

    python benchmarks/lab04_round11.py OUT.json [--rounds 7] [--parts floor,attn,step]

Part ``floor``: rounds 5-8 put the FP8 GEMMs' gap to bf16's bytes/s in each call's fixed
microseconds, on half the bytes. This asks what any one-launch kernel could do: each weight shape of
the H200-size model (qkv, out, up, down), 8 layers' weights in one CUDA graph as the lab's GEMM
comparison times them, and beside the GEMMs (bf16 on cuBLAS, the lab's FP8 GEMM, cuBLAS's FP8 GEMM,
at 16 and 4 rows, each checked against float32 first) load-only reads of the same weights
(:func:`hwlab.labs.fp8.research.stream_matrix`, each checked against torch's XOR first) over
:data:`PROBES` x the K splits that give 132-8192 programs, and torch's own sum of the weight as
int32 words. ``needed_us``: the time an FP8 GEMM must take to read its weight at bf16's bytes/s at
those rows; where even the fastest read of the FP8 weight takes longer, no one-launch FP8 GEMM can
meet that target on this machine, whatever its tile.

Part ``attn`` and ``step``: round 10's (``lab04_round10.py``) with :data:`KERNELS_11` /
:data:`STEP_11`: the lean loop at 8 positions per step. Round 10 ran the lean and pipelined loops
only at 16 positions per step, where the static compile under the H200's Triton 3.6 gives them
91-98 registers (19-21 one-warp programs per SM, against the lab's 32); at 8 per step they keep
54-56 registers and 32 programs per SM, issue K's and V's loads together at the top of the step,
and a 3-4 deep pipeline fits in 4-6 KiB of shared memory per program (32 per SM still).

Every way is timed both ways round 10 did (one sustained block per way, twice in opposite orders,
and alternating with a sync per replay); the results file is written after each part.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab04_round10 as r10  # noqa: E402
from lab04_round7 import SHAPES, gemm_inputs  # noqa: E402

from hwlab.labs.fp8 import attention as A  # noqa: E402
from hwlab.labs.fp8 import decode_gemm as G  # noqa: E402
from hwlab.labs.fp8 import quant as Q  # noqa: E402
from hwlab.labs.fp8 import research as R  # noqa: E402
from hwlab.core.measure_graph import capture_graph  # noqa: E402
from hwlab.core.store import write_json_atomic  # noqa: E402

#: part ``floor``'s read probes: name -> (rows per program, bytes of a row per step, warps, loop stages)
PROBES = {
    "64 rows x 256 B, 4 warps": (64, 256, 4, 0),
    "64 rows x 256 B, 4 warps, 3 stages": (64, 256, 4, 3),
    "16 rows x 256 B, 1 warp": (16, 256, 1, 0),
    "16 rows x 256 B, 1 warp, 3 stages": (16, 256, 1, 3),
}
SPLITS = (1, 2, 4, 8)
#: call 2: the lab's FP8 GEMM tile per shape with these changes, beside it (name -> config overrides)
KIT_TILES = {"K split 2 serial": {"SPLIT_K": 2, "SERIAL_K": True}, "K split 4 serial": {"SPLIT_K": 4, "SERIAL_K": True},
             "K split 8 serial": {"SPLIT_K": 8, "SERIAL_K": True}}
MIN_PROGRAMS, MAX_PROGRAMS = 132, 8192
N_LAYERS = 8

#: part ``attn``'s kernels: the lab's, round 10's lean loop at the lab's tile (its reference), and the
#: lean loop at 8 positions per step, plain and pipelined, and round 10's per-row loop at 8 per step
KERNELS_11 = {
    "lab": A.decode_attention,
    "lean": R.decode_attention_lean,
    "lean, 8 per step": functools.partial(R.decode_attention_lean, tile=A.AttnTile(block_t=8)),
    **{f"lean, 8 per step, {st} loop stages": functools.partial(R.decode_attention_lean, loop_stages=st,
                                                               tile=A.AttnTile(block_t=8, num_stages=st))
       for st in (2, 3, 4)},
    "rows, 8 per step, 3 loop stages": r10._few_programs(functools.partial(
        R.decode_attention_lean, rows=True, loop_stages=3, tile=A.AttnTile(block_t=8, num_stages=3))),
}
STEP_11 = {k: KERNELS_11[k] for k in ("lab", "lean, 8 per step", "lean, 8 per step, 3 loop stages",
                                      "lean, 8 per step, 4 loop stages")}


def probe_plans(n_rows: int, row_bytes: int, max_programs: int = MAX_PROGRAMS) -> dict:
    """The read probes that fit a weight of ``n_rows`` x ``row_bytes`` in :data:`MIN_PROGRAMS` to
    ``max_programs`` programs: name -> stream_matrix kwargs."""
    plans = {}
    for name, (bn, bk, warps, st) in PROBES.items():
        for split in SPLITS:
            programs = n_rows // bn * split
            if n_rows % bn or row_bytes % (split * bk) or not MIN_PROGRAMS <= programs <= max_programs:
                continue
            plans[f"{name}, K split {split}"] = {"block_n": bn, "block_k_bytes": bk, "split": split,
                                                 "num_warps": warps, "loop_stages": st, "programs": programs}
    return plans


def _capture_checked(fn, check, dev):
    """``fn`` captured in a CUDA graph, replayed once and passed to ``check`` (True: time it)."""
    cap = capture_graph(fn, dev)
    cap.replay()
    torch.cuda.synchronize()
    return cap if check(cap.out) else None


def floor_part(rounds: int) -> list:
    """Part ``floor``, every way with PDL off, as the lab's GEMM comparison times them
    (:func:`hwlab.labs.fp8.run.gemms_vs_bf16`; call 1 left the lab's PDL on, so its kit GEMMs
    overlapped each other back to back)."""
    old = Q.set_pdl(False)
    try:
        return _floor_part(rounds)
    finally:
        Q.set_pdl(old)


def _floor_part(rounds: int) -> list:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(11)
    rows_out = []
    for name, (N, Kd) in SHAPES.items():
        w32 = [torch.randn(N, Kd, generator=g, device=dev) / Kd ** 0.5 for _ in range(N_LAYERS)]
        w16 = [w.to(torch.bfloat16) for w in w32]
        w8 = [Q.quant_tensor_ref(w) for w in w32]  # (FP8 weight, scale)
        del w32
        graphs, errs, failed, meta = {}, {}, {}, {}
        with torch.no_grad():
            for rows in (16, 4):
                xb, xq, xs, ref16, ref8 = gemm_inputs(rows, Kd, w16[0], w8[0], g, dev)
                gemms = {f"bf16 x{rows}": (lambda xb=xb: [F.linear(xb, w16[i]) for i in range(N_LAYERS)], ref16),
                         f"kit fp8 x{rows}": (lambda xq=xq, xs=xs: [G.decode_mm(xq, w8[i][0], xs, w8[i][1])
                                                                  for i in range(N_LAYERS)], ref8)}
                for tname, over in KIT_TILES.items():
                    c = {**G.config_for(N, Kd), **over}
                    if c != G.config_for(N, Kd):
                        gemms[f"kit fp8 {tname} x{rows}"] = (lambda xq=xq, xs=xs, c=c: [
                            G.decode_mm(xq, w8[i][0], xs, w8[i][1], config=c) for i in range(N_LAYERS)], ref8)
                gemms[f"cublas fp8 x{rows}"] = (lambda xq=xq, xs=xs: [
                    torch._scaled_mm(xq, w8[i][0].t(), scale_a=xs, scale_b=w8[i][1], out_dtype=torch.bfloat16)
                    for i in range(N_LAYERS)], ref8)
                for k, (fn, ref) in gemms.items():
                    def check(out, k=k, ref=ref):
                        errs[k] = float((out[0].float() - ref).norm() / ref.norm())
                        return errs[k] < 2e-2  # wrong results are not timed
                    try:
                        cap = _capture_checked(fn, check, dev)
                    except Exception as e:  # noqa: BLE001 - a way that cannot run is a result too
                        failed[k] = f"{type(e).__name__}: {e}"[:300]
                        continue
                    if cap is None:
                        failed[k] = f"rel err {errs[k]:.3g} vs float32"
                    else:
                        graphs[k] = cap
                        meta[k] = {"kind": "gemm", "rows": rows, "bytes": (2 if "bf16" in k else 1) * N * Kd}
            for dname, ws in (("fp8", [w for w, _ in w8]), ("bf16", w16)):
                row_bytes = Kd * ws[0].element_size()
                for pname, kw in probe_plans(N, row_bytes).items():
                    k = f"read {dname}: {pname}"
                    kw = dict(kw)
                    programs = kw.pop("programs")
                    want_k = R.stream_matrix(ws[0], kw["block_n"], kw["block_k_bytes"], kw["split"], use_triton=False)
                    try:
                        cap = _capture_checked(lambda kw=kw: [R.stream_matrix(ws[i], **kw) for i in range(N_LAYERS)],
                                               lambda out, want_k=want_k: bool(torch.equal(out[0], want_k)), dev)
                    except Exception as e:  # noqa: BLE001
                        failed[k] = f"{type(e).__name__}: {e}"[:300]
                        continue
                    if cap is None:
                        failed[k] = "read wrong bytes"
                    else:
                        graphs[k] = cap
                        meta[k] = {"kind": "read", "dtype": dname, "bytes": N * row_bytes, "programs": programs, **kw}
                k = f"read {dname}: torch sum of int32 words"
                want_t = ws[0].view(torch.int32).sum(dtype=torch.int32)
                cap = _capture_checked(lambda ws=ws: [w.view(torch.int32).sum(dtype=torch.int32) for w in ws],
                                       lambda out, want_t=want_t: bool(torch.equal(out[0], want_t)), dev)
                if cap is None:
                    failed[k] = "summed wrong"
                else:
                    graphs[k] = cap
                    meta[k] = {"kind": "read", "dtype": dname, "bytes": N * row_bytes, "torch": True}
            for k in failed:
                print(f"floor {name}: {k} not timed: {failed[k]}", flush=True)
            t = r10.both_methods(graphs, rounds, N_LAYERS)
        row = {"layer": name, "N": N, "K": Kd, "n_layers": N_LAYERS, "ways": meta, "rel_err_vs_float32": errs,
               "failed": failed, **t}
        for method in ("sustained", "alternate"):
            us = row[f"{method}_us"]
            row[f"{method}_gbps"] = {k: meta[k]["bytes"] / v / 1e3 for k, v in us.items()}
            best = {d: min((k for k in us if meta[k]["kind"] == "read" and meta[k]["dtype"] == d), key=us.get)
                    for d in ("fp8", "bf16")}
            row[f"{method}_fastest_read"] = best
            row[f"{method}_fastest_kit"] = {r: min((k for k in us if k.startswith("kit fp8") and k.endswith(f" x{r}")),
                                                   key=us.get) for r in (16, 4)}
            row[f"{method}_needed_us"] = {r: N * Kd / (row[f"{method}_gbps"][f"bf16 x{r}"] * 1e3)
                                          for r in (16, 4) if f"bf16 x{r}" in us}
            print(f"floor {name} ({N}x{Kd}) {method}: " + ", ".join(
                f"{k} {us[k]:.2f} us {row[f'{method}_gbps'][k]:.0f} GB/s" for k in us if meta[k]["kind"] == "gemm")
                + f" | fastest kit {row[f'{method}_fastest_kit']}"
                + f" | fastest read fp8 {us[best['fp8']]:.2f} us ({best['fp8']}), bf16 {us[best['bf16']]:.2f} us"
                + " | FP8 needs " + ", ".join(f"x{r} {v:.2f} us" for r, v in row[f"{method}_needed_us"].items()),
                flush=True)
        rows_out.append(row)
        del graphs, w16, w8
        torch.cuda.empty_cache()
    return rows_out


def attn_plus_one_part(rounds: int, names) -> list:
    """Part ``attn+1`` (call 4): part ``attn`` at 4k and 32k, at T = context and with the caches one
    position longer and every position read (T = n_ctx = context + 1), as the decode step reads them:
    a one-position last step and an odd length the launcher does not specialise."""
    return r10.attn_part(rounds, names, shapes=r10.ATTN_SHAPES[1:], extra_positions=(0, 1), tag="attn+1")


def attn_new_kv_part(rounds: int, names) -> list:
    """Part ``attn+kv`` (call 5): part ``attn+1``'s T = context + 1, the kit's kernels writing the last
    position first (``new_kv``) as the decode step's do."""
    return r10.attn_part(rounds, names, shapes=r10.ATTN_SHAPES[1:], extra_positions=(1,), tag="attn+kv", new_kv=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--parts", default="floor,attn,step", help="floor, attn, step, attn+1, attn+kv")
    ap.add_argument("--pdl-in-floor", action="store_true", help="call 1's way: the lab's PDL setting left as it is")
    a = ap.parse_args()
    t0 = time.time()
    r10.KERNELS.update(KERNELS_11)
    r10.STEP_CHOICES.update(STEP_11)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "rounds": a.rounds, "block_reps": r10.BLOCK_REPS,
           "probes": {k: dict(zip(("block_n", "block_k_bytes", "warps", "loop_stages"), v)) for k, v in PROBES.items()},
           "kernels": list(KERNELS_11), "step_choices": list(STEP_11),
           "floor_pdl": "the lab's setting (on)" if a.pdl_in_floor else "off", "kit_tiles": KIT_TILES}
    parts = a.parts.split(",")
    for part, fn in (("floor", lambda: (_floor_part if a.pdl_in_floor else floor_part)(a.rounds)), ("attn", lambda: r10.attn_part(a.rounds, list(KERNELS_11))),
                     ("step", lambda: r10.step_part(a.rounds, list(STEP_11))),
                     ("attn+1", lambda: attn_plus_one_part(a.rounds, ["lab", "lean, 8 per step"])),
                     ("attn+kv", lambda: attn_new_kv_part(a.rounds, ["lab", "lean, 8 per step"]))):
        if part in parts:
            res[part] = fn()
            res["elapsed_s"] = time.time() - t0
            write_json_atomic(a.out, res, overwrite=True)  # after each part: a timeout keeps what ran


if __name__ == "__main__":
    sys.exit(main())
