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
# # 06 · Case studies for instructors
#
# **Needs:** nothing: every case reads a recorded run (the H200's, and Lab 3's link on a CPU machine), each
# labelled. On a GPU, `LIVE = True` in the first cell re-measures the GEMM and FP8-profile parts there.
# **Takes:** the run times measured on the H200 and on a CPU are in the table of `docs/LEARNING_PATH.md`.
#
# Two incidents from the seed page, each walked as symptom → measurement → flowchart → fix → re-verification
# → the minimal incident record. Then the two leaves no big lab holds (dtype/MMA path and workload mix).

# %%
import tempfile

from hwlab.core import evidence
from hwlab.core.gains import faster, less_more
from hwlab.diagnosis import flowchart, incident
from hwlab import nb
from hwlab.labs import scenarios

GPU = nb.has_gpu()
LIVE = False  # True on a GPU: re-measure leaves I and M and re-profile the FP8 paths live (about a minute)
DETAILS = False  # True: every walk in full (each step's rule, spread and source), every report and incident record whole
print(nb.live_label())

# %% [markdown]
# ## Case 1: an 8-GPU box loses throughput after a swap
# **Symptom.** Same serving config, lower throughput after a machine swap (the seed's figures are printed
# first below, from the constants Lab 3 calibrates to); single-GPU microbenchmarks normal; long-context
# P99 jitter; some ranks late; NCCL waits between kernels.
#
# **Measure.** Per-rank step times of the TP block with the reordered mapping, over a real slow link whose
# rate was calibrated so the naive mapping runs at the seed's ratio (recorded on a CPU machine with a
# rate-limited veth; Lab 3 shows the sweep and runs the link live where it can). Beside it, in the same
# launch, the seed's counter-example: the aware mapping with a kernel regressed on every rank.

# %%
from hwlab.labs import crosslink

nb.md(f"The seed's figures: throughput **1.0x → {crosslink.SEED_RATIO}x**; tail ranks "
      f"**{crosslink.SEED_TAIL_MS[0]:.0f}–{crosslink.SEED_TAIL_MS[1]:.0f} ms** late. _[the seed's report, quoted]_")
rec = evidence.recorded("lab03_linksweep", "cpu")
exp = rec.extra["calibrated"]
print(f"link {exp['rate']}: throughput naive / aware {exp['throughput_naive_over_aware']:.2f}x (seed 0.72x) "
      f"[{rec.label}]")
for name in ("naive", "aware"):
    r = exp[name]["report"]
    print(f"{name}: groups {exp[name]['groups']}, step {r['step_ms']:.1f} ms, tail {r['tail_ranks']} "
          f"{r['tail_ms']:.1f} ms late per step [{rec.label}]")
first = evidence.recorded("lab03_slowlink", "cpu").extra["experiment"]["overlap"]
print(f"seed scale: x{exp['seed']['scale']:.2f} -> tail {exp['seed']['tail_ms_at_seed_scale']:.1f} ms (seed: 10-20 ms); "
      f"overlap hid {exp['overlap']['slow']['hidden_pct']:.0f}% of what could hide on this link (rule 3c); "
      f"Lab 3's first example: "
      f"{first['fast']['hidden_pct']:.0f}% on a {first['fast']['link']}, {first['slow']['hidden_pct']:.0f}% on a "
      f"{first['slow']['link']}")
print("signature (measured):  rank tail (% of step) | comm wait ms | single-device slowdown vs floor | leaf")
for row, key in zip(exp["signature"], ("naive", "regressed")):
    print(f"  {row['case']:34} {row['rank_tail_pct']:6.1f} | {row['comm_wait_ms_median']:6.1f} | "
          f"{row['slowdown_vs_floor']:5.2f}x | {flowchart.diagnose(exp[key]['flowchart_evidence']).leaf_id}")
d1 = flowchart.diagnose(exp["naive"]["flowchart_evidence"])
print(f"naive mapping [{rec.label}]: {d1.render(full=DETAILS)}")
print(f"the counter-example (反例), regressed kernel [{rec.label}]: "
      f"{flowchart.diagnose(exp['regressed']['flowchart_evidence']).render(full=DETAILS)}")

