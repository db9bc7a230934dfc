"""Exercise 04's checker for a learner's FP8 path."""
from __future__ import annotations

import torch

from hwlab.labs.fp8.model import LOGIT_ERROR_BOUND, TINY, Decoder, ModelConfig, logit_error
from hwlab.labs.fp8.profile import decode_profile


def grade_path(path: dict | None, cfg: ModelConfig = TINY, min_hit_pct: float = 80.0):
    """Exercise 04's checker: no GEMM may fall back to a dequantized weight, FP8 must be hit
    on at least ``min_hit_pct`` % of GEMMs, and the logits stay within the FP8 bound."""
    from hwlab.core.grading import ExerciseResult, not_done

    name = "FP8 path"
    if path is None:
        return not_done(name, "Set MY_PATH to a dict with main/connector/head/kv_fp8_from_ctx.")
    try:
        m = Decoder(cfg, path, device="cpu" if not torch.cuda.is_available() else None)
    except ValueError as e:
        return ExerciseResult(name, "wrong", str(e))
    prof = decode_profile(m)
    models = {"bf16": Decoder(cfg, "bf16", device=m.device), "yours": m}
    err = logit_error(models)["yours"]
    if prof["fallback_gemms"]:
        return ExerciseResult(name, "wrong", f"{prof['fallback_gemms']} GEMM(s) still dequantize an FP8 "
                              f"weight every step ({prof['dequant_ranges']} dequant ranges in the profile).")
    if (prof["hit_rate_pct"] or 0) < min_hit_pct:
        return ExerciseResult(name, "wrong", f"FP8 hit rate {prof['hit_rate_pct']:.0f}% < {min_hit_pct:.0f}%: "
                              "the main matmuls should run on the FP8 path.")
    if err > LOGIT_ERROR_BOUND["fixed"]:
        return ExerciseResult(name, "wrong", f"logit error {err:.3f} exceeds the bound "
                              f"{LOGIT_ERROR_BOUND['fixed']}; keep the sensitive head in bf16.")
    return ExerciseResult(name, "passed", f"hit rate {prof['hit_rate_pct']:.0f}%, no fallback GEMMs, "
                          f"{prof['high_precision_by_choice']} kept high-precision on purpose, logit error "
                          f"{err:.3f} (bound {LOGIT_ERROR_BOUND['fixed']}).")
