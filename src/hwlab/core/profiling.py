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

import contextlib
import functools
import os
import re
import sys
import tempfile
from typing import Any, Iterable

from hwlab.core.kernel_classes import PRECISION_DTYPE, UNRECOGNISED, classify_kernel

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
#: top-level key of the trace ``hwlab examine`` writes: the call's median measured without the
#: profiler (ms), so an examination of the trace alone applies its shares to the same median
KIT_UNPROFILED_MEDIAN_KEY = "hwlab_unprofiled_median_ms"
#: top-level key of the trace ``hwlab examine`` writes: the last-level cache (bytes) its walk
#: judged wasted traffic against, so the trace examined alone walks on the same machine fact
KIT_CACHE_BYTES_KEY = "hwlab_cache_bytes"
#: top-level key of the trace ``hwlab examine`` writes: each profiled call's run-queue wait in us on
#: a CPU (:mod:`hwlab.core.hostwait`), so a reader of the trace alone leaves out the calls that
#: waited inside their ops, as the live parts do, and both read the same calls
KIT_CALL_WAIT_KEY = "hwlab_call_wait_us"
#: top-level key of the trace ``hwlab examine`` writes: each profiled call's page faults beyond the
#: unprofiled calls' count, as us at this process's measured cost per fault, on a CPU
#: (:func:`hwlab.core.hostwait.fault_us`): the other disturbance that ranks which calls the parts read
KIT_CALL_FAULT_KEY = "hwlab_call_fault_us"


#: lines libkineto writes straight to file descriptor 2 at every profiler start and stop
#: (``USDT:... profiler_start``), whatever its log level: trace points, not messages for a reader
NATIVE_NOISE_PREFIXES = ("USDT:",)


@contextlib.contextmanager
def native_stderr_filtered(drop_prefixes: tuple[str, ...] = NATIVE_NOISE_PREFIXES):
    """Catch what native code writes to fd 2 inside the block, and pass on every line except
    those starting with ``drop_prefixes`` (through ``sys.stderr``, so a notebook shows them).

    At the OS level, because libkineto writes with C stdio and a Jupyter kernel forwards fd 2
    into the cell's output."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    saved_fd = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()  # a plain script's stderr is fd 2 too: its buffer lands in `caught`
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            caught.seek(0)
            text = caught.read().decode(errors="replace")
            kept = "".join(line for line in text.splitlines(keepends=True) if not line.startswith(drop_prefixes))
            if kept:
                sys.stderr.write(kept)


class quiet_profile:
    """``torch.profiler.profile(**kwargs)`` whose start and stop keep libkineto's ``USDT:`` trace
    lines (:data:`NATIVE_NOISE_PREFIXES`) out of the output; its other native messages pass.

        with quiet_profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
    """

    def __init__(self, **kwargs):
        from torch.profiler import profile
        self.prof = profile(**kwargs)

    def __enter__(self):
        with native_stderr_filtered():
            self.prof.__enter__()
        return self.prof

    def __exit__(self, *exc):
        with native_stderr_filtered():
            return self.prof.__exit__(*exc)


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


#: kernel class (:mod:`hwlab.core.kernel_classes`) -> the short class :func:`kernel_class` reports
_SHORT_CLASS = {"conv": "gemm", "copy/concat": "copy", "memset": "memcpy", "norm/reduction": "reduce",
                "optimizer": "elementwise", "triton/compiled": "triton"}


@functools.lru_cache(maxsize=1 << 16)  # a trace repeats a few hundred kernel names thousands of times
def kernel_class(name: str) -> tuple[str, bool | None]:
    """(class, tensor_core) of a device kernel by name, from the kit's one classifier
    (:func:`hwlab.core.kernel_classes.classify_kernel`): class in fp8-gemm / gemm / attention /
    communication / triton / copy / reduce / elementwise / memcpy / gather/scatter /
    quant/dequant / unrecognised; tensor_core True/False/None for GEMM-class kernels (MMA or
    MFMA from the name), else None. A GEMM in fp4 (``mxfp4``) is a GEMM, not an FP8 GEMM."""
    k = classify_kernel(name)
    if k.gemm_class:
        return ("fp8-gemm" if k.precision == "fp8" else "gemm"), k.tensor_core
    return _SHORT_CLASS.get(k.cls, k.cls), None


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


# --------------------------------------------------------------------------------------------
# Parts of a step: the classes ``hwlab examine`` splits a function's time into
# (:mod:`hwlab.examine.parts`), and reading them out of a Chrome trace the profiler exported.
# --------------------------------------------------------------------------------------------

#: aten ops that are matmul work (a GEMM part, split by dtype)
#: aten convolutions with input and weight first: GEMM-class work (cuDNN, MIOpen and oneDNN run them
#: as implicit GEMMs, Winograd or FFT: the same MMA or FMA units as a matmul), FLOPs from their shapes
CONV_OPS = ("aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::_convolution",
            "aten::cudnn_convolution", "aten::miopen_convolution", "aten::mkldnn_convolution",
            "aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d")
#: device kernels of a convolution, by name (cuDNN: ``scudnn``/``hcudnn``, ``implicit_convolve``,
#: ``winograd``, ``wgrad``/``dgrad``/``fprop`` engines; MIOpen: ``MIOpenConv*``, ``naive_conv``,
#: ``igemm_*``); ``conv`` not followed by ``ert`` (``convert`` kernels are copies)
CONV_KERNEL = re.compile(r"conv(?!ert)|[sh]cudnn|winograd|wgrad|dgrad|fprop|igemm|miopen", re.I)
#: host ops of a convolution's backward (autograd's node names, every PyTorch version)
CONV_BACKWARD_MARKS = ("convolution_backward", "ConvolutionBackward", "ConvNdBackward", "conv2d_backward")


def is_conv(op: str | None, kernel: str | None = None) -> bool:
    """A convolution, by its aten op (:data:`CONV_OPS`, backward marks) or its kernel's name."""
    o = op or ""
    return o in CONV_OPS or any(m in o for m in CONV_BACKWARD_MARKS) or bool(kernel and _conv_kernel(kernel))