# %% [markdown]
# **The same case from profiler traces.** An on-call engineer usually has a `torch.profiler` trace per
# rank rather than a step log. `hwlab ranks --traces` reads them and tells the two shapes of this incident
# apart by arrival at each collective: a *slow rank* (one rank arrives last, the others wait for it) and
# a *slow link* (every rank arrives together and waits inside the collective; the link is named, not a
# rank). Shown from the recorded CPU traces of `examples/profiled_torchrun.py` beside the step-log view above.

# %%
from pathlib import Path

from hwlab.diagnosis import ranks_traces
from IPython.display import Markdown, display

TRACES = evidence.TRACES_DIR  # shipped inside the package
if TRACES.is_dir():
    src_tr = "recorded on a CPU machine: torch.profiler traces of 4 gloo ranks under torchrun"
    rows = []
    for name in ("slow_rank", "slow_link", "clean"):
        rep = ranks_traces.report(TRACES / name)
        f = rep["finding"]
        worst = max(rep["per_rank"].values(), key=lambda s: s["pct_arrived_last"] or 0)
        rows.append(f"| {name} | {f['names'] or 'nothing'} | {worst['pct_arrived_last']:.0f}% | "
                    f"{rep['flowchart']['evidence'].get('rank_tail_pct', float('nan')):.0f}% | "
                    f"{rep['flowchart']['evidence'].get('collective_floor_pct', float('nan')):.0f}% | "
                    f"{' -> '.join(rep['flowchart']['path'])} |")
    step_log = exp["naive"]["report"]
    display(Markdown(
        f"Traces ({src_tr}):\n\n| run | named | most often last | rank tail (% of step) | last arriver inside "
        f"collectives (% of step) | walk |\n|---|---|---|---|---|---|\n" + "\n".join(rows) +
        f"\n\nStep log of the calibrated case above: tail ranks {step_log['tail_ranks']}, "
        f"{step_log['tail_ms']:.1f} ms late per step [{rec.label}]."))
else:
    print("the recorded traces (hwlab/recorded/traces in the package) are not here: record your own with "
          "examples/profiled_torchrun.py and run `hwlab ranks --traces DIR`")

# %% [markdown]
# **Fix and re-verify.** TP groups from the topology (`hwlab.core.mapping.choose_tp_groups`), not from ordinals;
# the same per-rank probe, in the same launch, re-checks the tail and the step against the devices-alone
# step. A re-check whose walk reaches OK only inside its own spread of a threshold is borderline: the
# incident record then stays open (not re-verified) until a re-run with more repeats clears it.

# %%
fixed = flowchart.diagnose(exp["aware"]["flowchart_evidence"])
print(f"after the fix: {' -> '.join(fixed.path)}; aware over naive {exp['speedup_aware_over_naive']:.2f}x")
for s in fixed.borderline:  # a re-check that passes inside its own spread is one re-run from failing
    print(f"the re-check at {s.question}: {s.metric} = {s.value:.3g}{s.spread_text()}")
inc1 = incident.from_diagnosis(
    "TP throughput 0.72x after node swap", rec, d1, symptom_scope="multi-GPU",
    symptom=f"throughput {exp['throughput_naive_over_aware']:.2f}x of the aware mapping; ranks "
            f"{exp['naive']['report']['tail_ranks']} {exp['naive']['report']['tail_ms']:.0f} ms late in the TP all-reduce",
    fix="regroup TP ranks with hwlab.core.mapping.choose_tp_groups (TP traffic off the slow link)",
    reverify="Lab 3 per-rank step-time probe: no tail, step within 1.2x of reference",
    rank_mapping=f"before {exp['naive']['groups']}, after {exp['aware']['groups']}",
    topology=f"{exp['world']} ranks on one CPU host: ranks {exp['slow_ranks']} behind a {exp['rate']} veth (SYS), "
             "the others on loopback (NODE) [recorded Lab 3 run]",
    collective_wait_ms={r: v["comm_wait_ms"] for r, v in exp["naive"]["report"]["per_rank"].items()},
    reverify_evidence=exp["aware"]["flowchart_evidence"],
    reverify_probe="Lab 3 per-rank step-time probe, topology-aware mapping (same recording)",
    reverified=fixed.leaf_id == "OK")
folder = tempfile.mkdtemp(prefix="incidents-")
md, js = incident.save(inc1, folder)
print(md.read_text() if DETAILS else md.read_text().split("\n## Key evidence")[0] + f"\n(the whole record: {md})")

