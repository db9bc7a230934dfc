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
# # Exercise 01 · The transposed chain: fuse it, keep it coalesced
#
# **Needs:** nothing beyond the kit. On a CPU your kernel runs in the Triton interpreter, which checks it
# and counts the memory traffic of every load and store it issues (an estimate from the addresses,
# labelled CPU); on a GPU the speed band against this machine's measured copy bandwidth is graded instead.
# **Takes:** see the agendas in `docs/INSTRUCTOR.md`.
#
# Notebook 01 fused a chain that reads and writes in the same layout. Here a layer hands
# `y = gelu_tanh(x + bias) * scale + shift` to a GEMM that wants it **transposed**: `x (rows, cols)` and
# `y (cols, rows)`, both row-major, `bias (cols,)`, `scale` and `shift` two numbers. The model does it in
# eager PyTorch today (printed below).
#
# **Part 1.** Before anything is measured: how many times the bytes the work must move (read `x` and
# `bias` once, write `y` once) does the eager version move? Count each op's reads and writes.
#
# **Part 2.** Write one Triton kernel, and the function that launches it, computing `y`. The checker
# runs it on fresh random inputs against a float64 reference, then grades two figures the interpreter
# counts: the bytes your call moves against that floor, and the share of each fetched 32-byte sector
# your warps' loads and stores use (the bands are printed with the check). A warp's lanes read or write
# consecutive addresses only along the axis where the pointer block is contiguous.

# %%
import inspect

import torch
from hwlab.core import ceilings  # first: without a GPU it switches on Triton's interpreter
from hwlab.course import exercise_checks
from hwlab import nb
from hwlab.labs.bandwidth import transposed
import triton
import triton.language as tl

GPU = nb.has_gpu()
print(nb.live_label())
print(inspect.getsource(transposed.eager))
rows, cols = (8192, 8192) if GPU else (96, 160)
dtype = torch.float16
print(f"x: ({rows}, {cols}) {dtype}, bias: ({cols},), y: ({cols}, {rows})")

# %% tags=["learner"]
MY_BYTES_RATIO = None  # YOUR ANSWER HERE: bytes the eager version moves / bytes the work must move

# %%
exercise_checks.check_bytes_prediction(MY_BYTES_RATIO, 96, 160, dtype)

# %%
nb.md(f"Bands: bytes moved **≤ {exercise_checks.TRANSPOSED_MAX_BYTES_X:.2f}x** the floor and sectors used "
      f"**≥ {100 * exercise_checks.TRANSPOSED_MIN_SECTOR_USE:.0f}%** (counted in the interpreter); on a GPU, "
      f"**≥ {exercise_checks.TRANSPOSED_MIN_PCT:.0f}%** of this machine's measured copy bandwidth.")

# %% tags=["learner"]
@triton.jit
def my_transposed_kernel(x_ptr, b_ptr, y_ptr, n_rows, n_cols, scale, shift, BLOCK: tl.constexpr):
    # YOUR CODE HERE (the signature is yours to change: your function below is what launches it)
    pass


def my_transposed_chain(x, bias, scale=transposed.SCALE, shift=transposed.SHIFT):
    # YOUR CODE HERE: allocate y (cols, rows), launch my_transposed_kernel, return y
    raise NotImplementedError


# %% [markdown]
# ## Check
# First that your function runs *your* kernel (the kit's kernels, a `torch.compile` kernel or torch doing
# the arithmetic are refused); then correctness on fresh random data; then the traffic bands (interpreter)
# or the speed band (GPU). A missing or broken Triton is reported as an environment problem, with the fix.

# %%
c = ceilings.get(quick=True)
exercise_checks.check_transposed_kernel(my_transposed_chain, [my_transposed_kernel], rows, cols, dtype,
                                        ceiling_gbps=c.copy_gbps if GPU else None)
