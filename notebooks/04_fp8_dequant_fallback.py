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
# # 04 · FP8 dequant fallback: memory falls, TPOT does not
#
# **Needs:** an H100/H200-class GPU (FP8 tensor cores) for meaningful TTFT/TPOT; on a CPU the same decoder
# runs at a tiny size: memory accounting, hit rates, dequant counts and logit errors are real, the times
# are the CPU's (FP8 is emulated there) and say nothing about a GPU. **No H200 run of this lab has been
# recorded yet** — this notebook shows only what it measures where it runs. **Takes:** ~30 s on a CPU.
#
# ## Symptom (the seed's case)
# BF16 → FP8 weights: memory −35%, TPOT only −3%, P99 slightly worse. Some GEMMs hit FP8 kernels, but the
# connector and the output head dequantize back to BF16 every step, and the KV cache is still BF16.

# %%
import matplotlib.pyplot as plt
from hwlab import flowchart, nb
from hwlab.labs import fp8 as lab

GPU = nb.has_gpu()
print(nb.live_label())

# %% [markdown]
# ## Predict
# Decode at small batch is memory-bound: every step reads every weight once. FP8 weights halve those bytes
# *only if the GEMM reads them as FP8*. A dequantized layer reads the FP8 weight, writes a BF16 copy and
# reads it again: 1 + 2 + 2 = 5 bytes per weight instead of 2. With a large head dequantized, the savings of
# the FP8 layers are eaten.

# %%
res = lab.run(n_rep=5 if GPU else 3)
src = nb.live_label()
for p, r in res["paths"].items():
    prof = r["profile"]
    print(f"{p:>12}: weights {r['weight_bytes'] / 2**20:8.2f} MiB ({r['weight_mem_change_pct']:+.0f}%), "
          f"FP8 hit rate {prof['hit_rate_pct']:.0f}%, fallback GEMMs {prof['fallback_gemms']}, "
          f"dequant+requant per token {prof['dequant_requant_per_token']:.1f}, "
          f"logit error {res['logit_error'][p]:.3f}  [{src}]")

# %% [markdown]
# ## TTFT and TPOT per context bucket (prefill and decode reported apart)

# %%
fig, ax = plt.subplots(figsize=(8, 3.5))
for p, r in res["paths"].items():
    ax.plot([f"ctx {b['ctx']} x{b['batch']}" for b in r["buckets"]], [b["tpot_ms"] for b in r["buckets"]],
            marker="o", label=p)
ax.set_ylabel("TPOT (ms per decode step)")
ax.set_yscale("log")
ax.set_title(f"Decode step time by precision path\n({src})", fontsize=9)
ax.legend(fontsize=7)
plt.show()
for p, r in res["paths"].items():
    for b in r["buckets"]:
        print(f"{p:>12} ctx {b['ctx']:>6} batch {b['batch']:>3}: TTFT {b['ttft_ms']:.2f} ms, TPOT {b['tpot_ms']:.3f} ms "
              f"({b['tpot_change_pct']:+.0f}% vs bf16), KV {b['kv_bytes'] / 2**20:.1f} MiB")

# %% [markdown]
# ## Place it on the flowchart
# Kernel microbenchmarks are fine (the FP8 GEMM is fast); only the service path is slow; no rank tail →
# **shape bucket / cache / fallback**. The evidence that names the fallback is the profile: GEMMs fed by a
# dequantized weight.

# %%
d = flowchart.diagnose({"single_gpu_slow": False, "multi_gpu_or_service_slow": True, "rank_tail": False})
print(d.explain())
print("\nfallback GEMMs per path (profiler):", {p: r["profile"]["fallback_gemms"] for p, r in res["paths"].items()})

# %% [markdown]
# ## Fix and re-verify
# The seed's fix, as the `fixed` path: main matmuls confirmed on FP8, the sensitive head kept in BF16 *on
# purpose* (counted apart from fallbacks), FP8 KV cache for long-context buckets, dequant/requant counted per
# token. Re-verify with the same profile: zero fallback GEMMs, and the logit error within its bound.

# %%
fx = res["paths"]["fixed"]["profile"]
print(f"fixed: hit rate {fx['hit_rate_pct']:.0f}%, fallback {fx['fallback_gemms']}, high precision by choice "
      f"{fx['high_precision_by_choice']}, logit error {res['logit_error']['fixed']:.3f} "
      f"(bound {lab.LOGIT_ERROR_BOUND['fixed']})  [{src}]")

# %% [markdown]
# ## Summary
# - "The hardware supports FP8" is not "the path runs FP8": count FP8 kernel hits and dequant copies per token.
# - Report TTFT and TPOT per context bucket; long contexts are KV-bound, short ones weight-bound.
# - Next: `exercises/04_fp8_dequant_fallback.ipynb`.
