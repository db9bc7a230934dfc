"""The GEMM tile as a knob: ``BM x BN x BK``, warps and pipeline stages, and the sweep's presets.

The fp32 accumulator alone takes ``BM*BN / (32*warps)`` registers per thread
(:attr:`TileConfig.acc_regs_per_thread`); a thread may hold at most 255, and it needs more
than the accumulator (pointers, A/B fragments), so a tile whose accumulator is near or over
255 spills to local memory (DRAM-backed) inside the hot loop.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class TileConfig:
    bm: int
    bn: int
    bk: int
    warps: int
    stages: int

    @property
    def label(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk} w{self.warps} s{self.stages}"

    @property
    def acc_regs_per_thread(self) -> float:
        """fp32 accumulator registers each thread holds: BM*BN / threads."""
        return self.bm * self.bn / (32 * self.warps)

    @property
    def cli_arg(self) -> str:
        """``BM,BN,BK,WARPS,STAGES``, what :meth:`parse` and ``--config`` read."""
        return f"{self.bm},{self.bn},{self.bk},{self.warps},{self.stages}"

    @classmethod
    def parse(cls, text: str) -> "TileConfig":
        parts = [int(x) for x in re.split(r"[,x ]+", text.strip())]
        if len(parts) != 5:
            raise ValueError(f"a tile config is BM,BN,BK,WARPS,STAGES, got {text!r}")
        return cls(*parts)


#: 128 accumulator registers per thread: fits under 255 with room for fragments
SANE = TileConfig(128, 128, 64, 4, 3)
#: 128 per thread on 8 warps: more reuse per program, still fits
WIDE = TileConfig(128, 256, 64, 8, 3)
#: 32 per thread: fits easily, little reuse
SMALL = TileConfig(64, 64, 32, 4, 3)
#: 256 per thread: over 255 before anything else, spills
SPILL = TileConfig(256, 256, 64, 8, 3)
#: 512 per thread on 4 warps: spills heavily
SPILL_HEAVY = TileConfig(256, 256, 64, 4, 2)
SWEEP = (SANE, WIDE, SMALL, SPILL, SPILL_HEAVY)

#: the over-fused softmax(A @ B): one program owns a whole 512-wide row of the product
#: (BN = N = 512): 64 x 512 fp32 values on 128 threads, 256 registers each, so it spills
FUSED = TileConfig(64, 512, 64, 4, 2)
