"""What ``torch.profiler`` shows of a few calls of an arbitrary function, for ``hwlab examine``.

Per call: device kernels launched, the time they keep the GPU busy (union of their
intervals), which kernels dominate (share of kernel time), each kernel's class by name and
whether it is a tensor-core kernel, the aten op that launched it, and the Triton kernels
whose compiled metadata (registers, spills) is reachable in this process.

* **GPU idle / launch gaps.** ``launch_gap_pct = 100 * (1 - busy_ms / t_ms)`` where
  ``busy_ms`` is the union of kernel intervals per call under the profiler and ``t_ms`` the
  device-event median of the same call timed without it (:mod:`hwlab.core.measure`). The
  flowchart's threshold (50%) is in :mod:`hwlab.diagnosis.flowchart`.
* **Kernel classes** come from the kit's one table (:func:`hwlab.core.profiling.kernel_class`: GEMM /
  FP8 GEMM / tensor core or not, by name). A name heuristic: every kernel's name is kept in the
  record so the classification can be checked.
* **Attribution.** A kernel is attributable when the CPU event that launched it has an aten
  op above it and no compiled region; Triton launches and ``torch.compile`` graphs are not,
  and then the dispatch-mode traffic model (:mod:`hwlab.examine.estimate`) did not see them.
* On a CPU there are no device kernels: the same summary is made of aten ops (self CPU
  time), labelled as such, and no GPU idle figure is claimed.
"""
from __future__ import annotations

import gc
import json
import os
import tempfile
import warnings
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Sequence

# torch is imported by profile_calls, which runs it: the summary type and the trace readers load
# without it (a recorded trace is read where torch is not installed)
from hwlab.core.profiling import (KIT_CACHE_BYTES_KEY, KIT_CALL_FAULT_KEY, KIT_CALL_WAIT_KEY, KIT_RANGE_PREFIX,
                                  KIT_UNPROFILED_MEDIAN_KEY, event_device, kernel_class)
from hwlab.core.profiling import quiet_profile, trace_call_us, trace_calls
from hwlab.examine.shape_merge import merge_shapes, shapes_call

CALL_MARK = KIT_RANGE_PREFIX + "examine_call"
#: trace key: each profiled call's run-queue wait (:data:`hwlab.core.profiling.KIT_CALL_WAIT_KEY`)
CALL_WAIT_KEY = KIT_CALL_WAIT_KEY
COMPILED_MARKS = ("Torch-Compiled Region", "CompiledFunction", "## Call CompiledFxGraph")
TOP_N = 5


def _owner_op(e) -> tuple[str | None, bool]:
    """(nearest aten op above ``e``, whether a compiled region is above it)."""
    op, compiled, p = None, False, e
    while p is not None:
        if op is None and p.name.startswith("aten::"):
            op = p.name
        if any(p.name.startswith(m) for m in COMPILED_MARKS):
            compiled = True
        p = getattr(p, "cpu_parent", None)
    return op, compiled


def triton_kernels(names: Sequence[str]) -> list[dict[str, Any]]:
    """Registers and spills of the compiled Triton kernels named in ``names`` (the profiler's
    kernel names), read from the JIT caches of every Triton function in this process
    (``kernel.n_spills``: 4-byte local-memory slots, from ptxas). Empty without a GPU."""
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return []
    wanted = set(names)
    found: dict[str, dict[str, Any]] = {}
    with warnings.catch_warnings():  # isinstance on some lazy torch objects warns (deprecations)
        warnings.simplefilter("ignore")
        # type(), not isinstance(): isinstance on a dead weakref.proxy (torch.compile leaves some)
        # raises ReferenceError; type() does not dereference it
        jit_fns = [o for o in gc.get_objects() if issubclass(type(o), JITFunction)]
    for obj in jit_fns:
        caches = getattr(obj, "device_caches", None) or getattr(obj, "cache", None) or {}
        for entry in list(caches.values()):  # triton 3.x: device -> (kernel cache, ...); older: dict
            kernel_cache = entry[0] if isinstance(entry, tuple) else entry
            for k in list(getattr(kernel_cache, "values", lambda: [])()):
                kname = getattr(getattr(k, "metadata", None), "name", None) or getattr(obj, "__name__", "")
                if kname not in wanted and not any(kname and kname in w for w in wanted):
                    continue
                try:
                    if hasattr(k, "_init_handles"):
                        k._init_handles()
                    regs, spills = getattr(k, "n_regs", None), getattr(k, "n_spills", None)
                except Exception as e:  # a kernel whose binary cannot load here: say so
                    found.setdefault(kname, {"name": kname, "error": f"{type(e).__name__}: {e}"[:200]})
                    continue
                if regs is None:
                    continue
                prev = found.get(kname)
                if prev is None or (spills or 0) > (prev.get("n_spills") or 0):
                    shown = next((w for w in wanted if kname in w), kname)  # the profiler's name
                    found[kname] = {"name": shown, "n_regs": int(regs), "n_spills": int(spills or 0),
                                    "source": "triton compiled kernel metadata (ptxas)"}
    return sorted(found.values(), key=lambda d: d["name"])


