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
# # 03 · Cross-link tensor parallelism: topology, rank mapping, stragglers
#
# **Needs:** nothing for the mapping part (real `nvidia-smi topo -m` captures of five machine shapes).
# The slow-link run needs root and iproute2 (it builds a rate-limited veth in a network namespace);
# without them the notebook shows the run recorded on a CPU machine, labelled. The one-GPU part runs live
# on a GPU, otherwise shows the H200 run, labelled. The link-rate sweep, the case calibrated to the seed,
# overlap and the counter-example are shown from their CPU recording (a sweep takes many minutes).
# **Takes:** the run times measured on the H200 and on a CPU are in the table of `docs/LEARNING_PATH.md`.
#
# ## Symptom (the seed's case)
# The same serving config loses throughput on an 8-GPU box (the seed's figures are printed under the
# imports, from `lab.SEED_RATIO` and `lab.SEED_TAIL_MS`, the constants the kit calibrates to). Single-GPU
# microbenchmarks are fine. Some ranks finish late; NCCL waits sit between kernels; the slow ranks' traffic goes over
# PCIe instead of NVLink. A machine swap reordered GPU ordinals, and the TP groups, built from ordinals,
# now straddle a slow link. Signature: **local rank tail + collective wait + healthy single-card baseline**.

# %%
import inspect
import os
import shutil

import matplotlib.pyplot as plt
from hwlab.core import evidence, mapping, topology
from hwlab.diagnosis import flowchart
from hwlab import nb
from hwlab.labs import crosslink as lab

GPU = nb.has_gpu()
CAN_NETNS = hasattr(os, "geteuid") and os.geteuid() == 0 and bool(shutil.which("ip") and shutil.which("tc"))
print(nb.live_label(), "| slow link can be built here:", CAN_NETNS)
nb.md(f"The seed's figures: throughput **1.0x → {lab.SEED_RATIO}x** after the swap; tail ranks "
      f"**{lab.SEED_TAIL_MS[0]:.0f}–{lab.SEED_TAIL_MS[1]:.0f} ms** late per step. _[the seed's report, quoted]_")

# %% [markdown]
# ## 1. The topology decides which groups are cheap
# A TP group is as fast as its slowest link. For each real capture: the topology-unaware mapping (consecutive
# ordinals, or ordinals reordered after a swap) against the one `hwlab.core.mapping.choose_tp_groups` picks, with
# the predicted all-reduce time of one message (ring, latency-bandwidth model per link class; the size is
# `mapping.evaluate`'s default, printed below).

# %%
cases = [("dgx1_v100_hybrid_cube_mesh.txt", 2, None), ("pcie4_2socket_pix_sys.txt", 2, [0, 2, 1, 3]),
         ("rtx4090x8_pcie_2socket.txt", 4, [0, 4, 1, 5, 2, 6, 3, 7]), ("h100x8_nvswitch_4socket.txt", 4, None),
         ("b300x8_nvswitch_8nic.txt", 2, None)]
print(f"message: {inspect.signature(mapping.evaluate).parameters['n_bytes'].default / 2**20:.0f} MiB")
for name, tp, order in cases:
    t = topology.parse_topo_matrix((evidence.RECORDED_DIR / "topology" / name).read_text())
    naive = mapping.evaluate(t, mapping.naive_groups(t, tp, order))
    aware = mapping.evaluate(t, mapping.choose_tp_groups(t, tp))
    print(f"{name} tp={tp}{' (reordered ordinals)' if order else ''}\n"
          f"   unaware {naive.groups}: worst {naive.worst}, predicted {naive.step_us:,.0f} us, "
          f"{len(naive.crossings)} pairs on slower links than needed\n"
          f"   aware   {aware.groups}: worst {aware.worst}, predicted {aware.step_us:,.0f} us")

