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
# # 08 · Examine your own kernel: point the flowchart at your code
#
# **Needs:** nothing special; on a GPU the examination runs there, on a CPU it runs on the CPU (labelled,
# the leaf indicative) and the H200 examinations this kit recorded are shown beside it. **Takes:** the run
# times measured on the H200 and on a CPU are in the table of `docs/LEARNING_PATH.md`.
#
# Labs 1-4 walk the flowchart over the kit's own kernels. The week after, the slow kernel is *yours*.
# `hwlab examine` takes any PyTorch or Triton callable and does what the labs did, under the same protocol:
#
# 1. checks the call (it runs, returns a tensor, leaves its inputs alone; inputs never constant);
# 2. counts its work: **required bytes** (inputs read once, outputs written once), **FLOPs**
#    (`torch.utils.flop_counter`), and a **traffic model** (each aten op's tensors; sector amplification
#    from strides and real index values) — each labelled *estimated* unless you pass them;
# 3. times it (warm-up to the sustained state, device events, median and p10-p90, fresh input sets rotated
#    past L2 when you give an input factory);
# 4. profiles a few calls (kernels per call, GPU idle %, dominating kernels, tensor-core or not, Triton
#    spills), and with `--ncu` adds Nsight Compute counters, kept apart;
# 5. walks the flowchart on **measured metrics only**, names the leaf, the seed's actions, the lab that
#    teaches it, and drafts the incident record.
#
# ```
# hwlab examine examples/shuffled_gather.py:shuffled_gather          # inputs() from the same module
# hwlab examine mymodel.py:block --inputs mymodel.py:make_batch --json --out runs/block.json
# ```
# In Python: `hwlab.examine(fn, *args)` or `hwlab.examine(fn, make_inputs=factory)`.

# %%
from pathlib import Path

import torch

import hwlab
from hwlab import ceilings, evidence, nb
from hwlab.examine_report import format_table, plot_slowdowns, table
from hwlab.examine_target import load

ROOT = Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()
print(nb.live_label())
here = ceilings.get(quick=True)  # this machine's ceilings (cached after the first run)
print("ceilings:", here.label)

# %% [markdown]
# ## One of the examples, live
#
# `examples/unfused_chain.py` is an activation chain written op by op: six elementwise kernels, each
# reading and writing the whole tensor.
#
# **Prediction:** the required bytes are one read of `x` and one write of the result (8 bytes per element
# in fp32); the six kernels move 52 bytes per element. On a GPU it should run ~6x over its floor, at DRAM
# speed: the bandwidth leaf **G**.

# %%
fn, mod = load(f"{ROOT / 'examples' / 'unfused_chain.py'}:unfused_chain")
ex = hwlab.examine(fn, make_inputs=mod.inputs, ceilings=here, name="unfused_chain")
print(ex.report())
nb.show_mermaid(ex.diagnosis.mermaid())

# %% [markdown]
# On a CPU the numbers are the CPU's against the CPU's ceilings: its caches are large next to these small
# tensors, so the walk there is indicative of the code path, never a GPU verdict. The evidence lists the
# source of every metric; nothing in the walk was typed in.
#
# ## Every example on the H200 (recorded)
#
# Eight functions written apart from the labs, each with the leaf its cause predicts: the unfused chain
# and a shuffled gather (**G**), an fp32 GEMM without TF32 and a bf16 GEMM with K = 8191 (**I**), a Python
# loop of tiny kernels and a Triton tile that spills (**J**), and a cuBLAS bf16 GEMM and a
# `torch.compile`d chain (**OK**). `benchmarks/record_examine.py` examined each through the API, and two
# through the command line.

# %%
rec_path = evidence.RECORDED_DIR / "h200" / "examine.json"
if rec_path.exists():
    rec = evidence.load(rec_path)
    nb.banner("hwlab examine on the example functions", rec.label)
    rows = table(rec.extra["entries"])
    print(format_table(rows))
    for name, c in rec.extra.get("cli", {}).items():
        print(f"command line: {c['command']} -> leaf {c.get('leaf')}, exit code {c['rc']}")
    plot_slowdowns(rows, rec.label)
else:
    print("examine.json has not been recorded on the H200 yet (benchmarks/record_examine.py on a GPU); "
          "showing this machine's live examination instead")
    plot_slowdowns(table([{"name": "unfused_chain", "leaf": ex.leaf_id, "expected_leaf": "G",
                           "path": ex.diagnosis.path, "evidence": ex.evidence}]), ex.label)

# %% [markdown]
# ## Your turn: examine a function of your own
#
# Replace `my_layer_norm` with your own code (any callable taking tensors). Before running, write down
# its required bytes and which leaf you expect; then read the evidence and its sources.

# %%
def my_layer_norm(x, w, b):
    mu = x.mean(dim=-1, keepdim=True)
    var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + 1e-5) * w + b


def my_inputs():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rows, d = (16384, 4096) if dev == "cuda" else (256, 256)
    return torch.randn(rows, d, device=dev), torch.randn(d, device=dev), torch.randn(d, device=dev)


mine = hwlab.examine(my_layer_norm, make_inputs=my_inputs, ceilings=here)
print(mine.report())

# %% [markdown]
# ## Summary
#
# * `hwlab examine` measures a function under the kit's protocol and walks the flowchart on measured
#   metrics only; where a question cannot be measured for one function on one device, the walk stops and
#   says what to run (`--ncu`, per-rank step times).
# * Bytes and FLOPs you pass win; otherwise they are estimated and labelled so. The traffic model sees
#   aten ops only: Triton kernels and `torch.compile` graphs are reported as not attributable.
# * The report drafts the seed's incident record (`--out` writes it beside the examination).
#
# **Exercises.** (1) Fuse `unfused_chain` by hand with `torch.compile` or a Triton kernel and examine it
# again: which leaf now, and how close to the floor? (2) Make the shuffled gather coalesced (sort the
# index) and compare its estimated sector amplification. (3) Run your own function with `--ncu` on a GPU
# and compare the counted DRAM % and sector amplification with the estimates.