# %% [markdown]
# ## Case 2: FP8 weights, memory down, TPOT barely moves
# **Symptom.** BF16 → FP8 weights: memory down by about a third, TPOT barely better, P99 slightly worse (the
# seed's figures are printed first below). Some GEMMs hit FP8 kernels; the connector and output head
# dequantize back to BF16 every step; the KV cache is still BF16.
#
# **Measure.** Lab 4's decoder (its size printed below) served by a request stream per context bucket
# (continuous batching) on BF16, the seed's `mixed` path and its two fixes, with one performance report per
# path: FP8 hit rate and dequant/requant per token **per bucket**, the step's time by kernel class, TPOT
# **p50 and p99**. Notebook 04 runs this live on a GPU (on a CPU, a tiny version with its `CPU_LIVE = True`);
# here the recorded H200 run is read (with `LIVE = True` on a GPU the seed's path and the fixed one are also
# re-profiled live).

# %%
from hwlab.labs import fp8

SEED_FP8 = {"memory_pct": -35, "tpot_change_pct": -3}  # the seed page's report, quoted: not measured here
nb.md(f"The seed's figures: memory **{less_more(SEED_FP8['memory_pct'], 0)}**, TPOT **{faster(-SEED_FP8['tpot_change_pct'], 0)}** "
      f"(the seed writes it as a TPOT change of {SEED_FP8['tpot_change_pct']:+d}%), P99 slightly worse. "
      "_[the seed's report, quoted]_")
rec4 = evidence.recorded("lab04_fp8")
run4 = rec4.extra["run"]
s4, s4src, s4copy = run4["stream"], rec4.label, rec4.ceilings["copy_gbps"]
print("Lab 4's decoder:", run4["config"], f"[{s4src}]")
sig = fp8.seed_signature(run4)
nb.md(f"Lab 4's `mixed` path against BF16 over the whole service: weights **{less_more(sig['memory_change_pct'])}**, "
      f"TPOT p50 **{faster(sig['gain_p50_pct'])}**, p99 **{faster(sig['gain_p99_pct'])}**"
      + (f" (borderline: {', '.join(sig['borderline'])})" if sig["borderline"] else "") + f" _[{s4src}]_")
if GPU and LIVE:
    for p in ("mixed", "fixed"):
        pr = fp8.decode_profile(fp8.Decoder(fp8.H200_SIZE, p))
        print(f"{p:>6} live profile: {pr['fp8_hits']}/{pr['gemm_calls']} GEMMs on FP8 kernels, "
              f"{pr['fallback_gemms']} fallbacks  [{nb.live_label()}]")
for p in (fp8.SERVING_PATHS if DETAILS else ("mixed",)):  # DETAILS: every path's report
    print(fp8.format_report(fp8.performance_report(s4, p), s4src), end="\n\n")
# the chart, every answer measured: B = one decode step's kernels against this machine's byte floor,
# D = the stream's TPOT p50 over what those kernels predict, K = the one serving process's steps
fe4 = fp8.flowchart_evidence(s4, s4copy)
long_ctx = max(b["profile"]["ctx"] for b in s4["paths"]["mixed"]["buckets"])
k4 = next(k for k in fe4 if k.startswith(f"mixed ctx {long_ctx} "))
d2 = flowchart.diagnose(fe4[k4])
print(f"{k4} [{s4src}]: {d2.render(full=DETAILS)}")
# the seed's judgement, in one step's kernel time: where mixed spends it against bf16
by = {p: next(b["profile"]["breakdown"]["us"] for b in s4["paths"][p]["buckets"] if k4.endswith(
    f"ctx {b['profile']['ctx']} x{b['profile']['batch']}")) for p in ("bf16", "mixed")}
print(f"{k4} vs bf16, one step's kernel time by class (ms): " + ", ".join(
    f"{fp8.CLASSES[c]} {by['mixed'][c] / 1e3:.3f} ({(by['mixed'][c] - by['bf16'][c]) / 1e3:+.3f})"
    for c in fp8.CLASSES if c in by["mixed"] and c in by["bf16"]) + f"  [{s4src}]")

# %% [markdown]
# **Fix and re-verify.** The seed's list, as Lab 4's paths: `gemms_fixed` keeps the sensitive head in BF16
# on purpose and puts every trunk matmul on an FP8 kernel; `fixed` adds an FP8 KV cache for the long-context
# bucket. Re-checked with the same probes (the same stream, the same report, the same walk); the incident
# record says whether the re-check clears every threshold outside its own spread.

