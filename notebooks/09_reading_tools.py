# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 09 · Reading the tools yourself
#
# **Needs:** nothing: every output here was recorded by the kit's tools (on the H200, or on a CPU where
# labelled). **Takes:** seconds.
#
# The labs read the profiler, Nsight Compute and the topology for you. On your own cluster you read them
# raw. Four outputs, one skill each: a GPU trace, four ranks' traces, an Nsight Compute report, and
# `nvidia-smi topo -m` with NCCL's log. For each, read the evidence, write your answer in the cell marked
# `# YOUR CODE HERE`, and run the check: it grades your numbers and the evidence you cite, and shows the
# kit's own reading only once you got it. A wrong answer says what in the recording contradicts it.

# %%
from pathlib import Path

import matplotlib.pyplot as plt

from hwlab.core import evidence

from hwlab.traces import trace_events
from hwlab import nb  # nb.reveal: a check's answer after three wrong tries
from hwlab.course import reading_checks as check, reading_facts as facts

TRACES = evidence.TRACES_DIR  # the recorded traces, shipped inside the package
GPU_TRACE = next((TRACES / "h200_nccl_one_rank").glob("*.pt.trace.json.gz"))
RANKS = TRACES / "slow_rank"

# %% [markdown]
# ## 1 · One GPU rank's trace
#
# `torch.profiler` writes a Chrome trace (`*.pt.trace.json.gz`). To look at it yourself, open
# <https://ui.perfetto.dev>, choose *Open trace file* (or drag the file onto the page; it is read in your
# browser, nothing is uploaded). Each process is a group of rows: the Python process's threads (operators,
# CUDA runtime calls) and the GPU's streams (kernels, copies). `W`/`S` zoom, `A`/`D` pan, a click on a
# slice shows its arguments, and dragging over a range sums what lies under it.
#
# The file below is a one-rank NCCL job on the H200 (`tools/record_traces_h200.sh`): each step runs four
# GEMMs, then a few collectives. The plot draws one step the way Perfetto does.

# %%
gpu = trace_events.read_spans(GPU_TRACE)
print(f"{GPU_TRACE.name}: {facts.trace_label(GPU_TRACE)} (tools/record_traces_h200.sh); rows: {gpu.rows()}")
rows, window = facts.gpu_timeline(GPU_TRACE, step=1)
trace_events.timeline_figure(rows, window_us=window, t0_us=window[0], title="one profiled step")
plt.show()
print("the step's spans, as Perfetto's slice list shows them (start and duration in us; host: operators "
      "and runtime calls of 2 us or more):")
for row, spans in rows.items():
    for s in sorted(spans, key=lambda s: s.ts_us):
        shown = s.name.startswith(("aten::mm", "c10d::")) or (s.cat == "cuda_runtime" and s.dur_us >= 2)
        if window[0] <= s.ts_us <= window[1] and (shown or not row.endswith("(host)")):
            print(f"  {row:<22s} {s.ts_us - window[0]:9.1f} {s.dur_us:8.1f}  {s.name[:60]}")

# %% [markdown]
# Find the **launch gap**: the longest time the GPU stream sits idle between two of its activities inside
# one step, in microseconds, and the row you read it on. Then the **sync point**: the host call that waits
# until the device is done.

# %% tags=["learner"]
MY_TRACE = None  # YOUR CODE HERE: {"gap_us": ..., "row": "<a row of the plot>", "sync_call": "<a span's name>"}

# %%
check.check_gpu_trace(GPU_TRACE, MY_TRACE)

# %% [markdown]
# A gap on the stream is time the GPU waited for the host to launch the next kernel; here the host was
# busy with its own work. CUDA graphs or moving that work off the critical path close it (Lab 2's
# launch-bound case).
#
# ## 2 · Four ranks: the collective wait and the late rank
#
# One trace per rank, recorded on a CPU (4 gloo ranks of `examples/profiled_torchrun.py` under `torchrun`,
# one host clock). In Perfetto open each file in its own tab. An all-reduce ends when the last rank arrives:
# the early ranks wait inside it.

# %%
print(f"{RANKS.name}: {facts.trace_label(next(RANKS.glob('*.json.gz')))}, 4 gloo ranks (examples/profiled_torchrun.py); files:",
      sorted(p.name for p in RANKS.glob("*.json.gz")))
rows, window = facts.ranks_timeline(RANKS)
trace_events.timeline_figure(rows, window_us=window, t0_us=window[0], title="three steps, every rank")
plt.show()
for r, t in sorted(facts.rank_traces(RANKS).items()):
    print(f"rank {r}: " + "  ".join(f"{c.name} {c.dur_us / 1e3:.1f} ms" for c in t.collectives[:4]) + "  ...")

# %% [markdown]
# Name the **late rank** (or `"none"`), the **wait** of the ranks that arrived early (ms inside the
# collective), and the **span** you timed.

# %% tags=["learner"]
MY_RANKS = None  # YOUR CODE HERE: {"late_rank": ..., "wait_ms": ..., "span": "<span name>"}

# %%
check.check_rank_wait(RANKS, MY_RANKS)