# %% [markdown]
# ## The block each rank runs, beside its reference
# Lab 3 measures PyTorch's own kernels, not a Triton one: what it varies is where the traffic goes. Look at
# the two GEMMs on this rank's *shards* (a column slice of `w1`, a row slice of `w2`) and at what the
# function returns: a partial sum, not the block's output. Summing the partials is the all-reduce over the
# TP group that the mapping places on links; the float64 reference is the unsharded block.

# %%
nb.show_kernel(lab.block_partial, lab.block_reference)

# %% [markdown]
# ## 2. A real slow link, and the straggler it makes
# Six gloo ranks run the TP block (column-parallel linear → GELU → row-parallel linear → all-reduce),
# then a small data-parallel sync. Ranks 4 and 5 live in a network namespace behind a veth pair shaped with
# `tbf`: traffic between them and the host ranks *really* crosses a slower link. The "reordered" mapping
# puts two TP groups across it; the aware one comes from the chooser on the ranks' topology. One launch
# interleaves, round by round, three phases: the devices alone (every rank's compute, no collectives), the
# aware mapping and the naive one, so load from anything else on the machine lands on all three alike.
#
# First the obvious case: a very slow link (`lab.EXTREME_RATE_MBIT`, shown with the result).

# %%
if CAN_NETNS:
    exp, src = lab.experiment(lab.EXTREME_RATE_MBIT, steps=8, overlap=False), nb.live_label() + \
        " (gloo over loopback + shaped veth)"
else:
    rec = evidence.recorded("lab03_slowlink", "cpu")
    exp, src = rec.extra["experiment"], rec.label
fig, axes = plt.subplots(1, 2, figsize=(13, 4), sharey=True)
for ax, name in zip(axes, ("naive", "aware")):
    per = exp[name]["report"]["per_rank"]
    ranks = sorted(per, key=int)
    bottom = [0.0] * len(ranks)
    for part in ("compute_ms", "tp_allreduce_ms", "dp_sync_ms"):
        vals = [per[r][part] for r in ranks]
        ax.bar([f"rank {r}" for r in ranks], vals, bottom=bottom, label=part.replace("_ms", ""))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_title(f"{name}: groups {exp[name]['groups']}\nstep {exp[name]['report']['step_ms']:.1f} ms ({src})",
                 fontsize=8)
    ax.set_ylabel("median ms per step")
    ax.legend(fontsize=7)
plt.tight_layout()
plt.show()
for name in ("naive", "aware"):  # the rank tail in K's unit (% of the step), the figure the walk reads
    r = exp[name]["report"]
    print(f"{name}: tail ranks {r['tail_ranks']}, rank tail {exp[name]['flowchart_evidence']['rank_tail_pct']:.1f}% of "
          "the step" + "".join(f"; {n}" for n in r["notes"]))
print(f"throughput naive / aware: {exp['throughput_naive_over_aware']:.2f}x at {exp['rate']}  [{src}]")

# %% [markdown]
# ## 3. Place it on the flowchart: every answer measured
# B: one rank's block compute alone in one process against this machine's floor (measured copy and GEMM
# ceilings, one thread: one rank's "device" on a CPU). D: the multi-rank step over the devices-alone step of
# the same rounds. K: the per-rank tail. The naive mapping's evidence, as the walk will read it:

# %%
ev_naive = exp["naive"]["flowchart_evidence"]
nb.show_evidence(ev_naive, f"naive; {src}")

# %% [markdown]
# **Checkpoint: your diagnosis first.** Fill in the leaf, the metric that decides the last question before
# it and its value as the table shows it. The kit's walks show once this passes.

# %%
# replace each None: leaf="<a leaf letter>", metric="<a metric name from the table>", value=<its value>
ANSWER = nb.answer("03", leaf=None, metric=None, value=None, evidence=ev_naive)
CP = nb.checkpoint("03", ANSWER, flowchart.diagnose(ev_naive), ev_naive, source=src)

