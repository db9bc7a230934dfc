"""Lab 4, round 9 (issue #19): how many instructions the FP8 decode attention issues per byte it
reads, from its machine code. Call 9 (LAB04_NOTES round 9, item 10) found the kit's kernel slower
under sustained load with the SM clock pulled down, where SDPA is not: a kernel that is partly bound
by its own instruction issue, not by memory alone. This counts it, on a CPU.

    python benchmarks/lab04_sass_mix.py OUT.json

For each tile: the lab's kernel compiled for sm_90a as Triton's launcher specialises it (16-byte
aligned pointers), disassembled (``nvdisasm``, bundled with Triton), and the opcodes of its main
loop counted (:func:`hwlab.labs.registers.compile_guard.loop_instruction_mix`): one iteration is one
warp's ``block_t`` positions of K and V. ``issue_share_at``: the share of the GPU's instruction
issue (4 schedulers per SM, one warp instruction each per clock) the loop alone would take to stream
at SDPA's rate, at the SM clocks call 9 read after the kit's and SDPA's sustained blocks: an
estimate from the count, not a measurement.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # real kernels: this script compiles, it does not run them
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab04_static_registers as S  # noqa: E402

from hwlab.labs.fp8 import attention as A  # noqa: E402
from hwlab.labs.fp8 import research as R  # noqa: E402
from hwlab.labs.registers.compile_guard import loop_instruction_mix, sass_sm90  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: (label, block_t, warps, FP8 cache, kernel): "lab" the lab's kernel; "fp32 math" and "tensor cores"
#: research's round-2 kernel (:func:`~hwlab.labs.fp8.research.decode_attention_variant`), elementwise in
#: float32 (what round 3's fp16 math replaced) and with the products on the tensor cores (round 9's
#: flash-decoding shape at 64 positions and 4 warps); "lean" and "rows" round 10's loops
#: (:func:`~hwlab.labs.fp8.research.decode_attention_lean`, ``rows`` False and True)
TILES = (("lab tile, FP8 cache", A.DEFAULT_TILE.block_t, A.DEFAULT_TILE.num_warps, True, "lab"),
         ("32 per step, FP8 cache", 32, 1, True, "lab"),
         ("lab tile, bf16 cache", A.DEFAULT_TILE.block_t, A.DEFAULT_TILE.num_warps, False, "lab"),
         ("round 2's fp32 math, FP8 cache", A.DEFAULT_TILE.block_t, 1, True, "fp32 math"),
         ("tensor cores, 64 per step, 4 warps, FP8 cache", 64, 4, True, "tensor cores"),
         ("round 10's lean loop, lab tile, FP8 cache", A.DEFAULT_TILE.block_t, A.DEFAULT_TILE.num_warps, True, "lean"),
         ("round 10's lean loop, 32 per step, FP8 cache", 32, 1, True, "lean"),
         ("round 10's per-row loop, lab tile, FP8 cache", A.DEFAULT_TILE.block_t, A.DEFAULT_TILE.num_warps, True, "rows"))
D = 128
#: H200: SMs, schedulers per SM; SDPA's GB/s on bf16 at 32k and the SM clocks (MHz) read after the
#: kit's and after SDPA's sustained blocks, call 9 (benchmarks/results/round9/lab04_timing_method_h200.json)
SMS, SCHEDULERS = 132, 4


def main(out_path: str) -> None:
    call9 = json.loads((ROOT / "benchmarks" / "results" / "round9" / "lab04_timing_method_h200.json").read_text())
    r32 = next(r for r in call9["rows"] if r["ctx"] == 32768)
    sdpa_gbps = 2 * 2 * r32["batch"] * 32 * r32["ctx"] * D / (r32["sustained block"]["us_per_layer"]["sdpa"] * 1e3)
    clocks = {w: min(b["sm_mhz_after"] for b in r32["blocks"] if b["method"] == "sustained block" and b["way"] == w)
              for w in ("kit", "sdpa")}
    rows = []
    for label, bt, warps, fp8, kernel in TILES:
        if kernel in ("lab", "lean", "rows"):  # the lab's signature: round 10's kernel is the lab's, another loop
            fn, sig, c = S.attn_compile_args(kernel, bt, fp8=fp8, chunk=A.DEFAULT_TILE.chunk, d=D)
        else:
            fn, sig = R._decode_attn_partial_variants, S.VARIANT_SIG
            c = {"D": D, "CHUNK": A.DEFAULT_TILE.chunk, "BLOCK_T": bt, "PER_ROW": False,
                 "USE_DOT": kernel == "tensor cores", "PREFETCH": False}
        sig = dict(sig, k_ptr="*fp8e4nv" if fp8 else "*bf16", v_ptr="*fp8e4nv" if fp8 else "*bf16")
        c = {k: v for k, v in c.items() if sig[k] == "constexpr"}
        attrs = S.launched_attrs(sig)
        mix = loop_instruction_mix(sass_sm90(fn, sig, c, attrs,
                                             {"num_warps": warps, "num_stages": A.DEFAULT_TILE.num_stages}))
        n = sum(mix.values())
        nbytes = bt * D * 2 * (1 if fp8 else 2)  # K and V of block_t positions, one warp-iteration per warp
        per_byte = n / nbytes * warps  # warp instructions per byte read (each warp reads nbytes / warps)
        need = sdpa_gbps * 1e9 * per_byte  # warp instructions per second to stream at SDPA's rate
        row = {"label": label, "kernel": kernel, "block_t": bt, "warps": warps, "fp8": fp8,
               "instructions_per_iteration": n,
               "bytes_per_iteration": nbytes, "warp_instructions_per_kb": 1024 * per_byte, "mix": mix,
               "issue_share_at": {f"{w} clock {mhz} MHz": need / (SMS * SCHEDULERS * mhz * 1e6)
                                  for w, mhz in clocks.items()}}
        rows.append(row)
        print(f"{label}: {n} instructions per iteration ({nbytes} B), {row['warp_instructions_per_kb']:.0f} per KB; "
              + ", ".join(f"{k}: {v:.0%}" for k, v in row["issue_share_at"].items())
              + "; top " + ", ".join(f"{k} {v}" for k, v in list(mix.items())[:6]), flush=True)
    import triton
    out = {"source": f"static compile for sm_90a, no kernel launched (triton {triton.__version__}, its nvdisasm); "
                     "counts, not a GPU run (the lent H200 runs triton 3.6.0: under another Triton the code differs)",
           "triton": triton.__version__, "sdpa_gbps_32k_call9": sdpa_gbps, "sm_mhz_call9": clocks, "sms": SMS, "schedulers_per_sm": SCHEDULERS,
           "rows": rows}
    Path(out_path).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
