"""Lab 4's performance report: per path, per context bucket of the serving stream, what the
seed's fix asks to count into it (按 kernel hit rate 分桶统计; dequant/requant 次数计入性能报告).

:func:`run_stream` profiles each bucket's decode step (:func:`.profile.bucket_profile`: FP8
hit rate, fallbacks, dequant/requant ranges per token, device time by kernel class) and
serves each bucket's stream (:func:`.stream.serve`: TTFT, TPOT and ITL p50/p99). The report
(:func:`performance_report`, one per path) carries weight memory, those per-bucket figures
and the change of TPOT p50 and p99 against bf16; :func:`format_report` prints it,
:func:`plot_reports` draws it. :func:`service_tpot` pools every bucket's steps into the service's
TPOT; :func:`seed_signature` reads the seed's symptom from it (memory down, TPOT barely better,
P99 no better) for the ``mixed`` path against bf16.
"""
from __future__ import annotations

from typing import Any

import torch

from hwlab.core.gains import faster_from_change, less_more
from hwlab.labs.fp8.model import H200_SIZE, TINY, Decoder, ModelConfig
from hwlab.labs.fp8.profile import bucket_profile
from hwlab.labs.fp8.stream import StreamSpec, default_streams, percentile, serve

#: the paths a serving stream compares: the baseline, the seed's path, its GEMM fixes, all its fixes
SERVING_PATHS = ("bf16", "mixed", "gemms_fixed", "fixed")
#: kernel classes shown in the report, with the seed's reading of each
CLASSES = {"attention": "KV reads", "quant/dequant": "format conversion", "gemm": "bf16 GEMMs (fallbacks, head)",
           "gemm fp8": "FP8 GEMMs", "other": "norms, KV writes, adds"}


def run_stream(cfg: ModelConfig | None = None, streams: list[StreamSpec] | None = None, paths=SERVING_PATHS,
               device=None, models: dict[str, Decoder] | None = None, progress=None) -> dict[str, Any]:
    """Every path in ``paths``, every stream: the bucket's profile and the served stream.
    ``models`` reuses decoders already built (same weights, :func:`.model.make_models`)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cfg = cfg or (H200_SIZE if dev.type == "cuda" else TINY)
    streams = streams or default_streams(dev)
    say = progress or (lambda s: None)
    out: dict[str, Any] = {"config": cfg.__dict__, "device": str(dev), "paths": {}}
    for p in paths:
        m = (models or {}).get(p) or Decoder(cfg, p, device=dev)
        rows = []
        for spec in streams:
            say(f"stream {p} ctx {spec.ctx} x{spec.max_batch}: profile")
            prof = bucket_profile(m, spec.max_batch, spec.ctx, spec.max_len)
            say(f"stream {p} ctx {spec.ctx} x{spec.max_batch}: serve {spec.n_requests} requests")
            rows.append({"profile": prof, "stream": serve(m, spec, progress=say)})
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        out["paths"][p] = {"weight_bytes": m.weight_bytes, "buckets": rows}
    return out


def performance_report(stream_result: dict[str, Any], path: str) -> dict[str, Any]:
    """One path's report: weight memory (and its change against bf16 when bf16 ran), and per
    bucket the FP8 hit rate, fallback GEMMs, dequant/requant ranges per token, the decode
    step's device time by kernel class, TTFT, TPOT and ITL p50/p99, and TPOT p50/p99 change
    against bf16's same bucket."""
    paths = stream_result["paths"]
    v = paths[path]
    base = paths.get("bf16")
    rows = []
    for i, b in enumerate(v["buckets"]):
        pr, st, br = b["profile"], b["stream"], b["profile"]["breakdown"]
        row = {"ctx": pr["ctx"], "batch": pr["batch"], "kv_fp8": pr["kv_fp8"],
               "fp8_hit_pct": pr["hit_rate_pct"], "gemm_calls": pr["gemm_calls"],
               "fallback_gemms": pr["fallback_gemms"], "high_precision_by_choice": pr["high_precision_by_choice"],
               "quant_ranges": pr["quant_ranges"], "dequant_ranges": pr["dequant_ranges"],
               "dq_rq_per_token": pr["dequant_requant_per_token"],
               # apart: a weight dequant moves a whole weight, a requant one step's activation rows
               "dq_per_token": pr["dequant_ranges"] / pr["batch"], "rq_per_token": pr["quant_ranges"] / pr["batch"],
               "kernel_us": br["total_us"], "kernel_us_by_class": dict(br["us"]),
               "kernel_share_pct": dict(br["share_pct"]), "kernel_source": br["source"],
               "n_requests": len(st["requests"]), "n_tokens": st["n_tokens"], "n_steps": st["n_steps"],
               **{k: st[k] for k in ("ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99",
                                     "itl_ms_p50", "itl_ms_p99")}, "timer": st["timer"],
               # a GPU stream recorded before prefills got their GPU lead (stream.py) timed host
               # enqueue time into TTFT and ITL; TPOT (graph replays) never depended on it
               "ttft_device_only": st["timer"] != "cuda events" or st.get("host_lead_ms") is not None}
        if base is not None:
            bs = base["buckets"][i]["stream"]
            for q in ("p50", "p99"):
                row[f"tpot_{q}_change_pct"] = 100.0 * (st[f"tpot_ms_{q}"] / bs[f"tpot_ms_{q}"] - 1)
        rows.append(row)
    rep = {"path": path, "weight_bytes": v["weight_bytes"], "buckets": rows}
    if base is not None:
        rep["weight_change_pct"] = 100.0 * (v["weight_bytes"] / base["weight_bytes"] - 1)
    return rep


