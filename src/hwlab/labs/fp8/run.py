"""Lab 4's run: every path's memory, logit error and serving stream per context bucket
(:func:`run`); one decode step timed at one shape (:func:`time_prefill_decode`, the exercise's
TPOT check); the decode attention against SDPA (:func:`attention_vs_sdpa`)."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from hwlab.core.measure import require_memory, time_fn
from hwlab.core.measure_graph import graph_time
from hwlab.labs.fp8 import kernels as K
from hwlab.labs.fp8.kernels import DEFAULT_TILE, AttnTile
from hwlab.labs.fp8.model import (
    H200_SIZE, LOGIT_ERROR_BOUND, PATHS, TINY, Decoder, ModelConfig, logit_error, make_models)
from hwlab.labs.fp8.report import SERVING_PATHS, run_stream
from hwlab.labs.fp8.stream import StreamSpec, default_streams
from hwlab.labs.fp8.traffic import memory_needed_bytes


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
    time cost at this size. Per-layer times are the step's median over the layers."""
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
    return out


def run(cfg: ModelConfig | None = None, streams: list[StreamSpec] | None = None, device=None,
        paths=SERVING_PATHS, progress=None, long: bool = False, attn_tile: AttnTile = DEFAULT_TILE) -> dict[str, Any]:
    """Lab 4 on every path in ``paths`` (same weights): weight memory, logit error against bf16,
    the serving stream per context bucket (:func:`.report.run_stream`: per bucket the profiled
    decode step with its FP8 hit rate, fallbacks and dequant/requant per token, and the served
    stream's TTFT/TPOT), and on a GPU the decode attention at the longest bucket against SDPA
    (what a user would run instead). ``long``: the longer streams (:func:`.stream.default_streams`)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cfg = cfg or (H200_SIZE if dev.type == "cuda" else TINY)
    streams = streams or default_streams(dev, long=long)
    say = progress or (lambda s: None)
    need = memory_needed_bytes(cfg, [(s.max_len, s.max_batch) for s in streams], paths)
    require_memory(need, dev, f"Lab 4 with d_model {cfg.d_model}, {cfg.n_layers} layers, "
                   f"streams {[(s.ctx, s.max_batch) for s in streams]}")
    models = make_models(cfg, paths=paths, device=dev, attn_tile=attn_tile)
    say("logit error")
    out: dict[str, Any] = {"config": cfg.__dict__, "device": str(dev), "paths_cfg": {p: PATHS[p] for p in paths},
                           "logit_error": logit_error(models), "logit_error_bound": LOGIT_ERROR_BOUND,
                           "weight_bytes": {p: m.weight_bytes for p, m in models.items()}}
    out["stream"] = run_stream(cfg, streams, paths=paths, device=dev, progress=say, models=models)
    if dev.type == "cuda":
        say("attention vs SDPA")
        longest = max(streams, key=lambda s: s.ctx)
        out["attention_vs_sdpa"] = attention_vs_sdpa(cfg, longest.max_batch, longest.ctx, dev, attn_tile)
    return out
