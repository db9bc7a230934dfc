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
# # 04 · FP8 dequant fallback: memory falls, TPOT barely moves
#
# **Needs:** an H100/H200-class GPU (FP8 tensor cores) for live timing; without one the same decoder runs
# at a tiny size on the CPU (memory, hit rates, fallbacks and dequant counts are real; CPU times say
# nothing about a GPU) and the timing evidence is the H200 run this kit recorded, labelled as such.
# On a CPU that tiny run is opt-in (`CPU_LIVE = True` in the first cell; it adds about a minute): without it
# every figure below is the H200's record. **Takes:** the run times measured on the H200 and on a CPU are
# in the table of `docs/LEARNING_PATH.md`. Set `LONG = True` for streams three times as long.
#
# **Arc, in the seed's order:** symptom → key metrics (memory, the trace, hit rate per bucket, the KV
# cache) → judgement → the seed's fixes one by one → re-verify with the same probes.
#
# ## Symptom (the seed's case)
# A team moved a model's weights from BF16 to FP8. GPU memory fell by about a third, TPOT improved by only
# a few percent, and P99 got slightly worse. The trace shows some GEMMs on FP8 kernels, but the connector
# and the output head dequantize back to BF16 every step; in decode the KV cache is still BF16 and
# long-context requests dominate the cost.
#
# The lab's `mixed` path is that deployment, built from its parts rather than told: the trunk's matmuls
# on FP8 GEMMs (the recipe keeps the first and last blocks in BF16), the `out` projection's FP8 kernel
# built only for batches that fill its tile (`out_rows_multiple`), the connector and the head stored in
# FP8 and dequantized every step, the KV cache in BF16. The service has two context buckets: many short
# requests served in large batches, and a few long-context ones served in small batches.

# %%
from IPython.display import Markdown, display
import matplotlib.pyplot as plt
from hwlab.core import evidence, probes
from hwlab.core.gains import faster, less_more
from hwlab.diagnosis import flowchart
from hwlab import nb
from hwlab.labs import fp8 as lab

GPU = nb.has_gpu()
LONG = False  # True: three times the requests per bucket
CPU_LIVE = False  # True on a CPU: also serve the tiny decoder live here (about a minute; its times say nothing about a GPU)
print(nb.live_label())
for p in lab.SERVING_PATHS:
    print(f"{p:>12}: {lab.PATHS[p]}")

# %% [markdown]
# ## Predict
# Decode at these batch sizes is memory-bound: a step reads every weight once and the KV cache up to each
# request's position. The lab's byte model counts what one step must move on each path: a weight read by an
# FP8 GEMM is one byte, a dequantized one five (read the FP8 weight, write a BF16 copy, read the copy).

# %%
cfg = lab.H200_SIZE
for spec in lab.default_streams("cuda"):
    n, pos = spec.max_batch, spec.max_batch * (spec.ctx + 1)
    base = lab.step_bytes(cfg, lab.PATHS["bf16"], n, pos, False)
    for p in lab.SERVING_PATHS:
        kv8 = lab.PATHS[p]["kv_fp8_from_ctx"] is not None and spec.max_len >= lab.PATHS[p]["kv_fp8_from_ctx"]
        b = lab.step_bytes(cfg, lab.PATHS[p], n, pos, kv8)
        kv = 2 * cfg.n_layers * cfg.d_model * pos * (1 if kv8 else 2)
        print(f"ctx {spec.ctx:>6} x{n:<3} {p:>12}: {b / 1e9:5.2f} GB per step ({less_more(100 * (b / base - 1)):>10} than bf16), "
              f"KV {100 * kv / b:3.0f}% of it  [byte model, H200 size]")

# %% [markdown]
# **Prediction:** memory falls by about a third (trunk and head halve; the embedding and the kept blocks do
# not). In the short bucket the trunk saves a little more than the head's dequant copy costs, so a step
# gains a few %. In the long bucket the BF16 KV cache is most of the bytes and the `out` projections fall
# back at its small batch, so its steps gain nothing: the service's P99, made of long-context steps, should
# be no better than BF16's while its median gains a little.
#
# ## The kernel behind a fallback
# A module that falls back keeps its FP8 weight and, every step, writes a BF16 copy of it before a BF16 GEMM
# reads that copy. This is the kernel that writes it, beside its torch reference. Look at the load (one
# byte per weight), the multiply by the row's scale in fp32, and the store (two bytes per weight): per step
# it moves three times the bytes the FP8 weight was meant to save, before the GEMM reads the copy again.

# %%
from hwlab.labs.fp8 import quant

