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
# # Solution 04 · Find the fallback, fix the path
#
# **Needs:** nothing special (the checker profiles the decoder where it runs). **Takes:** see the agendas in `docs/INSTRUCTOR.md`.
#
# The seed's `mixed` path is profiled below. Find which modules fall back (their FP8 weights are
# dequantized every step) and write a path with **no fallback GEMMs**, a high **FP8 hit rate** (the
# checker's `min_hit_pct`), and
# logits within the FP8 bound of the BF16 model. The checker also grades what the seed's fix asks:
# the sensitive output head stays high-precision (先保留敏感头高精), and the FP8 KV cache is used per
# context bucket only where the KV bytes pay for it (`kv_fp8_from_ctx`: the shortest context that gets
# an FP8 cache; the bytes per bucket come from the H200 run). On a GPU it times your path's decode
# TPOT against this machine's bf16 TPOT in the same run. The modes are `lab.QLinear.MODES`; `fp8_static`
# is the lab's FP8 GEMM with activation scales calibrated once.

# %%
from hwlab.diagnosis import exercise_checks
from hwlab.labs import fp8 as lab

m = lab.Decoder(lab.TINY, "mixed", device="cpu")
prof = lab.decode_profile(m)
print(f"[measured live on this machine's CPU, tiny decoder: {prof['source']}]")
print({k: v for k, v in prof.items() if k != "gemm_names"})
print("GEMM kernels per decode step, by name:", prof["gemm_names"])
print("the decoder's linear modules and their stored weight dtype (which of them fall back is yours to find):")
print({name: str(mod.w.dtype).replace("torch.", "") for name, mod in m.named_modules() if isinstance(mod, lab.QLinear)})
print("modes a module can take:", lab.QLinear.MODES)
rows, label = exercise_checks.kv_buckets()
print(f"the KV rule the checker grades: an FP8 KV cache pays in a bucket where the KV cache is at least "
      f"{exercise_checks.KV_SHARE_PAYS_PCT:.0f}% of the bytes a decode step moves (an FP8 cache halves that part); "
      "set kv_fp8_from_ctx to the shortest context that should get one (None: never)")
print(f"per context bucket, the KV cache's share of the bytes a decode step moves ({label}, bf16 path):")
for r in rows:
    print(f"  ctx {r['ctx']:>6} x{r['batch']}: KV {r['kv_bytes'] / 1e9:.2f} GB of {r['decode_bytes'] / 1e9:.2f} GB "
          f"per step ({r['kv_share_pct']:.0f}%)")

# %% tags=["learner"]
# connector and head were "fp8_dequant": run the connector on the FP8 GEMM path (the lab's calibrated
# "fp8_static", as the trunk), keep the head in bf16 on purpose, FP8 KV only for the long bucket
MY_PATH = {"main": "fp8_static", "connector": "fp8_static", "head": "bf16", "kv_fp8_from_ctx": 8192}

# %%
exercise_checks.check_fp8_path(MY_PATH)

# %% [markdown]
# ## Part 2 · Which bucket falls back, and why does the tail not move?
#
# The seed's first fix is to count the FP8 kernel hit rate *per bucket*. Below is the
# `mixed` path's profiled decode step per context bucket of Lab 4's recorded H200 service. Find the bucket
# where the FP8 hit rate is lowest and the layer kind that falls back **only** there. Then say to yourself
# why that bucket's TPOT gains the least of the service's: which bytes dominate its step, and which of
# the seed's fixes moves them?

# %%
rows, label = exercise_checks.fallback_buckets()
print(f"mixed path per bucket ({label}):")
for r in rows:
    print(f"  ctx {r['ctx']:>6} x{r['batch']:<3}: FP8 hit {r['fp8_hit_pct']:.0f}%, fell back {r['fell_back']}, "
          f"TPOT p50 {r['tpot_p50_change_pct']:+.1f}% / p99 {r['tpot_p99_change_pct']:+.1f}% vs bf16")

# %% tags=["learner"]
# the lowest hit rate, and the kind in its list that no other bucket's list has.
# Why the tail does not move: the long bucket's step is mostly KV-cache reads in BF16, which FP8 weights do
# not touch, and its small batch has no FP8 kernel for `out`, so that layer reads a dequantized copy. Its
# steps are the service's longest, so they make the P99. Fix 2 (every trunk shape on FP8) removes the
# fallback; fix 3 (an FP8 KV cache for the long bucket) halves the bytes that dominate it.
low = min(rows, key=lambda r: r["fp8_hit_pct"])
MY_BUCKET = low["ctx"]
MY_MODULE = next(iter(set(low["fell_back"]).difference(*[r["fell_back"] for r in rows if r is not low])))

# %%
exercise_checks.check_fallback_bucket(MY_BUCKET, MY_MODULE)

