"""The GEMM ceiling a matmul part is judged against: the fastest precision this machine offers that
the part's numerics allow, from the machine's own measured ceilings (the dtype lever).

* **fp32 data on a GPU** is judged against the TF32 tensor-core rate (the fastest path fp32 data
  can take), so an fp32 GEMM without TF32 runs under half of it and walks to I.
* **fp32 data on a CPU** is judged against the bf16 ceiling where the CPU runs bf16 natively
  (:func:`hwlab.core.ceilings.bf16_support`: AVX-512 BF16 or AMX) and its measured bf16 GEMM
  ceiling is at least :data:`DTYPE_LEVER_MIN` times its fp32 one; else against fp32. The same
  rule as the GPU's: a GEMM part at its fp32 ceiling then runs at half (or less) of what the
  machine offers and walks to I, with the gain its floor at the bf16 ceiling gives.
* **bf16 / fp16 data** against the bf16 ceiling; **fp8** against fp8 where measured.
* **fp64 data** against its own fp64 ceiling where measured; where none is, its FLOPs set no
  floor (and it says so): another dtype's ceiling is not the floor of fp64 work.

``dtype_peak`` (``--dtype-peak``) overrides the rule for every part: ``fp32`` when the model needs
full fp32 accuracy.
"""
from __future__ import annotations

from typing import Any

#: a lower precision is the lever when its measured GEMM ceiling is at least this many times the
#: data's own: a smaller gain is within what shapes, threads and conversions eat, and not a verdict
DTYPE_LEVER_MIN = 1.5
#: torch dtype of a GPU matmul's inputs -> the measured GEMM ceiling that is its floor
GPU_PEAK_FOR_DTYPE = {"float32": "tf32", "bfloat16": "bf16", "float16": "bf16",
                      "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "float64": "fp64"}
#: the same on a CPU, before the lever (fp32 data may move to bf16 by the rule above)
CPU_PEAK_FOR_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "bf16", "float64": "fp64"}


def gemm_ceiling(dt: str | None, c: Any, gpu: bool, dtype_peak: str | None = None, bf16_native: bool = False,
                 fallback: str | None = None) -> tuple[float | None, str | None, str | None, float | None]:
    """``(TFLOP/s, ceiling name, lever, gain)`` for matmuls whose inputs are ``dt`` (module doc): the
    measured ceiling and its name, and, where the ceiling is a faster precision than the data's
    own, the action that takes it (with both measured rates) and its ceiling over the data's own,
    else None and None. ``fallback``: the ceiling of
    a GPU matmul whose dtype has none of its own."""
    if dtype_peak:
        return c.gemm(dtype_peak), dtype_peak, None, None
    if dt == "float64":
        return c.gemm("fp64"), "fp64", None, None
    if gpu:
        key = GPU_PEAK_FOR_DTYPE.get(dt or "", fallback or "bf16")
        if c.gemm(key) is None:
            key = fallback if fallback and c.gemm(fallback) is not None else next(iter(c.gemm_tflops), None)
        return (c.gemm(key) if key else None), key, None, None
    key = CPU_PEAK_FOR_DTYPE.get(dt or "", "fp32")
    if c.gemm(key) is None:
        key = "fp32" if c.gemm("fp32") is not None else next(iter(c.gemm_tflops), None)
    bf, fp = c.gemm("bf16"), c.gemm("fp32")
    if key == "fp32" and dt in ("float32", None) and bf16_native and bf and fp and bf >= DTYPE_LEVER_MIN * fp:
        return bf, "bf16", (
            f"run the matmuls in bf16 (torch.autocast('cpu', dtype=torch.bfloat16), or the model in bfloat16): "
            f"this CPU's bf16 GEMM ceiling is {bf * 1e3:,.4g} GFLOP/s against fp32's {fp * 1e3:,.4g} "
            f"({bf / fp:.2f}x, both measured here); pass dtype_peak='fp32' (--dtype-peak fp32) if the model "
            "needs full fp32 accuracy"), bf / fp
    return (c.gemm(key) if key else None), key, None, None


def lever_note(dt: str | None, name: str | None, lever: str | None) -> str | None:
    """What a part's note says about the ceiling it was judged against, where that needs saying."""
    if dt == "float64" and name == "fp64" and lever is None:
        return None
    if lever:
        return (f"its {dt or 'fp32'} matmuls are judged against the bf16 GEMM ceiling: the fastest precision "
                f"this machine offers that fp32 numerics usually allow (measured {DTYPE_LEVER_MIN}x or more faster)")
    return None


def no_ceiling_note(dt: str | None, name: str | None) -> str:
    return (f"no measured {name or dt} GEMM ceiling on this machine: its {dt} FLOPs set no floor "
            "(another precision's ceiling is not the floor of this work)")


#: why an fp64 part is not told to drop to bf16
FP64_NO_BF16 = ("an fp64 matmul: its numerics asked for fp64, and a lower precision changes its results; "
                "check whether fp32 is enough before any faster dtype")
