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
# # 08 · Examine your own kernel: point the flowchart at your code
#
# **Needs:** nothing special; on a GPU the examination runs there, on a CPU it runs on the CPU (labelled,
# the leaf indicative) and the H200 examinations this kit recorded are shown beside it. **Takes:** the run
# times measured on the H200 and on a CPU are in the table of `docs/LEARNING_PATH.md`.
#
# Labs 1-4 walk the flowchart over the kit's own kernels. The week after, the slow kernel is *yours*.
# `hwlab examine` takes any PyTorch or Triton callable and does what the labs did, under the same protocol:
#
# 1. checks the call (it runs, returns a tensor, leaves its inputs alone; inputs never constant);
# 2. counts its work: **required bytes** (inputs read once, outputs written once), **FLOPs**
#    (`torch.utils.flop_counter`), and a **traffic model** (each aten op's tensors; sector amplification
#    from strides and real index values) — each labelled *estimated* unless you pass them;
# 3. times it (warm-up to the sustained state, device events, median and p10-p90, fresh input sets rotated
#    past L2 when you give an input factory);
# 4. profiles a few calls (kernels per call, GPU idle %, dominating kernels, tensor-core or not, Triton
#    spills), and with `--ncu` adds Nsight Compute counters, kept apart;
# 5. walks the flowchart on **measured metrics only**, names the leaf, the seed's actions, the lab that
#    teaches it, and drafts the incident record.
#
# ```
# hwlab examine examples/shuffled_gather.py:shuffled_gather          # inputs() from the same module
# hwlab examine mymodel.py:block --inputs mymodel.py:make_batch --json --out runs/block.json
# ```
# In Python: `hwlab.examine(fn, *args)` or `hwlab.examine(fn, make_inputs=factory)`.

# %%
import torch

import hwlab
from hwlab.core import ceilings, evidence
from hwlab import nb
from hwlab.examine.report_text import against_prediction, format_table, plot_slowdowns, repeats_disagree, table
from hwlab.examine.target import load

print(nb.live_label())
here = ceilings.get(quick=True)  # this machine's ceilings (cached after the first run)
print("ceilings:", here.label)

# %% [markdown]
# ## First, read an examination yourself
# Before the kit walks anything here, read one examination the kit recorded on the H200: the function, its
# measured time, and the metrics the flowchart reads from it.

# %%
from hwlab.diagnosis import flowchart

rec_path = evidence.RECORDED_DIR / "h200" / "examine.json"
rec = evidence.load(rec_path)
first = next(e for e in rec.extra["entries"] if e["name"] == "gemm_fp32")
ev_first = {**first["evidence"], "metric_sources": first["evidence_sources"]}
print(f"{first['name']}: {first['target']}")
print(next(m for m in rec.results if m.name == first["measurement"]).summary())
nb.show_evidence(ev_first, f"{first['name']}; {rec.label}")

# %% [markdown]
# **Checkpoint: your diagnosis first.** Fill in the leaf, the metric that decides the last question before
# it and its value as the table shows it. The kit's walk (computed now from the same evidence) shows once
# this passes.

# %%
# replace each None: leaf="<a leaf letter>", metric="<a metric name from the table>", value=<its value>
ANSWER = nb.answer("08", leaf=None, metric=None, value=None, evidence=ev_first)
CP = nb.checkpoint("08", ANSWER, flowchart.diagnose(ev_first), ev_first, source=rec.label)

# %%
nb.walk(CP, f"{first['name']} [{rec.label}]")

# %% [markdown]
# ## One of the examples, live
#
# `examples/unfused_chain.py` is an activation chain written op by op: six elementwise kernels, each
# reading and writing the whole tensor.
#
# **Prediction:** the required bytes are one read of `x` and one write of the result (8 bytes per element
# in fp32); the six kernels move 52 bytes per element. On a GPU it should run ~6x over its floor, at DRAM
# speed: the bandwidth leaf **G**.

# %%
fn, mod = load(f"{evidence.example('unfused_chain.py')}:unfused_chain")  # shipped inside the package
ex = hwlab.examine(fn, make_inputs=mod.inputs, ceilings=here, name="unfused_chain")
DETAILS = False  # True: the whole report, as `hwlab examine` prints it (counts, profile, every step's rule)
if DETAILS:
    print(ex.report())
else:
    print(ex.measurement.summary())
    nb.show_evidence({**ex.evidence, "metric_sources": ex.evidence_sources}, ex.label)
    print(f"walk: {ex.diagnosis.compact()}")
