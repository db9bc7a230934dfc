"""Lab 4, round 10 (issue #19), item 10: in what order the compiler issues the FP8 attention loop's loads.

    python benchmarks/lab04_load_order.py OUT.json

Nsight Compute's per-instruction sampling on the H200 (``results/round10/lab04_attn_source_h200.csv``)
found the lab kernel's eight 16-byte loads per step in two groups of four into the same registers, the
second issued only after the step's K math: two memory round trips a step. This reads the same from a
static sm_90a compile on a CPU (nothing launched), under whatever Triton runs it, for the lab's tile as
launched and with a register cap (Triton's ``maxnreg``): where each load sits in the loop, the
registers it writes, and the first FP8 conversion.
"""
from __future__ import annotations

import os
import re
import sys

os.environ["TRITON_INTERPRET"] = "0"  # real kernels: this script compiles, it does not run them
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab04_static_registers as S  # noqa: E402

from hwlab.labs.fp8 import attention as A  # noqa: E402
from hwlab.labs.registers.compile_guard import ptxas_sm90, sass_sm90  # noqa: E402

#: register caps compared with the compiler's own choice (None)
CAPS = (None, 72, 80, 96, 128)


def load_order(sass: str) -> dict:
    """The loop's 16-byte K/V loads (``LDG.E.EF.128``) in issue order: their line in the kernel's
    instruction list, the register each writes, and the line of the first FP8 conversion."""
    lines = [ln for ln in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", ln)]
    loads = [(i, ln.split("LDG.E.EF.128")[1].split(",")[0].strip()) for i, ln in enumerate(lines) if "LDG.E.EF.128" in ln]
    first_cvt = next(i for i, ln in enumerate(lines) if "F2FP.F16.E4M3" in ln)
    return {"load_lines": [i for i, _ in loads], "load_registers": [r for _, r in loads], "first_conversion": first_cvt}


def main(out_path: str) -> None:
    sig = dict(S.LAB_SIG, k_ptr="*fp8e4nv", v_ptr="*fp8e4nv")
    c = {"D": 128, "CHUNK": A.DEFAULT_TILE.chunk, "BLOCK_T": A.DEFAULT_TILE.block_t, "PER_ROW": False, "F16": True,
         **S.LAB_OFF}
    c = {k: v for k, v in c.items() if sig[k] == "constexpr"}
    attrs = S.launched_attrs(sig)
    rows = []
    for cap in CAPS:
        opts = {"num_warps": A.DEFAULT_TILE.num_warps, "num_stages": A.DEFAULT_TILE.num_stages,
                **({"maxnreg": cap} if cap else {})}
        row = {"maxnreg": cap, "registers": ptxas_sm90(A._decode_attn_partial, sig, c, attrs, opts)["regs"],
               **load_order(sass_sm90(A._decode_attn_partial, sig, c, attrs, opts))}
        rows.append(row)
        print(row, flush=True)
    S.write_static_rows(out_path, rows)


if __name__ == "__main__":
    main(sys.argv[1])
