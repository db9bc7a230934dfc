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
# **Takes:** 15 min.
#
# Part 1: below are the per-rank median times of the TP block after a GPU reorder (recorded on a CPU
# machine with a real rate-limited link). Which ranks are the tail?
#
# Part 2: a two-socket PCIe server (real capture). Propose TP groups of 2 that keep every TP all-reduce
# on the fastest link this machine offers.

# %%
from hwlab import evidence, topology
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
