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
# # Exercise 03 · A job's rank map on a hybrid cube-mesh
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

# %%
exercise_checks.check_crossing(topo, DEVICES, TP, CROSSING, EVIDENCE, LEAF)

# %% tags=["learner"]
MY_GROUPS = None  # YOUR ANSWER HERE: groups of GPU ordinals, e.g. [[0, 1], [2, 3], [4, 5]]

# %%
exercise_checks.check_job_mapping(topo, DEVICES, MY_GROUPS, TP)
