"""Lab 4's flowchart evidence: the chart's B, D and K answered from metrics the run measured.

Per path and context bucket of the serving stream (:mod:`.stream`, keys ``"path ctx C xB"``):

* **B** ``slowdown_vs_floor``: the device time of one decode step's kernels run alone on one
  device (``torch.profiler`` kernel times summed, launch gaps excluded: :func:`.profile.bucket_profile`
  at the bucket's full batch and context) over the bytes those kernels must move on this path
  (:func:`.traffic.step_bytes`, a fallback's dequant traffic included) at this machine's
  measured copy bandwidth. It asks whether the kernels are slow *for what they do*; the
  flowchart's threshold is 1.5x. ``dram_pct_estimated`` (the same bytes over the same kernel
  time, % of the copy bandwidth) answers F where B says yes.
* **D** ``e2e_slowdown``: the stream's measured TPOT p50 over what the single-device figures
  predict for it: each stream step's *promised* bytes (every FP8 weight read once as FP8, the
  KV cache in its stored dtype: what the path's FP8 weights promise) at the rate the step's
  kernels reached in B, token-weighted p50 over the same steps. Fallback dequant copies,
  format conversions and per-step costs the kernel sum does not hold (launches, graph
  replays) are what lifts it; the flowchart's threshold is 1.2x.
* **K** ``rank_tail_pct`` with ``n_ranks``: the slowest rank's median step over the median
  rank's, from the per-step times of each serving process; one process serves here, so
  it is computed over one rank (0.0, measured, not typed in).

``metric_sources`` says for each metric what measured it; the profile's FP8 hit and fallback
rates ride along (the evidence the leaf names). No by-hand answer is set.

``metric_spreads`` (the flowchart's borderline check): B's spread is the range of the kernel
sums measured for the same path and bucket (the stream's profile and, in a full run, the
fixed-bucket run's), "not recorded" with one; D's is the p10-p90 of the steps' own TPOT over
their prediction. ``alt_floors_us`` (the flowchart's fewer-bytes lens): the same step's floor,
by the byte model at the same copy rate, on the lower-byte paths the kit models (an FP8 KV
cache, FP8 weights, both), each only where it moves fewer bytes than this path.
"""
from __future__ import annotations

import statistics
from typing import Any

from hwlab.labs.fp8.model import PATHS, ModelConfig
from hwlab.labs.fp8.stream import percentile
from hwlab.labs.fp8.traffic import step_bytes
from hwlab.core.measure import spread_of


def rank_tail_pct(step_ms_by_rank: dict[int, list[float]]) -> float:
    """Slowest rank's median step over the median of the ranks' medians, in % (the
    flowchart's K metric), from measured per-step times of each rank."""
    meds = [statistics.median(v) for v in step_ms_by_rank.values() if v]
    if not meds:
        raise ValueError("rank_tail_pct needs at least one rank with measured steps")
    return 100.0 * (max(meds) / statistics.median(meds) - 1.0)


#: the lower-byte alternatives the byte model can price: name -> (path changes, FP8 KV cache)
ALTERNATIVES = {
    "an FP8 KV cache": ({}, True),
    "FP8 weights (static scales)": ({"main": "fp8_static", "connector": "fp8_static"}, None),
    "FP8 weights and an FP8 KV cache": ({"main": "fp8_static", "connector": "fp8_static"}, True),
}


def alt_floors_us(cfg: ModelConfig, path: dict[str, Any], n_rows: int, kv_positions: int, kv_fp8: bool,
                  copy_gbps: float) -> dict[str, float]:
    """The floor (µs: byte model / copy rate) of one step on each lower-byte alternative
    (:data:`ALTERNATIVES`) that moves fewer bytes than ``path`` does."""
    own = step_bytes(cfg, path, n_rows, kv_positions, kv_fp8)
    out = {}
    for name, (change, kv) in ALTERNATIVES.items():
        n = step_bytes(cfg, {**path, **change}, n_rows, kv_positions, kv_fp8 if kv is None else kv)
        if n < own:
            out[name] = n / copy_gbps / 1e3
    return out


