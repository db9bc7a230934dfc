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
# # Solution 03 · A job's rank map on a hybrid cube-mesh
#
# **Needs:** nothing beyond the kit (a real `nvidia-smi topo -m` capture). **Takes:** see the agendas in
# `docs/INSTRUCTOR.md`.
#
# A training job got six GPUs of an eight-GPU server (the capture below) and was launched with the device
# list printed under it: rank `r` runs on the `r`-th GPU of that list, and each tensor-parallel (TP) group
# is consecutive ranks. Its step time has a rank tail.
#
# **Part 1.** Which TP groups (as lists of ranks) have a pair of GPUs that is not linked by NVLink? Cite,
# for each such group, a GPU pair and its cell as the matrix prints it, and name the flowchart leaf
# (`hwlab.diagnosis.flowchart.LEAVES`).
#
# **Part 2.** Regroup the job's own six GPUs into TP groups whose slowest link is the fastest these six
# allow (GPU ordinals, as the matrix names them).

# %%
from hwlab.core import evidence, topology
from hwlab.diagnosis import flowchart
from hwlab import nb  # nb.reveal: a check's answer after three wrong tries
from hwlab.course import exercise_checks

capture = evidence.RECORDED_DIR / "topology" / "dgx1_v100_hybrid_cube_mesh.txt"
print("[recorded capture]", " | ".join(l.lstrip("# ") for l in capture.read_text().splitlines()[:2]))
topo = topology.parse_topo_matrix(capture.read_text())
print(topo.render())
DEVICES = [0, 5, 1, 4, 2, 3]  # the launcher's device list: rank r -> GPU DEVICES[r]
TP = 2
print(f"CUDA_VISIBLE_DEVICES={','.join(map(str, DEVICES))}  (ranks 0..{len(DEVICES) - 1}), TP size {TP}")
print("leaves:", {k: v.title for k, v in flowchart.LEAVES.items()})

# %% tags=["learner"]
CROSSING = None  # YOUR ANSWER HERE: rank groups, e.g. [[0, 1]]
EVIDENCE = None  # YOUR ANSWER HERE: {(gpu_a, gpu_b): "CELL"} for at least one pair of each group
LEAF = None      # YOUR ANSWER HERE: a leaf id
### BEGIN SOLUTION
# ranks (0,1) -> GPUs 0,5; (2,3) -> GPUs 1,4; (4,5) -> GPUs 2,3. Row GPU0, column GPU5 reads SYS, as does
# GPU1-GPU4: those all-reduces leave NVLink for PCIe and the inter-socket link. GPU2-GPU3 is NV2.
CROSSING = [[0, 1], [2, 3]]
EVIDENCE = {(0, 5): "SYS", (1, 4): "SYS"}
LEAF = "L"
### END SOLUTION

# %%
exercise_checks.check_crossing(topo, DEVICES, TP, CROSSING, EVIDENCE, LEAF)

# %% tags=["learner"]
MY_GROUPS = None  # YOUR ANSWER HERE: groups of GPU ordinals, e.g. [[0, 1], [2, 3], [4, 5]]
### BEGIN SOLUTION
# the NV2 (two bonded NVLinks) pairs among GPUs 0-5: 0-3, 0-4, 1-2, 1-5, 2-3. GPU4 pairs at NV2 only with
# GPU0 and GPU5 only with GPU1, which leaves 2-3, also NV2.
MY_GROUPS = [[0, 4], [1, 5], [2, 3]]
### END SOLUTION

# %%
exercise_checks.check_job_mapping(topo, DEVICES, MY_GROUPS, TP)
