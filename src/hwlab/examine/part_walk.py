"""A part's rates, floor, gain and flowchart evidence, and its walk (the rules are in
:mod:`hwlab.examine.parts`' module doc); :func:`rewalk` floors and walks a recorded part again."""
from __future__ import annotations

from typing import Any

from hwlab.diagnosis.flowchart import diagnose
from hwlab.examine.part_record import Part
from hwlab.examine.rates import past_cache, settle_copy, settle_gemm, traffic_ratio


def floor_part(p: Part, dtype: str | None, copy_gbps: float | None, gemm_tflops: float | None,
               cache_bytes: int | None) -> None:
    """An attributable part's rates, the ceilings it is judged against (raised where its rate proves
    the measured one low, :mod:`hwlab.examine.rates`), its traffic ratio and its floor: the larger of
    its bytes at the copy ceiling and its FLOPs at the GEMM ceiling, except that a byte floor the
    part beat with bytes a cache can hold (under 4x the cache) is not DRAM's and gives way to the
    FLOP floor, so cache-resident weights do not leave a GEMM part without a verdict."""
    t = p.t_ms
    p.gbps = p.moved_bytes / (t * 1e6) if t > 0 else None
    p.tflops = p.flops / (t * 1e9) if t > 0 and p.flops else None
    sc = settle_copy(p.gbps, copy_gbps, p.floor_bytes, cache_bytes, what=f"the part {p.name}")
    p.ceiling_gbps = sc.ceiling if copy_gbps else None
    sg = settle_gemm(p.tflops, gemm_tflops, dtype, what=f"the part {p.name}")
    tf = sg.ceiling if gemm_tflops else None
    p.ceilings_raised = [x.note for x in (sc, sg) if x.raised]
    p.notes += p.ceilings_raised
    p.traffic_ratio = traffic_ratio(p.moved_bytes, p.floor_bytes, cache_bytes, p.n_ops)
    byte_ms = p.floor_bytes / (p.ceiling_gbps * 1e6) if p.ceiling_gbps else None
    p.ceiling_tflops = tf
    flop_ms = p.flops / (tf * 1e9) if tf and p.flops else None
    if byte_ms is not None and flop_ms is not None and t < byte_ms and not past_cache(p.floor_bytes, cache_bytes):
        # read faster than the copy ceiling allows, with bytes a cache can hold: the byte floor is not
        # DRAM's (a GEMM's weights resident in the CPU's LLC); its FLOPs still set a floor
        p.notes.append(f"its {p.floor_bytes / 1e6:,.4g} MB were read faster than the copy ceiling allows, and fit "
                       "the cache: the byte floor is not DRAM's; floored on its FLOPs")
        byte_ms = None
        p.floor_ms, p.floor_source = flop_ms, f"FLOPs at the measured {dtype} GEMM ceiling"
    if byte_ms is not None:
        if flop_ms is not None and flop_ms >= byte_ms:
            p.floor_ms, p.floor_source = flop_ms, f"FLOPs at the measured {dtype} GEMM ceiling"
        else:
            p.floor_ms, p.floor_source = byte_ms, FUSED_FLOOR


#: a part floored by its bytes: every intermediate free and the rest moved once at the copy ceiling,
#: which no fused kernel fully reaches: its gain is an upper bound (:func:`gain`)
FUSED_FLOOR = "bytes (as if its ops were fused) at the copy ceiling"
FUSED_BOUND = (" (an upper bound: the part's ops fused into one pass at the measured copy ceiling; a fused "
               "kernel reaches part of it)")


#: a GEMM part whose FLOP floor is within this factor of its byte floor answers H by its rate even
#: where the bytes set its floor: a busy host's copy ceiling moves the ridge point by this much, and
#: must not switch H between measured and unasked from one run to the next
RIDGE_BAND = 4.0


def near_ridge(p: Part) -> bool:
    """A GEMM part (all matmul work) whose FLOP floor is within :data:`RIDGE_BAND` of its byte floor."""
    if not (p.name.startswith("gemm") and p.flops and p.ceiling_tflops and p.ceiling_gbps and p.floor_bytes):
        return False
    flop_ms = p.flops / (p.ceiling_tflops * 1e9)
    byte_ms = p.floor_bytes / (p.ceiling_gbps * 1e6)
    # judged against a faster precision (the dtype lever), the ridge is where the data's own ceiling puts it
    return flop_ms * RIDGE_BAND * (p.lever_gain or 1.0) >= byte_ms


