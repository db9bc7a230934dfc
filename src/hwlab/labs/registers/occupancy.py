"""Theoretical occupancy: how many blocks of a kernel fit on one SM, and which limit binds.

Four limits, each computed from the machine's per-SM resources (Hopper values below; an
unknown machine passes its own :class:`SMLimits`):

* **registers**: registers are allocated per warp in units of ``reg_alloc_unit`` (256), after
  rounding the per-thread count up to a multiple of ``reg_per_thread_unit`` (8).
  ``warps_by_regs = floor(regs_per_sm / per_warp)``, blocks = ``floor(warps_by_regs / warps_per_block)``.
* **shared memory**: each block takes its dynamic + static shared memory rounded up to
  ``smem_alloc_unit`` (128 B) plus ``smem_reserved_per_block`` (1 KiB, sm_80+).
* **warps/threads**: ``floor(max_warps_per_sm / warps_per_block)``.
* **blocks**: ``max_blocks_per_sm``.

The smallest wins; ties are all reported (Nsight Compute's ``launch__occupancy_limit_*``
reports each limit separately, so the lab compares all four, not only the minimum).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class SMLimits:
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    reg_alloc_unit: int = 256           # registers, per warp
    reg_per_thread_unit: int = 8
    smem_per_sm: int = 233472           # 228 KiB
    smem_per_block_max: int = 232448    # 227 KiB
    smem_alloc_unit: int = 128
    smem_reserved_per_block: int = 1024
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    warp_size: int = 32
    source: str = ("CUDA C++ Programming Guide, 'Compute Capabilities' table, cc 9.0; "
                   "the H200 reports 65536 registers, 228 KiB shared memory, 2048 threads per SM")


HOPPER = SMLimits()


@dataclass
class Occupancy:
    blocks_by_limit: dict[str, int]
    blocks_per_sm: int
    binding: list[str]
    active_warps: int
    occupancy_pct: float
    regs_per_thread: int
    smem_per_block: int
    warps_per_block: int

    def to_dict(self) -> dict:
        return asdict(self)


def occupancy(regs_per_thread: int, smem_per_block: int, warps_per_block: int,
              limits: SMLimits = HOPPER) -> Occupancy:
    """Blocks per SM under each limit, the binding limit(s), and the resulting occupancy."""
    if warps_per_block <= 0:
        raise ValueError("warps_per_block must be positive")
    if regs_per_thread > limits.max_regs_per_thread:
        raise ValueError(f"{regs_per_thread} registers per thread exceeds the hardware maximum "
                         f"{limits.max_regs_per_thread}; the compiler would have spilled instead")
    if smem_per_block > limits.smem_per_block_max:
        raise ValueError(f"{smem_per_block} B of shared memory per block exceeds the "
                         f"{limits.smem_per_block_max} B a block may use: the launch would fail")
    regs = max(1, regs_per_thread)
    regs = math.ceil(regs / limits.reg_per_thread_unit) * limits.reg_per_thread_unit
    per_warp = math.ceil(regs * limits.warp_size / limits.reg_alloc_unit) * limits.reg_alloc_unit
    warps_by_regs = limits.regs_per_sm // per_warp
    smem = math.ceil(smem_per_block / limits.smem_alloc_unit) * limits.smem_alloc_unit
    smem += limits.smem_reserved_per_block
    by = {
        "registers": warps_by_regs // warps_per_block,
        "shared_mem": limits.smem_per_sm // smem,
        "warps": limits.max_warps_per_sm // warps_per_block,
        "blocks": limits.max_blocks_per_sm,
    }
    n = min(by.values())
    binding = [k for k, v in by.items() if v == n]
    warps = n * warps_per_block
    return Occupancy(by, n, binding, warps, 100.0 * warps / limits.max_warps_per_sm,
                     regs_per_thread, smem_per_block, warps_per_block)