def bucket_evidence(cfg: ModelConfig, path: dict[str, Any], bucket: dict[str, Any], copy_gbps: float,
                    kernel_us_repeats: tuple[float, ...] = ()) -> dict[str, Any]:
    """B, D and K for one path's bucket of a stream run (see the module docstring);
    ``kernel_us_repeats``: other kernel sums measured for the same path and bucket (B's spread)."""
    prof, st = bucket["profile"], bucket["stream"]
    kv_fp8 = prof["kv_fp8"]
    b, ctx = prof["batch"], prof["ctx"]
    kernel_us = prof["breakdown"]["total_us"]
    actual = step_bytes(cfg, path, b, b * (ctx + 1), kv_fp8)
    floor_us = actual / copy_gbps / 1e3
    slowdown = kernel_us / floor_us
    steps = st["steps"]
    predicted = [step_bytes(cfg, path, s["n"], s["kv_positions"], kv_fp8, promised=True) / copy_gbps / 1e6 * slowdown
                 for s in steps]
    weights = [s["n"] for s in steps]
    pred_p50 = percentile(predicted, 50, weights)
    tail = rank_tail_pct({0: [s["t_ms"] for s in steps]})
    totals = prof["breakdown"].get("total_us_of_profiles") or [kernel_us]
    spreads = {k: v for k, v in {
        "slowdown_vs_floor": spread_of([t / floor_us for t in totals] + [k / floor_us for k in kernel_us_repeats],
                                       "profiled kernel sums of this bucket"),
        "e2e_slowdown": spread_of([s["t_ms"] / p for s, p in zip(steps, predicted)], "stream steps")}.items() if v}
    return {
        "slowdown_vs_floor": slowdown, "dram_pct_estimated": 100.0 / slowdown,
        # the spread of the profiles' kernel sums carried into B and D (D's prediction scales with B)
        "slowdown_vs_floor_range": [min(totals) / floor_us, max(totals) / floor_us],
        "e2e_slowdown_range": [st["tpot_ms_p50"] / pred_p50 * kernel_us / max(totals),
                               st["tpot_ms_p50"] / pred_p50 * kernel_us / min(totals)],
        "e2e_slowdown": st["tpot_ms_p50"] / pred_p50,
        "rank_tail_pct": tail, "n_ranks": 1,
        "fp8_fallback_rate_pct": prof["fallback_rate_pct"], "fp8_hit_rate_pct": prof["hit_rate_pct"],
        "kernel_us": kernel_us, "floor_us": floor_us, "predicted_tpot_ms_p50": pred_p50,
        "tpot_ms_p50": st["tpot_ms_p50"],
        "metric_spreads": spreads,
        "alt_floors_us": alt_floors_us(cfg, path, b, b * (ctx + 1), kv_fp8, copy_gbps),
        "metric_sources": {
            "slowdown_vs_floor": f"{prof['breakdown']['source']} of one decode step ({b} rows at ctx {ctx}, "
                                 f"the stream's kernels) over its bytes by the byte model / copy GB/s",
            "e2e_slowdown": f"stream TPOT p50 over {st['n_steps']} device-timed steps over the promised bytes "
                            "of the same steps at the kernel rate measured for slowdown_vs_floor",
            "dram_pct_estimated": "the same step's bytes by the byte model over its kernel time, % of copy GB/s",
            "rank_tail_pct": "median step time of each serving process (1 process, measured steps)"},
    }


def flowchart_evidence(run_result: dict[str, Any], copy_gbps: float) -> dict[str, dict[str, Any]]:
    """Flowchart evidence per (path, bucket) of a Lab 4 run's serving stream (``run_result
    ["stream"]`` from :func:`.report.run_stream`, or a stream result itself), keyed ``"path
    ctx C xB"`` (B: the stream's batch limit). Every answer is a measured metric (module
    docstring); ``copy_gbps``: this machine's copy bandwidth measured in the same run."""
    stream = run_result.get("stream", run_result)
    if "paths" not in stream or not all("stream" in b for v in stream["paths"].values() for b in v["buckets"]):
        raise ValueError("this Lab 4 result has no serving stream (recorded before the stream existed): "
                         "re-run lab.run() or refresh_gpu_evidence.py --only lab04")
    cfg = ModelConfig(**stream["config"])
    out = {}
    for p, v in stream["paths"].items():
        fixed_run = (run_result.get("paths") or {}).get(p, {}).get("breakdown") or [] if "stream" in run_result else []
        for b in v["buckets"]:
            ctx, batch = b["profile"]["ctx"], b["profile"]["batch"]
            reps = tuple(x["total_us"] for x in fixed_run if x.get("ctx") == ctx and x.get("batch") == batch)
            out[f"{p} ctx {ctx} x{batch}"] = bucket_evidence(cfg, PATHS[p], b, copy_gbps, reps)
    return out
