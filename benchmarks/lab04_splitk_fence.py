"""Lab 4, round 7b's one wrong result, re-tested: does the split-K reduction of the kit's decode
GEMM (:mod:`hwlab.labs.fp8.decode_gemm`) ever sum a tile before every K slice's adds have landed?

    python benchmarks/lab04_splitk_fence.py OUT.json [--calls 300] [--set 7|serial]

Round 7b's tile sweep checked one output per tile and found one split-K tile (qkv, 4 rows, K split
in 2) 4e-2 off its float32 reference while every other split-K tile read 1.7e-3. The kernel's last
slice to arrive reads the workspace after a counter; the other slices' adds must be performed
GPU-wide before their counter increment, which the kernel makes sure of with a fence in every
thread (``FENCE``, CUDA's threadfence-reduction pattern). The first run (call 4 of the sixth
session, 400 calls per case) found 7b's tile off in 27 and 2 of 400 calls at 4 rows with and
without the fence, and the lab's split-K tiles (out, down) never: the fence is not what that tile
lacks. This run tries the tile's neighbours one change away, and the lab's four tiles again:
each ``--calls`` times at 16 and 4 rows, on fresh random rows each call, counting the calls whose
output is off its float32 reference by more than 1e-2 (a missing K slice in one tile is ~5e-2;
rounding is ~2e-3).
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from hwlab.labs.fp8 import decode_gemm as G
from hwlab.labs.fp8 import quant as Q
from hwlab.core.store import write_json_atomic

#: (name, (N, K), tile, fences): the lab's tiles (split-K and not), 7b's failing tile, and its
#: neighbours one change away: no split, promotion every 256 columns, BK 128
FAIL = {"SWAP": True, "BN": 64, "BK": 256, "STAGES": 4, "SPLIT_K": 2}
CASES = (("qkv (lab tile)", (12288, 4096), G.CONFIGS[(12288, 4096)], (True,)),
         ("out (lab tile)", (4096, 4096), G.CONFIGS[(4096, 4096)], (True,)),
         ("up (lab tile)", (14336, 4096), G.CONFIGS[(14336, 4096)], (True,)),
         ("down (lab tile)", (4096, 14336), G.CONFIGS[(4096, 14336)], (True,)),
         ("qkv, 7b's failing tile", (12288, 4096), FAIL, (True, False)),
         ("qkv, 7b's tile, no split", (12288, 4096), {**FAIL, "SPLIT_K": 1}, (True,)),
         ("qkv, 7b's tile, promote every 256", (12288, 4096), {**FAIL, "ACC_K": 256}, (True,)),
         ("qkv, 7b's tile, BK 128", (12288, 4096), {**FAIL, "BK": 128}, (True,)))
#: ``--set serial`` (round 8): the same tile and the lab's split-K tiles with the serial reduction
#: (``SERIAL_K``: each K slice stores its own partials, the last sums them; no float32 atomics)
CASES_SERIAL = (("qkv, 7b's failing tile, serial", (12288, 4096), {**FAIL, "SERIAL_K": True}, (True,)),
                ("out (lab tile), serial", (4096, 4096), {**G.CONFIGS[(4096, 4096)], "SERIAL_K": True}, (True,)),
                ("down (lab tile), serial", (4096, 14336), {**G.CONFIGS[(4096, 14336)], "SERIAL_K": True}, (True,)),
                ("qkv, 7b's failing tile, atomic", (12288, 4096), FAIL, (True,)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--set", default="7", choices=("7", "serial"), help="serial: CASES_SERIAL (round 8)")
    a = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(9)
    t0 = time.time()
    rows_out = []
    old = Q.set_pdl(False)  # one kernel at a time: the race is inside a kernel
    try:
        for name, (N, Kd), tile, fences in (CASES_SERIAL if a.set == "serial" else CASES):
            wq, ws = Q.quant_tensor_ref(torch.randn(N, Kd, generator=g, device=dev) / Kd ** 0.5)
            wf = wq.float() * ws
            for rows in (16, 4):
                for fence in fences:
                    cfg = {**G.DEFAULT_CONFIG, **tile, "FENCE": fence}
                    errs = []
                    for _ in range(a.calls):
                        x = torch.randn(rows, Kd, generator=g, device=dev)
                        xs = (x.abs().amax() / Q.FP8_MAX).float()
                        xq = Q.quant_static_ref(x, xs)
                        y = G.decode_mm(xq, wq, xs, ws, config=cfg)
                        ref = (xq.float() * xs) @ wf.t()
                        errs.append((y.float() - ref).norm() / ref.norm())
                    e = torch.stack(errs).cpu()
                    row = {"case": name, "N": N, "K": Kd, "rows": rows, "fence": fence, "tile": tile, "calls": a.calls,
                           "calls_off": int((e > 1e-2).sum()), "max_rel_err": float(e.max()),
                           "median_rel_err": float(e.median())}
                    rows_out.append(row)
                    print(f"{name} x{rows} fence={fence}: {row['calls_off']} of {a.calls} calls off "
                          f"(max {row['max_rel_err']:.2e}, median {row['median_rel_err']:.2e})", flush=True)
    finally:
        Q.set_pdl(old)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "rows": rows_out, "elapsed_s": time.time() - t0}
    write_json_atomic(a.out, res, overwrite=True)  # a re-run replaces its own output


if __name__ == "__main__":
    sys.exit(main())