# %%
DETAILS = False  # True: every step's rule, spread and source
nb.walk(CP, f"naive [{src}]", full=DETAILS)
with nb.gated(CP, "the aware mapping's walk"):
    print(f"aware [{src}]: {flowchart.diagnose(exp['aware']['flowchart_evidence']).render(full=DETAILS)}")
    nb.show_mermaid(flowchart.diagnose(ev_naive).mermaid())
nb.explain(CP, """After the fix the same probe walks the aware mapping: the line above says whether its tail and
slowdown are gone, and marks a step whose spread straddles its threshold as borderline.""")

# %%
if CP.passed:  # what the aware walk says about the fix, following the branch this run took
    nb.md(lab.aware_walk_note(exp, flowchart.diagnose(exp["aware"]["flowchart_evidence"])) + f" _[{src}]_")

# %% [markdown]
# ## 3b. The same question from the job's own profiler traces
# Real jobs rarely carry `StepLog`; many already write a `torch.profiler` trace per rank
# (`tensorboard_trace_handler`). `hwlab ranks --traces DIR` reads them streaming and asks, per collective,
# which rank arrived last: the last arriver waits least, so its time inside the collective is the shortest,
# and no common clock is needed. Three recorded runs of `examples/profiled_torchrun.py` (four gloo ranks on
# a CPU machine): one rank slowed before its all-reduce; every all-reduce carrying a payload the link
# cannot move in step (the link-bound shape: every rank waits inside); and a clean run. (A run behind
# section 2's shaped veth, `examples/profiled_slowlink.py`, is exercise 05's to read.) Beside
# them, the step-log view of section 2: the same split into own work and waiting, from the other source.

# %%
from pathlib import Path

from hwlab.diagnosis import ranks_traces
from IPython.display import Markdown, display

TRACES = evidence.TRACES_DIR  # shipped inside the package
if TRACES.is_dir():
    tr = {k: ranks_traces.report(TRACES / k) for k in ("slow_rank", "slow_link", "clean")}
    src_tr = "recorded on a CPU machine: torch.profiler traces of 4 gloo ranks under torchrun"
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6), sharey=False)
    for ax, (name, rep) in zip(axes, tr.items()):
        per = rep["per_rank"]
        rk = sorted(per, key=int)
        bottom = [0.0] * len(rk)
        for part in ("busy_ms", "exposed_comm_ms", "idle_ms"):
            vals = [per[r][part] for r in rk]
            ax.bar([f"rank {r}" for r in rk], vals, bottom=bottom, label=part.replace("_ms", ""))
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_title(f"traces, {name}: {rep['finding']['names'] or 'nothing named'}"[:60], fontsize=8)
        ax.set_ylabel("median ms per step")
        ax.legend(fontsize=7)
    per = exp["naive"]["report"]["per_rank"]  # section 2's step-log view, same axes units
    rk = sorted(per, key=int)
    own = [per[r]["compute_ms"] for r in rk]
    wait = [per[r]["tp_allreduce_ms"] + per[r]["dp_sync_ms"] for r in rk]
    axes[3].bar([f"rank {r}" for r in rk], own, label="compute")
    axes[3].bar([f"rank {r}" for r in rk], wait, bottom=own, label="collectives")
    axes[3].set_title(f"step log, naive mapping (section 2)", fontsize=8)
    axes[3].legend(fontsize=7)
    plt.tight_layout()
    plt.show()
    for name, rep in tr.items():
        last = {r: s["pct_arrived_last"] for r, s in rep["per_rank"].items()}
        print(f"{name}: arrived last (% of {rep['collectives']['matched']} collectives) {last}; "
              f"exit {1 if ranks_traces.has_finding(rep) else 0} [{src_tr}]")
        with nb.gated(CP, "its walk"):
            print(f"{name}: walk {' -> '.join(rep['flowchart']['path'])}")
    sr, sl = tr["slow_rank"], tr["slow_link"]
    f1, f2 = sr["finding"], sl["finding"]
    display(Markdown(
        f"From the traces ({src_tr}): in the slowed run **rank {f1['rank']}** arrived last in "
        f"{f1['pct_arrived_last']:.0f}% of the collectives while every rank's step lasted about as long "
        f"({min(s['step_ms'] for s in sr['per_rank'].values()):.1f}-{max(s['step_ms'] for s in sr['per_rank'].values()):.1f} ms): "
        f"the collective is a barrier, so only arrival tells the ranks apart. Its busy time is "
        f"{f1['busy_over_peers']:.2f}x the others' (the single-device check): not its device. Behind the shaped "
        f"link no rank is named; the last arriver still spends {f2['collective_floor_pct']:.0f}% of the step inside "
        f"the collective, so the report names {f2['names']} ({f2['why']}). Section 2's step log names ranks "
        f"{exp['naive']['report']['tail_ranks']} by their late finish [{src}]."))