def gain(p: Part, t_ms: float) -> None:
    """% of floor, expected gain and the whole function's speed-up if this part reached its floor."""
    if p.floor_ms is not None and p.t_ms > 0:
        if p.floor_ms > p.t_ms * 1.0001 and p.floor_ms > 0:
            p.notes.append(f"measured faster than its floor ({p.t_ms:.4g} < {p.floor_ms:.4g} ms): the "
                           "counted bytes or FLOPs are too high for this part; no gain or verdict from them")
            p.pct_of_floor, p.saved_ms = None, None
        else:
            p.pct_of_floor = 100.0 * p.floor_ms / p.t_ms
            p.saved_ms = p.t_ms - p.floor_ms
            p.speedup = t_ms / (t_ms - p.saved_ms) if t_ms > p.saved_ms else None
            if p.floor_source == FUSED_FLOOR and p.saved_ms > 0:
                p.gain_bound = FUSED_BOUND
    if p.lever_gain and p.lever_gain > 1 and p.t_ms > 0 and t_ms > 0:
        # the dtype lever at the part's present efficiency: its time over the ceilings' ratio. Its floor
        # assumes the faster precision's ceiling is reached, which small or convolution shapes do not
        # reach when they are far from the data's own ceiling already: that speed-up is the upper bound
        p.lever_speedup = t_ms / (t_ms - p.t_ms * (1.0 - 1.0 / p.lever_gain))
        if p.speedup is not None:
            p.gain_bound = (f" (an upper bound: the part at the faster precision's ceiling; at its present "
                            f"efficiency the faster precision gives {p.lever_speedup:.2f}x the whole function, "
                            "an estimate from the measured ceilings' ratio)")


def rewalk(d: dict[str, Any], *, copy_gbps: float, gemm_tflops: float | None = None, cache_bytes: int | None,
           t_ms: float | None = None, e2e_slowdown: float | None = None, gpu: bool = True) -> Part:
    """A recorded part (``Part.to_dict()``, e.g. from ``examine_parts.json``) floored and walked again
    against the given ceilings and cache: the same rules as :func:`build_parts`, on recorded counts
    and times (``t_ms``: the whole function's time, default the part's)."""
    p = Part(name=d["name"], t_ms=d["t_ms"], share_pct=d["share_pct"], n_items=d.get("n_items", 0.0),
             attributable=d["attributable"], moved_bytes=d["moved_bytes"], floor_bytes=d["floor_bytes"],
             flops=d["flops"], sector_amplification=d.get("sector_amplification"),
             n_tc=d.get("tensor_core_kernels"),
             n_ops=d.get("n_ops") or (round(d["n_items"]) if d.get("n_items") else None))
    dtype = next((k.split()[-1] for k in [p.name] if k.startswith("gemm ")), None)
    floor_part(p, dtype, copy_gbps, gemm_tflops if p.flops else None, cache_bytes)
    gain(p, t_ms or p.t_ms)
    rest = Part(name="rest", t_ms=0.0, share_pct=0.0, n_items=0.0, attributable=False)
    part_evidence(p, rest, copy_gbps, gpu, None, e2e_slowdown, None, None)
    p.walk = diagnose({**p.evidence, "metric_sources": p.sources})
    return p


def host_headline_refusal(net_ms: float, outside_ms_per_call: list[float], whole_leaf: str | None) -> str | None:
    """Why the CPU's host-outside-ops part may not head the report, or None when it may.

    Rule: it heads only when (1) its time (its share of the profiled calls, applied to the median) is
    larger than the spread (max - min) of the time outside ops across the profiled calls: a share
    inside its own spread is noise, and time the profiler added is an artefact of measuring; and
    (2) the whole-function walk, from the unprofiled median, lands on J too: a function whose
    measured time walks elsewhere is not host-bound, whatever a profiled call shows."""
    spread = (max(outside_ms_per_call) - min(outside_ms_per_call)) if len(outside_ms_per_call) > 1 else None
    if spread is not None and net_ms <= spread:
        return (f"its {net_ms:.4g} ms (its share of the profiled calls) is inside its own spread "
                f"across the profiled calls ({spread:.4g} ms): profiler or host noise, not a finding")
    if whole_leaf != "J":
        return (f"the whole function, walked on its unprofiled median, lands on {whole_leaf or 'no leaf'}, not J: "
                "the time outside ops is not what bounds it")
    return None


def ncu_matches(p: Part, ncu: dict[str, Any] | None) -> bool:
    """Counted figures are per examination; they describe a part when its kernels were counted."""
    if not ncu:
        return False
    names = " ".join(ncu.get("kernels") or [])
    return any(_base(k) and _base(k) in names for k in p.top if k)


def _base(kernel: str) -> str:
    """``void at::native::foo<16, long>(char*, ...)`` -> ``foo`` (ncu names kernels without namespaces)."""
    return kernel.split("(")[0].split("<")[0].strip().split(" ")[-1].split("::")[-1][:60]