nb.show_mermaid(ex.diagnosis.mermaid())
bl = ex.diagnosis.borderline
flip = repeats_disagree(ex.whole_repeat_leaves, "the chain")  # the blocks' own walks, from this run
nb.md(f"Live ({ex.label}): the walk {against_prediction(ex.diagnosis, 'G')}." + (
    "" if torch.cuda.is_available() or ex.diagnosis.leaf_id == "G" else
    " The prediction is a GPU's: on this CPU the figures are the CPU's against its own ceilings, and the "
    "H200's examination in the table below is the evidence for the chain.") + (
    f" **BORDERLINE on this machine** at {', '.join(s.question for s in bl)}: the measured spread contains the "
    "threshold, so a re-run (or the same run under other load) can take the other branch; this walk is not a "
    "verdict here." if bl and not flip else "") + (f" {flip}" if flip else ""))

# %% [markdown]
# On a CPU the numbers are the CPU's against the CPU's ceilings: its caches are large next to these small
# tensors, so the walk there is indicative of the code path, never a GPU verdict. The evidence lists the
# source of every metric; nothing in the walk was typed in.
#
# ## Every example on the H200 (recorded)
#
# Eight functions written apart from the labs, each with the leaf its cause predicts (named below once the
# checkpoint above passes). `tools/record_examine.py` examined each through the API, and two through the
# command line.

# %%
nb.explain(CP, """The leaf each example's cause predicts: the unfused chain and a shuffled gather (**G**), an fp32
GEMM without TF32 and a bf16 GEMM with K = 8191 (**I**), a Python loop of tiny kernels and a Triton tile that
spills (**J**), and a cuBLAS bf16 GEMM and a `torch.compile`d chain (**OK**).""")
if rec_path.exists():
    rec = evidence.load(rec_path)
    with nb.gated(CP, "the recorded examinations (the checkpoint's function is one of them)"):
        nb.banner("hwlab examine on the example functions", rec.label)
        rows = table(rec.extra["entries"])
        print(format_table(rows))
        for name, c in rec.extra.get("cli", {}).items():
            print(f"command line: {c['command']} -> leaf {c.get('leaf')}, exit code {c['rc']}")
        plot_slowdowns(rows, rec.label)
else:
    print("examine.json has not been recorded on the H200 yet (tools/record_examine.py on a GPU); "
          "showing this machine's live examination instead")
    plot_slowdowns(table([{"name": "unfused_chain", "leaf": ex.leaf_id, "expected_leaf": "G",
                           "path": ex.diagnosis.path, "evidence": ex.evidence}]), ex.label)

# %% [markdown]
# ## A whole model, part by part
#
# Real models are not single-cause. `examples/small_transformer.py` is a small GPT-style forward written
# the way model code is written: GEMMs, attention through SDPA, an embedding lookup, and a GELU spelled
# out op by op. One aggregate number per flowchart question averages these together; `examine` therefore
# also splits the measured time **by part** (each kernel joined to the aten op that launched it, grouped
# by class, plus the GPU's idle time between launches), floors each part on its own bytes and FLOPs (its
# bytes counted as if each run of its consecutive ops were fused), and walks the flowchart once per part
# that holds at least a tenth of the step. The **headline** is the part whose expected gain (its time
# minus its floor) is largest; the others follow in order.
#
# **Prediction:** on a GPU the op-by-op GELU makes the elementwise part large and far above its fused
# floor, so it should be the headline with leaf G (fusion), ahead of the GEMMs, which cuBLAS runs near
# their ceiling. The line under the plot says how this run's headline compares.

# %%
from IPython.display import Markdown, display

from hwlab.examine.report_text import fix_summary, plot_parts
from hwlab.examine.target import load_model