@dataclass
class ProfileSummary:
    """What the profiler saw, per call. ``on_gpu`` False: aten ops and CPU times instead."""

    on_gpu: bool
    n_calls: int
    kernels_per_call: float
    busy_ms_per_call: float
    top: list[dict[str, Any]] = field(default_factory=list)
    attributable_pct: float | None = None  # % of kernel time launched under a plain aten op
    compiled_region: bool = False
    triton: list[dict[str, Any]] = field(default_factory=list)
    gemm_kernels: int = 0
    tensor_core_gemm_kernels: int = 0
    fp8_gemm_kernels: int = 0
    source: str = ""
    error: str | None = None  # the profiler failed: no figures from it
    #: the Chrome trace the profiler exported (a temporary file; ``--out X.json`` copies it to
    #: ``X.trace.json``) and what :func:`hwlab.core.profiling.trace_calls` read out of it
    trace_path: str | None = None
    calls: list = field(default_factory=list, repr=False)
    call_us: list = field(default_factory=list)
    #: on a CPU, each profiled call's run-queue wait in us (:mod:`hwlab.core.hostwait`): host load
    #: that landed somewhere inside the call's wall-clock op times; empty where not reported
    call_wait_us: list = field(default_factory=list)
    #: on a CPU, each profiled call's page faults (:func:`hwlab.core.hostwait.faults`), the unprofiled
    #: calls' median count just before (``ref_faults``), one fault's measured cost, and each call's
    #: faults beyond the reference as us (``call_fault_us``): ranks the calls the parts read
    call_faults: list = field(default_factory=list)
    ref_faults: float | None = None
    fault_cost_us: float | None = None
    call_fault_us: list = field(default_factory=list)

    def fault_note(self) -> str | None:
        """One line on the profiled calls' page faults against the unprofiled calls', or None."""
        if not self.call_faults or self.ref_faults is None or self.fault_cost_us is None:
            return None
        return (f"page faults per profiled call {min(self.call_faults)}-{max(self.call_faults)} against "
                f"{self.ref_faults:g} per unprofiled call just before ({self.fault_cost_us:.2g} us each, measured "
                "here): faults beyond the unprofiled calls' rank a call as disturbed, like its run-queue wait")

    def churn_note(self, t_ms: float) -> str | None:
        """One line where the unprofiled calls' own page faults cost :data:`CHURN_SHARE` of the call or
        more (an estimate at the measured cost per fault), with what would save them; else None."""
        if self.ref_faults is None or self.fault_cost_us is None or t_ms <= 0:
            return None
        ms = self.ref_faults * self.fault_cost_us / 1e3
        if ms < CHURN_SHARE * t_ms:
            return None
        return (f"the {N_REF_CALLS} unprofiled calls before the profile took a median of {self.ref_faults:g} page "
                f"faults each: about {ms:.3g} ms, {100 * ms / t_ms:.0f}% of the call (an estimate at "
                f"{self.fault_cost_us:.2g} us per fault, measured here), inside the ops that allocate: the heap "
                "gives freed tensor memory back to the OS and takes it again every call. Reusing buffers (out=, "
                "in-place ops) or a heap that keeps its memory (MALLOC_TRIM_THRESHOLD_, jemalloc, tcmalloc) would "
                "save most of it")

    def launch_gap_pct(self, t_ms: float) -> float | None:
        """GPU idle share of the call (see module doc); None on a CPU."""
        if not self.on_gpu or t_ms <= 0 or self.error or not self.n_calls:
            return None
        return max(0.0, min(100.0, 100.0 * (1.0 - self.busy_ms_per_call / t_ms)))

    @property
    def n_spills(self) -> int | None:
        spills = [k["n_spills"] for k in self.triton if "n_spills" in k]
        return max(spills) if spills else None

    def to_dict(self) -> dict[str, Any]:
        # per-kernel items left out before the copy, not after: the parts summarise them, the trace
        # file keeps them, and asdict's deep copy of them costs more than the rest of the report
        d = asdict(replace(self, calls=[]))
        d.pop("calls", None)
        return d


