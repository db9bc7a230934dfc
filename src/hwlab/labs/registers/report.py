"""Lab 2's flowchart evidence: every question answered from this run's measurements.

* B (``slowdown_vs_floor``): a GEMM config's time against cuBLAS bf16 measured in the same run;
  the launch-bound step's eager time against its CUDA-graph replay.
* ``tensor_pct_of_peak``: the config's TFLOP/s as % of cuBLAS bf16's in the same run.
* ``dram_pct_estimated``: the required bytes over the time, as % of the copy ceiling measured
  on this machine (an estimate from a byte model, not a counter).
* ``n_spills``: the compiled kernel's spill slots (4 bytes each), from its compile report.
* ``launch_gap_pct``: the GPU's idle share of the eager step, ``1 - t_graph / t_eager``.
* D (``e2e_slowdown``) and K (``rank_tail_pct``, ``n_ranks`` = 1): the kernel or step run as
  one process serves it (:func:`hwlab.labs.scenarios.one_gpu_service`); without that run the
  walk stops at D as undecided, never answered by hand.
"""
from __future__ import annotations

from typing import Any

from hwlab.labs import scenarios
from hwlab.labs.registers.launch import LaunchResult
from hwlab.labs.registers.gemm_sweep import ConfigResult


def _service_evidence(svc: dict | None) -> dict[str, Any]:
    """D and K of a walk from a one-process service step; nothing when none was measured."""
    if not svc:
        return {}
    return {"e2e_slowdown": svc["e2e_slowdown"], "rank_tail_pct": svc["rank_tail_pct"],
            "n_ranks": svc["n_ranks"]}


def config_evidence(r: ConfigResult, copy_gbps: float | None = None) -> dict[str, Any]:
    """Flowchart evidence of one measured GEMM config (``copy_gbps``: this machine's measured
    copy ceiling, GB/s, for the DRAM estimate)."""
    m = r.measurement
    ev: dict[str, Any] = {"n_spills": r.report.n_spills}
    src = {"n_spills": f"the compiled kernel's spill count ({r.report.source or 'compile report'})"}
    if m is not None and m.ceiling_tflops:
        ev["slowdown_vs_floor"] = m.ceiling_tflops / m.tflops
        ev["tensor_pct_of_peak"] = 100.0 * m.tflops / m.ceiling_tflops
        src["slowdown_vs_floor"] = f"{m.name} alone vs cuBLAS bf16 measured in this run"
        src["tensor_pct_of_peak"] = f"{m.name} TFLOP/s over cuBLAS bf16's in this run"
        if copy_gbps:
            ev["dram_pct_estimated"] = 100.0 * m.gbps / copy_gbps
            src["dram_pct_estimated"] = f"{m.name} required bytes over time, vs the measured copy ceiling"
    if r.service:
        ev.update(_service_evidence(r.service))
        src.update(scenarios.SERVICE_SOURCE)
    ev["metric_sources"] = src
    return ev


def launch_evidence(lr: LaunchResult, copy_gbps: float | None = None) -> dict[str, Any]:
    """Flowchart evidence of the launch-bound step: the graph replay is its floor (B and the
    launch gap need a GPU); D and K from the eager step's service run, on any device."""
    ev: dict[str, Any] = _service_evidence(lr.service)
    src = dict(scenarios.SERVICE_SOURCE) if lr.service else {}
    if lr.graph is not None:
        ev["slowdown_vs_floor"] = lr.eager.t_ms / lr.graph.t_ms
        ev["launch_gap_pct"] = lr.gpu_idle_pct_eager
        src["slowdown_vs_floor"] = "eager step over the same kernels replayed from a CUDA graph, this run"
        src["launch_gap_pct"] = "1 - t_graph / t_eager, both measured in this run"
        if copy_gbps:
            ev["dram_pct_estimated"] = 100.0 * lr.eager.gbps / copy_gbps
            src["dram_pct_estimated"] = "eager step's bytes over time, vs the measured copy ceiling"
    if ev:
        ev["metric_sources"] = src
    return ev
