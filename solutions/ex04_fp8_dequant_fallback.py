# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Solution 04 · Another deployment, another fallback
#
# **Needs:** nothing special: the decoder below is profiled live on this machine (CPU is fine: the
# profile counts calls and shapes, not speed). **Takes:** see the agendas in `docs/INSTRUCTOR.md`.
#
# A smaller decoder is served on an FP8 path: its trunk runs FP8 GEMMs (the lab's calibrated
# `fp8_static`), its head and its first and last blocks stay bf16 on purpose. The service has three context
# buckets, each with its own batch. The FP8 GEMM library this deployment ships does not have a kernel for
# every shape: where a layer has none, its FP8 weight is dequantized to bf16 every step and a bf16 GEMM
# reads the copy (the seed's partial fallback).
#
# Below, for each bucket, are the rows of `torch.profiler`'s table for one decode step, grouped by input
# shape: the bf16 GEMMs (`aten::linear`: activation `(rows, 1, in_features)`, weight `(out_features,
# in_features)`), the FP8 GEMMs (`aten::_scaled_mm`: activation `(rows, in_features)`, weight transposed)
# and the lab's quant/dequant ranges. The layer kinds and their weight shapes come first.
#
# **Part 1.** Which bucket falls back, which layer kind, how many weights does that bucket's step dequantize,
# and what is the shape `(rows, in_features, out_features)` of a bf16 GEMM that reads a dequantized copy?
#
# **Part 2.** The library will not change this release. Pick a batch per bucket (padding a batch with empty
# rows is allowed) so that no bucket falls back, no bucket serves fewer rows than today, and no bucket
# carries more padding than it needs. The checker re-profiles your mix.

# %%
from hwlab import nb  # nb.reveal: a check's answer after three wrong tries
from hwlab.course import exercise_checks
from hwlab.labs.fp8 import bucket_case as case

buckets = exercise_checks.case_buckets()
print(f"[profiled live on this machine's CPU] decoder {case.CASE_CONFIG}")
print("layer kind -> weight (out_features, in_features):", case.layer_shapes(case.case_model("cpu")))
for b in buckets:
    print(f"\nbucket ctx {b['ctx']}, batch {b['batch']}: one decode step")
    print(f"  {'op':<20} {'input shapes':<34} calls")
    for r in b["table"]:
        print(f"  {r['op']:<20} {str(r['input_shapes']):<34} {r['calls']}")

# %% tags=["learner"]
MY_BUCKET = None    # YOUR ANSWER HERE: the bucket's context length
MY_MODULE = None    # YOUR ANSWER HERE: the layer kind, e.g. "qkv"
MY_DEQUANTS = None  # YOUR ANSWER HERE: weights dequantized per decode step in that bucket
MY_SHAPE = None     # YOUR ANSWER HERE: (rows, in_features, out_features) of a GEMM reading a dequantized copy
### BEGIN SOLUTION
# ctx 128 is the only table with hwlab::dequant_fp8 (2 calls). There the bf16 row with weight [64, 256]
# has 4 calls where the other buckets have 2 (the two bf16 edge blocks), and the FP8 row [[6, 256],
# [256, 64]] is missing: the two FP8 `down` layers (weight (64, 256)) fell back at 6 rows.
MY_BUCKET = 128
MY_MODULE = "down"
MY_DEQUANTS = 2
MY_SHAPE = (6, 256, 64)
### END SOLUTION

# %%
exercise_checks.check_case_fallback(MY_BUCKET, MY_MODULE, MY_DEQUANTS, MY_SHAPE, buckets)

# %% tags=["learner"]
MY_BATCHES = None  # YOUR ANSWER HERE: {ctx: batch} for every bucket
### BEGIN SOLUTION
# `down` runs FP8 at 8 and at 4 rows but not at 6: its kernels take a multiple of 4 rows (not 8: 4 works,
# not 2: 6 would). The smallest multiple of 4 that keeps 6 rows of capacity is 8.
MY_BATCHES = {64: 8, 128: 8, 256: 4}
### END SOLUTION

# %%
exercise_checks.check_case_batches(MY_BATCHES)