nb.show_kernel(quant._dequant_rows_kernel, quant.dequant_rows_ref,
               note="A grid of (row, block of `BLOCK` columns); one scale per row (or one for the tensor). The reference is what the fallback "
                    "computes; the lab's tests check the kernel against it in Triton's interpreter.")

# %% [markdown]
# ## Measure: the service on each path
# Every path runs the same weights. Per bucket a seeded stream of requests is served with continuous
# batching (a freed slot is refilled at once, every step serves the live requests at their own lengths,
# each step replayed from a CUDA graph and timed on the device); its decode step is profiled with
# `torch.profiler`. The service's TPOT pools every token of both buckets. Correctness first: each path's
# logits against BF16, and each batched step against the same requests decoded alone.

# %%
live = lab.run(long=LONG) if GPU or CPU_LIVE else None
src_live = nb.live_label()
if GPU:
    res, src, copy = live, src_live, probes.hbm_copy(size_mib=2048, impl="torch").gbps
else:
    rec = evidence.recorded("lab04_fp8")
    res, src, copy = rec.extra["run"], rec.label, rec.ceilings["copy_gbps"]
sig = lab.seed_signature(res)
svc = {p: lab.service_tpot(res["stream"], p) for p in res["stream"]["paths"]}
reports = {p: lab.performance_report(res["stream"], p) for p in res["stream"]["paths"]}
t = sig["tpot_ms"]
display(Markdown(
    f"**The symptom, measured** ({src}): `mixed` holds {less_more(sig['memory_change_pct'])} weight memory than BF16. "
    f"Over the service's {svc['bf16']['tokens']} tokens its TPOT p50 is {t['mixed']['tpot_ms_p50']:.3f} ms against "
    f"BF16's {t['bf16']['tpot_ms_p50']:.3f} ms ({faster(sig['gain_p50_pct'])}) and its p99 "
    f"{t['mixed']['tpot_ms_p99']:.3f} against {t['bf16']['tpot_ms_p99']:.3f} ms ({faster(sig['gain_p99_pct'])}). "
    f"Median gain between 0 and 6%: {sig['p50_gain_small']}; p99 gaining less than the median: "
    f"{sig['p99_gains_less']}" + (f"; borderline (within {sig['tol_pct']:.0f} points, a re-run may flip it): "
                                  f"{', '.join(sig['borderline'])}" if sig["borderline"] else "") + "."))
if live is not None and not GPU:  # the tiny decoder served here: counts are real, its times are this CPU's
    lsig = lab.seed_signature(live)
    print(f"the tiny decoder served live here ({src_live}): `mixed` holds {less_more(lsig['memory_change_pct'])} "
          "weight memory than bf16; per bucket:")
    for b in lab.performance_report(live["stream"], "mixed")["buckets"]:
        print(f"  ctx {b['ctx']:>5} x{b['batch']:<3} FP8 hit {b['fp8_hit_pct']:3.0f}%, fallback GEMMs {b['fallback_gemms']}, "
              f"{b['dq_per_token']:.2f} dequants per token  [{src_live}]")
elif not GPU:
    print(f"the live CPU run is off (CPU_LIVE = False): every figure here is the record [{src}]")

# %%
fig = lab.plot_reports([reports[p] for p in ("bf16", "mixed")],
                       f"TPOT p50 (bars) and p99 per bucket; one decode step's kernel time by class\n({src})")
plt.show()

# %% [markdown]
# ## Key metrics: memory, the trace, the hit rate per bucket, the KV cache
# The seed's first fix is a measurement: count the FP8 kernel hit rate **per bucket** (按 kernel hit rate
# 分桶统计) and put dequant/requant counts into the performance report. The profiled step of each bucket
# says which GEMMs ran on an FP8 kernel, which fell back to a dequantized weight, and where the step's
# kernel time went.

# %%
for p in ("bf16", "mixed"):
    print(lab.format_report(reports[p], src), end="\n\n")
for b in res["stream"]["paths"]["mixed"]["buckets"]:
    pr = b["profile"]
    print(f"mixed ctx {pr['ctx']:>6} x{pr['batch']}: fell back {sorted(set(n.split('.')[-1] for n in pr['fallback_modules']))} "
          f"({pr['fallback_gemms']} GEMMs: {', '.join(pr['fallback_modules'][:4])}{', ...' if pr['fallback_gemms'] > 4 else ''})")
