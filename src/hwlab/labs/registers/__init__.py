"""Lab 2, registers / occupancy / spills / launch overhead.

Three reproductions of the flowchart's "launch / occupancy / registers" leaf (J):

1. **Oversized tile** (:mod:`.tiles`, :mod:`.kernels`, :mod:`.gemm_sweep`). A Triton GEMM whose
   tile (BM x BN x BK), warps and stages are knobs. The fp32 accumulator alone takes
   ``BM*BN / (32*warps)`` registers per thread: 128x128 on 4 warps is 128, fine; 256x256 on
   8 warps is 256, over the 255 a thread may hold, so the compiler spills to local memory
   (DRAM-backed) inside the hot loop. Each tile is timed against cuBLAS bf16 in the same run.
2. **Over-fusion** (:mod:`.fusion`). ``softmax(A @ B)`` fused into one kernel needs a
   whole row of the product per program (BN = N): for N = 512 on 4 warps that is 64 x 512
   fp32 live values, 256 per thread, and it spills; split into a GEMM with a sane tile + a
   softmax kernel, it does not.
3. **Launch-bound step** (:mod:`.launch`). A decode-like step of many tiny kernels: each
   launch costs microseconds of CPU/driver time while the GPU work is shorter, so the GPU
   idles between kernels. Captured once in a CUDA graph, the same kernels replay without the
   gaps.

Registers and spills (:mod:`.compile_guard`) are read from the compiled kernel on a GPU and,
on any machine, from ``ptxas -v`` on an sm_90a compile made without a GPU; every compile runs
in a child process under a time limit. Occupancy by hand is :mod:`hwlab.labs.registers.occupancy`;
Nsight Compute's occupancy counters beside it come from :mod:`.counters`. The flowchart
evidence (:mod:`.report`) answers every question from the run; :mod:`.grader` is exercise
02's speed check; ``python -m hwlab.labs.registers`` (:mod:`.__main__`) is the guard's child.
"""
from __future__ import annotations

from hwlab.core.measure import InputError  # noqa: F401  (raised by the launchers on bad shapes)
from hwlab.labs.registers.compile_guard import (
    COMPILE_TIMEOUT_S, CompileReport, compile_guarded, compile_guarded_many, gpu_report, ptxas_sm90,
    runtime_report, static_report)
from hwlab.labs.registers.counters import NVTX_RANGE, NcuRows, collect_ncu, ncu_occupancy, ncu_unavailable  # noqa: F401
from hwlab.labs.registers.grader import MIN_PCT_OF_CUBLAS, grade_config  # noqa: F401
from hwlab.labs.registers.kernels import (
    KERNELS, matmul, matmul_kernel, matmul_softmax_fused, matmul_softmax_kernel, matmul_softmax_split,
    reference_matmul, reference_matmul_softmax, wide_block_kernel)
from hwlab.labs.registers.launch import LaunchResult, decode_like_step, launch_bound  # noqa: F401
from hwlab.labs.registers.fusion import OverfusionResult, overfusion  # noqa: F401
from hwlab.labs.registers.report import config_evidence, launch_evidence  # noqa: F401
from hwlab.labs.registers.gemm_sweep import ConfigResult, cublas_bf16, gemm_dtype, sweep, tile_service  # noqa: F401
from hwlab.labs.registers.tiles import FUSED, SANE, SMALL, SPILL, SPILL_HEAVY, SWEEP, WIDE, TileConfig  # noqa: F401
