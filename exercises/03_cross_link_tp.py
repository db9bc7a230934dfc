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
# # Exercise 03 · Find the straggler, fix the mapping
#
# **Needs:** nothing beyond the kit (recorded per-rank timings and real topology captures).
# **Takes:** see the agendas in `docs/INSTRUCTOR.md`.
#
# Part 1: below are the per-rank median times of the TP block after a GPU reorder (recorded on a CPU
# machine with a real rate-limited link). Which ranks are the tail?
#
# Part 2: a two-socket PCIe server (real capture). Propose TP groups of 2 that keep every TP all-reduce
# on the fastest link this machine offers.
#
# Part 3: two slow six-rank runs measured in one launch (recorded on a CPU machine). For each, is the
# mapping or the kernel to suspect first?

# %%
from hwlab.core import evidence, topology
from hwlab.labs import crosslink as lab

rec = evidence.recorded("lab03_slowlink", "cpu")
report = rec.extra["experiment"]["naive"]["report"]
print(rec.label)
for r, v in sorted(report["per_rank"].items(), key=lambda kv: int(kv[0])):
    print(f"rank {r}: compute {v['compute_ms']:.1f} ms, TP all-reduce {v['tp_allreduce_ms']:.1f} ms, "
          f"DP sync {v['dp_sync_ms']:.1f} ms, step {v['step_ms']:.1f} ms")

# %% tags=["learner"]
TAIL_RANKS = None  # YOUR ANSWER HERE, e.g. [0, 3]

# %%
lab.grade_straggler(TAIL_RANKS, report)

# %%
topo = topology.parse_topo_matrix((evidence.RECORDED_DIR / "topology" / "pcie4_2socket_pix_sys.txt").read_text())
print(topo.render())

# %% tags=["learner"]
MY_GROUPS = None  # YOUR ANSWER HERE, e.g. [[0, 2], [1, 3]]

# %%
lab.grade_mapping(topo, MY_GROUPS, tp=2)

# %%
sw = evidence.recorded("lab03_linksweep", "cpu")
sig = sw.extra["calibrated"]["signature"]
print(sw.label)
for i, row in enumerate(sig):
    print(f"run {i}: tail ranks {row['tail_ranks']} ({row['rank_tail_pct']:.0f}% over the others), every rank "
          f"~{row['comm_wait_ms_median']:.0f} ms per step in collectives, one rank's compute alone "
          f"{row['slowdown_vs_floor']:.2f}x its floor, step {row['step_ms']:.0f} ms")

# %% tags=["learner"]
SUSPECTS = [None, None]  # YOUR ANSWER HERE: "mapping" or "kernel" for run 0 and run 1

# %%
for row, ans in zip(sig, SUSPECTS):
    print(lab.grade_suspect(ans, row))
