"""``python -m hwlab.labs.registers --compile KERNEL ...``: compile one kernel config and print
its :class:`CompileReport` as one JSON line (the compile guard's child; also the process
Nsight Compute profiles, with ``--ncu-launch``)."""
from __future__ import annotations

import argparse
import json

from hwlab.labs.registers.compile_guard import gpu_report, static_report
from hwlab.labs.registers.counters import launch_in_range
from hwlab.labs.registers.kernels import KERNELS
from hwlab.labs.registers.tiles import TileConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hwlab.labs.registers",
                                description="compile one kernel config (the compile guard's child)")
    p.add_argument("--compile", required=True, choices=list(KERNELS))
    p.add_argument("--config", help="BM,BN,BK,WARPS,STAGES (matmul, matmul_softmax)")
    p.add_argument("--block", type=int, help="BLOCK (wide_block)")
    p.add_argument("--warps", type=int, help="warps (wide_block)")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--mode", choices=["static", "gpu"], default="static",
                   help="static: sm_90a compile and ptxas -v, no GPU needed; gpu: compile for this GPU")
    p.add_argument("--ncu-launch", action="store_true",
                   help="gpu mode: then launch once in the NVTX range ncu profiles")
    return p


def main(argv=None) -> None:
    p = build_parser()
    a = p.parse_args(argv)
    cfg = TileConfig.parse(a.config) if a.config else None
    if a.compile != "wide_block" and cfg is None:
        p.error(f"--compile {a.compile} needs --config BM,BN,BK,WARPS,STAGES")
    if a.mode == "static":
        rep = static_report(a.compile, cfg, a.dtype, a.block, a.warps)
    else:
        if a.compile == "wide_block":
            p.error("wide_block is compiled statically only (--mode static)")
        rep = gpu_report(a.compile, cfg)
        if a.ncu_launch:
            launch_in_range(cfg)
    print(json.dumps(rep.to_dict()))


if __name__ == "__main__":
    main()
