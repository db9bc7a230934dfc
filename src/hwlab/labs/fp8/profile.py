"""Lab 4's profiles of one decode step: FP8 hit rate, fallbacks and dequant/requant ranges
(:func:`decode_profile`), and where the step's device time goes by kernel class
(:func:`decode_breakdown`), both from one ``torch.profiler`` run. Kernels are classed by the
core's one table (:mod:`hwlab.core.profiling`); this module adds what only Lab 4 knows: its model's
quant/dequant ranges and which of its layers dequantize weights on purpose."""
from __future__ import annotations

from typing import Any

import torch
from torch.profiler import ProfilerActivity

from hwlab.core.profiling import (STEP_TIME_CLASSES, hit_rate_from_events, profiler_events, quiet_profile,
                                  time_by_class)
from hwlab.labs.fp8.model import DEQUANT_MARK, QUANT_MARK, Decoder, QLinear


def _profile_decode_step(m: Decoder, batch: int, ctx: int, per_row: bool = False, max_len: int | None = None,
                         n_profiles: int = 1, record_shapes: bool = False):
    """torch.profiler over one decode step at position ``ctx`` (after a prefill and one
    unprofiled decode step: the first call of a shape compiles, and any autotuned kernel
    benchmarks itself, which would put thousands of benchmark launches into the profile).
    ``per_row``: the step the serving stream runs (:mod:`.stream`: per-row lengths, the kit's
    attention kernel for every cache) on a cache of ``max_len`` positions. ``n_profiles`` > 1:
    that many profiles of the same step, returned as a list. ``record_shapes``: the profiler keeps
    each op's input shapes (what a profiler table groups by)."""
    gpu = m.device.type == "cuda"
    cache = m.new_cache(batch, max_len or ctx + 1)
    toks = torch.randint(0, m.cfg.vocab, (batch, ctx + 1)).to(m.device)
    with torch.no_grad():
        m(toks[:, :ctx], cache)
        step = cache
        if per_row:
            cache.row_len = torch.full((batch,), ctx, dtype=torch.int32, device=m.device)
            step = cache.rows(batch)
        m(toks[:, ctx:ctx + 1], step)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
        profs = []
        for _ in range(n_profiles):
            cache.len = ctx
            if per_row:
                cache.row_len.fill_(ctx)
            with quiet_profile(activities=acts, record_shapes=record_shapes) as prof:
                m(toks[:, ctx:ctx + 1], step)
                if gpu:
                    torch.cuda.synchronize()
            profs.append(prof)
    return profs if n_profiles > 1 else profs[0]


#: profiles of a bucket's step taken to keep the one with the median kernel time: one profiled step's
#: kernel sum moves by several % between profiles (the profiler's own start-up lands in some), which
#: the flowchart's B reads against a 1.5x threshold
N_BUCKET_PROFILES = 3


def decode_profile(m: Decoder, batch: int = 2, ctx: int = 32) -> dict[str, Any]:
    """FP8 hit rate and dequant/requant count of one decode step, from torch.profiler."""
    return _hits(m, _profile_decode_step(m, batch, ctx), batch)


def _hits(m: Decoder, prof, batch: int) -> dict[str, Any]:
    gpu = m.device.type == "cuda"
    ev = profiler_events(prof)
    r = hit_rate_from_events(ev, gpu)
    # count ranges on the host timeline only: on a GPU the profiler mirrors each range onto the
    # device timeline too (counting both would double these counts; evidence schema v2)
    names = [n for n, dt in ev if "CUDA" not in dt]
    # a fallback GEMM: an FP8 weight dequantized to bf16 in this step (every ``fp8_dequant`` layer, and an
    # FP8 layer with no FP8 kernel at this step's row count); each layer says whether its last call did
    fell_back = [n for n, mod in m.named_modules() if isinstance(mod, QLinear) and mod.fell_back]
    n_weight_dequant = len(fell_back)
    r.update({"quant_ranges": names.count(QUANT_MARK), "dequant_ranges": names.count(DEQUANT_MARK),
              "fallback_gemms": n_weight_dequant, "fallback_modules": fell_back,
              "fallback_rate_pct": 100.0 * n_weight_dequant / r["gemm_calls"] if r["gemm_calls"] else None,
              "high_precision_by_choice": r["gemm_calls"] - r["fp8_hits"] - n_weight_dequant,
              "dequant_requant_per_token": (names.count(QUANT_MARK) + names.count(DEQUANT_MARK)) / batch,
              "ranges_counted_on": "host timeline"})
    return r


def bucket_profile(m: Decoder, batch: int, ctx: int, max_len: int | None = None) -> dict[str, Any]:
    """One context bucket of the serving stream, profiled once: the stream's decode step
    (per-row lengths, ``batch`` rows at ``ctx``, a cache of ``max_len`` positions as the
    stream allocates it) with its FP8 hit rate, fallbacks and dequant/requant ranges per token
    (:func:`decode_profile`'s counts) and its device time by kernel class (``breakdown``, as
    :func:`decode_breakdown`): the kernels of one step run alone on one device, the median of
    :data:`N_BUCKET_PROFILES` profiles by kernel time (``breakdown["total_us_of_profiles"]``: all)."""
    profs = _profile_decode_step(m, batch, ctx, per_row=True, max_len=max_len, n_profiles=N_BUCKET_PROFILES)
    kv_fp8 = _kv_fp8(m, max_len or ctx + 1)
    brs = [_breakdown(m, p, batch, ctx) for p in profs]
    totals = [b["total_us"] for b in brs]
    i = sorted(range(len(brs)), key=totals.__getitem__)[len(brs) // 2]  # the median profile
    return {"ctx": ctx, "batch": batch, "kv_fp8": kv_fp8, **_hits(m, profs[i], batch),
            "breakdown": {**brs[i], "total_us_of_profiles": totals}}


def _kv_fp8(m: Decoder, max_len: int) -> bool:
    f = m.path_cfg["kv_fp8_from_ctx"]
    return f is not None and max_len >= f


#: the step-time classes of :func:`decode_breakdown` (the core's one table, :mod:`hwlab.core.profiling`)
BREAKDOWN_CATEGORIES = STEP_TIME_CLASSES


def decode_breakdown(m: Decoder, batch: int, ctx: int) -> dict[str, Any]:
    """Where one decode step's device time goes, by kernel category, from torch.profiler:
    GEMMs (FP8 or not), attention, quant/dequant, and everything else (norms, KV writes,
    residual adds, activations). On a GPU the sum of kernel times excludes launch gaps, so
    ``graph TPOT - kernel sum`` bounds what launches cost; on a CPU it is aten self time.
    """
    return _breakdown(m, _profile_decode_step(m, batch, ctx), batch, ctx)


def _breakdown(m: Decoder, prof, batch: int, ctx: int) -> dict[str, Any]:
    # on a CPU the (de)quantization is plain aten ops inside the model's marked ranges
    return {"ctx": ctx, "batch": batch,
            **time_by_class(prof, m.device.type == "cuda", quant_ranges=(QUANT_MARK, DEQUANT_MARK))}
