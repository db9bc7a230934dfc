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
# # Solution 02 · A row softmax: what fills the SM?
#
# **Needs:** nothing beyond the kit: each config is compiled for sm_90a (the H200's architecture)
# without a GPU, and registers, spills and shared memory are read from `ptxas -v`.
# **Takes:** see the agendas in `docs/INSTRUCTOR.md`.
#
# Notebook 02 tuned a GEMM tile. This kernel is different: a softmax over one row per program, the
# whole row (`BLOCK` elements, fp32) in one block of `num_warps` warps. Its knobs are the row length and
# the warps per program; it keeps no accumulator tile and almost no shared memory.
#
# How many blocks fit on one SM is the smallest of four limits (`hwlab.labs.registers.occupancy`):
# - **registers**: round the registers per thread up to a multiple of the allocation unit per thread,
#   times the warp size, rounded up to the allocation unit per warp; the register file holds
#   `floor(regs_per_sm / per_warp)` warps, so `floor(that / warps_per_block)` blocks;
# - **shared memory**: each block takes its shared memory rounded up to the allocation unit, plus the
#   reserved amount per block; `floor(smem_per_sm / that)` blocks;
# - **warps**: `floor(max_warps_per_sm / warps_per_block)`;
# - **block slots**: at most `max_blocks_per_sm` resident blocks, whatever their size.
#
# The SM's figures are printed below (the H200's, from the CUDA programming guide).
#
# **Part 1.** For the row of the first compile report below, how many blocks fit per SM, and which limit
# binds? **Part 2.** For a long row, pick the warps per program that gives the highest occupancy.

# %%
from dataclasses import asdict

from hwlab.course import exercise_checks
from hwlab import nb
from hwlab.labs import registers as lab
from hwlab.labs.registers.occupancy import HOPPER

print(nb.live_label())
nb.show_kernel(lab.wide_block_kernel)
print({k: v for k, v in asdict(HOPPER).items()})
SHORT, LONG = 256, 4096
rep = exercise_checks.softmax_report(SHORT, 1)
print(rep.skipped or f"BLOCK={SHORT}, 1 warp: {rep.n_regs} registers/thread, {rep.n_spills} spill slots, "
      f"{rep.shared_bytes} B shared memory per block [{rep.source}]")

# %% tags=["learner"]
MY_BLOCKS_PER_SM = None  # YOUR ANSWER HERE: blocks of this kernel (BLOCK=256, 1 warp) per SM
MY_LIMITER = None        # YOUR ANSWER HERE: "registers", "shared memory", "warps" or "block slots"
### BEGIN SOLUTION
# each limit from the report's registers and shared memory and the SM's figures; with so few registers and
# one warp per block, the register file, the shared memory and the warp limit each hold more blocks than
# the SM has block slots
MY_BLOCKS_PER_SM = min(HOPPER.regs_per_sm // (((rep.n_regs + 7) // 8 * 8 * 32 + 255) // 256 * 256),
                       HOPPER.smem_per_sm // ((rep.shared_bytes + 127) // 128 * 128 + 1024),
                       HOPPER.max_warps_per_sm, HOPPER.max_blocks_per_sm)
MY_LIMITER = "block slots"
### END SOLUTION

# %%
exercise_checks.check_occupancy_prediction(SHORT, 1, MY_BLOCKS_PER_SM, MY_LIMITER)

# %% [markdown]
# ## Part 2 · A long row
# Now each row has `LONG` elements and one program still takes the whole row. Pick `MY_WARPS` among
# the values printed below. The checker compiles every choice for sm_90a, refuses one that spills, and
# passes the one with the highest theoretical occupancy. The cell after it prints your choice's compile
# report, to check your reasoning against.

# %%
print(f"BLOCK = {LONG} fp32 per program; warps to choose from: {exercise_checks.SOFTMAX_WARPS}")

# %% tags=["learner"]
MY_WARPS = None  # YOUR ANSWER HERE: warps per program for BLOCK=4096
### BEGIN SOLUTION
# every warp more halves the elements each thread holds (4096 / (32 x warps)), so the registers per
# thread fall; with 16 warps a thread holds 8 values, the registers of 4 blocks fill the file and so do
# their 64 warps: full occupancy
MY_WARPS = 16
### END SOLUTION

# %%
exercise_checks.check_warps_choice(LONG, MY_WARPS)
