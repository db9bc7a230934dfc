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
# # 05 · Node health baseline: record it healthy, compare when it is not
#
# **Needs:** nothing special; on a GPU node every probe runs there, on a CPU the CPU is probed (labelled)
# and the H200 baseline this kit recorded is shown beside it.
# **Takes:** the run times measured on the H200 and on a CPU are in the table of `docs/LEARNING_PATH.md`.
#
# Without a baseline, on call you can only guess whether "this machine is weird". With one, a regression
# splits into **hardware**, **topology**, **runtime** or **workload** in one command:
#
# ```
# hwlab baseline record --out baselines/            # once, when the node is known good
# hwlab baseline compare baselines/baseline-<host>-<t>.json new.json
# ```
# Under torchrun or SLURM every node records in parallel (one process per node: `LOCAL_RANK`/`SLURM_LOCALID`
# 0) into a shared folder; `hwlab baseline compare BASE.json node1.json node2.json ...` prints one table.

# %%
from hwlab.diagnosis import baseline
from hwlab.core import evidence
from hwlab import nb

print(nb.live_label())
live = baseline.record(quick=not nb.has_gpu())
print("probes:", [m.name for m in live.results])
print("missing parts (recorded, not fatal):", live.extra["missing"])
print("runtime path:", live.extra["runtime_path"])

# %% [markdown]
# ## The H200's baseline (recorded), and an unchanged re-run compared against it

# %%
h200 = evidence.recorded("baseline")
rerun = evidence.recorded("baseline_rerun")
nb.banner("H200 baseline", h200.label)
for m in h200.results:
    print("  " + m.summary())
print("runtime path:", h200.extra["runtime_path"])
cmp_ = baseline.compare(h200, rerun)
print("\nre-run vs baseline:", cmp_.summary())

import matplotlib.pyplot as plt

names = [m.name for m in h200.results if m.name != "launch_overhead"]
b = {m.name: baseline._probe_value(m) for m in h200.results}
r = {m.name: baseline._probe_value(m) for m in rerun.results}
fig, ax = plt.subplots(figsize=(8, 3.2))
ax.bar(names, [100 * r[n][0] / b[n][0] for n in names])
ax.axhline(100 - baseline.TOL_RATE_PCT, color="r", ls="--", label=f"tolerance: -{baseline.TOL_RATE_PCT:.0f}%")
ax.set_ylabel("% of baseline (GB/s or TFLOP/s)")
ax.set_title(f"H200 re-run against its baseline\n({rerun.label})", fontsize=9)
ax.legend(fontsize=7)
plt.xticks(rotation=20, fontsize=7)
plt.show()

# %% [markdown]
# ## What each class of deviation looks like
# A **runtime** deviation, measured on this machine: its own record compared with the same record whose
# runtime path was measured again, live, with two of the decode step's main GEMMs taking the dequantized bf16
# path (what a build without the FP8 kernel for a shape does). Same machine, same drivers, same probes: the
# pair is comparable, and only the runtime path differs. Beside it, a **hardware** and a **topology**
# deviation injected into copies of the H200 record (a slower copy, a changed NUMA affinity), labelled so.

# %%
import copy

import torch

changed = copy.deepcopy(live)
changed.extra["runtime_path"] = {**live.extra["runtime_path"], **baseline.fp8_decode_path(
    torch.device("cuda" if nb.has_gpu() else "cpu"), quick=not nb.has_gpu(), fallback_main=2)}
c = baseline.compare(live, changed)
print(f"--- runtime, measured on {live.device}: this machine's record vs the same record with the runtime path "
      f"re-measured (2 main GEMMs on the fallback)\ncomparable: {c.comparable}; classified as "
      f"{sorted(c.categories())}\n{c.summary()}\n")


def injected(kind):
    ev = copy.deepcopy(rerun)
    if kind == "hardware":
        for m in ev.results:
            if m.name.startswith("hbm_copy"):  # 30% slower copy, in every repeat
                m.t_ms, m.t_p10_ms, m.t_p90_ms = m.t_ms * 1.3, m.t_p10_ms * 1.3, m.t_p90_ms * 1.3
    elif kind == "topology":
        ev.extra["topology"]["numa_affinity"] = {g: 1 for g in ev.extra["topology"]["gpus"]}
    return ev


for kind in ("hardware", "topology"):
    c = baseline.compare(h200, injected(kind))
    print(f"--- {kind}, injected into a copy of the H200 re-run: classified as {sorted(c.categories())}\n"
          f"{c.summary()}\n")

# %% [markdown]
# ## This machine against the H200 baseline
# On the H200 this compare is a re-check of the same machine type; on any other machine the two runs
# are not comparable (another GPU model or none) or differ in many probes, which says the machine differs,
# not that it is faulty. The compare below says which case this is.

# %%
print(baseline.compare(h200, live).summary(max_reasons=4))  # summary() alone lists every difference

# %% [markdown]
# ## Summary
# - Record a baseline per machine type when it is healthy; keep it with the node's records.
# - `compare` names the class of a regression and the next thing to check; when everything matches and
#   the service is still slow, the workload changed.