else:
    print("the recorded traces (hwlab/recorded/traces in the package) are not here: record your own with "
          "examples/profiled_torchrun.py and run `hwlab ranks --traces DIR`")

# %% [markdown]
# ## 4. Calibrating to the seed's ratio
# The seed's box lost far less than the obvious case above. The link's rate decides how much the naive
# mapping loses, so the kit sweeps it (each point a real run) and interpolates the rate where the naive
# mapping delivers the seed's ratio of the aware one's throughput (`lab.SEED_RATIO`); that rate becomes
# the case-study run, accepted within `lab.SEED_RATIO_BAND` of it (both printed under the plot).
# Recorded on a CPU machine: a sweep takes many minutes.

# %%
sw = evidence.recorded("lab03_linksweep", "cpu")
pts, cal = sw.extra["sweep"], sw.extra["calibrated"]
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot([p["rate_mbit"] for p in pts], [p["throughput_naive_over_aware"] for p in pts], "o-", label="sweep")
ax.plot([cal["rate_mbit"]], [cal["throughput_naive_over_aware"]], "r*", ms=14, label="calibrated case")
ax.axhline(lab.SEED_RATIO, color="k", ls="--", lw=1, label="seed: 0.72x")
ax.axhspan(lab.SEED_RATIO - lab.SEED_RATIO_BAND, lab.SEED_RATIO + lab.SEED_RATIO_BAND, color="k", alpha=0.08)
ax.set_xscale("log")
ax.set_xlabel("slow link rate (Mbit/s)")
ax.set_ylabel("throughput naive / aware")
ax.set_title(f"Naive mapping's throughput vs the link ({sw.label})", fontsize=9)
ax.legend(fontsize=8)
plt.show()
for p in pts:
    r = p["naive"]["report"]
    print(f"{p['rate']:>9}: naive/aware {p['throughput_naive_over_aware']:.2f}x, tail ranks {r['tail_ranks']}, "
          f"{r['tail_ms']:.1f} ms late per step")
print(f"calibrated: {cal['rate']} -> {cal['throughput_naive_over_aware']:.2f}x (seed {lab.SEED_RATIO}x, "
      f"accepted within ±{lab.SEED_RATIO_BAND})  [{sw.label}]")

# %% [markdown]
# ### The calibrated case: how late, who waits, and the step series
# Per rank: how much later than the on-time ranks it finishes its own work each step (median over steps),
# and how long it sits inside collectives (TP all-reduce + DP sync). The seed's tail ranks finish late by
# the span quoted under the symptom; the CPU block's step is not a decode step, so the comparison states its
# scale factor.

# %%
nr, ar = cal["naive"]["report"], cal["aware"]["report"]
ranks = sorted(nr["per_rank"], key=int)
fig, axes = plt.subplots(1, 2, figsize=(13, 3.5))
axes[0].bar([f"rank {r}" for r in ranks], [nr["per_rank"][r]["late_ms"] for r in ranks], label="late (ms/step)")
axes[0].bar([f"rank {r}" for r in ranks], [nr["per_rank"][r]["comm_wait_ms"] for r in ranks], alpha=0.4,
            label="in collectives (ms/step)")
