"""Flowchart evidence of an examination, from measured figures only, each with its source.

``slowdown_vs_floor`` and ``dram_pct_estimated`` come from the measurement against this
machine's ceilings (:func:`hwlab.diagnosis.flowchart.evidence_from_measurement`); ``tensor_pct_of_peak``
only for matmul-heavy work (:func:`flop_bound`: the FLOP floor at least the byte floor, i.e.
arithmetic intensity at or over the measured ridge point); ``launch_gap_pct`` and ``n_spills``
from the profile; ``e2e_slowdown`` from the back-to-back run; Nsight Compute's counted figures
beside them, named as counted. The thresholds are the flowchart's.
"""
from __future__ import annotations

import statistics
from typing import Any

from hwlab.examine.torch_profile import ProfileSummary
from hwlab.diagnosis.flowchart import evidence_from_measurement
from hwlab.core.measure import Measurement, spread_of

#: where each flowchart metric comes from in an examination
METRIC_SOURCES = {
    "slowdown_vs_floor": "measured time / max(bytes / copy ceiling, FLOPs / GEMM ceiling)",
    "dram_pct_estimated": "moved bytes (traffic model) / measured time vs the copy ceiling",
    "sector_amplification": "estimated from each op's strides and index values (or counted by ncu)",
    "traffic_ratio_estimated": "DRAM bytes at least (moved bytes by the traffic model, less one last-level "
                               "cache per op boundary) / required bytes (examine.rates)",
    "dram_pct_of_peak": "counted by Nsight Compute",
    "tensor_pct_of_peak": "FLOPs / measured time vs this machine's GEMM ceiling at the dtype",
    "tensor_pipe_pct": "counted by Nsight Compute",
    "launch_gap_pct": "GPU idle share of the call: profiler kernel intervals vs the measured time",
    "n_spills": "Triton compiled-kernel metadata (ptxas)",
    "e2e_slowdown": "wall-clock per call, back to back / device-event median",
    "matmul_flops": "FLOPs of matmul-family ops (torch.utils.flop_counter, or given by the caller)",
    "tensor_core_kernels": "tensor-core GEMM kernels per call (profiler kernel names; none on a CPU)",
}


def flop_bound(m: Measurement) -> bool:
    """Matmul-heavy: the FLOP floor is at least the byte floor (arithmetic intensity at or
    over this machine's measured ridge point)."""
    if not m.n_flops or not m.ceiling_tflops or not m.ceiling_gbps:
        return False
    return m.n_flops / (m.ceiling_tflops * 1e12) >= m.n_bytes / (m.ceiling_gbps * 1e9)


def e2e_spread(wall_chunks_ms: list[float], m: Measurement) -> dict[str, Any] | None:
    """D's spread: the back-to-back chunks' p10-p90 over the single calls' p90-p10 (lowest over
    highest, highest over lowest), so both timings' noise widens it. A busy host preempts some
    chunks and some single calls; with the spread beside it, e2e_slowdown near 1.2x reads
    BORDERLINE instead of a confident "slow in service"."""
    sp = spread_of(wall_chunks_ms, "chunks back to back")
    if sp is None or not m.t_p10_ms or not m.t_p90_ms or m.t_p10_ms <= 0:
        return None
    return {"lo": sp["lo"] / m.t_p90_ms, "hi": sp["hi"] / m.t_p10_ms, "n": sp["n"],
            "what": f"{sp['what']} over the single calls' p10-p90"}


def build_evidence(m: Measurement, *, moved: int, amp: float | None, prof: ProfileSummary,
                   wall_chunks_ms: list[float], flop_bound: bool, ncu: dict[str, Any] | None,
                   on_gpu: bool, traffic_ratio: float | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """Flowchart evidence from measured figures only, with the source of each metric.
    ``traffic_ratio`` is the DRAM lower bound over required bytes where it proves waste (:mod:`hwlab.examine.rates`)."""
    ev = evidence_from_measurement(m, ceiling_gbps=m.ceiling_gbps, ceiling_tflops=m.ceiling_tflops,
                                   bytes_moved=moved)
    if amp is not None:
        ev["sector_amplification"] = amp
    if traffic_ratio is not None:
        ev["traffic_ratio_estimated"] = traffic_ratio
    if flop_bound:
        ev["tensor_pct_of_peak"] = m.pct_of_flops_ceiling
    gap = prof.launch_gap_pct(m.t_ms)
    if gap is not None:
        ev["launch_gap_pct"] = gap
    if prof.n_spills is not None:
        ev["n_spills"] = prof.n_spills
    ev["e2e_slowdown"] = statistics.median(wall_chunks_ms) / m.t_ms if m.t_ms > 0 and wall_chunks_ms else None
    sp = e2e_spread(wall_chunks_ms, m)
    if ev["e2e_slowdown"] is not None and sp:
        ev.setdefault("metric_spreads", {})["e2e_slowdown"] = sp
    seen_all = not prof.compiled_region and not prof.triton and (prof.attributable_pct is None
                                                                 or prof.attributable_pct >= 95.0)
    if not prof.error and seen_all:  # H's applicability: no matmul counted, none on the tensor cores
        ev["matmul_flops"] = int(m.n_flops or 0)
        ev["tensor_core_kernels"] = prof.tensor_core_gemm_kernels if on_gpu else 0
    sources = {k: METRIC_SOURCES[k] for k in ev if k in METRIC_SOURCES}
    for k, v in (ncu or {}).get("evidence", {}).items():
        if k in ("tensor_pipe_pct",) and not flop_bound:
            continue  # the tensor pipe of a kernel with no matmul work says nothing about H
        ev[k] = v
        sources[k] = f"counted by Nsight Compute ({k})"
    ev = {k: v for k, v in ev.items() if v is not None}
    return ev, {k: s for k, s in sources.items() if k in ev}
