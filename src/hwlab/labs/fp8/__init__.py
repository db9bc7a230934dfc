"""Lab 4, FP8 dequant fallback: memory falls, TPOT does not.

A small decoder (embedding, a connector projection, attention + MLP layers with a KV cache,
an output head) whose every linear layer picks its precision path:

* ``bf16``        the weight in bf16, ``F.linear``;
* ``fp8_dequant`` the weight stored in FP8 (e4m3, per-tensor scale) and dequantized to bf16
                  before every matmul: memory falls, but each step reads the FP8 weight,
                  writes a bf16 copy and reads it again;
* ``fp8_mm``      the activation quantized per tensor and both operands fed to
                  ``torch._scaled_mm``: the FP8 GEMM path (a *hit*);
* ``fp8_static``  ``torch._scaled_mm`` with a *static* activation scale calibrated once
                  (:meth:`Decoder.calibrate`): the requant is one elementwise pass, fused into
                  the RMSNorm or GELU that feeds the layer where there is one.

Paths (:data:`PATHS`): ``bf16`` baseline; ``fp8_dequant`` everywhere; the seed's ``mixed``
path (main matmuls FP8, connector and head dequantized, KV cache bf16); the ``fixed`` path
(FP8 where it is hit, the head kept in bf16 on purpose, FP8 KV cache for long-context
buckets). Probes: weight and KV memory, prefill (TTFT) and decode (TPOT) time per context
bucket, FP8 hit rate and dequant/requant count per token from ``torch.profiler``, and the
logit error against the bf16 path; then a seeded request stream per context bucket
(continuous batching, mixed prompt and output lengths) served by bf16, mixed and fixed, one
performance report per path (hit rate, fallbacks and dequant/requant per token per bucket,
time by kernel class, TTFT and TPOT p50/p99), and the flowchart's B, D and K measured on it.

Modules, one job each: :mod:`.kernels` (the Triton kernels a path runs: :mod:`.quant` and
:mod:`.attention`, with the decode attention's tile as an :class:`AttnTile`), :mod:`.model`
(the decoder, its precision paths, the KV cache),
:mod:`.traffic` (the byte model), :mod:`.profile` (hit rate, fallbacks, time by kernel
class), :mod:`.run` (the fixed-bucket run and its tables), :mod:`.stream` (the serving
stream), :mod:`.report` (the per-path performance report), :mod:`.walk` (flowchart evidence),
:mod:`.grader` (exercise 04). Every name is re-exported here: ``fp8.<name>``. Tuning variants
measured against the kernels (not imported here, no lab path runs them): :mod:`.research`.

What the H200 measured: ``recorded/h200/lab04_fp8.json``, with its history and analysis in
``benchmarks/LAB04_NOTES.md``.
"""
from __future__ import annotations

from hwlab.labs.fp8 import kernels as K
from hwlab.labs.fp8.kernels import DEFAULT_TILE, AttnTile
from hwlab.labs.fp8.grader import grade_path
from hwlab.labs.fp8.model import (
    DEQUANT_MARK, FP8, FP8_MAX, H200_SIZE, LOGIT_ERROR_BOUND, MAIN, PATHS, QUANT_MARK, TINY, Decoder,
    KVCache, ModelConfig, QLinear, dequantize_fp8, logit_error, make_models, quantize_fp8)
from hwlab.labs.fp8.profile import BREAKDOWN_CATEGORIES, bucket_profile, decode_breakdown, decode_profile
from hwlab.labs.fp8.report import (
    CLASSES, SERVING_PATHS, format_report, performance_report, plot_reports, run_stream, seed_signature)
from hwlab.labs.fp8.run import (
    attention_vs_sdpa, bucket_table, default_buckets, gemms_vs_bf16, path_table, run, time_prefill_decode)
from hwlab.labs.fp8.targets import (
    PCT_OF_COPY_TARGET, byte_floor_targets, floor_shares, format_floor_shares, format_targets)
from hwlab.labs.fp8.stream import Request, StreamSpec, default_streams, make_requests, percentile, serve
from hwlab.labs.fp8.traffic import (
    BYTES_PER_WEIGHT, decode_bytes, decode_bytes_for, memory_needed_bytes, memory_report, step_bytes)
from hwlab.labs.fp8.walk import bucket_evidence, flowchart_evidence, rank_tail_pct

__all__ = [n for n in dir() if not n.startswith("_") and n != "annotations"]
