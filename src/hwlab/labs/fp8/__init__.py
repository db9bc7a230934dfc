"""Lab 4, FP8 dequant fallback: memory falls, TPOT barely moves.

A small decoder (embedding, a connector projection, attention + MLP layers with a KV cache,
an output head) whose every linear layer picks its precision path:

* ``bf16``        the weight in bf16, ``F.linear``;
* ``fp8_dequant`` the weight stored in FP8 (e4m3, per-tensor scale) and dequantized to bf16
                  before every matmul: memory falls, but each step reads the FP8 weight,
                  writes a bf16 copy and reads it again;
* ``fp8_mm``      the activation quantized per tensor and both operands fed to
                  ``torch._scaled_mm``: the FP8 GEMM path (a *hit*);
* ``fp8_static``  the FP8 GEMM with a *static* activation scale calibrated once
                  (:meth:`Decoder.calibrate`): the requant is one elementwise pass, fused into
                  the RMSNorm or GELU that feeds the layer where there is one.

Paths (:data:`PATHS`): ``bf16`` baseline; the seed's ``mixed`` deployment (trunk on FP8 GEMMs
except its first and last layers, kept bf16 by the recipe, and the ``out`` projection at batches
its FP8 kernel has no shape for; connector and head dequantized every step; KV cache bf16);
``gemms_fixed`` (the seed's fixes 1-2: head kept in bf16 on purpose, connector and every trunk
shape on FP8); ``fixed`` (and fix 3: an FP8 KV cache for the long-context bucket). Probes:
weight memory, logit error against bf16, and per context bucket a seeded request stream served
with continuous batching, one decode step profiled (FP8 hit rate, fallbacks, dequant/requant per
token, time by kernel class), TTFT and TPOT p50/p99, pooled into the service's TPOT; the
flowchart's B, D and K measured on it.

Modules, one job each: :mod:`.kernels` (the Triton kernels a path runs: :mod:`.quant`,
:mod:`.attention` and :mod:`.decode_gemm`), :mod:`.model` (the decoder, its precision paths,
the KV cache), :mod:`.traffic` (the byte model), :mod:`.profile` (hit rate, fallbacks, time by
kernel class), :mod:`.stream` (the serving stream), :mod:`.report` (the per-path performance
report and the seed's signature), :mod:`.run` (the lab's run), :mod:`.walk` (flowchart
evidence), :mod:`.grader` (exercise 04). Every name is re-exported here: ``fp8.<name>``.

What the H200 measured: ``recorded/h200/lab04_fp8.json``; how the kernels were tuned:
``docs/lab04-tuning.md``.
"""
from __future__ import annotations

from hwlab.labs.fp8 import kernels as K
from hwlab.labs.fp8.kernels import DEFAULT_TILE, AttnTile
from hwlab.labs.fp8.grader import grade_path
from hwlab.labs.fp8.model import (
    DEQUANT_MARK, FP8, FP8_MAX, H200_SIZE, KV_FP8_FROM_CTX, LOGIT_ERROR_BOUND, MAIN, PATH_DEFAULTS, PATHS,
    QUANT_MARK, TINY, Decoder, KVCache, ModelConfig, QLinear, dequantize_fp8, layer_mode, logit_error,
    make_models, quantize_fp8)
from hwlab.labs.fp8.profile import BREAKDOWN_CATEGORIES, bucket_profile, decode_breakdown, decode_profile
from hwlab.labs.fp8.report import (
    CLASSES, SERVING_PATHS, format_report, performance_report, plot_reports, run_stream, seed_signature,
    service_tpot)
from hwlab.labs.fp8.run import attention_vs_sdpa, run, time_prefill_decode
from hwlab.labs.fp8.stream import Request, StreamSpec, default_streams, make_requests, percentile, serve
from hwlab.labs.fp8.traffic import (
    BYTES_PER_WEIGHT, decode_bytes, decode_bytes_for, memory_needed_bytes, memory_report, step_bytes)
from hwlab.labs.fp8.walk import bucket_evidence, flowchart_evidence, rank_tail_pct

__all__ = [n for n in dir() if not n.startswith("_") and n != "annotations"]
