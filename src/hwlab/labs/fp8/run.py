"""Lab 4's fixed-bucket run: every path's memory, TTFT and TPOT per context bucket (one
decode step replayed from a CUDA graph), profiles, logit error; the tables the notebook prints."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from hwlab.core.measure import require_memory, time_fn
from hwlab.core.measure_graph import graph_time
from hwlab.labs.fp8 import decode_gemm
from hwlab.labs.fp8 import floor
from hwlab.labs.fp8 import kernels as K
from hwlab.labs.fp8.quant import pdl_enabled, set_pdl
from hwlab.labs.fp8.kernels import DEFAULT_TILE, AttnTile
from hwlab.labs.fp8.model import (
    H200_SIZE, LOGIT_ERROR_BOUND, MAIN, TINY, Decoder, ModelConfig, logit_error, make_models)
from hwlab.labs.fp8.profile import decode_breakdown, decode_profile
from hwlab.labs.fp8.report import SERVING_PATHS, run_stream
from hwlab.labs.fp8.stream import StreamSpec, default_streams
from hwlab.labs.fp8.traffic import decode_bytes, memory_needed_bytes


# ---------------------------------------------------------------- timing: TTFT and TPOT per bucket
def time_prefill_decode(m: Decoder, batch: int, ctx: int, n_rep: int = 10, graph: bool | None = None,
                        kv_fused: bool = True) -> dict[str, Any]:
    """Median TTFT (prefill of ``ctx`` tokens) and TPOT (one decode step at position ``ctx``).

    On a GPU the decode step is captured in a CUDA graph and replayed, so launch overhead
    (Lab 2) does not hide the bytes each path moves; on a CPU it runs eagerly. Prefills of
    64k tokens or more are timed 3 times (each is compute-bound and long: fewer repetitions keep the
    run within its device budget; the spread is recorded beside the median).
    ``kv_fused=False`` reads an FP8 cache by dequantizing it first (no FP8 attention kernel).
    """
    dev = m.device
    graph = dev.type == "cuda" if graph is None else graph
    g = torch.Generator().manual_seed(2)
    toks = torch.randint(0, m.cfg.vocab, (batch, ctx + 1), generator=g).to(dev)
    cache = m.new_cache(batch, ctx + 1, fused_read=kv_fused)

    def prefill():
        cache.len = 0
        return m(toks[:, :ctx], cache)

    with torch.no_grad():
        reps_pf = n_rep if batch * ctx < 65536 else min(n_rep, 3)
        t_pf = time_fn(prefill, [()], dev, n_warmup=1, n_rep=reps_pf, min_run_s=0.0, warmup_s=0.0)
        prefill()
        step_tok = toks[:, ctx:ctx + 1]

        def decode():
            cache.len = ctx
            return m(step_tok, cache)

        if graph:
            t_dec, cap = graph_time(decode, dev, n_capture_warmup=2, n_rep=max(n_rep, 20))
            graph = cap.graphed  # False where there are no CUDA graphs (eager, said so)
        else:
            t_dec = time_fn(decode, [()], dev, n_warmup=2, n_rep=n_rep)
    return {"ttft_ms": t_pf.median_ms, "ttft_p90_ms": t_pf.p90_ms, "tpot_ms": t_dec.median_ms,
            "tpot_p10_ms": t_dec.p10_ms, "tpot_p90_ms": t_dec.p90_ms, "timer": t_dec.timer,
            "graph": graph, "kv_fp8": cache.fp8, "kv_fused": kv_fused}



def attention_vs_sdpa(cfg: ModelConfig, batch: int, ctx: int, device=None,
                      tile: AttnTile = DEFAULT_TILE) -> dict[str, Any]:
    """One decode step's attention over every layer's cache (``cfg.n_layers`` of them), timed as
    the decode step runs it: one CUDA graph replay per step, over caches that together far
    exceed L2. Three ways, same shapes, same run: the kit's kernel on an FP8 cache (what the
    fixed path runs), torch's SDPA on the bf16 cache (what a user would pick, and what the
    bf16 path runs at fixed buckets from ``model.KIT_BF16_BELOW_CTX`` on), and the kit's kernel
    on the bf16 cache (what the serving stream runs for bf16, and both paths below that
    length). Each is checked against the float32 reference on its own cache's values first. GB/s count the K+V bytes each one reads as stored (an FP8
    cache is half a bf16 one). ``launch_share_pct``: of the same calls run eagerly (kernel by
    kernel from Python), the share the graph removes, 1 - graph / eager: what launches and host
    time cost at this size. Per-layer times are the step's median over the layers.
    ``fp8_read_floor`` / ``bf16_read_floor``: the same K and V bytes read by kernels that only read
    them (:func:`.floor.fastest_read`), the fastest: what a target on these bytes is measured against."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    n = cfg.n_layers
    shape = (batch, cfg.n_heads, ctx, cfg.d_head)
    g = torch.Generator(device=dev).manual_seed(5)
    kb = [torch.randn(shape, generator=g, device=dev, dtype=torch.bfloat16) for _ in range(n)]
    vb = [torch.randn(shape, generator=g, device=dev, dtype=torch.bfloat16) for _ in range(n)]
    q = torch.randn(batch, cfg.n_heads, 1, cfg.d_head, generator=g, device=dev, dtype=torch.bfloat16)
    one = torch.ones((), device=dev)
    s8 = torch.tensor(4.0 / K.FP8_MAX, device=dev)  # randn stays within +-4 sigma: nothing saturates
    kf = [K.quant_static_ref(t, s8) for t in kb]
    vf = [K.quant_static_ref(t, s8) for t in vb]
    ways = {"kit_fp8": lambda i: K.decode_attention(q, kf[i], vf[i], s8, ctx, tile=tile),
            "sdpa": lambda i: F.scaled_dot_product_attention(q, kb[i], vb[i]),
            "kit_bf16": lambda i: K.decode_attention(q, kb[i], vb[i], one, ctx, tile=tile)}
    refs = {"kit_fp8": K.decode_attention_ref(q, kf[0], vf[0], s8, ctx).float(),
            "sdpa": K.decode_attention_ref(q, kb[0], vb[0], one, ctx).float()}
    refs["kit_bf16"] = refs["sdpa"]
    bytes_per_layer = {"kit_fp8": 2 * kf[0].numel(), "sdpa": 4 * kb[0].numel(), "kit_bf16": 4 * kb[0].numel()}
    out: dict[str, Any] = {"ctx": ctx, "batch": batch, "n_layers": n, "kv_bytes": bytes_per_layer["sdpa"],
                           "kv_bytes_fp8": bytes_per_layer["kit_fp8"]}
    errs = {}
    with torch.no_grad():
        for name, call in ways.items():
            def check(res, name=name):
                errs[name] = K.rel_err(res[0], refs[name])
            t, cap = graph_time(lambda call=call: [call(i) for i in range(n)], dev, check=check, n_rep=20)
            us = t.median_ms * 1e3 / n
            out[f"{name}_us"] = us
            out[f"{name}_us_p10_p90"] = [t.quantile_ms(0.1) * 1e3 / n, t.quantile_ms(0.9) * 1e3 / n]
            out[f"{name}_gbps"] = bytes_per_layer[name] / us / 1e3
            out[f"{name}_graphed"] = cap.graphed
            del cap
        eager = time_fn(lambda: [ways["kit_fp8"](i) for i in range(n)], [()], dev, n_rep=20)
    out["timing"] = (f"CUDA graph over {n} layers' caches" if out["kit_fp8_graphed"]
                     else f"eager over {n} layers' caches (no CUDA graphs here)")
    out["rel_err_vs_float32"] = errs
    out["kit_fp8_eager_us"] = eager.median_ms * 1e3 / n
    out["launch_share_pct"] = 100.0 * (1 - out["kit_fp8_us"] / out["kit_fp8_eager_us"])
    out["kit_fp8_over_sdpa_gbps"] = out["kit_fp8_gbps"] / out["sdpa_gbps"]
    with torch.no_grad():  # the same bytes read by kernels that only read them (floor.py)
        for name, ks, vs in (("fp8", kf, vf), ("bf16", kb, vb)):
            out.update(_read_floor(name, lambda ks=ks, vs=vs: floor.kv_read_plans(ks, vs),
                                   bytes_per_layer["kit_fp8" if name == "fp8" else "sdpa"], n, dev))
    return out