tf = evidence.example("small_transformer.py")
module, args, make = load_model(f"{tf}:model")
mixed = hwlab.examine(module, *args, make_inputs=make, ceilings=here, name="small_transformer (GELU op by op)")
with nb.gated(CP, "the model's parts and their walks (an fp32 GEMM among them)"):
    lines = mixed.parts.render()
    print("\n".join(lines if DETAILS else [ln for ln in lines if not ln.startswith("       ")]))
    if not DETAILS:  # one line per part's walk; DETAILS = True prints each step
        for p in mixed.parts.ranked:
            print(f"  walk of {p.name}: {p.walk.compact()}")
    plot_parts(mixed.parts.to_dict(), f"time per part, {mixed.label}")
    h, whole = mixed.headline, mixed.diagnosis
    whole_said = (f"lands on **{whole.leaf_id}**" if whole.leaf_id else
                  f"stops undecided at **{whole.undecided.id}** (`{whole.compact()}`)" if whole.undecided else
                  "reaches no leaf")
    display(Markdown(
        f"Live ({mixed.label}): the whole-function walk {whole_said}; the headline "
        f"part is **{h.name}**, at {h.pct_of_floor:.0f}% of its floor; reaching it would save {h.saved_ms:.3g} ms of "
        f"{mixed.measurement.t_ms:.3g} ms ({h.speedup:.2f}x the whole forward). Its walk "
        f"{against_prediction(h.walk, 'G')}" + ("." if torch.cuda.is_available() or h.leaf_id == "G" else
        ". On a CPU the parts are op self times against the CPU's ceilings: the H200's record further down is the "
        "evidence for the prediction. The fix below fuses the chain either way.")
        if h and h.pct_of_floor is not None else "Live: no part was walked to a leaf on this machine."))
    for said in (repeats_disagree(mixed.whole_repeat_leaves, "the whole function"),
                 repeats_disagree(h.repeat_leaves, f"the headline part ({h.name})") if h else ""):
        if said:
            display(Markdown(said))

# %% [markdown]
# ### Apply the top fix and examine again
#
# The prediction's leaf, G, names fusion. The smallest fix that fuses the chain is the one-kernel
# `F.gelu(approximate="tanh")` (`model_fused`: the same weights). `torch.compile` would fuse it too, and
# more. The first examination predicted what the fix can save (the part's time minus its floor); the
# second times the model again, and the cell says whether the difference it measures stands out of the
# two runs' spreads on this machine. The floor assumes every run of the part's consecutive ops fused into
# one kernel, so a fix that fuses only the GELU (and leaves the residual add and the layer norm apart) can
# fall short of it: the prediction is the most this part can give.

# %%
module_f, args_f, make_f = load_model(f"{tf}:model_fused")
fused = hwlab.examine(module_f, *args_f, make_inputs=make_f, ceilings=here, name="small_transformer (fused GELU)")
with nb.gated(CP, "the fixed model's parts and the saving"):
    print("\n".join(fused.parts.render()[:10]))
    fx = fix_summary(mixed.parts.to_dict(), fused.measurement.t_ms, mixed.measurement.t_ms)
    b, a = mixed.measurement, fused.measurement
    # the saving stands out only where the two runs' p10-p90 bands do not overlap
    apart = a.t_p90_ms < b.t_p10_ms
    said = (f"the two runs' spreads do not overlap, so this run **measured a saving** of "
            f"{fx['measured_saving_ms']:.3g} ms ({100 * fx['measured_over_predicted']:.0f}% of the prediction)"
            if apart else
            f"the two runs' spreads overlap (the difference of medians, {fx['measured_saving_ms']:.3g} ms, lies inside "
            "them), so **this machine cannot support a saving either way** here: a busy or CPU host; the H200 "
            "record below is the evidence") if fx["headline"] else ""
    display(Markdown(
        f"Live: predicted saving **{fx['predicted_saving_ms']:.3g} ms** (part {fx['headline']}); before "
        f"{b.t_ms:.3g} ms (p10-p90 {b.t_p10_ms:.3g}-{b.t_p90_ms:.3g}), after {a.t_ms:.3g} ms (p10-p90 "
        f"{a.t_p10_ms:.3g}-{a.t_p90_ms:.3g}): {said}."
        if fx["headline"] else "Live: the headline part has no gain figure on this machine; see the H200 record below."))

# %% [markdown]
# On a CPU these parts are CPU op self times and the walk is indicative only. The H200 recording below is
# the evidence: the mixed model, its fix, a decode step with a KV cache, and a random row gather examined
# with and without Nsight Compute.

# %%
parts_path = evidence.RECORDED_DIR / "h200" / "examine_parts.json"
if parts_path.exists():
    prec = evidence.load(parts_path)
    ent = prec.extra["entries"]
    fx = prec.extra["fix"]
    nc = prec.extra["cli"].get("row_gather_ncu", {})
    ncu_ev = (nc.get("ncu") or {}).get("evidence", {})
