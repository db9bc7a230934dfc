"""Nsight Compute counters for ``hwlab examine --ncu``, kept apart from the estimates.

The function is run in a child process under ``ncu`` (:mod:`hwlab.core.ncu`, clocks left as
they are): three warm-up calls, then one call inside the NVTX range ``hwlab_examine`` whose
kernels are profiled. Counted figures, time-weighted over the kernels of that call:

* ``dram_pct_of_peak`` — ``dram__throughput`` % of peak;
* ``sector_amplification`` — global-load sectors per request over 4 (the ideal for 32 lanes
  of 4-byte items, as Lab 1 counts it);
* ``tensor_pipe_pct`` — tensor pipe active %; registers per thread and warps-active
  occupancy are shown beside them (the flowchart has no criterion for them).
Without ``ncu`` on the PATH, nothing is collected and the examination says so.
"""
from __future__ import annotations

from typing import Any

from hwlab.core import ncu as ncu_mod

NVTX_RANGE = "hwlab_examine"
METRICS = ncu_mod.MEMORY_METRICS + ["launch__registers_per_thread",
                                    "sm__warps_active.avg.pct_of_peak_sustained_active"]
IDEAL_SECTORS_PER_REQUEST = 4.0
#: one profiled call; a counter run that takes longer than this is abandoned (estimates stand)
NCU_TIMEOUT_S = 180.0


def run_target(spec: str) -> None:
    """Child side: ``spec`` is ``MODULE:FUNC`` or ``MODULE:FUNC@MODULE:INPUTS``."""
    import torch

    from hwlab.examine.target import load

    target, _, inputs = spec.partition("@")
    fn, mod = load(target)
    make = load(inputs, "input factory")[0] if inputs else getattr(mod, "inputs", None)
    args = tuple(make()) if make else ()
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    with torch.cuda.nvtx.range(NVTX_RANGE):
        fn(*args)
        torch.cuda.synchronize()


def summarise(rows: list[dict]) -> dict[str, Any]:
    """Time-weighted counters over the profiled kernels, as flowchart evidence + details."""
    def w(key: str) -> float | None:
        pairs = [(r.get("gpu__time_duration.sum"), r.get(key)) for r in rows]
        pairs = [(t, v) for t, v in pairs if isinstance(t, float) and isinstance(v, float)]
        tot = sum(t for t, _ in pairs)
        return sum(t * v for t, v in pairs) / tot if tot else None

    sectors = sum(r.get("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum") or 0.0 for r in rows
                  if isinstance(r.get("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"), float))
    reqs = sum(r.get("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum") or 0.0 for r in rows
               if isinstance(r.get("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"), float))
    ev = {"dram_pct_of_peak": w("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
          "tensor_pipe_pct": w(ncu_mod.TENSOR_METRIC),
          "sector_amplification": sectors / reqs / IDEAL_SECTORS_PER_REQUEST if reqs else None}
    regs = [r.get("launch__registers_per_thread") for r in rows]
    return {"source": "counted by Nsight Compute", "n_kernels": len(rows),
            "evidence": {k: v for k, v in ev.items() if v is not None},
            "registers_per_thread_max": max((x for x in regs if isinstance(x, float)), default=None),
            "warps_active_pct": w("sm__warps_active.avg.pct_of_peak_sustained_active"),
            "kernels": [r.get("kernel", "")[:160] for r in rows]}


def collect(spec: str, notes: list[str]) -> dict[str, Any] | None:
    """Run the child under ncu; None (with a note) where ncu is absent or fails."""
    if not ncu_mod.available():
        notes.append("--ncu: no `ncu` on the PATH here; counters not collected (estimates only)")
        return None
    code = f"from hwlab.examine.ncu_counters import run_target; run_target({spec!r})"
    try:
        rows = ncu_mod.profile(["-c", code], METRICS, nvtx_range=NVTX_RANGE, timeout_s=NCU_TIMEOUT_S)
    except Exception as e:  # a failed counter run leaves the estimates standing, said
        notes.append(f"--ncu failed ({type(e).__name__}: {' '.join(str(e).split())[:200]}); estimates only")
        return None
    if not rows:
        notes.append("--ncu profiled no kernel in the call; estimates only")
        return None
    return summarise(rows)