rb = {r["ctx"]: r for r in reports["mixed"]["buckets"]}
short, long_ = min(rb), max(rb)
us = {c: rb[c]["kernel_us_by_class"] for c in rb}
display(Markdown(
    f"**Per bucket** ({src}): `mixed` hits FP8 on {rb[short]['fp8_hit_pct']:.0f}% of a step's GEMMs at context "
    f"{short} and on {rb[long_]['fp8_hit_pct']:.0f}% at context {long_}, with {rb[short]['dq_per_token']:.2f} "
    f"and {rb[long_]['dq_per_token']:.2f} weight dequants per token. In the long bucket the KV reads "
    f"(attention) take {us[long_]['attention'] / 1e3:.2f} ms of the step's {rb[long_]['kernel_us'] / 1e3:.2f} ms of "
    f"kernels and format conversion {us[long_]['quant/dequant'] / 1e3:.2f} ms; in the short bucket format "
    f"conversion takes {us[short]['quant/dequant'] / 1e3:.2f} ms of {rb[short]['kernel_us'] / 1e3:.2f} ms."))

# %% [markdown]
# ## Judgement, placed on the flowchart
# Every answer is measured: **B** is one profiled step's kernel time over the bytes those kernels must move at
# this machine's copy bandwidth (slow on one GPU?); **D** is the stream's TPOT p50 over what the same kernels
# would take if every FP8 weight were read once as FP8 (slow only in service?); **K** is the rank tail (one
# serving process here). The short bucket of `mixed`, as the walk will read it:

# %%
fe = lab.flowchart_evidence(res, copy)
key = f"mixed ctx {short} x{rb[short]['batch']}"
nb.show_evidence(fe[key], f"{key}; {src}")

# %% [markdown]
# **Checkpoint: your diagnosis first.** Fill in the leaf, the metric that decides **D** (slow only in
# service?) and its value as the table shows it. The kit's walks show once this passes.

# %%
# replace each None: leaf="<a leaf letter>", metric="<a metric name from the table>", value=<its value>
ANSWER = nb.answer("04", leaf=None, metric=None, value=None, evidence=fe[key])
CP = nb.checkpoint("04", ANSWER, flowchart.diagnose(fe[key]), fe[key], step="D", source=src)

# %%
DETAILS = False  # True: every step's rule, spread and source
leaves = {k: flowchart.diagnose(e).leaf_id for k, e in fe.items()}
nb.walk(CP, f"{key} [{src}]", full=DETAILS)
with nb.gated(CP, "the other buckets' walks"):
    for k, e in fe.items():
        if k != key:
            print(f"{k:>24}: {flowchart.diagnose(e).render(full=DETAILS)}  [{src}]")
nb.explain(CP, """A walk that ends on **M** (shape bucket / cache / fallback) is named by the profile: the per-bucket
table above says which GEMMs fell back and where the step's kernel time went. `BORDERLINE` marks a step
whose spread over the profiles (B) or the stream (D) contains its threshold.""")

# %% [markdown]
# The seed's judgement, read off these tables: FP8 support in the hardware is not a path on FP8. The saving
# of the FP8 trunk is spent on **format conversion** (the head's and connector's BF16 copies every step), on
# **partial fallback** (the `out` projections at batches their FP8 kernel has no shape for), and what is left
# is small next to **KV reads**, which FP8 weights never touch and which dominate the long-context steps,
# the steps that make the P99.
#
# ## The seed's fixes, one by one
# 1. *Count the hit rate per bucket*: done above; it found the bucket where `out` falls back.
# 2. *Keep the sensitive head in high precision, confirm the trunk hits FP8* (`gemms_fixed`): the head in
#    BF16 on purpose (counted apart from fallbacks), the connector on an FP8 GEMM, and `out` on an FP8
#    kernel at every batch size.
# 3. *Evaluate KV-cache quantization for the long-context bucket* (`fixed`): an FP8 KV cache from
#    `lab.KV_FP8_FROM_CTX` on, read by an attention kernel that reads FP8 directly.
# 4. *Count dequant/requant in the performance report*: the per-token counts below, per path and bucket.

# %%
for p in ("mixed", "gemms_fixed", "fixed"):
    rep, s = reports[p], svc[p]
    print(f"{p:>12}: weights {less_more(rep['weight_change_pct'])} than bf16, service TPOT p50 {s['tpot_ms_p50']:.3f} ms "
          f"({faster(100 * (1 - s['tpot_ms_p50'] / svc['bf16']['tpot_ms_p50']))}), p99 {s['tpot_ms_p99']:.3f} ms "
          f"({faster(100 * (1 - s['tpot_ms_p99'] / svc['bf16']['tpot_ms_p99']))})  [{src}]")
    for r in rep["buckets"]:
        print(f"{'':>14}ctx {r['ctx']:>6} x{r['batch']:<3} KV {'fp8' if r['kv_fp8'] else 'bf16':>4}: hit {r['fp8_hit_pct']:3.0f}%, "
              f"fallback {r['fallback_gemms']}, bf16 on purpose {r['high_precision_by_choice']}, per token "
              f"{r['dq_per_token']:.2f} dequants and {r['rq_per_token']:.2f} requants, TPOT p50 {faster(-r['tpot_p50_change_pct'], 0)} / "
              f"p99 {faster(-r['tpot_p99_change_pct'], 0)} than bf16")
