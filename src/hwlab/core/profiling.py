"""The kit's one table of kernel classes, and what it reads out of a ``torch.profiler`` run.

Every floor that looks at a profile uses this module: the node baseline's runtime path
(:mod:`hwlab.diagnosis.baseline`), Lab 4's FP8 hit rate and step-time breakdown
(:mod:`hwlab.labs.fp8.profile`) and ``hwlab examine`` (:mod:`hwlab.examine.torch_profile`). One table,
as HTA keeps one kernel classifier for all its analyzers, so a kernel is never a GEMM for one
report and "other" for the next.

The classes are a name heuristic, and every report that uses them keeps the names it classified
so the classification can be checked:

* **GEMM**: a device kernel whose lower-cased name holds a :data:`GEMM_KERNEL_MARKERS` or
  :data:`FP8_KERNEL_MARKERS` fragment (cuBLAS/cuBLASLt ``nvjet``, ``cutlass``, ``sm90_xmma``,
  ``gemm``) and none of :data:`NOT_GEMM_MARKERS` (cuBLAS split-K reductions match ``gemm``-ish
  names but are not a GEMM call). On a CPU: one of the aten ops :data:`CPU_GEMM_OPS`.
* **FP8 GEMM**: a GEMM whose name holds an FP8 fragment (``e4m3``, ``f8f8``, cuBLASLt's
  ``qqtst`` type code, ``fp8``); on a CPU ``aten::_scaled_mm``. The FP8 *hit rate* is FP8 GEMMs
  over all GEMM calls; every other GEMM is a *fallback* to a higher precision.
* **Dequant copies**: ``copy_kernel`` (an FP8 tensor cast up with ``.to()``) and the kit's
  ``_dequant_rows_kernel``; on a CPU ``aten::_to_copy``.
* **Step-time classes** (:data:`STEP_TIME_CLASSES`, first match wins): attention, quant/dequant,
  FP8 GEMM, GEMM, then ``other`` (norms, KV writes, residual adds, activations).
* **Tensor-core GEMMs** (:func:`kernel_class`): a GEMM whose name holds an MMA fragment
  (:data:`TENSOR_CORE_MARKERS`) runs on the tensor cores; one with an fp32 SIMT fragment
  (:data:`SIMT_GEMM_MARKERS`) does not; otherwise unknown (``None``).

On a GPU the profiler mirrors the kit's ``record_function`` ranges (named ``hwlab::...``) onto
the device timeline: they are ranges, not kernels, and are left out of every count here.
"""
from __future__ import annotations

from typing import Any, Iterable

#: aten ops that are one GEMM call on a CPU (``aten::_scaled_mm`` calls ``aten::mm`` inside
#: itself: ops nested in one of these are left out, so one call counts once)
CPU_GEMM_OPS = ("aten::_scaled_mm", "aten::mm", "aten::addmm", "aten::bmm")
#: name fragments of an FP8 GEMM kernel (cuBLASLt ``qqtst`` = the e4m3 x e4m3 type code)
FP8_KERNEL_MARKERS = ("qqtst", "fp8", "e4m3", "f8f8")
#: name fragments of a GEMM kernel (cuBLAS/cuBLASLt, CUTLASS, Hopper xmma)
GEMM_KERNEL_MARKERS = ("gemm", "nvjet", "cutlass", "sm90_xmma", "ampere_bf16", "cublas")
#: kernels that match a GEMM marker but are not a GEMM call (cuBLAS split-K reductions)
NOT_GEMM_MARKERS = ("splitkreduce", "reduce_kernel")
#: device kernels that dequantize: an FP8 tensor cast up (``.to()``) or the kit's row dequant
DEQUANT_KERNEL_MARKERS = ("copy_kernel", "_dequant_rows_kernel")
#: name fragments of tensor-core (MMA) kernels: cuBLAS/cuBLASLt (nvjet, xmma with a
#: half/bf16/tf32/fp8 type, *_tensorop_*), CUTLASS (s16816/s1688/h16816 = mma shapes), wgmma
TENSOR_CORE_MARKERS = ("nvjet", "tensorop", "wgmma", "hmma", "16816", "1688", "bf16", "f16", "fp16",
                       "tf32", "e4m3", "e5m2", "f8f8", "qqtst", "gmma")