axes[0].set_title(f"naive mapping at {cal['rate']} ({sw.label})", fontsize=8)
axes[0].legend(fontsize=7)
for rep, name in ((nr, "naive"), (ar, "aware")):
    axes[1].plot(rep["step_series_ms"], label=f"{name}: {rep['spikes']['n']} spikes"
                 + (" (periodic)" if rep["spikes"]["periodic"] else ""))
axes[1].set_xlabel("step")
axes[1].set_ylabel("ms")
axes[1].set_title("step time per round (median rank)", fontsize=8)
axes[1].legend(fontsize=7)
plt.tight_layout()
plt.show()
seed = cal["seed"]
print(f"tail ranks {nr['tail_ranks']} finish {nr['tail_ms']:.1f} ms late per step "
      f"({seed['tail_pct_of_aware_step']:.0f}% of the {seed['cpu_aware_step_ms']:.0f} ms aware step) [{sw.label}]")
print(f"scale: the figures above are as measured, no factor applied. At 0.72x a tail that explains the whole loss "
      f"is 0.39 of the step, so the seed's 10-20 ms implies a {seed['seed_step_ms_range'][0]:.0f}-"
      f"{seed['seed_step_ms_range'][1]:.0f} ms step; this CPU block's healthy step is {seed['cpu_aware_step_ms']:.0f} ms "
      f"(it stretches with the machine's load), so on the seed's step scale (x{seed['scale']:.2f}) the tail reads "
      f"{seed['tail_ms_at_seed_scale']:.1f} ms")
lo_ms, hi_ms = lab.SEED_TAIL_MS
where = ("inside" if lo_ms <= seed["tail_ms_at_seed_scale"] <= hi_ms else
         "below" if seed["tail_ms_at_seed_scale"] < lo_ms else "above")
nb.md(f"Against the seed: on its step scale this tail is **{where}** the seed's {lo_ms:.0f}-{hi_ms:.0f} ms. "
      + ("The calibration and the seed agree on the tail as well as on the ratio." if where == "inside" else
         "The link rate was calibrated to the seed's throughput ratio, not to its tail, so the tail is a result "
         "here, not a target: this block's step splits its loss between lateness and time inside collectives "
         "differently from the seed's decode step, and the machine's load stretches the step it is scaled by. "
         "What carries over is the shape: the same ranks late every step, behind the same slow link.")
      + f" _[{sw.label}]_")
sp = nr["spikes"]
print("periodic spikes: " + (f"yes, every {sp['period_steps']} steps" if sp["periodic"] else
      f"no ({sp['n']} steps over {lab.SPIKE_OVER_MEDIAN}x the median, not periodic): the seed's "
      "periodic decode spikes come from its serving loop, which this block does not have"))
with nb.gated(CP, "the calibrated case's walks"):
    for name in ("naive", "aware"):
        print(f"{name} [{sw.label}]: {flowchart.diagnose(cal[name]['flowchart_evidence']).render(full=DETAILS)}")
    nb.md(lab.aware_walk_note(cal, flowchart.diagnose(cal["aware"]["flowchart_evidence"])) + f" _[{sw.label}]_")

# %% [markdown]
# ## 5. Rule 3c: did the overlap really happen?
# The overlapped block splits the batch into micro-batches and issues each one's all-reduce asynchronously
# (`dist.all_reduce(..., async_op=True)`) while the next computes. Measured in the same launch: compute alone,
# the all-reduces alone and both overlapped. Only the shorter of the two can hide under the longer, so the
# share is measured against what *could* hide:
#
# **hidden % = 100 · (comm alone + compute alone − overlapped) / min(comm alone, compute alone)**
#
# Two cases read differently. Under half of what could hide hidden: the overlap did not really happen (the
# seed's rule 3c), a code problem. Most of it hidden while the all-reduce alone still outlasts the compute:
# the overlap did all it could and the *link* is the limiter; no overlap fixes that, moving the traffic does.
# Each walk below says which case it is, with the launches' spread beside the share.

