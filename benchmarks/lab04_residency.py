"""Lab 4, round 11 (issue #19): registers, shared memory and one-warp programs per SM of the FP8
attention's loops, from a static sm_90a compile on a CPU (nothing launched).

    python benchmarks/lab04_residency.py OUT.json

Round 10 ran its lean and pipelined loops at 16 positions per step only; this reads what each
variant costs in residency (:func:`hwlab.labs.registers.occupancy.occupancy` on ptxas's registers and Triton's
shared memory), under whatever Triton runs it (the H200's image has 3.6.0; install it beside with
``pip install --no-deps --target DIR triton==3.6.0`` and put DIR first on PYTHONPATH).
"""
from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "0"  # real kernels: this script compiles, it does not run them
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab04_static_registers as S  # noqa: E402

from hwlab.labs.fp8 import attention as A  # noqa: E402
from hwlab.labs.registers.occupancy import occupancy  # noqa: E402
from hwlab.labs.registers.compile_guard import ptxas_sm90  # noqa: E402

#: (loop, positions per step, loop stages (0: no software pipeline), the new position written first
#: (``NEW_KV``, as the decode step's kernel does)), one warp per program
VARIANTS = (("lab", 16, 0, False), ("lab", 8, 0, False), ("lean", 16, 0, False), ("lean", 8, 0, False),
            ("lean", 16, 2, False), ("lean", 16, 3, False), ("lean", 8, 2, False), ("lean", 8, 3, False),
            ("lean", 8, 4, False), ("rows", 16, 3, False), ("rows", 8, 3, False),
            ("lab", 16, 0, True), ("lean", 8, 0, True))


def main(out_path: str) -> None:
    rows = []
    for kernel, bt, stages, new_kv in VARIANTS:
        fn, sig, c = S.attn_compile_args(kernel, bt, stages, new_kv, chunk=A.DEFAULT_TILE.chunk)
        g = ptxas_sm90(fn, sig, c, S.launched_attrs(sig), {"num_warps": 1, "num_stages": max(stages, 2)})
        o = occupancy(g["regs"], g["shared"], 1)
        row = {"loop": kernel, "block_t": bt, "loop_stages": stages, "new_kv": new_kv, "registers": g["regs"], "shared_bytes": g["shared"],
               "programs_per_sm": o.blocks_per_sm, "binding": o.binding}
        rows.append(row)
        print(row, flush=True)
    S.write_static_rows(out_path, rows, " on a CPU")


if __name__ == "__main__":
    main(sys.argv[1])
