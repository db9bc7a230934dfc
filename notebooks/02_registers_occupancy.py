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
# # 02 · Registers, occupancy, spills and launch overhead
#
# **Needs:** a CUDA GPU for times; without one, every register/spill figure is still real: the kernels
# are compiled for sm_90 (Hopper) on this CPU and `ptxas -v` reports them. Speed figures then come from
# the H200 run this kit recorded, labelled. **Takes:** the run times measured on the H200 and on a CPU are
# in the table of `docs/LEARNING_PATH.md` (most of it is compiling the sweep).
#
# **Arc:** symptom → predict → measure → flowchart → fix → re-verify.
#
# ## Symptom
# A Triton GEMM was "tuned" by making the tile bigger for more data reuse. It now runs several times
# slower than cuBLAS on the same card, and Nsight shows the tensor cores mostly idle. Nothing else changed.

# %%
import matplotlib.pyplot as plt
import torch
from hwlab.core import ceilings, evidence
from hwlab.diagnosis import flowchart
from hwlab import nb
from hwlab.labs import registers as lab
from hwlab.labs.registers.occupancy import HOPPER, occupancy

GPU = nb.has_gpu()
FULL = False  # True: also the heavily spilling 256x256 tile on 4 warps (its compile alone takes minutes)
print(nb.live_label())

# %% [markdown]
# ## The kernel, beside its reference
# The GEMM every config runs, and the float64 reference it is checked against first. Look at the tile
# (`BM × BN` outputs per program, `BK` deep per step of the loop), the two `tl.load`s per step feeding
# `tl.dot` (the Tensor-Core MMA), the accumulate dtype (`acc` is fp32 whatever the inputs), and the one
# `tl.store` at the end. The tile is the knob: `acc` lives in registers for the whole loop.

# %%
nb.show_kernel(lab.matmul_kernel, lab.reference_matmul)

# %% [markdown]
# ## Predict: count the accumulator
# Each program keeps a `BM × BN` fp32 accumulator in registers, spread over `32 × warps` threads. A thread
# can hold at most 255 registers, and it needs more than the accumulator (pointers, A/B fragments).

# %%
for cfg in lab.SWEEP:
    print(f"{cfg.label:>20}: accumulator {cfg.acc_regs_per_thread:5.0f} registers/thread "
          f"-> {'fits' if cfg.acc_regs_per_thread <= 160 else 'will spill'}")

# %% [markdown]
# ## Measure: the compiler's own report, guarded
# Each config is compiled in a child process with a time limit (some spilling configs take minutes to
# compile). On a GPU the figures come off the launched kernel (`n_regs`, `n_spills`, `metadata.shared`);
# on a CPU from `ptxas -v` on the sm_90a build. `n_spills` counts 4-byte local-memory slots.

# %%
configs = lab.SWEEP if (GPU and FULL) else (lab.SANE, lab.WIDE, lab.SMALL, lab.SPILL)
rows = lab.sweep(configs, n_rep=20, timeout_s=120,
                 ceiling_tflops=lab.cublas_bf16().tflops if GPU else None,
                 progress=lambda s: print("compiling", s, flush=True))
nb.banner("Compile reports", nb.live_label() if GPU else "static sm_90a compile on this CPU (real ptxas output)")
for r in rows:
    rep = r.report
    occ = r.occupancy
    print(f"{r.config.label:>20}: {rep.n_regs} regs, {rep.n_spills} spill slots, {rep.shared_bytes} B smem"
          + ("" if occ else f" [{rep.skipped}]"))

# %% [markdown]
# ## Time against cuBLAS (same run, same card)

# %%
rec = evidence.recorded("lab02_registers")
if GPU:
    src, ms = nb.live_label(), [r.measurement for r in rows if r.measurement]
    cublas = ms[0].ceiling_tflops
    copy_gbps = ceilings.get(quick=True).copy_gbps
    ev = {r.config.label: lab.config_evidence(r, copy_gbps) for r in rows if r.measurement}
else:
    src = rec.label
    ms = [m for m in rec.results if m.name.startswith("triton")]
    cublas = rec.ceilings["cublas_bf16_tflops"]
    ev = rec.extra["flowchart_evidence"]
fig, ax = plt.subplots(figsize=(8, 3.5))
ax.bar([m.params["config"] for m in ms], [m.tflops for m in ms])
ax.axhline(cublas, color="r", ls="--", label=f"cuBLAS bf16 {cublas:,.0f} TFLOP/s")
ax.set_ylabel("TFLOP/s")
ax.set_title(f"Triton GEMM 8192³ bf16 by tile config\n({src})", fontsize=9)
ax.legend(fontsize=7)
plt.xticks(rotation=20, fontsize=7)
plt.show()
for m in ms:
    print(f"{m.params['config']:>20}: {m.t_ms:.2f} ms, {m.tflops:,.0f} TFLOP/s = {m.pct_of_flops_ceiling:.0f}% of cuBLAS [{src}]")