# %%
for p in ("gemms_fixed", "fixed"):
    sp = fp8.seed_signature(run4, p)
    walks = {k: flowchart.diagnose(ev).leaf_id for k, ev in fe4.items() if k.startswith(p + " ")}
    nb.md(f"`{p}` against BF16: weights **{less_more(sp['memory_change_pct'])}**, TPOT p50 **{faster(sp['gain_p50_pct'])}**, "
          f"p99 **{faster(sp['gain_p99_pct'])}**; walks " + ", ".join(f"{k}: {v}" for k, v in walks.items())
          + f" _[{s4src}]_")
kf = k4.replace("mixed", "fixed")
fixed_walk = flowchart.diagnose(fe4[kf])
sf = fp8.seed_signature(run4, "fixed")
inc2 = incident.from_diagnosis(
    "FP8 weights: memory down, decode TPOT barely better", rec4, d2, symptom_scope="inference",
    symptom=f"mixed weights {less_more(sig['memory_change_pct'], 0)}, service TPOT p50 {faster(sig['gain_p50_pct'])} / "
            f"p99 {faster(sig['gain_p99_pct'])} than bf16",
    fix="head kept bf16 on purpose, every trunk GEMM on an FP8 kernel, FP8 KV cache for the long bucket",
    reverify=f"Lab 4 serving stream, fixed path: TPOT p50 {faster(sf['gain_p50_pct'])} / p99 "
             f"{faster(sf['gain_p99_pct'])} than bf16; walk {kf}: {fixed_walk.leaf_id}",
    reverify_evidence=fe4[kf], reverify_probe=f"Lab 4 serving stream, {kf} [{s4src}]",
    reverified=fixed_walk.leaf_id == "OK")
md2, _ = incident.save(inc2, folder)
print(md2.read_text() if DETAILS else md2.read_text().split("\n## Key evidence")[0] + f"\n(the whole record: {md2})")

# %% [markdown]
# ## Leaf I: the Tensor-Core / dtype path
# The same 8192³ GEMM in fp32 with TF32 off, in TF32, and in bf16, plus bf16 with K not a multiple of 8.

# %%
if GPU and LIVE:
    dp, src = scenarios.dtype_path(), nb.live_label()
    ms, fe = dp["measurements"], dp["flowchart_evidence"]
else:
    sc = evidence.recorded("scenarios")
    src, fe = sc.label, sc.extra["dtype_path"]["flowchart_evidence"]
    ms = {k: m for k, m in zip(("fp32", "tf32", "bf16", "bf16_unaligned"), sc.results[:4])}
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(7, 3))
ax.bar(list(ms), [m.tflops for m in ms.values()])
ax.set_ylabel("TFLOP/s")
ax.set_title(f"The same GEMM on four math paths\n({src})", fontsize=9)
plt.show()
for k, m in ms.items():
    print(f"{k:>15}: {m.tflops:,.0f} TFLOP/s  [{src}]")
for k in ("fp32", "bf16"):
    print(f"{k} [{src}]: {flowchart.diagnose(fe[k]).render(full=DETAILS)}")

# %% [markdown]
# ## Leaf M: one tuned shape does not predict the workload
# A serving step mixes decode GEMMs (batch 16: memory-bound) with a prefill chunk. A benchmark on one big
# tuned shape predicts it badly; measuring each bucket predicts it.

# %%
if GPU and LIVE:
    w, src = scenarios.workload_mix(), nb.live_label()
    W = {k: w[k] for k in ("measured_step_ms", "predicted_from_tuned_ms", "predicted_from_buckets_ms",
                           "flowchart_evidence")}
else:
    sc = evidence.recorded("scenarios")
    W, src = sc.extra["workload"], sc.label
print(f"measured step {W['measured_step_ms']:.3f} ms; predicted from the tuned shape "
      f"{W['predicted_from_tuned_ms']:.3f} ms; from per-bucket probes {W['predicted_from_buckets_ms']:.3f} ms [{src}]")
for k, ev in W["flowchart_evidence"].items():
    print(f"{k} [{src}]: {flowchart.diagnose(ev).render(full=DETAILS)}")

# %% [markdown]
# ## Summary for the class
# - Topology faults look like "some ranks late + collective waits + healthy single card".
# - "Hardware supports FP8" is not "the path runs FP8": count kernel hits and dequant copies; then compare
#   each step with its byte floor, because a hit is not yet a win.
# - A benchmark is only as good as its shape buckets.
