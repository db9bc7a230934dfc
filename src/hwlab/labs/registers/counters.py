"""Nsight Compute's occupancy counters for each tile, beside hwlab's own occupancy calculation.

``ncu`` profiles a child process (``python -m hwlab.labs.registers --compile matmul --mode gpu
--ncu-launch --config ...``) that compiles the config, warms it up once at the sweep's size,
then launches it once inside the NVTX range :data:`NVTX_RANGE`; only that launch is profiled.
The metrics are :data:`hwlab.core.ncu.OCCUPANCY_METRICS` (``launch__occupancy_limit_*``: blocks per
SM under each limit, which :mod:`hwlab.labs.registers.occupancy` computes by hand). ``--clock-control
none`` (in :func:`hwlab.core.ncu.profile`) leaves the card's clocks alone.

Where ncu cannot run (not installed, or no CUDA GPU), :func:`ncu_occupancy` says so in
``unavailable`` instead of returning rows, and the sweep's records keep ``ncu`` = None.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hwlab.core import ncu
from hwlab.labs.registers.kernels import matmul
from hwlab.labs.registers.gemm_sweep import GPU_SIZE, ConfigResult
from hwlab.labs.registers.tiles import TileConfig

NVTX_RANGE = "hwlab_case"
#: seconds one ncu run of one config may take (compile, warm-up, one profiled launch)
NCU_TIMEOUT_S = 300.0


@dataclass
class NcuRows:
    """Nsight Compute's rows for one config (one dict per profiled kernel: metric -> value), or
    why there are none: ``unavailable`` (ncu cannot run here) or ``error`` (ncu ran and failed)."""
    rows: list[dict] = field(default_factory=list)
    unavailable: str | None = None
    error: str | None = None

    def record(self) -> dict | None:
        """What a sweep record keeps as ``ncu``: the profiled launch's row, ``{"error": ...}``
        when ncu failed, None when it could not run or profiled nothing."""
        if self.error:
            return {"error": self.error}
        return self.rows[0] if self.rows else None


def ncu_unavailable() -> str | None:
    """Why ncu cannot profile here, or None when it can."""
    if not ncu.available():
        return "ncu unavailable: Nsight Compute's ncu is not on PATH"
    if not torch.cuda.is_available():
        return "ncu unavailable: no CUDA GPU"
    return None


def ncu_args(cfg: TileConfig) -> list[str]:
    """The child's Python arguments that ncu profiles for ``cfg``."""
    return ["-m", "hwlab.labs.registers", "--compile", "matmul", "--mode", "gpu", "--ncu-launch",
            "--config", cfg.cli_arg]


def ncu_occupancy(cfg: TileConfig, timeout_s: float = NCU_TIMEOUT_S) -> NcuRows:
    """Profile one launch of the GEMM at ``cfg`` under ncu (occupancy metrics)."""
    why = ncu_unavailable()
    if why:
        return NcuRows(unavailable=why)
    try:
        return NcuRows(ncu.profile(ncu_args(cfg), metrics=ncu.OCCUPANCY_METRICS,
                                   nvtx_range=NVTX_RANGE, timeout_s=timeout_s))
    except Exception as e:  # ncu's own failure (permissions, driver, timeout) is recorded, not fatal
        return NcuRows(error=str(e)[-300:])


def collect_ncu(results: list[ConfigResult], progress=None) -> str | None:
    """Fill ``ncu`` of every compiled config in ``results``; returns why ncu could not run
    (every ``ncu`` then stays None), else None."""
    why = ncu_unavailable()
    if why:
        return why
    for r in results:
        if r.report.skipped:
            continue
        if progress:
            progress(r.config.label)
        r.ncu = ncu_occupancy(r.config).record()
    return None


def launch_in_range(cfg: TileConfig, size: int = GPU_SIZE) -> None:
    """The profiled child's work: one warm-up launch at ``size``-cubed bf16, then one launch
    inside :data:`NVTX_RANGE` (the one ncu profiles)."""
    dev = torch.device("cuda")
    a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    matmul(a, b, cfg)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(NVTX_RANGE)
    matmul(a, b, cfg)
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
