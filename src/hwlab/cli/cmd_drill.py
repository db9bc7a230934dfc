"""``hwlab drill new|submit|reveal|summary|pool``: diagnosis drills, a hidden fault to find; ``pool`` is
the instructor's self-check of the drill pool (every fault's leaf: kept out of the learner's notebook).

Exit codes: 0 written or passed; 1 a submission that did not find the fault (a finding);
2 bad input (unknown fault or leaf, a file that is not a drill or grade, a bad learner name)
or a write that failed (the result is kept in the rescue folder); 3 internal error.
"""
from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

from hwlab.course import classroom, drills
from hwlab.cli.console import print_json, whole_number
from hwlab.errors import EXIT_FINDING, EXIT_OK, EXIT_USAGE, UserInputError
from hwlab.diagnosis.flowchart import LEAVES
from hwlab.core.store import (
    check_destination, check_folder, read_user_json, write_json_atomic, write_or_rescue)
from hwlab.core import validate
from hwlab.core.store import rescue


def _load_drill(path: str) -> drills.Drill:
    raw = read_user_json(path, "drill file", drills.DRILL_HINT)
    if not isinstance(raw, dict):
        raise UserInputError(f"drill file {path} is not a drill written by `hwlab drill new` (it holds "
                             f"a JSON {type(raw).__name__}, not an object)")
    try:
        return drills.Drill.from_dict(raw, str(path))
    except (TypeError, KeyError, AttributeError) as e:
        raise UserInputError(f"drill file {path} is not a drill written by `hwlab drill new` "
                             f"({str(e)[:80]})") from None


def cmd_drill(a) -> int:
    if a.action == "new":
        return _new(a)
    if a.action == "summary":
        return _summary(a)
    if a.action == "pool":
        print_json(drills.pool_check())
        return EXIT_OK
    if not a.drill:
        raise UserInputError(f"drill {a.action} needs the drill's .json file")
    d = _load_drill(a.drill)
    if a.action == "reveal":
        print_json(drills.reveal(d))
        return EXIT_OK
    return _submit(a, d)


def _new(a) -> int:
    if a.drill:
        raise UserInputError("drill new takes no drill file (it writes one into --dir)")
    if a.fault is not None and a.fault not in drills.FAULTS:
        raise UserInputError(f"unknown fault {a.fault!r}; choose one of {', '.join(drills.FAULTS)}")
    folder = check_folder(a.dir, what="--dir folder")
    if a.seed is not None:  # the file name is known: refuse an existing one before measuring
        check_destination(drills.drill_path(folder, a.seed), overwrite=a.force)
    d = drills.new(seed=a.seed, fault=a.fault)
    p, err = write_or_rescue(lambda: d.save(folder, overwrite=a.force), dataclasses.asdict(d), "drill", folder)
    if err:
        print(f"hwlab drill: {err}", file=sys.stderr)
        return EXIT_USAGE
    if a.json:
        print_json({"drill_id": d.drill_id, "file": str(p), "workload": d.workload,
                    "source": d.label, "live": d.live, "observations": d.observations})
        return EXIT_OK
    print(f"drill {d.drill_id} written to {p}\nworkload: {d.workload}\nwhat the probes show "
          f"({d.label}):\n{json.dumps(d.observations, indent=2)}\nwalk the flowchart, then: "
          f"hwlab drill submit {p} --leaf LEAF --learner NAME")
    return EXIT_OK


def _summary(a) -> int:
    folder = Path(a.dir)
    if not folder.is_dir():
        raise UserInputError(f"--dir {folder} is not a folder of grades: pass the folder "
                             "`hwlab drill submit` wrote into")
    grades = []
    for x in sorted(folder.glob("grade-*.json")):
        g = read_user_json(x, "grade file", "remove it, or pass a folder of grades `hwlab drill submit` wrote")
        try:
            grades.append(drills.Grade(**g))
        except TypeError:
            raise UserInputError(f"grade file {x} is not a grade written by `hwlab drill submit`") from None
    print_json(drills.class_summary(grades))
    return EXIT_OK


def _submit(a, d: drills.Drill) -> int:
    if not a.leaf:
        raise UserInputError(f"submit needs --leaf ({', '.join(LEAVES)})")
    if a.leaf not in LEAVES:
        raise UserInputError(f"--leaf {a.leaf!r}: leaf must be one of {', '.join(LEAVES)}")
    if not re.fullmatch(r"[\w.-]{1,64}", a.learner) or a.learner.startswith("."):
        raise UserInputError(f"--learner {a.learner!r}: use 1-64 letters, digits, '.', '-' or '_' "
                             "(it becomes part of the grade's file name)")
    ev = (read_user_json(a.evidence, "evidence file", "pass a .json file of metric -> value")
          if a.evidence else None)
    if ev is not None and not isinstance(ev, dict):
        raise UserInputError(f"evidence file {a.evidence} should hold a JSON object of metric -> value")
    if ev is not None:  # type, finiteness, range of each metric (hwlab.core.validate)
        validate.observations(ev, where=f"evidence file {a.evidence}: ")
    # every place the grade goes is checked before grading: --dir, and the class folder
    # (--class-dir, else $HWLAB_CLASS_DIR); a write that still fails afterwards keeps the
    # record in the rescue folder, and the grade is printed either way
    class_named = classroom.class_dir(a.class_dir)
    class_what = "--class-dir folder" if a.class_dir else f"class folder (${classroom.ENV_DIR})"
    class_folder = check_folder(class_named, what=class_what) if class_named is not None else None
    folder = check_folder(a.dir, what="--dir folder")
    g = drills.grade(d, a.leaf, ev, learner=a.learner)
    errs = []
    if class_folder is not None:
        try:
            classroom.record_drill(d, g, class_folder)
        except OSError as e:
            errs.append(rescue(classroom.drill_record(d, g), "class-result", class_folder, e))
    target = folder / f"grade-{d.drill_id}-{a.learner}-{g.at.replace(':', '')}.json"
    _, err = write_or_rescue(lambda: write_json_atomic(target, dataclasses.asdict(g)),
                             dataclasses.asdict(g), "grade", target)
    if err:
        errs.insert(0, err)
    if a.json:
        print_json({**dataclasses.asdict(g), "passed": g.passed, "file": None if err else str(target)})
    else:
        print(("PASSED: " if g.passed else "NOT YET: ") + g.explanation)
    for e in errs:
        print(f"hwlab drill: {e}", file=sys.stderr)
    if errs:
        return EXIT_USAGE
    return EXIT_OK if g.passed else EXIT_FINDING


def add_parser(sub) -> None:
    dr = sub.add_parser("drill", help="diagnosis drills: a hidden fault to find")
    dr.add_argument("action", choices=["new", "submit", "reveal", "summary", "pool"])
    dr.add_argument("drill", nargs="?", help="submit/reveal: the drill .json")
    dr.add_argument("--seed", type=whole_number)
    dr.add_argument("--fault", help="instructor: choose the fault (see hwlab.course.drills.FAULTS)")
    dr.add_argument("--leaf")
    dr.add_argument("--evidence", help="submit: a .json of the metrics your diagnosis rests on")
    dr.add_argument("--learner", default="anonymous")
    dr.add_argument("--dir", default="drills", help="where drills and grades are kept")
    dr.add_argument("--force", action="store_true", help="new: replace a drill file of the same seed")
    dr.add_argument("--json", action="store_true", help="new/submit: strict JSON on stdout "
                    "(reveal, summary and pool always print JSON)")
    dr.add_argument("--class-dir", help="submit: also record the graded result here (default: $HWLAB_CLASS_DIR)")
    dr.set_defaults(fn=cmd_drill)