def _busy_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -float("inf")
    for lo, hi in sorted(intervals):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


def profile_calls(fn: Callable[..., Any], arg_sets: Sequence[Sequence[Any]], kwargs: dict,
                  device: torch.device, n_calls: int = 3,
                  unprofiled_median_ms: float | None = None, cache_bytes: int | None = None) -> ProfileSummary:
    """Profile ``n_calls`` calls (after the caller's warm-up) and summarise them. The Chrome trace
    written beside the summary carries ``unprofiled_median_ms`` (the caller's measured median) under
    :data:`~hwlab.core.profiling.KIT_UNPROFILED_MEDIAN_KEY`, so the trace examined alone applies
    its op shares to the same median (``hwlab examine --trace``), and ``cache_bytes`` (the cache the
    caller's walk judges wasted traffic against) under :data:`~hwlab.core.profiling.KIT_CACHE_BYTES_KEY`,
    so the trace's walk uses the same machine fact."""
    import torch
    from torch.profiler import ProfilerActivity, record_function

    gpu = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    from hwlab.core import hostwait

    waits: list[float] = []
    faults: list[int] = []
    ref_faults, cost_us = (None, None) if gpu else _reference_faults(fn, arg_sets, kwargs)
    # shapes: the trace can be examined alone; on a CPU from a call of their own (examine/shape_merge)
    with quiet_profile(activities=acts, record_shapes=gpu) as prof:
        for i in range(n_calls):
            w0 = None if gpu else hostwait.wait_ns()
            f0 = None if ref_faults is None else hostwait.faults()
            with record_function(CALL_MARK):
                fn(*arg_sets[i % len(arg_sets)], **kwargs)
            f1 = hostwait.faults() if f0 is not None else None
            w1 = hostwait.wait_ns() if w0 is not None else None
            if w1 is not None:
                waits.append((w1 - w0) / 1e3)
            if f1 is not None:
                faults.append(f1 - f0)
        if gpu:
            torch.cuda.synchronize(device)
    summary = None
    if gpu:  # a CPU's summary is read from the Chrome trace below (parsing the profiler's events costs more)
        events = list(prof.events())
        compiled = any(any(e.name.startswith(m) for m in COMPILED_MARKS) for e in events)
        summary = _summarise_gpu(events, n_calls, compiled)
    try:  # the Chrome trace: what the parts are read from, and what the user can open
        fd, path = tempfile.mkstemp(prefix="hwlab_examine_", suffix=".trace.json")
        os.close(fd)
        prof.export_chrome_trace(path)
        with open(path) as f:
            text = f.read()
        kit: dict[str, Any] = {k: (float(v) if k == KIT_UNPROFILED_MEDIAN_KEY else int(v)) for k, v in
                               ((KIT_UNPROFILED_MEDIAN_KEY, unprofiled_median_ms), (KIT_CACHE_BYTES_KEY, cache_bytes))
                               if v is not None}
        if len(waits) == n_calls and waits:
            kit[CALL_WAIT_KEY] = [float(w) for w in waits]
        fault_us = _fault_time_us(faults, ref_faults, cost_us, n_calls)
        if fault_us:
            kit[KIT_CALL_FAULT_KEY] = fault_us
        if gpu and kit and text.lstrip().startswith("{"):  # the keys added as text (no second parse and dump)
            text = text.replace("{", "{" + json.dumps(kit)[1:-1] + ", ", 1)
            with open(path, "w") as f:
                f.write(text)
        trace = json.loads(text)
        if not gpu:  # the shapes of one more call, copied onto the timed calls' ops (examine/shape_merge)
            shaped = merge_shapes(trace, CALL_MARK, shapes_call(fn, arg_sets[0], kwargs))
            trace = {**kit, **trace}
            with open(path, "w") as f:
                json.dump(trace, f)
        calls, call_us = trace_calls(trace, CALL_MARK), trace_call_us(trace, CALL_MARK)
        if summary is None:
            compiled = any(isinstance(e, dict) and any(str(e.get("name", "")).startswith(m) for m in COMPILED_MARKS)
                           for e in trace.get("traceEvents", []))
            summary = _summarise_cpu_calls(calls, n_calls, compiled)
        summary.trace_path, summary.calls, summary.call_us = path, calls, call_us
        if not gpu and not shaped:
            summary.source += ("; the calls ran different ops, so the trace carries no shapes (a shapes call's "
                               "inputs are copied only onto the same ops)")
    except Exception as e:  # the summary stands; the parts say they could not be read
        if summary is None:
            events = list(prof.events())
            summary = _summarise_cpu(events, n_calls, any(any(x.name.startswith(m) for m in COMPILED_MARKS)
                                                          for x in events))
        summary.calls = []
        summary.source += f"; no Chrome trace ({type(e).__name__}: {' '.join(str(e).split())[:120]})"
    summary.call_wait_us = waits if len(waits) == n_calls else []
    summary.call_fault_us = _fault_time_us(faults, ref_faults, cost_us, n_calls)
    if summary.call_fault_us:
        summary.call_faults, summary.ref_faults, summary.fault_cost_us = faults, ref_faults, cost_us
    return summary