# %%
from hwlab.diagnosis.flowchart_checks import overlap_verdict

first = evidence.recorded("lab03_slowlink", "cpu")
o1 = first.extra["experiment"]["overlap"]
keys, names = ("t_compute_alone_ms", "t_comm_alone_ms", "t_overlapped_ms"), ("compute alone", "comm alone", "overlapped")
fig, ax = plt.subplots(figsize=(8, 3.5))
for i, side in enumerate(("fast", "slow")):
    ax.bar([x + 0.4 * i for x in range(3)], [o1[side][k] for k in keys], width=0.4,
           label=f"{side}: {o1[side]['link']}, " + lab.overlap_shown(o1[side])["text"].split(":")[0])
ax.set_xticks([x + 0.2 for x in range(3)], names)
ax.set_ylabel("ms per step (pair's slower rank, median)")
ax.set_title(f"Overlap of the micro-batched block's all-reduces ({first.label})", fontsize=9)
ax.legend(fontsize=8)
plt.show()
for side in ("fast", "slow"):
    o = o1[side]
    print(f"{side} ({o['link']}): {lab.overlap_shown(o)['text']} (median of {len(o['hidden_pct_repeats'])} "
          "launches: " + ", ".join(f"{h:.0f}%" + ("" if 0 <= h <= 100 else " invalid") for h in o["hidden_pct_repeats"])
          + f"); comm alone {o['t_comm_alone_ms']:.1f} ms, compute alone {o['t_compute_alone_ms']:.1f} ms  [{first.label}]")
oc = cal["overlap"]["slow"]
print(f"calibrated case ({oc['link']}): {lab.overlap_shown(oc)['text']} (launches: "
      + ", ".join(f"{h:.0f}%" + ("" if 0 <= h <= 100 else " invalid") for h in oc["hidden_pct_repeats"])
      + f")  [{sw.label}]")
print(f"rule 3c: under {lab.OVERLAP_FAILED_PCT:.0f}% of what could hide, the overlap did not really happen; "
      "the walks' overlap lines say which case each link is:")
with nb.gated(CP, "the walks' overlap lines"):
    for case, src_, name in ((first.extra["experiment"], first.label, "naive"),
                             (first.extra["experiment"], first.label, "aware"), (cal, sw.label, "naive")):
        ev_ = case[name]["flowchart_evidence"]
        d = flowchart.diagnose(ev_)
        print(f"{case['rate']} {name}: {d.compact()}; {overlap_verdict(ev_)}  [{src_}]")
        if DETAILS:  # the whole overlap reading: the share's formula, its spread, what the times alone say
            print("\n".join(d.lens_notes))

# %% [markdown]
# ## 6. The counter-example (反例): a kernel regressed on every rank
# Same launch, aware mapping, but every rank computes its block one row at a time (each row re-reads the
# weight shards). Everyone is slow together: no rank tail, and the single-device baseline is slow too. The
# seed's signature of a topology fault is **local rank tail + communication wait + single-card baseline
# normal**; here only the waits are there, so the walk goes to the kernel, not to the mapping.

# %%
cols = ("rank_tail_pct", "tail_ranks", "tail_ms", "comm_wait_ms_median", "slowdown_vs_floor", "e2e_slowdown")
with nb.gated(CP, "the signature table and its walks"):
    print(f"signature, measured in one launch [{sw.label}]")
    print(f"{'case':34}" + "".join(f"{c:>21}" for c in cols) + f"{'leaf':>6}")
    for row in cal["signature"]:
        key = "naive" if row["case"].startswith("slow link") else "regressed"
        leaf = flowchart.diagnose(cal[key]["flowchart_evidence"]).leaf_id
        print(f"{row['case']:34}" + "".join(f"{row[c]:>21.2f}" if isinstance(row[c], float) else f"{str(row[c]):>21}"
                                            for c in cols) + f"{leaf:>6}")
    print(f"regressed kernel [{sw.label}]: {flowchart.diagnose(cal['regressed']['flowchart_evidence']).render(full=DETAILS)}")

