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
# # 01 · Bandwidth-bound: the unfused chain and the strided layout
#
# **Needs:** a CUDA GPU for live speed; without one the kernels run in the Triton interpreter at tiny
# sizes (correctness only) and the speed evidence is the H200 run this kit recorded, labelled as such.
# **Takes:** the run times measured on the H200 and on a CPU are in the table of `docs/LEARNING_PATH.md`
# (Nsight Compute, where installed, adds its own replays).
#
# **Arc:** symptom → predict → measure → place on the flowchart → fix → re-verify with the same probe.
#
# ## Symptom
# After every linear layer the model runs `y = (gelu(x + bias) + residual) * scale`. In the profile these
# four small kernels take several times longer than their FLOPs could explain, while the GPU's math units
# idle. The seed's first question: *DRAM throughput high, arithmetic intensity low, Tensor Cores idle →
# look at data flow, layout and fusion, not at more compute.*

# %%
import matplotlib.pyplot as plt
import torch
from hwlab.core import ceilings, evidence, roofline
from hwlab.diagnosis import flowchart
from hwlab import nb
from hwlab.labs import bandwidth as lab

GPU = nb.has_gpu()
DTYPE = torch.float16  # fp16 is right in the interpreter too (bf16 is not)
print(nb.live_label())

# %% [markdown]
# ## Predict before measuring
# Eager PyTorch runs four kernels; each reads its input from DRAM and writes its output back:
#
# | op | reads | writes |
# |---|---|---|
# | `t1 = x + bias` | x (N), bias (cols) | t1 (N) |
# | `t2 = gelu(t1)` | t1 (N) | t2 (N) |
# | `t3 = t2 + residual` | t2 (N), residual (N) | t3 (N) |
# | `y = t3 * scale` | t3 (N) | y (N) |
#
# **9N** elements cross DRAM; the work needs only **3N** (read x and residual, write y).
#
# **Prediction:** the chain does about 11 FLOP per element on 3 fp16 elements (6 bytes) it must move,
# under 2 FLOP/byte: far left of the ridge point, so bytes decide. If both versions run at the copy
# bandwidth, the fused one is faster by the ratio of the bytes each moves: work that ratio out from the
# table (or from the byte counts the cell below prints) and keep it for the checkpoint further down.

# %%
rows, cols = lab.default_size(None)
tr = lab.chain_traffic(rows, cols, torch.tensor([], dtype=DTYPE).element_size())
print(f"{rows}x{cols} {DTYPE}: the work requires {tr['bytes_required']/2**20:,.1f} MiB, the unfused chain moves "
      f"{tr['bytes_moved_unfused']/2**20:,.1f} MiB; AI {tr['n_flops']/tr['bytes_required']:.2f} FLOP/B")

# %% [markdown]
# ## The kernel, beside its reference
# The unfused chain is four eager PyTorch calls; the fused one is one Triton kernel. Look at the three
# `tl.load`s and the one `tl.store` (each element of `x` and `residual` read once, `y` written once),
# the tile (`BLOCK` consecutive elements per program, so a warp's loads are contiguous), and the
# accumulate dtype (fp16 loaded, math in fp32, cast back at the store).

# %%
nb.show_kernel(lab._fused_chain_kernel, lab.unfused_chain)

# %% [markdown]
# ## Measure (live), against the copy ceiling measured here
# Every case is first checked against a float64 reference on fresh random inputs, then timed
# (warm-up, device events, median of many runs, p10–p90 spread).

# %%
ceil = ceilings.get(quick=True)
live = flowchart.walk_cases(lab.run(dtype=DTYPE, ceiling_gbps=ceil.copy_gbps, n_rep=50 if GPU else 3))
nb.banner("Lab 1 cases", nb.live_label())
for row in live.table():
    print(f"{row['case']:>10}: {row['t_ms']:.4f} ms ±{row['spread_pct']:.0f}%, "
          f"{row['gbps_required']:,.1f} GB/s required-bytes = {row['pct_of_copy']:.0f}% of copy")
if not GPU:
    print("\nCPU: all four cases are correct (checked against float64). Their times are the Triton "
          "interpreter's, not a GPU's, so no diagnosis is drawn from them. The GPU evidence follows.")