#: the unprofiled calls' page-fault time, as a share of the call, at which the report names it:
#: under it the faults are within the call's own run-to-run spread
CHURN_SHARE = 0.05
#: unprofiled calls just before the profiler starts whose page faults set the reference a
#: profiled call's faults are measured beyond (hostwait module doc)
N_REF_CALLS = 3
#: calls a CPU profile makes beside the profiled ones: the reference calls and the shapes call
#: (:mod:`hwlab.examine.shape_merge`), for the time-left estimate
CPU_EXTRA_CALLS = N_REF_CALLS + 1


def _reference_faults(fn: Callable[..., Any], arg_sets: Sequence[Sequence[Any]], kwargs: dict
                      ) -> tuple[float | None, float | None]:
    """(median page faults of :data:`N_REF_CALLS` unprofiled calls, one fault's cost in us), or
    (None, None) where the OS does not count faults per thread."""
    import statistics

    from hwlab.core import hostwait

    cost = hostwait.fault_us()
    if cost is None or hostwait.faults() is None:
        return None, None
    counts = []
    for i in range(N_REF_CALLS):
        f0 = hostwait.faults()
        fn(*arg_sets[i % len(arg_sets)], **kwargs)
        counts.append((hostwait.faults() or 0) - (f0 or 0))
    return float(statistics.median(counts)), cost


def _fault_time_us(faults: list[int], ref: float | None, cost_us: float | None, n_calls: int) -> list[float]:
    """Each call's faults beyond ``ref`` as us at ``cost_us`` each; empty where not all were counted."""
    if ref is None or cost_us is None or len(faults) != n_calls:
        return []
    return [max(0.0, f - ref) * cost_us for f in faults]


