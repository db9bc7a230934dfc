"""The roofline: attainable rate = min(peak FLOP/s, bandwidth x arithmetic intensity).

Arithmetic intensity (AI) is FLOPs per byte of required DRAM traffic. Below the ridge
point ``peak / bandwidth`` a kernel cannot be compute-bound: more FLOP/s needs fewer bytes
(fusion, smaller dtypes, better layout), not a faster math path. Both roofs here are the
*measured* ceilings of one machine (:class:`hwlab.core.ceilings.Ceilings`).
"""
from __future__ import annotations

from typing import Any, Iterable

from hwlab.core.ceilings import Ceilings
from hwlab.core.measure import Measurement


def attainable_tflops(ai: float, copy_gbps: float, peak_tflops: float) -> float:
    return min(peak_tflops, copy_gbps * 1e9 * ai / 1e12)


def bound_by(ai: float, c: Ceilings, dtype: str = "bf16") -> str:
    """'memory' below the measured ridge point, else 'compute'."""
    ridge = c.ridge_point(dtype)
    if ridge is None:
        return "memory"
    return "memory" if ai < ridge else "compute"


def evidence_from_measurement(m: Measurement, *, ceiling_gbps: float, ceiling_tflops: float | None = None,
                              bytes_moved: int | None = None, **extra: Any) -> dict[str, Any]:
    """Flowchart evidence from one measurement and this machine's measured ceilings (no verdict:
    :mod:`hwlab.diagnosis.flowchart` walks it). ``slowdown_vs_floor`` = time over the roofline floor (the
    required bytes at ``ceiling_gbps`` GB/s, or the FLOPs at ``ceiling_tflops`` TFLOP/s when that
    is longer); ``dram_pct_estimated`` = ``bytes_moved`` (default: the required bytes) over the
    time, in % of ``ceiling_gbps``. ``extra`` metrics that are not None are added as given."""
    floor_ms = m.n_bytes / (ceiling_gbps * 1e9) * 1e3
    if m.n_flops and ceiling_tflops:
        floor_ms = max(floor_ms, m.n_flops / (ceiling_tflops * 1e12) * 1e3)
    moved = bytes_moved if bytes_moved is not None else m.n_bytes
    ev = {"slowdown_vs_floor": m.t_ms / floor_ms if floor_ms > 0 else None,
          "dram_pct_estimated": 100.0 * moved / (m.t_ms * 1e-3) / 1e9 / ceiling_gbps}
    sp = slowdown_spread(m, ev["slowdown_vs_floor"])
    if sp:
        ev["metric_spreads"] = {"slowdown_vs_floor": sp}
    ev.update({k: v for k, v in extra.items() if v is not None})
    if m.gpu_share and m.gpu_share.get("shared"):  # another process on the GPU: the walk says so
        ev["gpu_shared"] = m.gpu_share
    return ev


def slowdown_spread(m: Measurement, slowdown: float | None) -> dict[str, Any] | None:
    """The spread of ``slowdown_vs_floor`` from the measurement's own p10-p90 (the floor is fixed,
    so the time's spread scales straight onto it), for the flowchart's borderline check."""
    if not slowdown or not m.t_ms or m.t_p10_ms is None or m.t_p90_ms is None:
        return None
    return {"lo": slowdown * m.t_p10_ms / m.t_ms, "hi": slowdown * m.t_p90_ms / m.t_ms,
            "what": f"p10-p90 of {m.n_rep} timed calls", "n": m.n_rep}


def plot(c: Ceilings, points: Iterable[Measurement] = (), dtypes=("bf16", "fp32"),
         ax=None, title: str | None = None, label: str | None = None):
    """Log-log roofline of ``c`` with measured points; returns the matplotlib Axes."""
    import matplotlib.pyplot as plt  # deferred on purpose: only plots need it, and it costs ~0.5 s
    import numpy as np  # deferred too: the flowchart imports this module and reads no arrays

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    ai = np.logspace(-2, 4, 200)
    for dt in dtypes:
        peak = c.gemm(dt)
        if peak is None:
            continue
        ax.plot(ai, [attainable_tflops(x, c.copy_gbps, peak) for x in ai],
                label=f"roof: {c.copy_gbps:,.0f} GB/s, {dt} {peak:,.1f} TFLOP/s")
        ridge = c.ridge_point(dt)
        ax.axvline(ridge, ls=":", lw=0.8, color="grey")
        ax.annotate(f"ridge {dt}\n{ridge:.0f} FLOP/B", (ridge, peak), fontsize=7,
                    xytext=(4, -24), textcoords="offset points")
    for m in points:
        if m.n_flops and m.n_bytes:
            ax.scatter([m.arithmetic_intensity], [m.tflops], zorder=3)
            ax.annotate(m.name, (m.arithmetic_intensity, m.tflops), fontsize=7,
                        xytext=(4, 4), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte of DRAM traffic)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title or f"Roofline: {c.device} ({label or c.label})", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", lw=0.3)
    return ax
