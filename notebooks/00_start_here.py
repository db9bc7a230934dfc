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
# # 00 · Start here: the machine in front of you
#
# **Needs:** nothing special. On a GPU node every number below is measured live; on a laptop or CI
# machine without a GPU the kit measures the CPU (labelled *CPU*) and shows the H200 runs this kit
# recorded (labelled *recorded on NVIDIA H200*). **Takes:** the run times measured on the H200 and on a CPU
# are in the table of `docs/LEARNING_PATH.md`.
#
# **You will see:** the machine's state (NVML), its topology, the two ceilings every lab judges against
# (copy bandwidth and GEMM rate, *as measured here*), the roofline they draw, and the diagnosis
# flowchart the labs walk.
#
# The rule of this kit: a time alone says nothing. Every probe knows the bytes it had to move and the
# FLOPs it had to do, so it reports GB/s, TFLOP/s and *% of what this machine measured*.

# %%
import matplotlib.pyplot as plt
from hwlab.core import ceilings, evidence, roofline, specs, system, topology
from hwlab.diagnosis import flowchart
from hwlab import nb

GPU = nb.has_gpu()
print("GPU present:", GPU, "|", nb.live_label())

# %% [markdown]
# ## 1. System state (NVML)
# Temperature, power, clocks against their maxima, throttle reasons, ECC, PCIe link. Without a driver
# NVML is absent: that is a state, not an error.

# %%
snap = system.snapshot()
print("versions:", snap["versions"])
if snap["nvml"]["available"]:
    for g in snap["gpus"]:
        print({k: g[k] for k in ("name", "temperature_c", "power_w", "sm_clock_mhz",
                                 "sm_clock_max_mhz", "clock_event_reasons", "pcie_gen", "pcie_width")})
else:
    print("NVML:", snap["nvml"]["reason"])
    rec = evidence.recorded("doctor")
    nb.banner("The H200's NVML state instead", rec.label)
    g = rec.snapshot["gpus"][0]
    print({k: g[k] for k in ("name", "temperature_c", "power_w", "power_limit_w", "sm_clock_max_mhz",
                             "clock_event_reasons", "ecc_mode", "pcie_gen", "pcie_width", "nvlink")})
print("health flags:", system.health_flags(snap if snap["nvml"]["available"] else rec.snapshot) or "none")

# %% [markdown]
# ## 2. Topology
# `nvidia-smi topo -m` says how each pair of GPUs (and NICs) is connected: `NV#` (NVLink) is fastest,
# then `PIX`, `PXB`, `PHB`, `NODE`, and `SYS` (across sockets) is slowest. A tensor-parallel group that
# crosses `SYS` when an NVLink group exists is the seed's first incident (Lab 3).

# %%
text = topology.capture_topo_text()
if text:
    print(topology.parse_topo_matrix(text).render())
else:
    print("no nvidia-smi here; a real 8-GPU capture instead (DGX-1 hybrid cube mesh):")
    cap = (evidence.RECORDED_DIR / "topology" / "dgx1_v100_hybrid_cube_mesh.txt").read_text()
    t = topology.parse_topo_matrix(cap)
    print(t.render())
    print("slowest link inside GPU0-3:", t.slowest_link([0, 1, 2, 3]),
          "| inside GPU0,4,5:", t.slowest_link([0, 4, 5]))

# %% [markdown]
# ## 3. Ceilings: what this machine measured
# The datasheet is a lead; the lab's yardstick is what *this* card reached on a large copy (bytes read
# + written) and a large GEMM on random data. They are cached per machine (`hwlab doctor --remeasure`
# refreshes them).

# %%
here = ceilings.get(quick=True)
print(f"live ({here.label}): copy {here.copy_gbps:,.1f} GB/s, GEMM",
      {k: round(v, 2) for k, v in here.gemm_tflops.items()}, "TFLOP/s")
h200 = ceilings.recorded()
print(f"{h200.label}: copy {h200.copy_gbps:,.0f} GB/s, GEMM",
      {k: round(v, 1) for k, v in h200.gemm_tflops.items()}, "TFLOP/s")
