"""Over-fusion measured: ``softmax(A @ B)`` fused into one kernel vs a GEMM then a softmax.

Fusing the softmax into the GEMM's epilogue makes one program own a whole row of the product
(BN = N): at N = 512 on 4 warps that is 64 x 512 fp32 live values, 256 registers per thread
before anything else, so the fused kernel spills (:data:`FUSED`). Split, the GEMM runs at a
sane tile (:data:`SANE`, no spills) and softmax is its own kernel. Both paths are checked
against a float64 reference (tolerance :data:`TOL`) before they are timed, and both are
reported as TFLOP/s over the GEMM's ``2*M*N*K`` FLOPs and GB/s over the bytes either must
move (A, B and the output once, bf16).

On a GPU each kernel is first compiled under the guard (filling Triton's cache) and its
registers/spills come off the launched kernel; on a CPU the kernels run in the interpreter at a
small size (correctness and the path, not speed) and the reports are the static sm_90a ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hwlab.core.measure import Measurement, bench, device_of
from hwlab.labs.registers.compile_guard import (
    COMPILE_TIMEOUT_S, CompileReport, compile_guarded_many, runtime_report)
from hwlab.labs.registers.kernels import matmul, matmul_softmax_fused, matmul_softmax_split
from hwlab.labs.registers.gemm_sweep import gemm_dtype
from hwlab.labs.registers.tiles import FUSED, SANE, TileConfig

#: (M, K) on a GPU: enough rows to fill the card many times over; N is the fused tile's BN
GPU_MK = (16384, 4096)
#: (M, K) in the interpreter: one fused program's rows, one K step
CPU_MK = (64, 64)
#: relative error allowed against the float64 softmax (bf16 inputs and output)
TOL = 2e-2
#: the names the recorded evidence keeps the two timings under
FUSED_NAME, SPLIT_NAME = "over-fused gemm+softmax", "split gemm, softmax"


@dataclass
class OverfusionResult:
    fused_report: CompileReport
    split_report: CompileReport
    fused: Measurement | None = None
    split: Measurement | None = None
    #: why nothing was timed (a compile past its limit or failed); None when both ran
    skipped: str | None = None

    @property
    def split_speedup(self) -> float | None:
        """How many times faster the split path is (fused time over split time)."""
        return self.fused.t_ms / self.split.t_ms if self.fused and self.split else None

    def reports(self) -> dict:
        return {"fused": self.fused_report.to_dict(), "split": self.split_report.to_dict()}


def overfusion(m: int | None = None, k: int | None = None, fused: TileConfig = FUSED,
               split: TileConfig = SANE, device=None, n_rep: int = 30,
               timeout_s: float = COMPILE_TIMEOUT_S) -> OverfusionResult:
    """Time ``softmax(A[m, k] @ B[k, N])`` fused (tile ``fused``, N = ``fused.bn``) and split
    (GEMM at ``split``, then torch's softmax), each checked first; sizes default to
    :data:`GPU_MK` on a GPU and :data:`CPU_MK` in the interpreter."""
    dev = device_of(device)
    gpu = dev.type == "cuda"
    m, k = (m or (GPU_MK if gpu else CPU_MK)[0]), (k or (GPU_MK if gpu else CPU_MK)[1])
    n = fused.bn
    rep_f, rep_s = compile_guarded_many([("matmul_softmax", fused), ("matmul", split)],
                                        timeout_s=timeout_s, static=not gpu)
    bad = [f"{r.kernel} {r.config}: {r.skipped}" for r in (rep_f, rep_s) if r.skipped]
    if bad:
        return OverfusionResult(rep_f, rep_s, skipped="; ".join(bad))
    dt = gemm_dtype(dev)

    def make():
        return (torch.randn(m, k, device=dev, dtype=dt) * 0.05, torch.randn(k, n, device=dev, dtype=dt) * 0.05)

    def fused_fn(a, b):
        return matmul_softmax_fused(a, b, fused.bm, fused.bk, fused.warps, fused.stages)[0]

    if gpu:  # the launched kernels' own resources (the guard's compile is now in the cache)
        a, b = make()
        compile_f, compile_s = rep_f.compile_s, rep_s.compile_s
        rep_f = runtime_report("matmul_softmax", fused.label, matmul_softmax_fused(
            a, b, fused.bm, fused.bk, fused.warps, fused.stages)[1])
        rep_s = runtime_report("matmul", split.label, matmul(a, b, split)[1])
        rep_f.compile_s, rep_s.compile_s = compile_f, compile_s
    common = dict(n_bytes=(m * k + k * n + m * n) * 2, n_flops=2 * m * n * k, tol=TOL, device=dev, n_rep=n_rep,
                  reference=lambda a, b: torch.softmax(a.double() @ b.double(), dim=1))
    f = bench(FUSED_NAME, fused_fn, make, params={"report": rep_f.to_dict()}, **common)
    s = bench(SPLIT_NAME, lambda a, b: matmul_softmax_split(a, b, split)[0], make,
              params={"report": rep_s.to_dict()}, **common)
    return OverfusionResult(rep_f, rep_s, f, s)
