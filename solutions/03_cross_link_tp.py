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
# # Solution 03 · Find the straggler, fix the mapping
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
# own work = compute + TP all-reduce; the ranks whose TP all-reduce crosses the shaped veth stand out
own = {int(r): v["compute_ms"] + v["tp_allreduce_ms"] for r, v in report["per_rank"].items()}
base = min(own.values())
TAIL_RANKS = sorted(r for r, t in own.items() if t > 2 * base)

# %%
lab.grade_straggler(TAIL_RANKS, report)

# %%
topo = topology.parse_topo_matrix((evidence.RECORDED_DIR / "topology" / "pcie4_2socket_pix_sys.txt").read_text())
print(topo.render())

# %% tags=["learner"]
MY_GROUPS = [[0, 1], [2, 3]]  # each pair shares a PCIe switch (PIX); 0/1 and 2/3 sit on different sockets

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
# a tail with a normal single-rank baseline points at the mapping; no tail with a slow baseline at the kernel
SUSPECTS = ["mapping" if row["tail_ranks"] and row["slowdown_vs_floor"] < 1.5 else "kernel" for row in sig]

# %%
for row, ans in zip(sig, SUSPECTS):
    print(lab.grade_suspect(ans, row))
