"""Lab 4's byte model: the bytes a decode step must move on each path (the floor a step is
compared with), the memory each path holds, and what :func:`.run.run` needs before it allocates."""
from __future__ import annotations

from typing import Any

from hwlab.labs.fp8.model import PATHS, Decoder, ModelConfig, layer_mode, rows_multiples


def memory_report(models: dict[str, Decoder], batch: int, ctx: int) -> dict[str, dict[str, int]]:
    return {p: {"weight_bytes": m.weight_bytes, "kv_bytes": m.new_cache(batch, ctx).n_bytes}
            for p, m in models.items()}



#: bytes per weight element a decode step moves, by QLinear mode (a dequantized FP8 weight:
#: 1 B read + 2 B bf16 copy written + 2 B read again by the bf16 GEMM)
BYTES_PER_WEIGHT = {"bf16": 2, "fp8_dequant": 5, "fp8_mm": 1, "fp8_static": 1}


def decode_bytes_for(cfg: ModelConfig, path: dict[str, Any], batch: int, ctx: int, promised: bool = False) -> int:
    """The fewest bytes one decode step must move on ``path``: each weight once at its mode's
    bytes (:data:`BYTES_PER_WEIGHT`), ``batch`` embedding rows, and K and V up to ``ctx + 1``
    in their stored dtype. ``promised=True``: what the FP8 weights promise, i.e. every weight
    stored in FP8 read once as FP8 (a fallback's dequant traffic left out)."""
    f = path["kv_fp8_from_ctx"]
    return step_bytes(cfg, path, batch, batch * (ctx + 1), f is not None and ctx + 1 >= f, promised)


def decode_bytes(m: Decoder, batch: int, ctx: int) -> int:
    """:func:`decode_bytes_for` of this model's path."""
    return decode_bytes_for(m.cfg, m.path_cfg, batch, ctx)


def step_bytes(cfg: ModelConfig, path: dict[str, Any], n_rows: int, kv_positions: int, kv_fp8: bool,
               promised: bool = False) -> int:
    """:func:`decode_bytes_for` for a continuous-batching step: ``n_rows`` live requests whose
    attention reads ``kv_positions`` cache positions in all (summed over rows, this step's
    included), from a cache stored in FP8 or not (the stream's cache, not the row's length,
    decides). With every row at ``ctx + 1`` positions it equals :func:`decode_bytes_for`.
    A layer with no FP8 kernel at ``n_rows`` (``out_rows_multiple``, ``fp8_rows_multiple``) counts
    as a dequantized weight."""
    p = {**PATHS["bf16"], **path}
    d = cfg.d_model
    per_layer = {"qkv": 3 * d * d, "out": d * d, "up": d * cfg.d_ff, "down": d * cfg.d_ff}
    n = n_rows * d * 2

    def weight(mode: str, elems: int) -> int:
        return elems * (1 if promised and mode == "fp8_dequant" else BYTES_PER_WEIGHT[mode])

    n += weight(p["connector"], d * d) + weight(p["head"], cfg.vocab * d)
    mult = rows_multiples(p)
    for i in range(cfg.n_layers):
        mode = layer_mode(p, cfg, i)
        for name, elems in per_layer.items():
            fb = mode in ("fp8_mm", "fp8_static") and name in mult and n_rows % mult[name] != 0
            n += weight("fp8_dequant" if fb else mode, elems)
    return n + 2 * cfg.n_layers * cfg.n_heads * kv_positions * cfg.d_head * (1 if kv_fp8 else 2)


def memory_needed_bytes(cfg: ModelConfig, buckets, paths=tuple(PATHS)) -> int:
    """A conservative estimate of what :func:`run` holds at its peak: every path's weights at
    once, the fp32 copy a weight is drawn in, and the largest bucket's bf16 KV cache plus its
    prefill activations and one layer's dequantized-first KV (fp32 and bf16 copies)."""
    d = cfg.d_model
    linear = cfg.n_layers * (3 * d * d + d * d + 2 * d * cfg.d_ff) + d * d
    weights = 0
    for p in paths:
        pc = PATHS[p]
        n_main = linear - d * d
        weights += 2 * cfg.vocab * d  # embedding, bf16 on every path
        weights += sum(n * (2 if pc[g] == "bf16" or g == "main" else 1)  # a trunk's bf16 edge layers: counted at 2 B
                       for g, n in (("main", n_main), ("connector", d * d), ("head", cfg.vocab * d)))
    draw = 4 * max(cfg.vocab * d, d * cfg.d_ff)
    per_bucket = []
    for ctx, batch in buckets:
        kv_layer = 2 * batch * cfg.n_heads * (ctx + 1) * cfg.d_head * 2  # K and V of one layer, bf16
        prefill = batch * ctx * (3 * d + 3 * cfg.d_ff) * 2
        per_bucket.append(cfg.n_layers * kv_layer + prefill + 3 * kv_layer)
    return weights + draw + max(per_bucket, default=0)
