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
# # Exercise 01 · Fuse the chain yourself
#
# **Needs:** a GPU to be graded on speed; on a CPU your kernel runs in the Triton interpreter and is
# graded on correctness only (the result says so). **Takes:** see the agendas in `docs/INSTRUCTOR.md`.
#
# Write one Triton kernel computing `y = (gelu_tanh(x + bias) + residual) * scale` for a row-major
# `x (rows, cols)`, `bias (cols,)`, `residual (rows, cols)`. The checker tests it on fresh random inputs
# against a float64 reference, then (on a GPU) asks for a share of **the copy bandwidth this machine
# measured** (the pass band, `MIN_PCT`, is shown with the check), counting the 3N bytes the work requires.
#
# Hints: one program per `BLOCK` of flattened elements; `bias` is indexed by `offs % cols`; compute in
# fp32 and cast back on store; `0.5·t·(1 + tanh(u)) == t·sigmoid(2u)` with `u = √(2/π)(t + 0.044715 t³)`.

# %%
import torch
from hwlab.core import ceilings  # first: without a GPU it switches on Triton's interpreter
from hwlab.diagnosis import exercise, exercise_checks
from hwlab import nb
from hwlab.labs import bandwidth as lab
from hwlab.core.measure import TOL_BY_DTYPE
import triton
import triton.language as tl

GPU = nb.has_gpu()
print(nb.live_label())

# %% tags=["learner"]
@triton.jit
def my_fused_kernel(x_ptr, b_ptr, r_ptr, y_ptr, n, n_cols, scale, BLOCK: tl.constexpr):
    # YOUR CODE HERE: load x, bias and residual for this block, compute, store y
    pass


def my_fused_chain(x, bias, residual, scale=0.5):
    # YOUR CODE HERE: allocate y, launch my_fused_kernel over cdiv(numel, BLOCK) programs, return y
    raise NotImplementedError

# %% [markdown]
# ## Check
# First that your function runs *your* kernel (an answer that calls the kit's fused kernel, a
# `torch.compile` kernel, or lets torch do the arithmetic is refused: it would grade someone else's
# kernel); then correctness on fresh random data; then the pass band relative to this machine's copy
# ceiling. A missing or broken Triton is reported as an environment problem, with the fix.

# %%
rows, cols = (8192, 8192) if GPU else (48, 200)
MIN_PCT = 70.0  # the pass band: a fused chain that streams its 3N bytes near the copy rate clears it
nb.md(f"Pass band: **≥ {MIN_PCT:.0f}%** of this machine's measured copy bandwidth"
      + ("." if GPU else " (not graded here: no GPU, correctness only)."))
dtype = torch.float16
c = ceilings.get(quick=True)
res = exercise_checks.check_own_kernel(
    "fused chain", my_fused_chain, [my_fused_kernel], lab.reference_chain,
    lambda: lab.make_chain_inputs(rows, cols, dtype),
    tol=TOL_BY_DTYPE["float16"], n_bytes=lab.chain_traffic(rows, cols, 2)["bytes_required"],
    ceiling_gbps=c.copy_gbps if GPU else None, min_pct=MIN_PCT,
    hint="Load each input once, compute in fp32, store once; BLOCK of 1024-4096 with 4-8 warps.")
res

# %% [markdown]
# ## Question: where on the flowchart?
# Below is the unfused chain's flowchart evidence from Lab 1's recorded run: each metric, its value and what
# measured it. Walk the chart yourself, question by question (the rules are in `hwlab.diagnosis.flowchart.QUESTIONS`),
# and answer with the leaf id (`"G"`, `"I"`, `"J"`, `"L"`, `"M"` or `"OK"`).

# %%
from hwlab.core import evidence
from hwlab.diagnosis import flowchart

rec = evidence.recorded("lab01_bandwidth")
ev = rec.extra["flowchart_evidence"]["unfused"]
print(f"unfused chain [{rec.label}]")
for k, v in ev.items():
    if k not in flowchart.META_KEYS:
        print(f"  {k} = {v:.4g}" if isinstance(v, float) else f"  {k} = {v}",
              f"  <- {(ev.get('metric_sources') or {}).get(k, '')}")
for q in flowchart.QUESTIONS.values():
    print(f"{q.id}. {q.text}  yes -> {q.yes}, no -> {q.no}; rules: " + "; ".join(c.describe() for c in q.criteria)
          + ("; first, to NO: " + "; ".join(c.describe() for c in q.overrides_no) if q.overrides_no else ""))

# %% tags=["learner"]
leaf_answer = None  # YOUR ANSWER HERE, e.g. "J"

# %%
exercise.check_value("flowchart leaf", leaf_answer, flowchart.diagnose(ev).leaf_id,
                     "walk it from B: at each question compare the metric printed above with the rule; "
                     "the first rule that holds picks the branch.")
