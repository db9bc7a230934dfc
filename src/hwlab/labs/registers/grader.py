"""Exercise 02's speed check: the learner's tile must compile without spills and, on a GPU,
reach a band of cuBLAS bf16 measured in the same run.

The band starts at :data:`MIN_PCT_OF_CUBLAS` % of cuBLAS: a spill-free tile that reuses its
operands well gets there on the same card, a tile too small to reuse them does not. On a CPU
only the compile is graded (static sm_90a report), and the result says so.
"""
from __future__ import annotations

from hwlab.core.grading import ExerciseResult, not_done
from hwlab.core.measure import device_of
from hwlab.labs.registers.compile_guard import COMPILE_TIMEOUT_S
from hwlab.labs.registers.gemm_sweep import cublas_bf16, sweep
from hwlab.labs.registers.tiles import TileConfig

#: pass band: % of cuBLAS bf16 TFLOP/s measured in the same run
MIN_PCT_OF_CUBLAS = 70.0


def grade_config(cfg: TileConfig | None, reason: str | None, min_pct_of_cublas: float = MIN_PCT_OF_CUBLAS,
                 timeout_s: float = COMPILE_TIMEOUT_S, device=None) -> ExerciseResult:
    """The learner's config must compile without spills (static report on a CPU, the launched
    kernel on a GPU), come with a reason, and on a GPU reach ``min_pct_of_cublas`` % of cuBLAS
    bf16 measured in the same run."""
    name = "spill-free tile"
    if cfg is None or not reason:
        return not_done(name, "Set MY_CONFIG to a TileConfig and MY_REASON to one sentence.")
    gpu = device_of(device).type == "cuda"
    cublas = cublas_bf16(device=device).tflops if gpu else None
    r = sweep([cfg], ceiling_tflops=cublas, timeout_s=timeout_s, device=device, service=False)[0]
    if r.report.skipped:
        return ExerciseResult(name, "wrong", f"{cfg.label} did not compile: {r.report.skipped}")
    if r.report.n_spills:
        return ExerciseResult(name, "wrong", f"{cfg.label} still spills {r.report.n_spills} slots "
                              f"({r.report.n_regs} registers): accumulator alone is "
                              f"{cfg.acc_regs_per_thread:.0f} registers/thread.")
    if not gpu:
        return ExerciseResult(name, "passed (correctness only)",
                              f"{cfg.label}: {r.report.n_regs} registers, no spills, occupancy "
                              f"{r.occupancy['blocks_per_sm']} block(s)/SM bound by "
                              f"{r.occupancy['binding']} (static sm_90a report); speed is graded on a GPU.")
    pct = r.measurement.pct_of_flops_ceiling or 0.0
    if pct < min_pct_of_cublas:
        return ExerciseResult(name, "too slow", f"{cfg.label}: no spills but {pct:.0f}% of cuBLAS "
                              f"({r.measurement.tflops:,.0f} of {cublas:,.0f} TFLOP/s); band starts at "
                              f"{min_pct_of_cublas:.0f}%. Bigger tiles reuse more, up to the register limit.",
                              r.measurement)
    return ExerciseResult(name, "passed", f"{cfg.label}: no spills, {pct:.0f}% of cuBLAS measured "
                          f"in this run (band >= {min_pct_of_cublas:.0f}%).", r.measurement)
