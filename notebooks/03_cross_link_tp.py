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
# on a GPU, otherwise shows the H200 run, labelled. **Takes:** ~1 min.
#
# ## Symptom (the seed's case)
# The same serving config drops from 1.0x to **0.72x** on an 8-GPU box. Single-GPU microbenchmarks are
# fine. Some ranks finish 10–20 ms late; NCCL waits sit between kernels; the slow ranks' traffic goes over
# PCIe instead of NVLink. A machine swap reordered GPU ordinals, and the TP groups, built from ordinals,
# now straddle a slow link. Signature: **local rank tail + collective wait + healthy single-card baseline**.

# %%
import os
import shutil

import matplotlib.pyplot as plt
from hwlab import evidence, flowchart, mapping, nb, topology
from hwlab.labs import crosslink as lab

GPU = nb.has_gpu()
CAN_NETNS = hasattr(os, "geteuid") and os.geteuid() == 0 and bool(shutil.which("ip") and shutil.which("tc"))
print(nb.live_label(), "| slow link can be built here:", CAN_NETNS)

# %% [markdown]
# ## 1. The topology decides which groups are cheap
# A TP group is as fast as its slowest link. For each real capture: the topology-unaware mapping (consecutive
# ordinals, or ordinals reordered after a swap) against the one `hwlab.mapping.choose_tp_groups` picks, with
# the predicted all-reduce time of a 32 MiB message (ring, latency-bandwidth model per link class).

# %%
cases = [("dgx1_v100_hybrid_cube_mesh.txt", 2, None), ("pcie4_2socket_pix_sys.txt", 2, [0, 2, 1, 3]),
         ("rtx4090x8_pcie_2socket.txt", 4, [0, 4, 1, 5, 2, 6, 3, 7]), ("h100x8_nvswitch_4socket.txt", 4, None),
         ("b300x8_nvswitch_8nic.txt", 2, None)]
for name, tp, order in cases:
    t = topology.parse_topo_matrix((evidence.RECORDED_DIR / "topology" / name).read_text())
    naive = mapping.evaluate(t, mapping.naive_groups(t, tp, order))
    aware = mapping.evaluate(t, mapping.choose_tp_groups(t, tp))
    print(f"{name} tp={tp}{' (reordered ordinals)' if order else ''}\n"
          f"   unaware {naive.groups}: worst {naive.worst}, predicted {naive.step_us:,.0f} us, "
          f"{len(naive.crossings)} pairs on slower links than needed\n"
          f"   aware   {aware.groups}: worst {aware.worst}, predicted {aware.step_us:,.0f} us")

# %% [markdown]
# ## 2. A real slow link, and the straggler it makes
# Six gloo ranks run the TP block (column-parallel linear → GELU → row-parallel linear → all-reduce),
# then a small data-parallel sync. Ranks 4 and 5 live in a network namespace behind a veth pair shaped with
# `tbf`: traffic between them and the host ranks *really* crosses a slower link. The "reordered" mapping
# puts two TP groups across it; the aware one comes from the chooser on the ranks' topology.

# %%
if CAN_NETNS:
    exp, src = lab.slowlink_experiment(), "measured live on this machine (gloo over loopback + shaped veth)"
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
for name in ("naive", "aware"):
    r = exp[name]["report"]
    print(f"{name}: tail ranks {r['tail_ranks']} ({r['tail_pct']:.0f}% over the others); " + " ".join(r["notes"]))
print(f"aware over naive: {exp['speedup_aware_over_naive']:.2f}x  [{src}]")

# %% [markdown]
# ## 3. Place it on the flowchart
# Single card fine → only slow at scale → a rank tail → **NCCL / NVLink / NUMA / rank mapping**. After the
# fix the same probe shows no tail and no slowdown against the all-loopback reference.

# %%
for name in ("naive", "aware"):
    d = flowchart.diagnose(exp[name]["flowchart_evidence"])
    print(f"--- {name} [{src}]\n{d.explain()}\n")
nb.show_mermaid(flowchart.diagnose(exp["naive"]["flowchart_evidence"]).mermaid())

# %% [markdown]
# ## 4. One GPU: the all-reduce in device memory vs staged through host memory
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
# ## 5. Several GPUs: force the slow route and read NCCL's choice
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
# - Next: `exercises/03_cross_link_tp.ipynb` — find the straggler and propose the mapping.