def part_evidence(p: Part, rest: Part, copy_gbps: float | None, gpu: bool, whole_slowdown: float | None,
              e2e: float | None, prof, ncu: dict[str, Any] | None, e2e_spread: dict[str, Any] | None = None) -> None:
    ev, src = p.evidence, p.sources
    if p is rest:
        if whole_slowdown is not None:
            ev["slowdown_vs_floor"] = whole_slowdown
            src["slowdown_vs_floor"] = "the whole function's measured time over its floor (idle has no floor)"
        ev["dram_pct_estimated"] = 0.0
        src["dram_pct_estimated"] = "no kernel runs in this part: it moves no bytes"
        if gpu:
            ev["launch_gap_pct"] = 100.0
            src["launch_gap_pct"] = "this part is the GPU's idle time between launches (profiler vs measured)"
        else:
            ev["launch_gap_pct"] = 100.0
            src["launch_gap_pct"] = "this part is host time outside aten ops (CPU profile)"
    else:
        below_floor = bool(p.floor_ms) and p.floor_ms > p.t_ms * 1.0001  # as gain(): a rounding is no evidence
        if p.floor_ms and not below_floor:
            ev["slowdown_vs_floor"] = p.t_ms / p.floor_ms
            src["slowdown_vs_floor"] = f"part time / its floor ({p.floor_source})"
        ceiling = p.ceiling_gbps or copy_gbps
        if p.moved_bytes is not None and ceiling and p.t_ms > 0:
            pct = 100.0 * p.moved_bytes / (p.t_ms * 1e6) / ceiling
            if pct <= 100.0:
                ev["dram_pct_estimated"] = pct
                src["dram_pct_estimated"] = "the part's moved bytes (traffic model) / its time vs the copy ceiling"
            else:
                p.notes.append(f"estimated DRAM share {pct:.0f}% is above the measured copy ceiling: either the data "
                               "was served from cache, not DRAM (enlarge the inputs), or the ceiling was measured "
                               "low (re-measure it: hwlab doctor --remeasure); not used as evidence")
        if p.sector_amplification is not None:
            ev["sector_amplification"] = p.sector_amplification
            src["sector_amplification"] = "estimated from the part's ops' strides and index values"
        if p.traffic_ratio is not None:
            ev["traffic_ratio_estimated"] = p.traffic_ratio
            src["traffic_ratio_estimated"] = ("the part's DRAM bytes at least (moved bytes by the traffic model, "
                                              "less one cache per op boundary) / its bytes as if fused")
        gemm_part = p.floor_source.startswith("FLOPs") or near_ridge(p)
        if gemm_part and p.tflops is not None and p.ceiling_tflops and not below_floor:
            ev["tensor_pct_of_peak"] = 100.0 * p.tflops / p.ceiling_tflops
            src["tensor_pct_of_peak"] = "part FLOPs / its time vs the measured GEMM ceiling at its dtype"
        if below_floor:
            p.notes.append("its slowdown and rates are not evidence (above the measured ceilings): the walk "
                           "cannot answer B for this part until the ceilings are re-measured")
        if p.flops is not None and p.attributable:
            ev["matmul_flops"] = p.flops
            src["matmul_flops"] = "torch.utils.flop_counter formulas over the part's ops (counted)"
        if gpu and p.n_tc is not None and p.name != "triton/compiled":
            ev["tensor_core_kernels"] = p.n_tc
            src["tensor_core_kernels"] = "tensor-core GEMM kernels per call among the part's kernels (profiler names)"
        elif not gpu and p.flops == 0:
            ev["tensor_core_kernels"] = 0
            src["tensor_core_kernels"] = "CPU: no tensor cores; no matmul op in the part"
        if p.name == "triton/compiled" and prof.n_spills is not None:
            ev["n_spills"] = prof.n_spills
            src["n_spills"] = "Triton compiled-kernel metadata (ptxas)"
        if ncu and ncu_matches(p, ncu):
            for k, v in (ncu.get("evidence") or {}).items():
                if k == "tensor_pipe_pct" and not p.floor_source.startswith("FLOPs"):
                    continue
                ev[k] = v
                src[k] = f"counted by Nsight Compute ({k}, the examination's counted kernels)"
    ev["n_ranks"] = 1  # a part of one process's step: K (rank tail) is not asked of it
    src["n_ranks"] = "a part of one process's step (one function, or one rank's trace)"
    if e2e is not None:
        ev["e2e_slowdown"] = e2e
        src["e2e_slowdown"] = "the whole function: wall-clock per call back to back / device-event median"
        if e2e_spread:
            ev.setdefault("metric_spreads", {})["e2e_slowdown"] = e2e_spread


def is_tc(name: str) -> bool:
    from hwlab.core.profiling import kernel_class
    c, tc = kernel_class(name)
    return bool(tc) and c in ("gemm", "fp8-gemm")