def _summarise_gpu(events, n_calls: int, compiled: bool) -> ProfileSummary:
    kern = [e for e in events if "CUDA" in event_device(e) and not e.name.startswith(KIT_RANGE_PREFIX)]
    owner: dict[str, tuple[str | None, bool]] = {}
    for e in events:  # CPU events that launched kernels carry them in .kernels
        if "CUDA" not in event_device(e) and getattr(e, "kernels", None):
            op, comp = _owner_op(e)
            for k in e.kernels:
                owner.setdefault(k.name, (op, comp))
    per: dict[str, dict[str, Any]] = {}
    intervals = []
    for e in kern:
        lo, hi = e.time_range.start, e.time_range.end
        intervals.append((lo, hi))
        d = per.setdefault(e.name, {"us": 0.0, "count": 0})
        d["us"] += hi - lo
        d["count"] += 1
    total = sum(d["us"] for d in per.values())
    triton = triton_kernels(list(per))
    outside = {t["name"] for t in triton}

    def seen_by_aten(name: str) -> bool:
        """Positive evidence only: a Triton kernel, or a launcher with no aten op / a compiled
        region above it, is outside; a kernel whose launcher the profiler did not link is not."""
        if name in outside or name.startswith("triton"):
            return False
        if name in owner:
            op, comp = owner[name]
            return bool(op) and not comp
        return True

    attributed = sum(d["us"] for n, d in per.items() if seen_by_aten(n))
    top = []
    for name, d in sorted(per.items(), key=lambda kv: -kv[1]["us"])[:TOP_N]:
        cls, tc = kernel_class(name)
        if name in outside:
            cls = "triton"
        top.append({"name": name[:200], "share_pct": 100.0 * d["us"] / total if total else 0.0,
                    "us_per_call": d["us"] / n_calls, "per_call": d["count"] / n_calls,
                    "class": cls, "tensor_core": tc, "launched_by": owner.get(name, (None, False))[0]})
    classes = [(kernel_class(e.name), e) for e in kern]
    gemms = [c for (c, _t), _e in classes if c in ("gemm", "fp8-gemm")]
    return ProfileSummary(
        on_gpu=True, n_calls=n_calls, kernels_per_call=len(kern) / n_calls,
        busy_ms_per_call=_busy_us(intervals) / n_calls / 1e3, top=top,
        attributable_pct=100.0 * attributed / total if total else None, compiled_region=compiled,
        triton=triton, gemm_kernels=len(gemms) // n_calls,
        tensor_core_gemm_kernels=sum(1 for (c, t), _ in classes if c in ("gemm", "fp8-gemm") and t) // n_calls,
        fp8_gemm_kernels=gemms.count("fp8-gemm") // n_calls,
        source="torch.profiler device kernels (CUPTI)")


def _summarise_cpu_calls(calls: list, n_calls: int, compiled: bool) -> ProfileSummary:
    """The CPU summary (as :func:`_summarise_cpu`) from the trace's calls (:func:`trace_calls`): each
    outermost aten op's time is the self times of every item under it."""
    per: dict[str, dict[str, Any]] = {}
    for items in calls:
        seen = set()
        for it in items:
            if not it["stack"]:
                continue
            name, oid = it["stack"][-1], it["op_ids"][-1]
            d = per.setdefault(name, {"us": 0.0, "count": 0})
            d["us"] += it["us"]
            if (name, oid) not in seen:
                seen.add((name, oid))
                d["count"] += 1
    return _cpu_summary(per, n_calls, compiled)


def _summarise_cpu(events, n_calls: int, compiled: bool) -> ProfileSummary:
    def top_level(e) -> bool:  # an aten op with no aten op above it, inside one of our calls
        p = e.cpu_parent
        inside = False
        while p is not None:
            if p.name.startswith("aten::"):
                return False
            inside = inside or p.name == CALL_MARK
            p = p.cpu_parent
        return inside

    ops = [e for e in events if e.name.startswith("aten::") and top_level(e)]
    per: dict[str, dict[str, Any]] = {}
    for e in ops:
        d = per.setdefault(e.name, {"us": 0.0, "count": 0})
        d["us"] += e.cpu_time_total
        d["count"] += 1
    return _cpu_summary(per, n_calls, compiled)


def _cpu_summary(per: dict[str, dict[str, Any]], n_calls: int, compiled: bool) -> ProfileSummary:
    total = sum(d["us"] for d in per.values())
    top = [{"name": n, "share_pct": 100.0 * d["us"] / total if total else 0.0,
            "us_per_call": d["us"] / n_calls, "per_call": d["count"] / n_calls,
            "class": "matmul" if n in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul",
                                       "aten::linear", "aten::_scaled_mm") else "aten op",
            "tensor_core": None, "launched_by": n}
           for n, d in sorted(per.items(), key=lambda kv: -kv[1]["us"])[:TOP_N]]
    return ProfileSummary(
        on_gpu=False, n_calls=n_calls, kernels_per_call=sum(d["count"] for d in per.values()) / n_calls,
        busy_ms_per_call=total / n_calls / 1e3, top=top,
        attributable_pct=None if compiled else 100.0, compiled_region=compiled,
        source="torch.profiler aten ops on the CPU (no device kernels: CPU run)")
