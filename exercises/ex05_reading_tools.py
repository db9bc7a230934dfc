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
# # Exercise 05 · Read the raw outputs of another run
#
# **Needs:** nothing (recorded outputs). **Takes:** reading time; it executes in seconds (`docs/LEARNING_PATH.md`).
#
# Notebook 09's questions, on recordings it does not show: four ranks of another job, another Lab 1 case,
# another Lab 2 tile and another machine's topology. Read each output (in Perfetto too: drag a
# `.pt.trace.json.gz` onto <https://ui.perfetto.dev>), fill the cells marked `# YOUR CODE HERE`, and run the
# checks at the end. Each check grades your numbers and the evidence you cite against the same recording.

# %%
from pathlib import Path

import matplotlib.pyplot as plt

from hwlab.core import evidence

from hwlab.traces import trace_events
from hwlab import nb  # nb.reveal: a check's answer after three wrong tries
from hwlab.course import reading_checks as check, reading_facts as facts

RANKS = evidence.recorded_traces("slow_link_tbf")  # shipped inside the package
RANK0 = sorted(RANKS.glob("*.pt.trace.json.gz"))[0]
print(f"{RANKS.name}: {facts.trace_label(RANK0)}, 4 gloo ranks; files:", sorted(p.name for p in RANKS.glob("*.json.gz")))
rows, window = facts.ranks_timeline(RANKS)
trace_events.timeline_figure(rows, window_us=window, t0_us=window[0], title="three steps, every rank")
plt.show()

# %% [markdown]
# **1.** The late rank (or `"none"`), the time the ranks that arrived early spend inside the collective
# (ms), and the span you timed. Then, on `RANK0`'s main thread, the longest gap between two top-level
# operators inside a step (ms): time the host launched nothing.

# %% tags=["learner"]
MY_RANKS = None  # YOUR CODE HERE: {"late_rank": ..., "wait_ms": ..., "span": "<span name>"}
MY_GAP = None    # YOUR CODE HERE: {"gap_ms": ...}

# %% [markdown]
# **2.** Lab 1's strided walk and Lab 2's `256x256x64 w4 s2` tile under Nsight Compute (H200). Read the
# counted DRAM %, the sector amplification, and the kit's estimate on ncu's denominator; then registers,
# spills, achieved occupancy and the limit row that binds.

# %%
print(facts.ncu_lab01_text("strided"))
print()
print(facts.ncu_lab02_text("256x256x64 w4 s2"))

# %% tags=["learner"]
MY_NCU_LAB1 = None  # YOUR CODE HERE: {"dram_pct": ..., "sector_amplification": ..., "estimate_pct_of_peak": ...}
MY_NCU_LAB2 = None  # YOUR CODE HERE: {"registers": ..., "spills": ..., "achieved_occupancy_pct": ..., "binding_metric": "<row>"}

# %% [markdown]
# **2b.** ncu's own rows (`ncu --csv`, H200): Lab 1's fused kernel, and two Lab 2 tiles of which one spills.
# Read the fused kernel's sectors per request (global-load sectors over requests), which tile spills, and its
# local-memory sectors (loads and stores together).

# %%
RAW_CASES = ("lab01_fused",)
RAW_TILES = ("lab02_64x64x32x4x3", "lab02_256x256x64x4x2")
for name in RAW_CASES + RAW_TILES:
    print(facts.ncu_raw_text(name, ("global_op_ld", "local_op", "registers_per_thread")), end="\n\n")

# %% tags=["learner"]
MY_NCU_RAW = None  # YOUR CODE HERE: {"sectors_per_request": {"lab01_fused": ...}, "spilling_tile": "<report>", "local_sectors": ...}

# %% [markdown]
# **3.** A four-GPU PCIe machine (public capture, `src/hwlab/recorded/topology/`): which pairs of the group
# cross its slowest link, and which class is it?

# %%
TOPO = (evidence.RECORDED_DIR / "topology" / "pcie4_2socket_pix_sys.txt").read_text()
GROUP = [1, 2, 3]
print(TOPO)
print("group:", GROUP)

# %% tags=["learner"]
MY_TOPO = None  # YOUR CODE HERE: {"pairs": [(a, b), ...], "link": "<class>"}

# %%
for result in (check.check_rank_wait(RANKS, MY_RANKS), check.check_host_gap(RANK0, MY_GAP),
               check.check_ncu_lab01("strided", MY_NCU_LAB1), check.check_ncu_lab02("256x256x64 w4 s2", MY_NCU_LAB2),
               check.check_ncu_raw(RAW_CASES, RAW_TILES, MY_NCU_RAW),
               check.check_slow_pairs(TOPO, GROUP, MY_TOPO)):
    display(result)