# %% [markdown]
# ## Checkpoint: your diagnosis first
# The evidence the flowchart reads for the first spilling tile is below. Fill in the leaf, the metric that
# decides the last question before it and its value as the table shows it, and your prediction of that
# tile's **blocks per SM**: from its registers and shared memory in the compile report and its warps,
# against Hopper's limits (printed with the table). Then the occupancy table and the kit's walk.

# %%
from hwlab.course.checkpoint import Prediction

spill = next(k for k, v in ev.items() if (v.get("n_spills") or 0) > 0)
nb.show_evidence(ev[spill], f"{spill}; {src}")
nb.md(f"Hopper per SM: {HOPPER.regs_per_sm:,} registers, {HOPPER.smem_per_sm / 1024:.0f} KiB shared memory, "
      f"{HOPPER.max_warps_per_sm} warps, {HOPPER.max_blocks_per_sm} blocks _[{HOPPER.source}]_")
occ_spill = next((r.occupancy for r in rows if r.config.label == spill and r.occupancy), None) or next(
    c["occupancy"] for c in rec.extra["configs"] if c["report"]["config"] == spill)

# %%
# replace each None: leaf="<a leaf letter>", metric="<a metric name from the table>", value=<its value>, prediction=<a number>
ANSWER = nb.answer("02", leaf=None, metric=None, value=None, prediction=None, evidence=ev[spill])
CP = nb.checkpoint("02", ANSWER, flowchart.diagnose(ev[spill]), ev[spill], source=src,
                   prediction=Prediction(f"blocks per SM of {spill}", occ_spill["blocks_per_sm"], " block(s)/SM", band_abs=0,
                                         reconsider="each of the four limits (registers per thread, shared memory "
                                                    "per block, warps per block, block slots) from the compile "
                                                    "report and Hopper's limits printed above",
                                         why_band="occupancy is a whole number of blocks, set by the tightest limit"))

# %% [markdown]
# ## Occupancy: which limit binds
# `hwlab.labs.registers.occupancy` turns registers, shared memory and warps into blocks per SM under each limit
# (Hopper's limits, printed above from `HOPPER` with their source). Recorded on the H200, Nsight
# Compute's `launch__occupancy_limit_*` reads the same limits: compare them below.

# %%
with nb.gated(CP, "the occupancy table"):
    nb.banner("Occupancy: hwlab's calculation vs Nsight Compute", rec.label)
    for c in rec.extra["configs"]:
        if not c["occupancy"]:
            continue
        ours = c["occupancy"]["blocks_by_limit"]
        ncu = c["ncu"] or {}
        theirs = {k: ncu.get(f"launch__occupancy_limit_{k}") for k in ours}
        print(f"{c['report']['config']:>20}: hwlab {ours}\n{'':>20}  ncu   {theirs}")
    for r in rows:
        if r.occupancy:
            print(f"{r.config.label:>20}: {r.occupancy['blocks_per_sm']} block(s)/SM bound by {r.occupancy['binding']} "
                  f"[{r.report.source}]")

# %% [markdown]
# ## The kit's walk
# One line per walk; `DETAILS = True` prints every step's rule, spread and source.

# %%
DETAILS = False
best = max((k for k in ev if (ev[k].get("n_spills") or 0) == 0 and "slowdown_vs_floor" in ev[k]),
           key=lambda k: -ev[k]["slowdown_vs_floor"])
nb.walk(CP, f"{spill} [{src}]", full=DETAILS)
with nb.gated(CP, "the best config's walk"):
    print(f"{best} [{src}]: {flowchart.diagnose(ev[best]).render(full=DETAILS)}")
    nb.show_mermaid(flowchart.diagnose(ev[spill]).mermaid())
nb.explain(CP, """Reading the walk: the spilling config is far from its floor (B) and DRAM is not saturated (F). H asks
whether Tensor-Core use is low, and its override answers first: the compiler report shows spills, and a
spilling kernel starves its tensor cores, so the walk takes H's NO branch (registers are the cause, not
the MMA path) → **launch / occupancy / registers**. The best config leaves the chart's slow branch.""")

# %% [markdown]
# ## Over-fusion: softmax fused into the GEMM
# Fusing `softmax(A @ B)` into the GEMM's epilogue forces one program to own a *whole row* of the product
# (BN = N = 512): 64 × 512 fp32 values on 128 threads, 256 registers each before anything else. Split into a
# GEMM with a sane tile and a softmax kernel, nothing spills. `lab.overfusion()` compiles both (guarded),
# checks both against float64, then times them; without a GPU the times are the H200's, recorded.
# Look at the over-fused kernel's tile: `BN` spans the whole row (`rn = tl.arange(0, BN)`), so the fp32
# `acc` of the GEMM loop and the softmax's `e` and `p` after it are all `BM × N` values held in registers.