@functools.lru_cache(maxsize=1 << 16)
def _conv_kernel(kernel: str) -> bool:
    return bool(CONV_KERNEL.search(kernel))


PART_GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm", "aten::linear",
                 "aten::matmul", "aten::convolution", "aten::_convolution", "aten::addmv", "aten::mv",
                 "aten::cudnn_convolution", "aten::_addmm_activation")
#: aten ops that are attention
PART_ATTENTION_OPS = ("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
                      "aten::_scaled_dot_product_efficient_attention", "aten::_flash_attention_forward",
                      "aten::_efficient_attention_forward", "aten::_scaled_dot_product_cudnn_attention",
                      "aten::_scaled_dot_product_flash_attention_for_cpu")
#: aten ops that read or write through an index
PART_GATHER_OPS = ("aten::index", "aten::index_select", "aten::gather", "aten::embedding", "aten::take",
                   "aten::scatter", "aten::scatter_add", "aten::scatter_reduce", "aten::index_add",
                   "aten::index_put", "aten::index_put_", "aten::_index_put_impl_", "aten::embedding_bag",
                   "aten::_embedding_bag", "aten::index_copy", "aten::masked_select", "aten::sort",
                   "aten::topk", "aten::argsort")
#: aten ops that copy or concatenate without arithmetic
PART_COPY_OPS = ("aten::cat", "aten::copy_", "aten::clone", "aten::contiguous", "aten::_to_copy", "aten::to",
                 "aten::stack", "aten::constant_pad_nd", "aten::repeat", "aten::_unsafe_view",
                 "aten::fill_", "aten::zero_", "aten::zeros", "aten::ones", "aten::full", "aten::split_with_sizes_copy",
                 "aten::narrow_copy", "aten::flip", "aten::roll", "aten::tril", "aten::triu")
#: kernel-name fragments of collective communication
COMM_KERNEL_MARKERS = ("nccl", "allreduce", "all_reduce", "allgather", "reducescatter", "c10d::")
#: low-precision dtypes: a copy to or from one of them is quantization / dequantization
PART_LOW_PRECISION = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "int8", "uint8")
#: the part classes, in the order reports list them when times tie
PART_CLASSES = ("gemm", "attention", "elementwise/reduction", "copy/concat", "gather/scatter",
                "quant/dequant", "triton/compiled", "communication", "gpu idle", "host outside ops", UNRECOGNISED)