# %% [markdown]
# ## 7. One GPU: the all-reduce in device memory vs staged through host memory
# Without peer-to-peer, NCCL moves data GPU → pinned host memory → GPU over PCIe. On one GPU the TP block's
# two shards can sum their partials in device memory, or stage them through the host link the same way.

# %%
if GPU:
    d, s = lab.single_gpu_tp_step(staged=False), lab.single_gpu_tp_step(staged=True)
    src1, link = nb.live_label(), None
else:
    rec3 = evidence.recorded("lab03_crosslink")
    d, s = rec3.results[0], rec3.results[1]
    src1, link = rec3.label, rec3.extra["host_link_gbps"]
print(f"{d.summary()}\n{s.summary()}\nstaged / device step time: {s.t_ms / d.t_ms:.2f}x [{src1}]")
if link:
    print(f"host link measured in the same run: h2d {link['h2d']:.1f} GB/s, d2h {link['d2h']:.1f} GB/s")

# %% [markdown]
# ## 8. Several GPUs: force the slow route and read NCCL's choice
# `lab.launch(n, groups, nccl=True, extra_env=lab.FORCE_SLOW_ROUTE)` runs the same block over NCCL with
# `NCCL_P2P_DISABLE=1` and parses `NCCL_DEBUG=INFO` for the transport NCCL chose (P2P/IPC, SHM, NET).
# NVLink multicast stays off (`NCCL_NVLS_ENABLE=0`).

# %%
print("P2P matrix:", lab.p2p_matrix_gbps().get("skipped", "measured"))
print("NCCL collectives:", lab.collectives(2, nccl=True).get("skipped", "measured"))

# %% [markdown]
# ## Knobs: machine, TP size, ordinal order

# %%
import ipywidgets as W
from IPython.display import display

machines = sorted(p.name for p in (evidence.RECORDED_DIR / "topology").glob("*.txt"))
mw = W.Dropdown(options=machines, value="pcie4_2socket_pix_sys.txt", description="machine")
tpw = W.Dropdown(options=[2, 4], value=2, description="TP size")
orderw = W.Text(value="0,2,1,3", description="ordinals")
out = W.Output()


def show(_=None):
    out.clear_output()
    with out:
        t = topology.parse_topo_matrix((evidence.RECORDED_DIR / "topology" / mw.value).read_text())
        try:
            order = [int(x) for x in orderw.value.split(",")] if orderw.value.strip() else None
            if order and sorted(order) != list(range(t.n_gpus)):
                order = None
            n = mapping.evaluate(t, mapping.naive_groups(t, tpw.value, order))
            a = mapping.evaluate(t, mapping.choose_tp_groups(t, tpw.value))
        except ValueError as e:
            print(e)
            return
        print(t.render())
        print(f"unaware {n.groups}: worst {n.worst}, {n.step_us:,.0f} us\naware   {a.groups}: worst {a.worst}, {a.step_us:,.0f} us")


for w in (mw, tpw, orderw):
    w.observe(show, names="value")
display(W.VBox([W.HBox([mw, tpw, orderw]), out]))
show()

# %% [markdown]
# ## Summary
# - Save `nvidia-smi topo -m` and the rank-to-device map at start-up; build TP groups from the topology,
#   never from ordinals alone.
# - Per-rank step time splits into compute, TP all-reduce and the wait for others: the tail ranks have
#   slow all-reduces, everyone else waits — that is the signature, not a slow kernel.
# - Calibrated to the seed's ratio, the tail is a fraction of a step, not a multiple: measure it per rank.
# - Overlap hides a link only while its all-reduce fits under the compute (rule 3c).
# - If every rank is slow and the single-device baseline is slow too, suspect the kernel first (反例).
# - Next: `exercises/ex03_cross_link_tp.ipynb` — a job's rank map on another capture: the groups on the slow link, then better groups.
