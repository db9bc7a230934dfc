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
# # 07 · Diagnosis drills: a slow run you did not set up
#
# **Needs:** nothing special. Each drill draws one fault from the kit's scenarios (or none) and shows only
# what the probes showed when the fault's scenario was *run*: live here on a GPU, or the H200's recorded run
# of the same configuration on a CPU machine (the slow-link rank: its recorded multi-rank CPU run). Every
# flowchart answer in a drill is a measured metric — B (the kernel alone against this machine's floor),
# D (the served step against what the kernel predicts), K (the per-rank step distribution; one process
# reports its one rank) — and each says what measured it. **Takes:** per drill, see the agendas in
# `docs/INSTRUCTOR.md`.
#
# You walk the flowchart, submit a leaf and the evidence it rests on; hwlab grades the leaf, checks that
# your evidence is what the probes showed and leads there, then runs the *fixed* configuration and
# recomputes every metric to see the slowdown go. Nothing you see or the fix check uses is derived from the
# fault's name. The drill file is sealed whole (an HMAC with a key outside the file): edit an observation
# and hwlab refuses it. From the command line: `hwlab drill new`, `hwlab drill submit DRILL.json --leaf G`,
# `hwlab drill reveal`.

# %%
from IPython.display import display
from hwlab.course import classroom, drills
from hwlab import nb

print(nb.live_label())
drill = drills.new()  # instructors: drills.new(seed=..., fault="slow_link_rank")
print(f"drill {drill.drill_id}: the workload is {drill.workload}")
print(f"what the probes show ({drill.source}):")
print("\n".join(drills.observations_text(drill.observations)))

# %% [markdown]
# ## Walk the flowchart
# Answer each question from the numbers above. *Hint* reveals one measured answer at a time (the metric
# that decides the question at hand, against its rule); the walk moves only when you press Yes or No.

# %%
display(nb.flowchart_walkthrough(drill.observations, drill.source))

# %% [markdown]
# ## Submit
# Set `MY_LEAF` to the leaf you reached (G, I, J, L, M or OK). Optionally pass the metrics you relied on as
# `MY_EVIDENCE` (a dict); by default the probes' own readings are used.

# %%
MY_LEAF = None  # e.g. "G"
MY_EVIDENCE = None
if MY_LEAF is None:
    print("not done yet: set MY_LEAF to the leaf the walk reached, then run this cell again")
else:
    g = drills.grade(drill, MY_LEAF, MY_EVIDENCE, learner=classroom.learner_name())
    classroom.record_drill(drill, g)  # kept for the instructor when HWLAB_CLASS_DIR is set
    print(("PASSED: " if g.passed else "NOT YET: ") + g.explanation)

# %% [markdown]
# ## The seal: an edited drill is refused
# A copy of this drill with one observation changed (as a learner might, to make a walk come out) does not
# load: the HMAC over the whole file no longer matches. What it does not stop: anyone who can read the key
# file (`~/.config/hwlab/drill.key`, or `HWLAB_DRILL_KEY_FILE`) can re-seal; for an exam, keep the key and
# the grading on an account the learners cannot read.

# %%
import json
import tempfile
from pathlib import Path

from hwlab.errors import UserInputError

p = drill.save(tempfile.mkdtemp(prefix="drill-"))
raw = json.loads(p.read_text())
metric = next(k for k, v in raw["observations"].items() if isinstance(v, float))
raw["observations"][metric] *= 0.5
forged = Path(p.parent / "forged.json")
forged.write_text(json.dumps(raw))
try:
    drills.Drill.load(forged)
    print("the edited drill loaded: the seal failed")
except UserInputError as e:
    print(f"halved {metric} in a copy -> refused: {e}")

# %% [markdown]
# ## Instructor: one drill per fault on the H200
# The kit's refresh script ran one drill per fault on the H200: each fault's scenario run live there, faulty
# and fixed (the slow-link rank uses its recorded CPU run: it needs several ranks and a shaped link), the
# right answer graded with the fixed configuration run again and every metric recomputed, one wrong answer.
# Two come from the seed's checklist: the new sync point (a per-step `.item()`: the launch gap and the host's
# step time show it, measured) and the bad card (its kernels measured on a healthy lent card, its NVML
# snapshot built from that card's real one with throttle reasons and ECC errors set, and labelled so; the
# chart's walk stays at OK, and the card's state against the node's baseline is what its fix must clear).

# %%
from hwlab.core import evidence
from hwlab.diagnosis import flowchart

rec = evidence.recorded("drills")
for r in rec.extra["drills"]:
    if "error" in r:
        print(f"{r['fault']:>15}: did not run there ({r['error']})  [{rec.label}]")
        continue
    walk = flowchart.diagnose(r["drill"]["observations"])
    fix = flowchart.diagnose(r["right"]["fix_evidence"])
    built = any("CONSTRUCTED" in str(v) for v in r["drill"]["observations"].get("metric_sources", {}).values())
    print(f"{r['fault']:>15} ({'live' if r['drill']['live'] else 'recorded'}"
          f"{'; its NVML snapshot CONSTRUCTED from a real one' if built else ''}): probes -> {walk.leaf_id} "
          f"({'has BY-HAND answers' if walk.by_hand else 'every answer measured'}), right answer "
          f"{'passed' if r['right']['correct_leaf'] and r['right']['evidence_supports'] else 'FAILED'}, "
          f"fixed run re-measured -> {fix.leaf_id}  "
          f"[{r['drill']['source'] if not r['drill']['live'] else f'recorded on {rec.device}, ' + r.get('recorded_at', rec.recorded_at)[:10]}]")
r0 = rec.extra["drills"][0]
print(f"\na wrong answer ({r0['wrong']['submitted_leaf']} for {r0['fault']}), graded now on the recorded observations: "
      + drills.contradiction(r0["drill"]["observations"], r0["wrong"]["submitted_leaf"]))

# %% [markdown]
# ## Instructor: every fault, graded once each (a self-check of the drill pool, from recorded evidence)

# %%
import matplotlib.pyplot as plt

grades = []
for name, fault in drills.FAULTS.items():
    d = drills.new(seed=1, fault=name, live=False)
    grades.append(drills.grade(d, fault.leaf, learner="reference"))
    wrong = next(x for x in ("G", "J", "L", "OK") if x != fault.leaf)
    grades.append(drills.grade(d, wrong, learner="a learner guessing"))
summary = drills.class_summary(grades)
print(summary)
fig, ax = plt.subplots(figsize=(6, 3))
ax.bar(list(summary["wrong_leaf_counts"]), list(summary["wrong_leaf_counts"].values()))
ax.set_ylabel("wrong submissions")
ax.set_xlabel("leaf submitted")
ax.set_title("Class view: which wrong leaves were taken", fontsize=9)
plt.show()