with nb.gated(CP, "the recorded model, its fix, the decode step and the gather (leaves among them)"):
    if parts_path.exists():
        nb.banner("hwlab examine, part by part", prec.label)
        for key in ("model", "model_fused", "decode", "row_gather"):
            plot_parts(ent[key]["parts"], f"{key}: time per part (recorded, {prec.label})")
        display(Markdown(
            f"Recorded on the H200: the mixed model's whole-function walk lands on "
            f"**{ent['model']['whole_function_leaf']}**; its headline part is **{fx['headline']}** on "
            f"**{fx['headline_leaf']}**. The fix was predicted to save {fx['predicted_saving_ms']:.3g} ms and saved "
            f"{fx['measured_saving_ms']:.3g} ms ({100 * fx['measured_saving_ms'] / fx['predicted_saving_ms']:.0f}% of "
            f"the prediction; before {fx['before_ms'][1]:.3g} ms, p10-p90 {fx['before_ms'][0]:.3g}-{fx['before_ms'][2]:.3g}; "
            f"after {fx['after_ms'][1]:.3g} ms, p10-p90 {fx['after_ms'][0]:.3g}-{fx['after_ms'][2]:.3g}). "
            f"The decode step's headline is **{ent['decode']['parts']['headline']}** on "
            f"**{ent['decode']['leaf']}**. The row gather lands on **{ent['row_gather']['leaf']}** without ncu and on "
            f"**{nc.get('leaf')}** with it (counted sector amplification "
            f"{ncu_ev.get('sector_amplification', float('nan')):.2f}, DRAM {ncu_ev.get('dram_pct_of_peak', float('nan')):.1f}% "
            f"of peak)."))
    else:
        print("examine_parts.json has not been recorded on the H200 yet (tools/record_examine.py --parts)")

# %% [markdown]
# Reading the gather: there is no matmul in it, so the Tensor-Core question is answered *not applicable*
# (measured: no matmul FLOPs counted, no tensor-core kernel in the profile) and the walk goes on to J. J is
# then split by what was measured: launch gaps, registers and occupancy (from the profiler's kernel records,
# or from Nsight Compute), and the achieved bandwidth against the copy ceiling (the cell below shows which
# rule held). For a gather the actions that fit are to sort or batch the indices and to widen the rows,
# not a dtype or a tile.

# %%
with nb.gated(CP, "the gather's walks"):
    if parts_path.exists():
        for label, src in (("without ncu", ent["row_gather"]["parts"]), ("with --ncu", nc.get("parts") or {})):
            g = next((p for p in src.get("parts", []) if p["name"] == "gather/scatter"), None)
            if g and g.get("j_detail"):
                j = g["j_detail"]
                display(Markdown(f"Recorded, {label}: leaf **{g['leaf']}**, J in detail: **{j['cause']}** "
                                 f"({j['rule']}). Figures: " + ", ".join(
                                     f"{k} = {v:.3g}" for k, v in j["figures"].items()) +
                                 ". Actions: " + "; ".join(g["actions"][:3]) + "."))

# %% [markdown]
# ## Your turn: examine a function of your own
#
# Replace `my_layer_norm` with your own code (any callable taking tensors). Before running, write down
# its required bytes and which leaf you expect; then read the evidence and its sources.

# %%
def my_layer_norm(x, w, b):
    mu = x.mean(dim=-1, keepdim=True)
    var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + 1e-5) * w + b


def my_inputs():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rows, d = (16384, 4096) if dev == "cuda" else (256, 256)
    return torch.randn(rows, d, device=dev), torch.randn(d, device=dev), torch.randn(d, device=dev)


mine = hwlab.examine(my_layer_norm, make_inputs=my_inputs, ceilings=here)
print(mine.report() if DETAILS else f"{mine.measurement.summary()}\nwalk: {mine.diagnosis.compact()}\n"
      "(print(mine.report()) for the whole report: counts, profile, sources, every step's rule)")
flip = repeats_disagree(mine.whole_repeat_leaves, "your function")
if flip:
    nb.md(flip)

# %% [markdown]
# ## Summary
#
# * `hwlab examine` measures a function under the kit's protocol and walks the flowchart on measured
#   metrics only; where a question cannot be measured for one function on one device, the walk stops and
#   says what to run (`--ncu`, per-rank step times).
# * Bytes and FLOPs you pass win; otherwise they are estimated and labelled so. The traffic model sees
#   aten ops only: Triton kernels and `torch.compile` graphs are reported as not attributable.
# * The report drafts the seed's incident record (`--out` writes it beside the examination) and the
#   profiler's Chrome trace (`X.json` -> `X.trace.json`: open it in Perfetto).
# * A model is split into parts; each part is walked on its own metrics and the fixes are ranked by what
#   they would save (`hwlab examine FILE.py:FACTORY --model` for a factory returning the module and its
#   inputs).
#
# **Exercises.** (1) Fuse `unfused_chain` by hand with `torch.compile` or a Triton kernel and examine it
# again: which leaf now, and how close to the floor? (2) Make the shuffled gather coalesced (sort the
# index) and compare its estimated sector amplification. (3) Run your own function with `--ncu` on a GPU
# and compare the counted DRAM % and sector amplification with the estimates.