# %%
nb.show_kernel(lab.matmul_softmax_kernel, lab.reference_matmul_softmax)

# %%
if GPU:
    of = lab.overfusion(n_rep=20)
    fused, split, f, s, of_src = of.fused_report, of.split_report, of.fused, of.split, nb.live_label()
else:
    fused = lab.compile_guarded("matmul_softmax", lab.FUSED, timeout_s=120)
    split = lab.compile_guarded("matmul", lab.SANE, timeout_s=120)
    of = {m.name: m for m in rec.results}
    f, s, of_src = of["over-fused gemm+softmax"], of["split gemm, softmax"], rec.label
print(f"fused: {fused.n_regs} regs, {fused.n_spills} spill slots | split GEMM: {split.n_regs} regs, "
      f"{split.n_spills} spill slots [{fused.source}]")
print(f"{of_src}: fused {f.t_ms:.3f} ms ({f.tflops:,.0f} TFLOP/s) vs split {s.t_ms:.3f} ms ({s.tflops:,.0f} TFLOP/s)"
      f" -> split is {f.t_ms / s.t_ms:.1f}x faster")

# %% [markdown]
# ## Launch-bound: many tiny kernels
# A decode step of 64 layers × 3 tiny kernels. Each launch costs microseconds of CPU and driver time; the
# GPU work per kernel is shorter, so the GPU waits. A CUDA graph replays the same kernels without the
# launch path.

# %%
lb = lab.launch_bound(n_rep=30)
print(f"live: eager {lb.eager.t_ms:.3f} ms for {lb.n_kernels} kernels = {lb.us_per_launch_eager:.2f} us/kernel"
      + (f"; graph {lb.graph.t_ms:.3f} ms ({lb.speedup:.1f}x), GPU idle {lb.gpu_idle_pct_eager:.0f}% of the eager step"
         if lb.graph else f" ({lb.note})") + f" [{nb.live_label()}]")
L = rec.extra["launch"]
print(f"{rec.label}: eager {L['eager']['t_ms']:.3f} ms, graph {L['graph']['t_ms']:.3f} ms -> {L['speedup']:.1f}x; "
      f"{L['us_per_launch_eager']:.2f} us per kernel eager, GPU idle {L['gpu_idle_pct_eager']:.0f}%")
with nb.gated(CP, "the launch-bound step's walk"):
    print("launch-bound step:", flowchart.diagnose(rec.extra["flowchart_evidence"]["launch-bound step"]).compact())

# %% [markdown]
# ## Knobs: tile, warps, stages
# Change a knob and the config is recompiled (guarded): registers, spills, shared memory and occupancy,
# plus the time on a GPU. It opens on the sweep's own row for the starting config (measured above).

# %%
import ipywidgets as W
from IPython.display import display

bm = W.Dropdown(options=[64, 128, 256], value=128, description="BM")
bn = W.Dropdown(options=[64, 128, 256], value=128, description="BN")
bk = W.Dropdown(options=[32, 64], value=64, description="BK")
warps = W.Dropdown(options=[4, 8], value=4, description="warps")
stages = W.Dropdown(options=[2, 3, 4], value=3, description="stages")
out = W.Output()


def show(r):
    print(r.report.to_dict())
    print("occupancy:", r.occupancy)
    if r.measurement:
        print(r.measurement.summary())


def recompile(_=None):
    out.clear_output()
    cfg = lab.TileConfig(bm.value, bn.value, bk.value, warps.value, stages.value)
    with out, nb.gated(CP, "its occupancy"):
        show(lab.sweep([cfg], n_rep=10, timeout_s=120)[0])


for w in (bm, bn, bk, warps, stages):
    w.observe(recompile, names="value")
display(W.VBox([W.HBox([bm, bn, bk]), W.HBox([warps, stages]), out]))
start = lab.TileConfig(bm.value, bn.value, bk.value, warps.value, stages.value)
with out:
    print(f"{start.label}: the sweep's row above (change a knob to recompile)")
    with nb.gated(CP, "its occupancy"):
        show(next(r for r in rows if r.config == start))

# %% [markdown]
# ## Summary
# - Accumulator registers per thread = BM·BN / threads: predict the spill before compiling.
# - Read registers, spills and shared memory from the compiler; compute which occupancy limit binds.
# - Over-fusion and oversized tiles fail the same way: too much live state per thread.
# - Many tiny launches: measure µs per launch; a CUDA graph (or fusion) removes the gaps.
# - Next: `exercises/ex02_registers_occupancy.ipynb`.