# %% [markdown]
# The late rank's own work is long, not its collective: the next question is what delays it (its device,
# its host, its data), which `hwlab ranks --traces` answers with the flowchart.
#
# ## 3 · An Nsight Compute report
#
# `ncu` counts what the hardware did; the kit's traffic model estimates what a case must move. Below, Lab 1's
# unfused chain and one of Lab 2's GEMM tiles, as the kit's tools recorded them on the H200. ncu's DRAM %
# is of the DRAM peak; the kit's estimate is of the copy ceiling it measured. Put the estimate on ncu's
# denominator (times ceiling, over peak) to compare them.

# %%
print(facts.ncu_lab01_text("unfused"))
print()
print(facts.ncu_lab02_text("128x128x64 w4 s3"))

# %% tags=["learner"]
MY_NCU_LAB1 = None  # YOUR CODE HERE: {"dram_pct": ..., "sector_amplification": ..., "estimate_pct_of_peak": ...}
MY_NCU_LAB2 = None  # YOUR CODE HERE: {"registers": ..., "spills": ..., "achieved_occupancy_pct": ..., "binding_metric": "<row>"}

# %%
display(check.check_ncu_lab01("unfused", MY_NCU_LAB1))
check.check_ncu_lab02("128x128x64 w4 s3", MY_NCU_LAB2)

# %% [markdown]
# ### ncu's own rows
#
# The readings above are the kit's summary of each run. On your cluster you get ncu's CSV instead: one row
# per kernel and metric. Below, Lab 1's strided and coalesced cases and two of Lab 2's tiles, as `ncu --csv`
# wrote them on the H200 (`tools/record_ncu_h200.py`; the kernel, metric, unit and value columns, and only the
# memory rows).
#
# * **Sectors per request** is global-load sectors over global-load requests. A warp's request for 32 lanes of
#   *w* bytes each needs at best 32·*w* / 32 = *w* sectors of 32 B: 2 for a scalar fp16 load, 16 for a 16-byte
#   vector load. 32 means every lane touched a sector of its own.
# * **Local-memory sectors** (loads and stores together) are register spills, moved through L1.

# %%
RAW_CASES = ("lab01_strided", "lab01_coalesced")
RAW_TILES = ("lab02_128x128x64x4x3", "lab02_256x256x64x8x3")
for name in RAW_CASES + RAW_TILES:
    print(facts.ncu_raw_text(name, ("global_op_ld", "local_op", "registers_per_thread")), end="\n\n")

# %% tags=["learner"]
MY_NCU_RAW = None  # YOUR CODE HERE: {"sectors_per_request": {"lab01_strided": ..., "lab01_coalesced": ...}, "spilling_tile": "<report>", "local_sectors": ...}

# %%
check.check_ncu_raw(RAW_CASES, RAW_TILES, MY_NCU_RAW)

# %% [markdown]
# A strided read that takes a sector per lane fetches a whole sector to use one element of it: Lab 1's fix
# changes the layout, not the kernel's arithmetic. Spill traffic shares L1 with the tile's own loads: Lab 2's
# fix is a tile whose accumulators fit in registers.

# %% [markdown]
# ## 4 · The topology and NCCL's paths
#
# `nvidia-smi topo -m` prints one link class per GPU pair (legend under the matrix). A TP group all-reduces
# over every pair it holds, so its slowest pair sets its pace. Below, a DGX-1 capture (public, transcribed in
# `src/hwlab/recorded/topology/`) and the group of GPUs 0, 1, 4 and 5.

# %%
TOPO = (evidence.RECORDED_DIR / "topology" / "dgx1_v100_hybrid_cube_mesh.txt").read_text()
GROUP = [0, 1, 4, 5]
print(TOPO)
print("group:", GROUP)

# %% tags=["learner"]
MY_TOPO = None  # YOUR CODE HERE: {"pairs": [(a, b), ...], "link": "<class>"}

# %%
check.check_slow_pairs(TOPO, GROUP, MY_TOPO)

# %% [markdown]
# With `NCCL_DEBUG=INFO` NCCL prints the topology it detected: per device, each path as
# `(hops/bandwidth GB/s/type)`. The log below is the H200 run of one rank (`tools/record_straggler_nccl.sh`);
# read the slowest path the GPU has.

# %%
LOG = (evidence.RECORDED_DIR / "runs" / "straggler_nccl_h200" / "vm" / "nccl.764.log").read_text()
print("recorded on NVIDIA H200 (one GPU, one rank), NCCL_DEBUG=INFO; its topology lines:")
print("\n".join(dict.fromkeys(ln for ln in LOG.splitlines() if " :GPU/" in ln or " :NET/" in ln or "Pattern" in ln)))
routes = [ln for ln in LOG.splitlines() if " via " in ln and "Channel" in ln]
print("\n".join(routes) if routes else
      "\nno channel route lines ('Channel 00/0 : 0[0] -> 1[1] via ...') in this log: a single rank opens no "
      "channel to another, so what there is to read here is the topology above")

# %% tags=["learner"]
MY_NCCL = None  # YOUR CODE HERE: {"gbps": ..., "type": "<path type>"}

# %%
check.check_nccl_path(LOG, MY_NCCL)

# %% [markdown]
# A log of several ranks on one node has more to read than this one: `Channel ... via` lines, one per ring
# hop, saying which transport it took (`P2P` where NVLink or PCIe peer access exists, `SHM` or `NET` where it
# does not). A pair that reads `SYS` in the topology matrix and `SHM` in such a log is a slow link between
# ranks. Exercise 05 asks the same questions of other recordings.