ds = specs.lookup("NVIDIA H200")
print(f"H200 datasheet: {ds.hbm_gbps:,} GB/s, bf16 {ds.bf16_tflops} TFLOP/s dense -> measured copy is "
      f"{100 * h200.copy_gbps / ds.hbm_gbps:.0f}% and bf16 GEMM {100 * h200.gemm('bf16') / ds.bf16_tflops:.0f}% of it")

# %% [markdown]
# ## 4. The roofline
# Attainable TFLOP/s = min(peak, bandwidth × arithmetic intensity). Left of the ridge point a kernel
# is memory-bound whatever its math. Where the Lab 1 points (an elementwise chain) sit against the H200's
# measured ridge is computed under the plot from the recorded run's counted FLOPs and bytes.

# %%
lab1 = evidence.recorded("lab01_bandwidth")
fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
roofline.plot(h200, lab1.results, ax=axes[0], label=h200.label)
roofline.plot(here, [], dtypes=("fp32",), ax=axes[1], label=here.label)
plt.tight_layout()
plt.show()
ridge = h200.ridge_point("bf16")
un = next(m for m in lab1.results if m.name == "unfused")
ai_required, ai_moved = un.n_flops / un.n_bytes, un.n_flops / un.params["bytes_moved"]
nb.md(f"The Lab 1 chain does {un.n_flops / 1e6:,.0f} MFLOP on {un.n_bytes / 2**20:,.0f} MiB it must move: "
      f"**{ai_required:.2f} FLOP/byte** ({ai_moved:.2f} on the bytes the unfused chain really moves). "
      f"The H200's measured bf16 ridge is **{ridge:.0f} FLOP/byte**, {ridge / ai_required:.0f}x further right: "
      f"the chain is memory-bound by a wide margin. _[{lab1.label}; ridge {h200.label}]_")

# %% [markdown]
# ## 5. The diagnosis flowchart, and how to read evidence against it
# Every lab ends by placing its evidence on this chart. Questions carry a metric, a threshold and a
# reason; a missing metric stops the walk with "cannot decide: run probe X". Each rule is in
# `flowchart.QUESTIONS`.

# %%
nb.show_mermaid(flowchart.render_mermaid())
for q in flowchart.QUESTIONS.values():
    print(f"{q.id}. {q.text}  rule: " + " or ".join(c.describe() for c in q.criteria)
          + (f"; first, {' or '.join(c.describe() for c in q.overrides_no)} answers NO" if q.overrides_no else ""))

# %% [markdown]
# ### Read one piece of evidence
# The evidence is a table of measured metrics, each with its spread and what measured it. To walk it,
# start at **B**, find the row its rule names, compare the value (and its spread) with the threshold,
# take that branch, and repeat until a leaf. A value whose spread contains the threshold is
# **BORDERLINE**: either branch may be right, so re-measure before acting. The example is a cuBLAS bf16
# GEMM the kit examined on the H200, one that no lab asks you to diagnose; each lab's own evidence you
# walk yourself, at its checkpoint.

# %%
from IPython.display import display

ex_rec = evidence.load(evidence.RECORDED_DIR / "h200" / "examine.json")
ex = next(e for e in ex_rec.extra["entries"] if e["name"] == "gemm_bf16")
ex_ev = {**ex["evidence"], "metric_sources": ex["evidence_sources"]}
nb.show_evidence(ex_ev, f"{ex['name']}: {ex['target']}; {ex_rec.label}")

# %% [markdown]
# ### Walk it yourself
# Click through the chart on the table above: answer each question yourself; *Hint* shows how this
# evidence answers the question at hand (one at a time). Each step shows the metric, its threshold and why.

# %%
display(nb.flowchart_walkthrough(ex_ev, f"{ex['name']}; {ex_rec.label}"))

# %% [markdown]
# Every leaf has a scenario in the kit that lands on it; which lab lands where is what each lab's
# checkpoint asks you, from its own evidence (`docs/LEARNING_PATH.md` lists each lab's symptom).
#
# ## Summary
# - Judge kernels against ceilings *this* machine measured; keep datasheet peaks apart.
# - The roofline's ridge point says whether bytes or FLOPs bound a kernel before you profile.
# - The flowchart turns evidence into the next action. Next: `01_bandwidth_bound.ipynb`.
