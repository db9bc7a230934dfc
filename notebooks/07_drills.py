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
#
# **In a class** (the hub sets `HWLAB_GRADER_URL`), the class's grading service draws the drill and seals it
# with its own key, which your account cannot read; it grades and records each submission, and a reveal is
# recorded before the answer is shown. Without a class service the drill is sealed with your own key
# (`~/.config/hwlab/drill.key`): fine for practice, not for grades.

# %%
from IPython.display import display
from hwlab.course import classroom, drillclient, drills
from hwlab import nb

print(nb.live_label())
if drillclient.served():  # the class's service draws and seals it: the fault is out of your reach
    drill = drillclient.draw()
    print("drawn and sealed by the class's grading service")
else:
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
elif drillclient.served():  # graded and recorded by the class's service
    got = drillclient.submit(drill, MY_LEAF, MY_EVIDENCE)
    print(("PASSED: " if got["passed"] else f"NOT YET ({got['status']}): ") + got["explanation"])
else:
    g = drills.grade(drill, MY_LEAF, MY_EVIDENCE, learner=classroom.learner_name())
    classroom.record_drill(drill, g)  # kept for the instructor when HWLAB_CLASS_DIR is set
    print(("PASSED: " if g.passed else "NOT YET: ") + g.explanation)

# %% [markdown]
# ## The seal: an edited drill is refused
# A copy of this drill with one observation changed (as a learner might, to make a walk come out) does not
# load: the HMAC over the whole file no longer matches. What it does not stop: anyone who can read the key
# file (`~/.config/hwlab/drill.key`, or `HWLAB_DRILL_KEY_FILE`) can re-seal; in a class the key is the
# grading service's, on an account the learners cannot read, and the service refuses the edited copy.

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
    if drillclient.served():  # the service verifies the seal with its key before it grades
        drillclient.submit(drillclient.unverified(raw), "G")
    else:
        drills.Drill.load(forged)
    print("the edited drill was accepted: the seal failed")
except UserInputError as e:
    print(f"halved {metric} in a copy -> refused: {e}")

# %% [markdown]
# ## Instructors
# The self-check of the drill pool (one drill per fault run on the H200, faulty and fixed, and every fault
# graded once) names every fault's leaf, so it is not in this notebook: `hwlab drill pool` prints it
# (`docs/INSTRUCTOR.md`).