def service_tpot(stream_result: dict[str, Any], path: str) -> dict[str, float]:
    """The whole service's TPOT on ``path``: every decode step of every bucket's stream, each
    counted once per token it produced (token-weighted), nearest-rank p50 and p99, and the mean;
    ``tokens``: how many; ``long_share_pct``: the share of step time spent in the longest bucket."""
    steps = [(s["t_ms"], s["n"], b["profile"]["ctx"]) for b in stream_result["paths"][path]["buckets"]
             for s in b["stream"]["steps"]]
    t, w = [x[0] for x in steps], [x[1] for x in steps]
    longest = max(x[2] for x in steps)
    return {"tpot_ms_p50": percentile(t, 50, w), "tpot_ms_p99": percentile(t, 99, w),
            "tpot_ms_mean": sum(a * b for a, b in zip(t, w)) / sum(w), "tokens": sum(w),
            "long_share_pct": 100.0 * sum(x[0] for x in steps if x[2] == longest) / sum(t)}


#: percentage points a TPOT gain moves between runs of the same stream (a p99 over a few hundred
#: steps moves by a point or two where the p50 does not): a comparison closer than this is borderline
SIGNATURE_TOL_PCT = 2.0


def seed_signature(run_result: dict[str, Any], path: str = "mixed") -> dict[str, Any]:
    """The seed's symptom, measured on ``path`` against bf16 over the whole service: weight memory
    change (%), TPOT p50 and p99 gain (%, positive = faster) and their millisecond difference.
    The seed's case reads: memory about -35%, the p50 gain a few % (``p50_gain_small``: between
    0 and 6%), the p99 gaining less than the p50 or losing (``p99_gains_less``). ``borderline``:
    the comparisons that lie within :data:`SIGNATURE_TOL_PCT` of their threshold."""
    st = run_result.get("stream", run_result)
    w = run_result["weight_bytes"]
    a, b = service_tpot(st, path), service_tpot(st, "bf16")
    g50 = 100.0 * (1 - a["tpot_ms_p50"] / b["tpot_ms_p50"])
    g99 = 100.0 * (1 - a["tpot_ms_p99"] / b["tpot_ms_p99"])
    return {"path": path, "memory_change_pct": 100.0 * (w[path] / w["bf16"] - 1),
            "gain_p50_pct": g50, "gain_p99_pct": g99,
            "delta_p50_ms": a["tpot_ms_p50"] - b["tpot_ms_p50"], "delta_p99_ms": a["tpot_ms_p99"] - b["tpot_ms_p99"],
            "tpot_ms": {"bf16": b, path: a},
            "p50_gain_small": 0.0 <= g50 <= 6.0, "p99_gains_less": g99 < g50, "tol_pct": SIGNATURE_TOL_PCT,
            "borderline": [k for k, near in (("p50 gain at 0", abs(g50) < SIGNATURE_TOL_PCT),
                                             ("p50 gain at 6", abs(g50 - 6.0) < SIGNATURE_TOL_PCT),
                                             ("p99 against p50", abs(g99 - g50) < SIGNATURE_TOL_PCT)) if near]}