#: fp32 GEMM kernels on the CUDA cores (no MMA): cuBLAS sgemm and fp32 xmma without tf32
SIMT_GEMM_MARKERS = ("sgemm", "f32f32_f32f32_f32", "gemv")
#: where a decode step's device time goes: (class, name fragments), first match wins (GPU
#: kernel names; CPU aten ops); what matches none is ``other``
STEP_TIME_CLASSES = (
    ("attention", ("_decode_attn", "flash", "fmha", "attention")),
    ("quant/dequant", ("_quant_", "_row_amax", "_dequant_rows")),
    ("gemm fp8", ("fp8w_gemm", "fp8_decode_gemm", "qqtst", "_scaled_mm", "e4m3", "f8f8")),
    ("gemm", ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas", "aten::mm", "aten::addmm", "aten::bmm")),
)
#: the kit's own ``record_function`` ranges start with this (mirrored on the GPU timeline)
KIT_RANGE_PREFIX = "hwlab::"


def event_device(e) -> str:
    """``"CPU"`` / ``"CUDA"`` of a profiler event (the enum's name, or its string)."""
    return e.device_type.name if hasattr(e.device_type, "name") else str(e.device_type)


def inside_op(e, names) -> bool:
    """Whether a profiler event runs inside (below) an op or range named in ``names``."""
    p = getattr(e, "cpu_parent", None)
    while p is not None:
        if p.name in names:
            return True
        p = getattr(p, "cpu_parent", None)
    return False


def profiler_events(prof) -> list[tuple[str, str]]:
    """(name, device type) of every event a ``torch.profiler`` run recorded, leaving out ops
    nested inside a GEMM op (on a CPU ``aten::_scaled_mm`` calls ``aten::mm`` itself: one call)."""
    return [(e.name, event_device(e)) for e in prof.events() if not inside_op(e, CPU_GEMM_OPS)]


def is_gemm_kernel(name: str) -> bool:
    """A device kernel that is one GEMM call, by name (module docstring)."""
    n = name.lower()
    return any(m in n for m in GEMM_KERNEL_MARKERS + FP8_KERNEL_MARKERS) and \
        not any(m in n for m in NOT_GEMM_MARKERS)


def is_fp8_kernel(name: str) -> bool:
    n = name.lower()
    return any(m in n for m in FP8_KERNEL_MARKERS)


def kernel_class(name: str) -> tuple[str, bool | None]:
    """(class, tensor_core) of a device kernel by name: class in fp8-gemm / gemm / triton /
    copy / reduce / elementwise / memcpy / other; tensor_core True/False for GEMMs, else None."""
    n = name.lower()
    if n.startswith(("memcpy", "memset")):
        return "memcpy", None
    if is_gemm_kernel(n):
        tc = True if any(m in n for m in TENSOR_CORE_MARKERS) else (
            False if any(m in n for m in SIMT_GEMM_MARKERS) else None)
        return ("fp8-gemm" if is_fp8_kernel(n) else "gemm"), tc
    if n.startswith("triton"):
        return "triton", None
    if "copy" in n:
        return "copy", None
    if "reduce" in n:
        return "reduce", None
    if "elementwise" in n or "vectorized" in n:
        return "elementwise", None
    return "other", None


def step_time_class(name: str) -> str:
    """The :data:`STEP_TIME_CLASSES` class of a kernel (or CPU aten op) name, else ``other``."""
    n = name.lower()
    return next((c for c, marks in STEP_TIME_CLASSES if any(k.lower() in n for k in marks)), "other")


def hit_rate_from_events(events: list[tuple[str, str]], gpu: bool) -> dict[str, Any]:
    """FP8 hit rate, fallback rate (%) and dequant count from (name, device) profiler events
    (:func:`profiler_events`); ``gemm_names`` keeps what was classified, with its count."""
    if gpu:
        kernels = [n for n, dt in events if "CUDA" in dt and not n.startswith(KIT_RANGE_PREFIX)]
        gemms = [n for n in kernels if is_gemm_kernel(n)]
        hits = [n for n in gemms if is_fp8_kernel(n)]
        dequant = [n for n in kernels if any(m in n for m in DEQUANT_KERNEL_MARKERS)]
    else:
        ops = [n for n, _ in events]
        gemms = [n for n in ops if n in CPU_GEMM_OPS]
        hits = [n for n in gemms if n == "aten::_scaled_mm"]
        dequant = [n for n in ops if n == "aten::_to_copy"]
    n = len(gemms)
    names: dict[str, int] = {}
    for g in gemms:
        names[g[:160]] = names.get(g[:160], 0) + 1
    return {"gemm_calls": n, "fp8_hits": len(hits), "hit_rate_pct": 100.0 * len(hits) / n if n else None,
            "fallback_rate_pct": 100.0 * (n - len(hits)) / n if n else None,
            "dequant_copies": len(dequant), "gemm_names": names,
            "source": "torch.profiler kernel names" if gpu else "torch.profiler aten ops"}


def time_by_class(prof, gpu: bool, quant_ranges: Iterable[str] = ()) -> dict[str, Any]:
    """Device time (µs) and count per :data:`STEP_TIME_CLASSES` class of one profiler run.

    GPU: each kernel's own interval (the sum excludes launch gaps, so a graph-timed step minus
    this sum bounds what launches cost). CPU: aten ops' self time, ops nested in a GEMM op left
    out; an ``other`` op inside one of ``quant_ranges`` (the caller's ``record_function`` names)
    counts as quant/dequant, since on a CPU (de)quantization is plain aten ops in those ranges.
    """
    ranges = tuple(quant_ranges)
    per: dict[str, float] = {c: 0.0 for c, _ in STEP_TIME_CLASSES}
    per["other"] = 0.0
    counts: dict[str, int] = {k: 0 for k in per}
    for e in prof.events():
        if gpu:
            if "CUDA" not in event_device(e) or e.name.startswith(KIT_RANGE_PREFIX):
                continue
            us = e.time_range.elapsed_us()
        else:
            if not e.name.startswith("aten::") or inside_op(e, CPU_GEMM_OPS):
                continue
            us = e.self_cpu_time_total
        cat = step_time_class(e.name)
        if not gpu and cat == "other" and ranges and inside_op(e, ranges):
            cat = "quant/dequant"
        per[cat] += us
        counts[cat] += 1
    total = sum(per.values())
    return {"source": "GPU kernel times" if gpu else "CPU aten self times", "us": per, "count": counts,
            "total_us": total, "share_pct": {k: 100.0 * v / total if total else 0.0 for k, v in per.items()}}