@functools.lru_cache(maxsize=1 << 16)  # pure in its (hashable) arguments; traces repeat them
def part_class(op: str | None, kernel: str | None = None, dtypes: tuple = (), compiled: bool = False) -> str:
    """The part a kernel (or, on a CPU, an aten op) belongs to: one of :data:`PART_CLASSES`,
    GEMMs suffixed with their input dtype (``gemm bfloat16``). ``op`` is the aten op that
    launched it (None: none did or none was recorded), ``kernel`` its device name, ``dtypes``
    the op's input dtypes from the traffic model (first = the matmul's), ``compiled`` whether a
    compiled region (torch.compile) is above the launch.

    A device kernel is classed **by its own name** (:func:`hwlab.core.kernel_classes.classify_kernel`),
    so a cuBLAS GEMM in a compiled region, a graph replay or a GPU-only trace is still a GEMM; a
    GEMM's dtype is its op's input dtype where the op is linked, else the name's precision. The
    aten op decides only where the name is not recognised; a kernel with neither is
    :data:`~hwlab.core.kernel_classes.UNRECOGNISED` (inside a compiled region: ``triton/compiled``).
    A cast between a low-precision dtype and another (the op's dtypes) is quant/dequant."""
    o = op or ""
    if o.startswith("c10d::") or "nccl" in o.lower():
        return "communication"
    if kernel is not None:
        kk = classify_kernel(kernel)
        if kk.recognised:
            part = kk.part
            if part == "gemm":
                linked = dtypes and (o in PART_GEMM_OPS or is_conv(o))
                dt = dtypes[0] if linked else PRECISION_DTYPE.get(kk.precision or "")
                return f"gemm {dt}" if dt else "gemm"
            if part in ("copy/concat", "elementwise/reduction") and _casts_low_precision(o, dtypes):
                return "quant/dequant"
            return part
        if compiled:
            return "triton/compiled"
        if not o.startswith("aten::"):  # no aten op linked (none, the unlaunched mark, a user range)
            return UNRECOGNISED
    elif compiled:
        return "triton/compiled"
    if o in PART_ATTENTION_OPS:
        return "attention"
    if o in PART_GEMM_OPS or is_conv(o):
        return f"gemm {dtypes[0]}" if dtypes else "gemm"
    if _casts_low_precision(o, dtypes):
        return "quant/dequant"
    if o in PART_GATHER_OPS:
        return "gather/scatter"
    if o in PART_COPY_OPS:
        return "copy/concat"
    return "elementwise/reduction"


def _casts_low_precision(op: str, dtypes: tuple) -> bool:
    if op not in ("aten::_to_copy", "aten::copy_", "aten::to") or not dtypes:
        return False
    return (dtypes[0] in PART_LOW_PRECISION) != (dtypes[-1] in PART_LOW_PRECISION)


#: trace categories of device work in a Kineto Chrome trace
TRACE_KERNEL_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
#: categories as other PyTorch versions and ROCm builds write them -> the names above and the
#: host ones (``cpu_op``, ``cuda_runtime``). PyTorch 1.8's Kineto wrote "Operator", "Kernel",
#: "Runtime", "Memcpy", "Memset"; other spellings (e.g. "Memcpy" as ``gpu_memcpy``) are the same
#: events. Unlisted categories pass through unchanged.
TRACE_CAT_ALIASES = {"Operator": "cpu_op", "operator": "cpu_op", "Kernel": "kernel",
                     "Runtime": "cuda_runtime", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset",
                     "Driver": "cuda_driver", "User annotation": "user_annotation",
                     "GPU annotation": "gpu_user_annotation"}


def trace_cat(cat: Any) -> Any:
    """A trace event's category in current Kineto's spelling (:data:`TRACE_CAT_ALIASES`)."""
    return TRACE_CAT_ALIASES.get(cat, cat) if isinstance(cat, str) else cat
#: trace arguments Kineto writes on a kernel event that say how it occupied the GPU
KERNEL_OCCUPANCY_ARGS = ("registers per thread", "est. achieved occupancy %", "blocks per SM", "warps per SM",
                         "shared memory", "grid", "block")