a = res.get("attention_vs_sdpa")
if a:
    print(f"\nwhat a user would run instead, the long bucket's attention over {a['n_layers']} layers ({a['timing']}): "
          f"the kit's kernel on the FP8 cache {a['kit_fp8_us']:.0f} us per layer ({a['kit_fp8_gbps']:,.0f} GB/s, "
          f"{100 * a['kit_fp8_gbps'] / copy:.0f}% of copy), torch SDPA on the BF16 cache {a['sdpa_us']:.0f} us "
          f"({a['sdpa_gbps']:,.0f} GB/s, {100 * a['sdpa_gbps'] / copy:.0f}% of copy; a stream that only reads may pass "
          f"the copy rate, which reads and writes)  [{src}]")

# %% [markdown]
# ## Re-verify with the same probes
# The same stream, profile and walk on the fixed paths: no fallback GEMMs, no weight dequantized per token,
# the logits within the FP8 bound, and the walk off the `mixed` path's leaf.

# %%
err, bound = res["logit_error"], res["logit_error_bound"]
dq = {p: {r["ctx"]: r["dq_per_token"] for r in reports[p]["buckets"]} for p in reports}
rq = {p: {r["ctx"]: r["rq_per_token"] for r in reports[p]["buckets"]} for p in reports}
gain = {p: 100 * (1 - svc[p]["tpot_ms_p50"] / svc["bf16"]["tpot_ms_p50"]) for p in svc}
gain99 = {p: 100 * (1 - svc[p]["tpot_ms_p99"] / svc["bf16"]["tpot_ms_p99"]) for p in svc}
display(Markdown(
    f"**Re-verified** ({src}): weight dequants per token at context {short} / {long_}: `mixed` "
    f"{dq['mixed'][short]:.2f} / {dq['mixed'][long_]:.2f}, `fixed` {dq['fixed'][short]:.2f} / {dq['fixed'][long_]:.2f}; "
    f"activation requants per token (a pass over one step's rows, fused into a norm or the attention where it can be): "
    f"`mixed` {rq['mixed'][short]:.2f} / {rq['mixed'][long_]:.2f}, `fixed` {rq['fixed'][short]:.2f} / {rq['fixed'][long_]:.2f}. "
    f"Fallback GEMMs on `fixed`: {sum(r['fallback_gemms'] for r in reports['fixed']['buckets'])}. Logit error against "
    f"BF16: `mixed` {err['mixed']:.3f}, `fixed` {err['fixed']:.3f} (bound {bound['fixed']}). Service TPOT p50 / p99 "
    f"against BF16: " + ", ".join(f"`{p}` {faster(gain[p])} / {faster(gain99[p])}" for p in ("mixed", "gemms_fixed", "fixed"))
    + "."))
with nb.gated(CP, "the re-verified walks"):
    nb.md("Walks: " + ", ".join(f"{k} → {v}" for k, v in leaves.items() if not k.startswith("bf16")) + ".")

# %% [markdown]
# Read which fix moves which figure: fixes 1 and 2 act on every step (the short bucket's steps stop paying
# for the head's copy), fix 3 only on the long-context steps, which are KV reads first and make the P99. A walk that leaves the `mixed` leaf
# for **OK** has nothing left the flowchart can name; one that lands on **G** instead says the step's kernels
# sit far from their byte floor (small kernels, a short cache) and is the next thing to look at, not a
# fallback. How the kit's FP8 kernels were tuned, and what is still open there: `docs/lab04-tuning.md`.
#
# ## Summary
# - "The hardware supports FP8" is not "the path runs FP8": count FP8 kernel hits and dequant copies per
#   token, per bucket, in the performance report; a fallback can hide in one bucket's shapes.
# - Report TTFT and TPOT p50 **and p99** from a stream whose batches change: long contexts are KV-bound and
#   make the tail, short ones are weight-bound.
# - Next: `exercises/ex04_fp8_dequant_fallback.ipynb`.