def format_report(rep: dict[str, Any], label: str = "") -> str:
    """The report as text: one header line and one line per bucket, plus the kernel-class split."""
    w = rep["weight_bytes"]
    head = f"{rep['path']}: weights {w / 1e9:.3f} GB" + (
        f" ({less_more(rep['weight_change_pct'], 0)} than bf16)" if "weight_change_pct" in rep else "") + (
        f"  [{label}]" if label else "")
    lines = [head, f"{'bucket':>14} {'KV':>4} {'FP8 hit':>7} {'fallb':>5} {'dq/tok':>6} {'rq/tok':>6} {'TTFT p50/p99 ms':>17} "
                   f"{'TPOT p50/p99 ms':>17} {'TPOT vs bf16 p50 / p99':>24} {'ITL p99':>8}"]
    for r in rep["buckets"]:
        chg = (f"{faster_from_change(r['tpot_p50_change_pct'], 0)} / {faster_from_change(r['tpot_p99_change_pct'], 0)}"
               if "tpot_p50_change_pct" in r else "")
        lines.append(f"{'ctx ' + str(r['ctx']) + ' x' + str(r['batch']):>14} {'fp8' if r['kv_fp8'] else 'bf16':>4} "
                     f"{r['fp8_hit_pct']:6.0f}% {r['fallback_gemms']:5d} {r['dq_per_token']:6.2f} {r['rq_per_token']:6.2f} "
                     f"{r['ttft_ms_p50']:8.2f}/{r['ttft_ms_p99']:<8.2f} {r['tpot_ms_p50']:8.3f}/{r['tpot_ms_p99']:<8.3f} "
                     f"{chg:>24} {r['itl_ms_p99']:8.2f}")
    if not all(r["ttft_device_only"] for r in rep["buckets"]):
        lines.append(f"{'':>14} note: this record's TTFT and ITL include host enqueue time (recorded before "
                     "prefills ran behind a GPU lead); TPOT does not")
    for r in rep["buckets"]:
        lines.append(f"{'':>14} step kernels {r['kernel_us']:.0f} us: " + ", ".join(
            f"{k} ({CLASSES.get(k, k)}) {r['kernel_share_pct'][k]:.0f}%" for k in CLASSES if k in r["kernel_share_pct"]))
    return "\n".join(lines)


def plot_reports(reports: list[dict[str, Any]], title: str = ""):
    """TPOT p50 (bar) and p99 (marker) per bucket and path, and each bucket's decode-step
    kernel time split by class, side by side. Returns the matplotlib figure."""
    import matplotlib.pyplot as plt  # deferred on purpose: only a notebook draws; the library and its tests do not need it

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.8))
    buckets = [f"ctx {r['ctx']} x{r['batch']}" for r in reports[0]["buckets"]]
    width = 0.8 / len(reports)
    for i, rep in enumerate(reports):
        xs = [j + i * width for j in range(len(buckets))]
        bars = a1.bar(xs, [r["tpot_ms_p50"] for r in rep["buckets"]], width, label=f"{rep['path']} p50")
        a1.plot(xs, [r["tpot_ms_p99"] for r in rep["buckets"]], "v", color=bars.patches[0].get_facecolor(),
                markeredgecolor="k", label=f"{rep['path']} p99")
    a1.set_xticks([j + 0.4 - width / 2 for j in range(len(buckets))], buckets)
    a1.set_ylabel("TPOT (ms per token, device-timed steps)")
    a1.legend(fontsize=7, ncol=len(reports), loc="upper center", bbox_to_anchor=(0.5, -0.12))
    labels, bottoms = [], []
    for rep in reports:
        for r in rep["buckets"]:
            labels.append(f"{rep['path']}\n{r['ctx']}")
            bottoms.append(0.0)
    for k in CLASSES:
        vals = [r["kernel_us_by_class"].get(k, 0.0) / 1e3 for rep in reports for r in rep["buckets"]]
        a2.bar(range(len(labels)), vals, bottom=bottoms, label=f"{k} ({CLASSES[k]})")
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    a2.set_xticks(range(len(labels)), labels, fontsize=7)
    a2.set_ylabel("one decode step's kernel time (ms)")
    a2.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig
