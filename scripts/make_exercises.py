"""Write each exercise from its solution: ``exercises/exNN_*.py`` is ``solutions/exNN_*.py`` with every
block between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` (markers included) removed and the
title's "Solution" made "Exercise". nbgrader's markers, so the same source serves a course.

A learner cell keeps its stub (``MY_X = None  # YOUR ANSWER HERE``) above the block; in the
solution the block's assignment follows and wins. Run it after editing a solution, then sync
the notebooks (``bash scripts/sync_notebooks.sh``); ``--check`` exits 1 when an exercise is stale.

    python scripts/make_exercises.py [--check]
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


def learner_version(text: str) -> str:
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        s = line.strip()
        if s == BEGIN:
            if inside:
                raise ValueError("nested ### BEGIN SOLUTION")
            inside = True
        elif s == END:
            if not inside:
                raise ValueError("### END SOLUTION without a BEGIN")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError("### BEGIN SOLUTION without an END")
    text = re.sub(r"^# # Solution (\d+)", r"# # Exercise \1", "".join(out), count=1, flags=re.M)
    return re.sub(r"\n{3,}(# %%)", r"\n\n\n\1", text)  # no runs of blank lines where a block was


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for sol in sorted((ROOT / "solutions").glob("*.py")):
        if BEGIN not in sol.read_text():
            continue
        ex = ROOT / "exercises" / sol.name
        want = learner_version(sol.read_text())
        if not ex.exists() or ex.read_text() != want:
            stale.append(ex)
            if not check:
                ex.write_text(want)
    for p in stale:
        print(("stale: " if check else "wrote ") + str(p.relative_to(ROOT)))
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