# %% [markdown]
# ## The evidence the flowchart will read (recorded on the H200 when there is no GPU here)
# Read it yourself before the kit walks it: the unfused chain's metrics, each with its spread and what
# measured it, and (recorded) the Nsight Compute counters of every case.

# %%
from hwlab.course.checkpoint import Prediction

if GPU:
    result, source = live, nb.live_label()
else:
    rec = evidence.recorded("lab01_bandwidth")
    result, source = flowchart.walk_cases(lab.result_from_evidence(rec)), rec.label
    print("Nsight Compute counters (counted on the H200):")
    for k, c in rec.extra["counters"].items():
        print(f"  {k:>10}: DRAM {c['dram_pct_of_peak']:.0f}% of peak, sector amplification "
              f"{c['sector_amplification']:.1f}x, tensor pipe {c['tensor_pipe_pct']:.0f}%")
nb.show_evidence(result.evidence["unfused"], f"unfused; {source}")

# %% [markdown]
# ## Checkpoint: your diagnosis first
# Walk the chart on the table above (`nb.show_mermaid(flowchart.render_mermaid())` draws it; each rule is
# in `flowchart.QUESTIONS`). Fill in the leaf, the metric that decides the last question before it and
# its value as the table shows it, and your predicted speed-up of the fused kernel over the unfused chain
# (from your byte count above). The kit's walk shows once this passes.

# %%
# replace each None: leaf="<a leaf letter>", metric="<a metric name from the table>", value=<its value>, prediction=<a number>
ANSWER = nb.answer("01", leaf=None, metric=None, value=None, prediction=None, evidence=result.evidence["unfused"])
CP = nb.checkpoint("01", ANSWER, result.diagnoses["unfused"], result.evidence["unfused"], source=source,
                   prediction=Prediction("the fused kernel's speed-up over the unfused chain",
                                         result.speedup("unfused", "fused"), "x", band_pct=40.0,
                                         reconsider="the bytes each version moves (the table of reads and "
                                                    "writes per op, and the byte counts printed under it) and "
                                                    "what rate each streams them at",
                                         why_band="each pass fused away also saves its own launch and ramp, "
                                                  "which a byte count leaves out"))

# %%
m = result.measurements
moved = {k: v.params.get("bytes_moved", v.n_bytes) for k, v in m.items()}
speedup = result.speedup("unfused", "fused")
byte_ratio = moved["unfused"] / m["fused"].n_bytes
gbps_moved = {k: moved[k] / (m[k].t_ms * 1e6) for k in ("unfused", "fused")}
with nb.gated(CP, "the measured speed-up and its plots"):
    fig, axes = plt.subplots(1, 2, figsize=(13, 4))
    nb.plot_gbps(m.values(), result.params["ceiling_gbps"], "Achieved bandwidth per case", source,
                 moved=moved, ax=axes[0])
    c_for_roof = ceil if GPU else ceilings.recorded()
    roofline.plot(c_for_roof, m.values(), ax=axes[1], label=source)
    plt.tight_layout()
    plt.show()
    print(f"fused over unfused: {speedup:.2f}x (the byte ratio predicts {byte_ratio:.2f}x); "
          f"coalesced over strided: {result.speedup('strided', 'coalesced'):.2f}x  [{source}]")
    nb.md(f"**Measured:** the fused kernel is **{speedup:.2f}x** faster; the byte ratio alone predicts "
          f"**{byte_ratio:.2f}x**. The rest is bandwidth: the unfused chain moves its bytes at "
          f"{gbps_moved['unfused']:,.0f} GB/s, the fused kernel at {gbps_moved['fused']:,.0f} GB/s "
          f"({gbps_moved['fused'] / gbps_moved['unfused']:.2f}x), and "
          f"{byte_ratio:.2f} x {gbps_moved['fused'] / gbps_moved['unfused']:.2f} = "
          f"{byte_ratio * gbps_moved['fused'] / gbps_moved['unfused']:.2f}x. _[{source}]_")