def trace_calls(trace: dict, call_mark: str) -> list[list[dict[str, Any]]]:
    """The timed work of each call (a ``record_function(call_mark)`` range) in a Kineto
    Chrome trace (``torch.profiler``'s ``export_chrome_trace``), one list per call.

    Each item: ``stack`` (the aten ops above it, innermost first), ``op_ids`` (their trace
    External ids, same order), ``us`` (its time), ``kernel`` (device kernel name, None on a
    CPU), ``compiled`` (a compiled region above it), ``args`` (the kernel's trace arguments).

    * **GPU** (device kernels present): every kernel, memcpy and memset whose launch (the
      runtime event with the same ``correlation``) lies inside the call; its stack is the aten
      ops enclosing that launch on the launching thread; ``us`` its own duration.
    * **CPU**: every aten op inside the call with its *self* time (its duration minus its
      child ops'), so the items add up to the time spent in aten ops, each counted once.
    """
    ev = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    calls = sorted((e for e in ev if e.get("name") == call_mark and e.get("cat") == "user_annotation"),
                   key=lambda e: e["ts"])
    host = sorted((e for e in ev if e.get("cat") in ("cpu_op", "user_annotation")), key=lambda e: (e["ts"], -e["dur"]))
    kernels = [e for e in ev if e.get("cat") in TRACE_KERNEL_CATS]
    runtime = {e["args"].get("correlation"): e for e in ev
               if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}

    def enclosing(ts: float, tid) -> list[dict]:
        """Host events enclosing ``ts`` on thread ``tid``, innermost first."""
        return sorted((h for h in host if h.get("tid") == tid and h["ts"] <= ts <= h["ts"] + h["dur"]),
                      key=lambda h: h["dur"])

    def which_call(ts: float) -> int | None:
        for i, c in enumerate(calls):
            if c["ts"] <= ts <= c["ts"] + c["dur"]:
                return i
        return None

    by_ext = {_ext(h): h for h in host if h.get("cat") == "cpu_op"}
    out: list[list[dict[str, Any]]] = [[] for _ in calls]
    if kernels:
        for k in kernels:
            launch = runtime.get(k.get("args", {}).get("correlation"))
            if launch is None:  # no runtime event: the op with the kernel's External id launched it
                launch = by_ext.get(k.get("args", {}).get("External id"))
            if launch is None:
                continue
            i = which_call(launch["ts"])
            if i is None:
                continue
            encl = enclosing(launch["ts"], launch.get("tid"))
            ops = [h for h in encl if h.get("cat") == "cpu_op" and h["name"].startswith("aten::")]
            compiled = any(any(h["name"].startswith(m) for m in COMPILED_TRACE_MARKS) for h in encl)
            out[i].append({"stack": [h["name"] for h in ops], "op_ids": [_ext(h) for h in ops],
                           "op_ts": [h["ts"] for h in ops], "us": float(k.get("dur", 0.0)),
                           "kernel": k["name"], "compiled": compiled,
                           "args": {a: k["args"][a] for a in KERNEL_OCCUPANCY_ARGS if a in k.get("args", {})},
                           "op_args": {a: ops[0]["args"][a] for a in OP_SHAPE_ARGS if a in ops[0].get("args", {})}
                           if ops else {},
                           "ts": k["ts"]})
        return out
    for i, c in enumerate(calls):
        inside = [h for h in host if h.get("cat") == "cpu_op" and h.get("tid") == c.get("tid")
                  and c["ts"] <= h["ts"] and h["ts"] + h["dur"] <= c["ts"] + c["dur"] + 1e-3]
        # one pass in (start, longest first) order: the stack holds the ops enclosing the current one,
        # outermost first; each op's self time is its duration less its direct children's
        stack: list[tuple[dict, dict]] = []
        for h in inside:
            while stack and not (stack[-1][0]["ts"] <= h["ts"] and h["ts"] + h["dur"] <= stack[-1][0]["ts"]
                                 + stack[-1][0]["dur"] + 1e-3 and stack[-1][0]["dur"] >= h["dur"]):
                stack.pop()
            ops = [x for x in [h, *reversed([e for e, _ in stack])] if x["name"].startswith("aten::")]
            item = {"stack": [x["name"] for x in ops], "op_ids": [_ext(x) for x in ops],
                    "op_ts": [x["ts"] for x in ops], "us": float(h["dur"]), "kernel": None,
                    "compiled": False, "ts": h["ts"], "dur": float(h["dur"]),
                    "args": {a: h["args"][a] for a in OP_SHAPE_ARGS if a in h.get("args", {})}}
            if stack:
                stack[-1][1]["us"] -= h["dur"]
            stack.append((h, item))
            out[i].append(item)
        for item in out[i]:
            item["us"] = max(0.0, item["us"])
    return out


#: a CPU op's recorded shapes (``record_shapes``) kept on its item: an op inside a fused native op
#: is counted from them (:mod:`hwlab.traces.trace_shapes`)
OP_SHAPE_ARGS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")
#: names of host ranges that mark a compiled (torch.compile) region in a trace
COMPILED_TRACE_MARKS = ("Torch-Compiled Region", "CompiledFunction", "## Call CompiledFxGraph")


def _ext(e: dict) -> Any:
    return e.get("args", {}).get("External id", id(e))


def trace_call_us(trace: dict, call_mark: str) -> list[float]:
    """Host duration (µs) of each ``call_mark`` range in a trace, in call order (as :func:`trace_calls`)."""
    return [float(e["dur"]) for e in sorted(
        (e for e in trace.get("traceEvents", [])
         if e.get("ph") == "X" and e.get("name") == call_mark and e.get("cat") == "user_annotation"),
        key=lambda e: e["ts"])]