def _read_floor(name: str, plans, nbytes: int, n_layers: int, dev) -> dict[str, Any]:
    """``{name}_read_floor`` (:func:`.floor.fastest_read` over ``plans()``), nothing where no read
    shape fits, or ``{name}_read_floor_error`` where a read fails to build or reads wrong bytes:
    the floor is context for the targets, and a failure there must not lose the measurements the
    run already holds."""
    try:
        best = floor.fastest_read(plans(), nbytes, n_layers, dev)
    except Exception as e:  # noqa: BLE001 - recorded beside the run, not raised
        return {f"{name}_read_floor_error": f"{type(e).__name__}: {e}"[:300]}
    return {} if best is None else {f"{name}_read_floor": best}


def gemms_vs_bf16(bf16: Decoder, fp8: Decoder, rows_list, device=None) -> list[dict[str, Any]]:
    """Each main decode GEMM (qkv, out, up, down) over every layer's weight, timed as a decode
    step runs it (one CUDA graph per way, the layers' weights together far larger than L2): the
    bf16 path's layer against ``fp8``'s FP8 layer on its static-scaled FP8 input (the fixed
    path), at each batch size in ``rows_list``. Bytes/s count the weight bytes each reads as
    stored (FP8 half of bf16's). Where the FP8 layer runs swap-AB at these rows (``swap_ab``), the
    plain operand order is timed too; where it runs the kit's decode GEMM (``kit_gemm``,
    :mod:`.decode_gemm`), cuBLAS's FP8 GEMM is timed too (``fp8_cublas``, in the operand order the
    layer would give it): each choice, measured in the same run. Each output is first checked
    against the float32 product of the very operands it read. ``*_us_p10_p90``: each way's spread
    over its replays.

    Every way is timed with PDL off (:func:`.quant.set_pdl`), one GEMM after another finished, as
    cuBLAS's run: in a decode step a GEMM sits between a norm or the attention and the next
    kernel, never behind another GEMM, and 8 of the kit's GEMMs launched back to back with PDL
    overlap each other's programs in a way no step has (round 7 measured them slower so). Where
    the lab has PDL on, that back-to-back time is recorded beside it (``fp8_pdl_back_to_back``).
    ``fp8_read_floor`` / ``bf16_read_floor``: each weight read by kernels that only read it
    (:func:`.floor.fastest_read`, once per weight, the same in each row of that weight)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    g = torch.Generator(device=dev).manual_seed(6)
    out = []
    pdl_on = pdl_enabled()
    for name in MAIN:
        l16 = [layer[name] for layer in bf16.layers]
        l8 = [layer[name] for layer in fp8.layers]
        n = len(l8)
        floors: dict[str, Any] = {}
        with torch.no_grad():  # each weight's bytes read by a kernel that only reads them (floor.py), once per weight
            for key, ls in (("fp8", l8), ("bf16", l16)):
                floors.update(_read_floor(key, lambda ls=ls: floor.matrix_read_plans([m.w for m in ls]),
                                          ls[0].weight_bytes, n, dev))
        for rows in rows_list:
            x = torch.randn(rows, l16[0].in_features, generator=g, device=dev).to(torch.bfloat16)
            xq = [K.quant_static_ref(x, m.x_scale) for m in l8]
            refs = {"bf16": x.float() @ l16[0].w.float().t(),
                    "fp8": (xq[0].float() * l8[0].x_scale) @ (l8[0].w.float() * l8[0].w_scale).t()}
            ways = {"bf16": lambda: [l16[i](x) for i in range(n)], "fp8": lambda: [l8[i](xq[i]) for i in range(n)]}
            swapped, kit_on = l8[0].swap_ab, decode_gemm.USE_KIT_GEMM
            kit = l8[0].runs_kit_gemm(xq[0])
            row: dict[str, Any] = {"layer": name, "rows": rows, "n_layers": n, "kit_gemm": kit,
                                   "swap_ab": l8[0].runs_swap_ab(rows) and not kit,
                                   "weight_bytes": {"bf16": l16[0].weight_bytes, "fp8": l8[0].weight_bytes},
                                   "rel_err_vs_float32": {}}
            # (key, way, swap-AB setting or None, the kit's GEMM on or None, PDL)
            plans = ([("bf16", "bf16", None, None, False), ("fp8", "fp8", None, None, False)]
                     + ([("fp8_plain_order", "fp8", False, None, False)] if row["swap_ab"] else [])
                     + ([("fp8_cublas", "fp8", None, False, False)] if kit else [])
                     + ([("fp8_pdl_back_to_back", "fp8", None, None, True)] if kit and pdl_on else []))
            with torch.no_grad():
                for key, way, swap, use_kit, pdl in plans:
                    set_pdl(pdl)
                    if swap is not None:
                        for m in l8:
                            m.swap_ab = swap
                    if use_kit is not None:
                        decode_gemm.USE_KIT_GEMM = use_kit
                    try:
                        def check(res, key=key, way=way):
                            row["rel_err_vs_float32"][key] = K.rel_err(res[0], refs[way])
                        t, cap = graph_time(ways[way], dev, check=check, n_rep=20)
                    finally:
                        set_pdl(pdl_on)
                        decode_gemm.USE_KIT_GEMM = kit_on
                        for m in l8:
                            m.swap_ab = swapped
                    row[f"{key}_us"] = t.median_ms * 1e3 / n
                    row[f"{key}_us_p10_p90"] = [t.quantile_ms(0.1) * 1e3 / n, t.quantile_ms(0.9) * 1e3 / n]
                    row[f"{key}_gbps"] = row["weight_bytes"][way] / row[f"{key}_us"] / 1e3
                    row["graphed"] = cap.graphed
                    del cap
            row["fp8_over_bf16_gbps"] = row["fp8_gbps"] / row["bf16_gbps"]
            row.update(floors)
            out.append(row)
    return out


def default_buckets(device) -> list[tuple[int, int]]:
    """(context, batch): short context (weights dominate), 4k, and a long 32k bucket."""
    if torch.device(device).type == "cuda":
        return [(512, 16), (4096, 16), (32768, 4)]
    return [(32, 2), (128, 2)]


def run(cfg: ModelConfig | None = None, buckets=None, device=None, n_rep: int = 10,
        progress=None, streams: list[StreamSpec] | None = None, stream: bool = True,
        attn_tile: AttnTile = DEFAULT_TILE) -> dict[str, Any]:
    """Every path: memory, TTFT/TPOT per bucket (with the bytes a step must move and the
    GB/s it achieved), hit rate and dequant counts, logit error; on FP8-KV buckets the fixed
    path is also timed with the cache dequantized before attention (no fused kernel). Then
    (``stream=True``) the serving stream per bucket on bf16, mixed and fixed
    (:func:`.report.run_stream`, under ``"stream"``). ``attn_tile``: every decoder's decode
    attention tile (:class:`.attention.AttnTile`)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cfg = cfg or (H200_SIZE if dev.type == "cuda" else TINY)
    buckets = buckets or default_buckets(dev)
    streams = (streams or default_streams(dev)) if stream else []
    say = progress or (lambda s: None)
    # a stream's cache holds its longest prompt plus its longest output (estimated like a bucket)
    need = memory_needed_bytes(cfg, list(buckets) + [(s.max_len, s.max_batch) for s in streams])
    require_memory(need, dev, f"Lab 4 with d_model {cfg.d_model}, {cfg.n_layers} layers, buckets {list(buckets)}"
                   + (f", streams {[(s.ctx, s.max_batch) for s in streams]}" if streams else ""))
    models = make_models(cfg, device=dev, attn_tile=attn_tile)
    say("logit error")
    out: dict[str, Any] = {"config": cfg.__dict__, "buckets": buckets, "device": str(dev),
                           "logit_error": logit_error(models), "logit_error_bound": LOGIT_ERROR_BOUND,
                           "paths": {}}
    for p, m in models.items():
        rows = []
        for ctx, batch in buckets:
            say(f"{p} ctx {ctx} batch {batch}")
            mem = m.new_cache(batch, ctx + 1).n_bytes
            t = time_prefill_decode(m, batch, ctx, n_rep)
            nb = decode_bytes(m, batch, ctx)
            row = {"ctx": ctx, "batch": batch, "kv_bytes": mem, **t, "decode_bytes": nb,
                   "decode_gbps": nb / t["tpot_ms"] / 1e6}
            if t["kv_fp8"]:
                u = time_prefill_decode(m, batch, ctx, n_rep, kv_fused=False)
                row["tpot_kv_dequant_ms"] = u["tpot_ms"]
            rows.append(row)
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        out["paths"][p] = {"weight_bytes": m.weight_bytes, "buckets": rows, "profile": decode_profile(m),
                           "breakdown": [decode_breakdown(m, b, c) for c, b in buckets[:2]]}
    if dev.type == "cuda":
        say("attention vs SDPA")
        out["attention_vs_sdpa"] = [attention_vs_sdpa(cfg, b, c, dev, attn_tile) for c, b in buckets]
        say("FP8 GEMMs vs bf16")
        out["gemms_vs_bf16"] = gemms_vs_bf16(models["bf16"], models["fixed"], sorted({b for _, b in buckets}), dev)
    if streams:
        out["stream"] = run_stream(cfg, streams, device=dev, progress=say,
                                   models={p: models[p] for p in SERVING_PATHS if p in models})
    base = out["paths"]["bf16"]
    for p, r in out["paths"].items():
        r["weight_mem_change_pct"] = 100.0 * (r["weight_bytes"] / base["weight_bytes"] - 1)
        for row, b in zip(r["buckets"], base["buckets"]):
            row["tpot_change_pct"] = 100.0 * (row["tpot_ms"] / b["tpot_ms"] - 1)
            row["ttft_change_pct"] = 100.0 * (row["ttft_ms"] / b["ttft_ms"] - 1)
    return out