nb.explain(CP, """Why the gap: the byte ratio assumes every pass streams at the same rate, and the line above shows
the unfused passes do not. Each of the four eager kernels pays its own launch and its own ramp-up and drain
of the memory pipeline, and PyTorch's generic elementwise kernels (broadcasting, type handling) stream
below the rate of one long, specialised kernel; which of these weighs most is not measured here (a
profile of the four kernels would say). Fusion removes passes *and* their per-pass costs.""")

# %% [markdown]
# ## The kit's walk
# One line per walk (`~` marks an estimate, `BORDERLINE` a threshold inside the measured spread); set
# `DETAILS = True` for every step's rule, spread and source.

# %%
DETAILS = False
nb.walk(CP, f"unfused [{source}]", full=DETAILS)
with nb.gated(CP, "the strided case's walk"):
    print(f"strided [{source}]: {result.diagnoses['strided'].render(full=DETAILS)}")
    nb.show_mermaid(result.diagnoses["unfused"].mermaid())
nb.explain(CP, """Reading the walks: the unfused chain is far from its floor (B), and its DRAM throughput is over F's
threshold (Nsight Compute's DRAM share of the peak, or, without counters, the moved bytes over the
measured copy rate): by F's rule the memory path is saturated → **bandwidth / layout / fusion**. The
strided case is also slow, but its DRAM throughput is under that threshold; what answers F is its
other rule, the sector amplification over F's threshold (each 2-byte lane drags a whole 32-byte sector):
wasted traffic → the same leaf.""")

# %% [markdown]
# ## Fix, and re-verify with the same probe
# One Triton kernel reads `x` and `residual` once and writes `y` once (`hwlab.labs.bandwidth.fused_chain`,
# shown above); the layout fix walks rows so a warp's lanes read consecutive addresses. The layout kernel
# below does both walks: look at how `row` and `col` come from the lane index `idx` in each branch, and at
# the one `tl.load` and one `tl.store` whose addresses they set. The same probe, the same flowchart: both
# fixed runs leave the unfused chain's leaf.

# %%
nb.show_kernel(lab._scale_kernel)

# %%
with nb.gated(CP, "the fixed cases' walks"):
    for case in ("fused", "coalesced"):
        d = result.diagnoses[case]
        print(f"{case} [{source}]: {d.render(full=DETAILS)}  ({d.leaf.title if d.leaf else 'undecided'})")

# %% [markdown]
# ## Knobs: size, dtype, layout, fused/unfused
# On a GPU each change re-measures live; on a CPU it re-checks correctness in the interpreter at the
# chosen (small) size and says so.

# %%
import ipywidgets as W
from IPython.display import display

size = W.IntSlider(value=4096 if GPU else 64, min=64, max=16384 if GPU else 512, step=64,
                   description="rows=cols")
dtype = W.Dropdown(options=["float16", "float32"] + (["bfloat16"] if GPU else []), description="dtype")
case = W.ToggleButtons(options=["unfused", "fused", "strided", "coalesced"], description="case")
out = W.Output()


def remeasure(_=None):
    out.clear_output()
    with out:
        r = flowchart.walk_cases(lab.run(size.value, size.value, getattr(torch, dtype.value),
                                         ceiling_gbps=ceil.copy_gbps, n_rep=30 if GPU else 2, cases=(case.value,)))
        mm = r.measurements[case.value]
        print(f"{mm.summary()}\n[{nb.live_label()}]")
        if case.value in r.diagnoses:
            with nb.gated(CP, "this case's walk"):
                print("flowchart:", r.diagnoses[case.value].compact())


for w in (size, dtype, case):
    w.observe(remeasure, names="value")
display(W.VBox([size, dtype, case, out]))
remeasure()

# %% [markdown]
# ## Summary
# - Count bytes before timing: the byte ratio of unfused to fused is the floor of the speed-up; each extra
#   pass also pays a launch and a ramp, so fusion can beat the ratio (measured above).
# - A bandwidth-bound kernel is judged by % of the measured copy ceiling, not by FLOP/s.
# - Uncoalesced access wastes sectors: DRAM throughput can look *low* while the memory path is the
#   limiter; the sector counters (or the access-pattern estimate) reveal it.
# - Next: `exercises/ex01_bandwidth_bound.ipynb` — a transposed chain: fuse it and keep both sides coalesced.
