"""Lab 4's teaching kernels, in one place: what a lab path runs, and the self-check recorded
beside the lab's GPU evidence.

* :mod:`.quant`: per-tensor and static FP8 quantization, the fallback's dequant, RMSNorm with
  the next GEMM's requant fused in, GELU with it fused in;
* :mod:`.attention`: the KV-cache write and the split-context decode attention that reads a bf16
  or FP8 cache in its stored dtype, launched with an :class:`AttnTile`.

How they were tuned, and the variants that measured slower: ``docs/lab04-tuning.md``.
"""
from __future__ import annotations

import torch

from hwlab.labs.fp8.attention import (
    DEFAULT_TILE, FP8_CACHE_MATH_REL, AttnTile, decode_attention, decode_attention_ref, kv_store,
    kv_store_ref)
from hwlab.labs.fp8.quant import (
    FP8, FP8_MAX, dequant_rows, dequant_rows_ref, quant_static, quant_static_ref, quant_tensor,
    quant_tensor_ref, rmsnorm, rmsnorm_ref, add_rmsnorm, add_rmsnorm_ref, use_triton_for)

__all__ = ["AttnTile", "DEFAULT_TILE", "FP8", "FP8_CACHE_MATH_REL", "FP8_MAX", "decode_attention", "decode_attention_ref", "dequant_rows",
           "dequant_rows_ref", "kv_store", "kv_store_ref", "quant_static", "quant_static_ref", "quant_tensor",
           "quant_tensor_ref", "rel_err", "rmsnorm", "rmsnorm_ref", "add_rmsnorm", "add_rmsnorm_ref", "self_check",
           "use_triton_for"]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b||, in float32."""
    return float(torch.linalg.vector_norm(a.float() - b.float()) / torch.linalg.vector_norm(b.float()))


def self_check(device=None, act_dtype: torch.dtype | None = None, seed: int = 0,
               tile: AttnTile = DEFAULT_TILE) -> dict[str, float]:
    """Each teaching kernel against its torch reference on fresh random data: relative errors.

    A GPU checks bf16 activations; the CPU interpreter fp16 (bf16 is wrong there). The FP8
    kernels differ from torch's rounding by at most one FP8 step in a few elements (the
    interpreter truncates), so quantization is judged by its round-trip error (< 1/8, one e4m3
    step, where it rounds to nearest: < 1/16) and an exact scale. Attention is checked at
    lengths 1, a chunk boundary either side, and the whole cache, with ``tile``.
    """
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    act = act_dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float16)
    g = torch.Generator(device=dev).manual_seed(seed)
    x = (torch.randn(37, 1500, generator=g, device=dev) * 3).to(act)
    qt, st = quant_tensor(x, use_triton=True)
    qtr, str_ = quant_tensor_ref(x)
    wq, ws = quant_tensor_ref(torch.randn(96, 1500, generator=g, device=dev))
    s_x = x.float().abs().amax() / FP8_MAX  # x's own amax as a static scale: nothing saturates
    gelu = torch.nn.functional.gelu(x.float())
    out = {"quant_tensor_roundtrip": rel_err(qt.float() * st, x), "quant_tensor_scale": rel_err(st, str_),
           "quant_static_gelu_roundtrip": rel_err(quant_static(x, s_x, use_triton=True, gelu=True).float() * s_x, gelu),
           "dequant_rows": rel_err(dequant_rows(wq, ws, act, use_triton=True), dequant_rows_ref(wq, ws, torch.float32)),
           "rmsnorm": rel_err(rmsnorm(x, use_triton=True), rmsnorm_ref(x.float()))}
    s_n = torch.tensor(0.01, device=dev)
    out["rmsnorm_fp8_roundtrip"] = rel_err(rmsnorm(x, use_triton=True, out_scale=s_n).float() * s_n, rmsnorm_ref(x.float()))
    r = (torch.randn(x.shape, generator=g, device=dev) * 3).to(act)  # a GEMM output to add into x
    (tot, y), (tot_ref, y_ref) = add_rmsnorm(x, r, use_triton=True), add_rmsnorm_ref(x, r)
    out["add_rmsnorm_sum"], out["add_rmsnorm"] = rel_err(tot, tot_ref), rel_err(y, rmsnorm_ref(tot_ref.float()))
    B, H, T, D = 2, 3, 2 * tile.chunk + 188, 64
    qq = torch.randn(B, H, 1, D, generator=g, device=dev).to(act)
    kc = torch.randn(B, H, T, D, generator=g, device=dev)
    vc = torch.randn(B, H, T, D, generator=g, device=dev)
    for name, dt, sc in (("decode_attention_16bit", act, 1.0), ("decode_attention_fp8", FP8, 0.01)):
        kk, vv = (kc / sc).to(dt), (vc / sc).to(dt)
        scale = torch.tensor(sc, device=dev)
        out[name] = max(rel_err(decode_attention(qq, kk, vv, scale, n, use_triton=True, tile=tile),
                                decode_attention_ref(qq, kk, vv, scale, n))
                        for n in (1, tile.chunk - 1, tile.chunk + 1, T))
        # one decode position written through the kernel, read back against the reference write
        kn = (torch.randn(B, H, 1, D, generator=g, device=dev) * 3).to(act)
        vn = (torch.randn(B, H, 1, D, generator=g, device=dev) * 3).to(act)
        k2, v2, k3, v3 = (t.clone() for t in (kk, vv, kk, vv))
        kv_store(kn, vn, k2, v2, scale, 5, use_triton=True)
        kv_store_ref(kn, vn, k3, v3, scale, 5)
        out[name.replace("decode_attention", "kv_store")] = max(
            rel_err(a[:, :, 5], b[:, :, 5]) for a, b in ((k2, k3), (v2, v3)))
    return out