def bucket_table(run_result: dict[str, Any], copy_gbps: float | None = None) -> list[dict[str, Any]]:
    """One row per (path, bucket): TTFT, TPOT and their change against bf16, the bytes a decode
    step must move, the GB/s it reached and, given this machine's copy ceiling, the byte floor
    (bytes / ceiling) and % of the ceiling."""
    rows = []
    for p, v in run_result["paths"].items():
        for b in v["buckets"]:
            row = {"path": p, "ctx": b["ctx"], "batch": b["batch"], "ttft_ms": b["ttft_ms"],
                   "ttft_change_pct": b.get("ttft_change_pct"), "tpot_ms": b["tpot_ms"],
                   "tpot_change_pct": b.get("tpot_change_pct"), "kv_fp8": b.get("kv_fp8"),
                   "decode_bytes": b.get("decode_bytes"), "decode_gbps": b.get("decode_gbps"),
                   "tpot_kv_dequant_ms": b.get("tpot_kv_dequant_ms")}
            if copy_gbps and b.get("decode_bytes"):
                row["floor_ms"] = b["decode_bytes"] / copy_gbps / 1e6
                row["pct_of_copy"] = 100.0 * b["decode_gbps"] / copy_gbps
            rows.append(row)
    return rows


def path_table(run_result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per path: weight memory and its change, FP8 hit rate, fallback GEMMs, GEMMs
    kept high-precision on purpose, dequant+requant ranges per token, logit error and bound."""
    out = []
    for p, v in run_result["paths"].items():
        pr = v["profile"]
        per_tok = pr["dequant_requant_per_token"]  # counted once (evidence.migrate_v1_to_v2 for old records)
        out.append({"path": p, "weight_gb": v["weight_bytes"] / 1e9, "weight_change_pct": v["weight_mem_change_pct"],
                    "gemm_calls": pr["gemm_calls"], "fp8_hit_pct": pr["hit_rate_pct"],
                    "fallback_gemms": pr["fallback_gemms"], "high_precision_by_choice": pr["high_precision_by_choice"],
                    "dq_rq_per_token": per_tok, "logit_error": run_result["logit_error"][p],
                    "logit_bound": LOGIT_ERROR_BOUND.get(p)})
    return out
