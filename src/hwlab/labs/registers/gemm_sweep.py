"""The tile sweep: each config compiled (guarded), its registers, spills and occupancy, and on
a GPU its time against cuBLAS bf16 measured in the same run.

A config's speed is judged as TFLOP/s over ``2*size**3`` FLOPs and as % of cuBLAS bf16 on the
same card in the same run (:func:`cublas_bf16`), never against a datasheet. With ``service``
each timed config also runs as one process serves it (:func:`tile_service`), which gives the
flowchart's D and K.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from hwlab.core.measure import TOL_BY_DTYPE, Measurement, bench, device_of
from hwlab.core.probes import gemm
from hwlab.labs import scenarios
from hwlab.labs.registers.compile_guard import (
    COMPILE_TIMEOUT_S, CompileReport, compile_guarded_many, runtime_report)
from hwlab.labs.registers.kernels import matmul
from hwlab.labs.registers.tiles import SWEEP, TileConfig

#: GEMM size (square, elements per side) on a GPU, large enough that every tile fills the card;
#: in the interpreter (CPU) a small one, since only correctness is checked there
GPU_SIZE, CPU_SIZE = 8192, 128


@dataclass
class ConfigResult:
    config: TileConfig
    report: CompileReport
    occupancy: dict | None = None
    measurement: Measurement | None = None
    #: Nsight Compute's occupancy row for this config (:mod:`.counters`), where ncu ran
    ncu: dict | None = None
    #: the config's GEMM run as a one-process service step (D and K), see :func:`tile_service`
    service: dict | None = None

    def to_dict(self) -> dict:
        return {"config": asdict(self.config), "report": self.report.to_dict(),
                "occupancy": self.occupancy,
                "measurement": self.measurement.to_dict() if self.measurement else None,
                "ncu": self.ncu, "service": self.service}


def gemm_dtype(device) -> torch.dtype:
    """bf16 on a GPU; fp16 in the interpreter (bf16 is wrong there)."""
    return torch.bfloat16 if device_of(device).type == "cuda" else torch.float16


def tile_service(cfg: TileConfig, size: int, kernel_ms: float, device=None,
                 n_rep: int = 10) -> dict[str, Any]:
    """The Triton GEMM at ``cfg`` (``size``-cubed) as one process serves it: back-to-back calls
    timed as one step, over ``kernel_ms`` (its own median) x calls; D and K of its walk."""
    dev = device_of(device)
    dt = gemm_dtype(dev)

    def make():
        return (torch.randn(size, size, device=dev, dtype=dt), torch.randn(size, size, device=dev, dtype=dt))
    return scenarios.one_gpu_service(lambda a, b: matmul(a, b, cfg)[0], make, kernel_ms, dev, n_rep=n_rep)


def sweep(configs=SWEEP, size: int | None = None, device=None, n_rep: int = 20,
          timeout_s: float = COMPILE_TIMEOUT_S, ceiling_tflops: float | None = None,
          progress=None, service: bool = True) -> list[ConfigResult]:
    """For each config: compile (guarded, ``timeout_s`` seconds; all configs at once, before
    anything is timed), registers/spills/shared,
    occupancy, and on a GPU the time and TFLOP/s against ``ceiling_tflops`` (cuBLAS bf16
    measured in the same run) and, with ``service``, the one-process service step of
    :func:`tile_service` (D and K). On a CPU, the static report only."""
    dev = device_of(device)
    gpu = dev.type == "cuda"
    size = size or (GPU_SIZE if gpu else CPU_SIZE)
    dt = gemm_dtype(dev)
    configs = list(configs)
    if progress:
        progress(", ".join(c.label for c in configs))
    reps = compile_guarded_many([("matmul", c) for c in configs], timeout_s=timeout_s, static=not gpu)
    out = []
    for cfg, rep in zip(configs, reps):
        res = ConfigResult(cfg, rep)
        if rep.skipped:
            out.append(res)
            continue
        m = None
        if gpu:
            a = torch.randn(size, size, device=dev, dtype=dt)
            b = torch.randn(size, size, device=dev, dtype=dt)
            _, k = matmul(a, b, cfg)
            res.report = runtime_report("matmul", cfg.label, k)
            res.report.compile_s = rep.compile_s
            m = bench(f"triton {cfg.label}", lambda x, y, c=cfg: matmul(x, y, c)[0],
                      lambda: (torch.randn(size, size, device=dev, dtype=dt),
                               torch.randn(size, size, device=dev, dtype=dt)),
                      n_bytes=3 * size * size * 2, n_flops=2 * size**3,
                      reference=lambda x, y: (x.double() @ y.double()),
                      tol=TOL_BY_DTYPE["bfloat16"], device=dev, n_rep=n_rep,
                      params={"config": cfg.label})
            if ceiling_tflops:
                m = m.with_ceilings(tflops=ceiling_tflops, source="cuBLAS bf16 in this run")
            if service:
                res.service = tile_service(cfg, size, m.t_ms, dev)
        occ = res.report.occupancy(cfg.warps)
        res.occupancy = occ.to_dict() if occ else None
        res.measurement = m
        out.append(res)
    return out


def cublas_bf16(size: int = GPU_SIZE, device=None, n_rep: int = 20) -> Measurement:
    """cuBLAS bf16 GEMM (``size``-cubed) on this card: the floor every tile is judged against."""
    return gemm(size=size, dtype="bf16", device=device, n_rep=n_rep)
