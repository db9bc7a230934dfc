"""Nsight Compute counters for ``hwlab examine --ncu``, kept apart from the estimates.

The function is run in a child process under ``ncu`` (:mod:`hwlab.core.ncu`, clocks left as
they are): three warm-up calls, then one call inside the NVTX range ``hwlab_examine`` whose
kernels are profiled. Counted figures, time-weighted over the kernels of that call:

* ``dram_pct_of_peak`` — ``dram__throughput`` % of peak;
* ``sector_amplification`` — the global-memory sectors the kernels' accesses touched over the
  sectors they would touch if every warp's accesses were coalesced
  (``memory_l2_theoretical_sectors_global`` / ``..._ideal``, the source counters ncu's own
  uncoalesced-access rule reads). The ideal counts each warp's *distinct* addresses at their
  real access width, so the ratio cannot fall below 1. Sectors per request over a fixed 4
  (the earlier formula) is not a coalescing measure: a warp with one active lane, or lanes
  sharing an address (an index broadcast), makes fewer than 4 sectors per request without
  any waste, and 16-byte loads make 16 per request when perfectly coalesced. A ratio under 1
  means the counters are not what this formula needs: it is marked invalid and not used;
  nothing is clamped. Without the source counters, no counted amplification.
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
#: the source counters of the coalescing ratio, and occupancy figures; tried first, and the
#: run falls back to :data:`METRICS` alone (said) where this ncu does not know them
SECTOR_METRICS = ["memory_l2_theoretical_sectors_global", "memory_l2_theoretical_sectors_global_ideal"]
OCCUPANCY_METRICS = ["sm__maximum_warps_per_active_cycle_pct", "launch__occupancy_limit_registers",
                     "launch__waves_per_multiprocessor"]
#: with more distinct kernels than this in the profile, only the top ones (by time) are counted
MAX_KERNELS = 8
#: one profiled call; a counter run that takes longer than this is abandoned (estimates stand)
NCU_TIMEOUT_S = 180.0


def run_target(spec: str) -> None:
    """Child side: ``spec`` is ``MODULE:FUNC`` or ``MODULE:FUNC@MODULE:INPUTS``."""
    import torch

    from hwlab.examine.target import load

    if spec.startswith("model="):  # a factory returning (module, inputs), as `--model` takes it
        from hwlab.examine import as_inference
        from hwlab.examine.target import load_model

        module, args, make = load_model(spec[len("model="):])
        fn = as_inference(module)
        args = tuple(make()) if make else args
    else:
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
    """Time-weighted counters over the profiled kernels, as flowchart evidence + details.
    ``invalid`` names any counted figure outside its physical range, and why."""
    def w(key: str) -> float | None:
        pairs = [(r.get("gpu__time_duration.sum"), r.get(key)) for r in rows]
        pairs = [(t, v) for t, v in pairs if isinstance(t, float) and isinstance(v, float)]
        tot = sum(t for t, _ in pairs)
        return sum(t * v for t, v in pairs) / tot if tot else None

    sectors = sum(r.get("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum") or 0.0 for r in rows
                  if isinstance(r.get("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"), float))
    reqs = sum(r.get("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum") or 0.0 for r in rows
               if isinstance(r.get("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"), float))
    def total(key: str) -> float | None:
        vals = [r.get(key) for r in rows if isinstance(r.get(key), float)]
        return sum(vals) if vals else None

    theo, ideal = total(SECTOR_METRICS[0]), total(SECTOR_METRICS[1])
    invalid: dict[str, str] = {}
    amp = None
    if theo is not None and ideal:
        amp = theo / ideal
        if amp < 1.0:
            invalid["sector_amplification"] = (
                f"{amp:.3g} < 1: touched sectors below the ideal cannot happen; these counters are not "
                "the coalescing ratio here (not used)")
            amp = None
    ev = {"dram_pct_of_peak": w("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
          "tensor_pipe_pct": w(ncu_mod.TENSOR_METRIC), "sector_amplification": amp}
    regs = [r.get("launch__registers_per_thread") for r in rows]
    return {"source": "counted by Nsight Compute", "n_kernels": len(rows),
            "evidence": {k: v for k, v in ev.items() if v is not None}, "invalid": invalid,
            "sectors_per_request": sectors / reqs if reqs else None,
            "sectors_theoretical": theo, "sectors_ideal": ideal,
            "theoretical_occupancy_pct": w("sm__maximum_warps_per_active_cycle_pct"),
            "registers_per_thread_max": max((x for x in regs if isinstance(x, float)), default=None),
            "warps_active_pct": w("sm__warps_active.avg.pct_of_peak_sustained_active"),
            "kernels": [r.get("kernel", "")[:160] for r in rows]}


def kernel_filter(top_kernels: list[str] | None) -> str | None:
    """An ncu ``-k regex:`` matching the base names of the given profiler kernel names."""
    import re

    bases = []
    for k in top_kernels or []:
        head = k.split("(")[0].split("<")[0].strip().split(" ")[-1].split("::")[-1]
        if head and head not in bases:
            bases.append(re.escape(head))
    return "regex:" + "|".join(bases) if bases else None


def collect(spec: str, notes: list[str], top_kernels: list[str] | None = None) -> dict[str, Any] | None:
    """Run the child under ncu; None (with a note) where ncu is absent or fails. With
    ``top_kernels`` (more distinct kernels than :data:`MAX_KERNELS`), only those are counted."""
    if not ncu_mod.available():
        notes.append("--ncu: no `ncu` on the PATH here; counters not collected (estimates only)")
        return None
    code = f"from hwlab.examine.ncu_counters import run_target; run_target({spec!r})"
    kf = kernel_filter(top_kernels)
    extra = ["-k", kf] if kf else []
    rows, fallback = None, None
    for metrics in (METRICS + SECTOR_METRICS + OCCUPANCY_METRICS, METRICS):
        try:
            rows = ncu_mod.profile(["-c", code], metrics, nvtx_range=NVTX_RANGE, timeout_s=NCU_TIMEOUT_S,
                                   extra=extra)
            break
        except Exception as e:  # a failed counter run leaves the estimates standing, said
            fallback = f"{type(e).__name__}: {' '.join(str(e).split())[-200:]}"
    if rows is None:
        notes.append(f"--ncu failed ({fallback}); estimates only")
        return None
    if fallback:
        notes.append(f"--ncu: the source counters for sector amplification were refused ({fallback[:150]}); "
                     "counted without them (no counted amplification)")
    if kf:
        notes.append(f"--ncu counted the top kernels only ({kf[6:][:160]})")
    if not rows:
        notes.append("--ncu profiled no kernel in the call; estimates only")
        return None
    out = summarise(rows)
    for k, why in out["invalid"].items():
        notes.append(f"--ncu {k} = {why}")
    return out
