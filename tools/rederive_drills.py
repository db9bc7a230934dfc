"""Re-read the recorded bad-card drill runs through the current card-state rule, with no new
measurement: each run's counts are recomputed from the NVML state it holds against the node's
recorded baseline (:func:`hwlab.labs.drillruns.rederive_card_state`), then the drill rows are
re-sealed under a key made for this step (not kept, like the refresh's) and graded again.

    python tools/rederive_drills.py src/hwlab/recorded/h200/drills.json
"""
from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from hwlab.diagnosis import flowchart

from hwlab.course import drills
from hwlab.core.evidence import load
from hwlab.labs import drillruns


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: rederive_drills.py PATH/drills.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    ev = load(path)
    for key, r in ev.extra["runs"].items():
        if key.startswith("badcard/"):
            r["evidence"] = drillruns.rederive_card_state(r["evidence"])
    ev.save(path, overwrite=True)  # the grading below reads the fixed run from this file
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["HWLAB_DRILL_KEY_FILE"] = str(Path(tmp) / "rederive.key")
        for row in ev.extra["drills"]:
            if row.get("scenario") != "badcard":
                continue
            f = drills.FAULTS[row["fault"]]
            d = drills.Drill(**{**row["drill"], "mac": ""})
            d.observations = ev.extra["runs"][f"{f.scenario}/{f.case}"]["evidence"]
            d.sealed = drills._seal(d.salt, f.name)
            d.signed()
            right = drills.grade(d, f.leaf, learner="refresh-script")
            wrong_leaf = "G" if f.leaf != "G" else "J"
            wrong = drills.grade(d, wrong_leaf, learner="refresh-script")
            walk = flowchart.diagnose(d.observations)
            row.update(drill=asdict(d), right=asdict(right), wrong=asdict(wrong), observed_leaf=walk.leaf_id,
                       fully_measured=walk.fully_measured)
            print(f"{f.name}: right passed={right.passed} fix works={right.fix_removes_slowdown}; {right.explanation}")
    ev.extra["rederived_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    ev.extra["rederived_what"] = ("bad-card runs re-read through the card-state rule (the software power cap "
                                  "no longer counts as a bad-card sign) and their rows re-graded; no new measurement")
    print(ev.save(path, overwrite=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
