"""``hwlab drill new|submit|reveal|summary|pool``: diagnosis drills, a hidden fault to find; ``pool`` is
the instructor's self-check of the drill pool (every fault's leaf: kept out of the learner's notebook).

Where the class's grading service is configured (``HWLAB_GRADER_URL``, set by the hub in every
learner's server), ``new``, ``submit`` and ``reveal`` go through it (:mod:`hwlab.course.drillclient`):
the service draws and seals the drill with its own key, grades and records each submission, and
records a reveal before it sends the answer; nothing is sealed, graded or recorded with the
learner's own key then (``--fault``, ``--learner`` and ``--class-dir`` do not apply: the service draws
the fault and the hub names the learner).

Exit codes: 0 written or passed; 1 a submission that did not find the fault (a finding);
2 bad input (unknown fault or leaf, a file that is not a drill or grade, a bad learner name)
or a write that failed (the result is kept in the rescue folder); 3 internal error.
"""
from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

from hwlab.course import classroom, drillclient, drills, dropbox
from hwlab.cli.console import print_json, read_observations, whole_number
from hwlab.core import validate
from hwlab.errors import EXIT_FINDING, EXIT_OK, EXIT_USAGE, UserInputError
from hwlab.diagnosis.flowchart import LEAVES
from hwlab.core.store import (
    RecordExistsError, check_destination, check_folder, read_user_json, rescue, write_json_atomic,
    write_or_rescue)


def _load_drill(path: str) -> drills.Drill:
    raw = read_user_json(path, "drill file", drills.DRILL_HINT)
    if drillclient.served():  # sealed with the service's key: the service verifies it
        return drillclient.unverified(raw, f"drill file {path}")
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
    if a.fault is not None:  # the fault is the drill's own, hidden: only `new` may choose it
        raise UserInputError(f"--fault goes with `drill new` (the instructor chooses the fault there); "
                             f"drill {a.action} reads the fault from the drill file: leave --fault out")
    if not a.drill:
        raise UserInputError(f"drill {a.action} needs the drill's .json file")
    d = _load_drill(a.drill)
    if a.action == "reveal":
        print_json(drillclient.reveal(d) if drillclient.served() else drills.reveal(d))
        return EXIT_OK
    return _submit_served(a, d) if drillclient.served() else _submit(a, d)


def _new(a) -> int:
    if a.drill:
        raise UserInputError("drill new takes no drill file (it writes one into --dir)")
    if a.fault is not None and a.fault not in drills.FAULTS:
        raise UserInputError(f"unknown fault {a.fault!r}; choose one of {', '.join(drills.FAULTS)}")
    if a.fault is not None and drillclient.served():
        raise UserInputError("--fault: the class's grading service draws the fault (HWLAB_GRADER_URL is set); "
                             "leave --fault out")
    folder = check_folder(a.dir, what="--dir folder")
    if a.seed is not None:  # the file name is known: refuse an existing one before measuring
        check_destination(drills.drill_path(folder, a.seed), overwrite=a.force)
    d = drillclient.draw(a.seed) if drillclient.served() else drills.new(seed=a.seed, fault=a.fault)
    p, err = write_or_rescue(lambda: d.save(folder, overwrite=a.force), dataclasses.asdict(d), "drill", folder,
                             lost="no drill was kept (it is never printed: it holds the hidden fault); free "
                                  "space or choose another --dir, then run hwlab drill new again")
    if err:
        print(f"hwlab drill: {err}", file=sys.stderr)
        return EXIT_USAGE
    if a.json:
        print_json({"drill_id": d.drill_id, "file": str(p), "workload": d.workload,
                    "source": d.label, "live": d.live, "observations": d.observations})
        return EXIT_OK
    print(f"drill {d.drill_id} written to {p}\nworkload: {d.workload}\nwhat the probes show "
          f"({d.label}):\n" + "\n".join(drills.observations_text(d.observations)) + "\nwalk the flowchart, then: "
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
            grades.append(_checked_grade(drills.Grade(**g)))
        except (TypeError, validate.NumberError) as e:
            raise UserInputError(f"grade file {x} is not a grade written by `hwlab drill submit` "
                                 f"({str(e)[:120]}): remove it, or pass a folder of grades") from None
    if not grades:
        raise UserInputError(f"no grades (grade-*.json) in {folder}: `hwlab drill submit DRILL --leaf LEAF` writes "
                             "one per submission into --dir; pass that folder")
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
    # type, finiteness, range and name of each metric, as `hwlab incident` checks them
    ev = read_observations(a.evidence, "evidence file") if a.evidence else None
    # every place the grade goes is checked before grading: --dir, and the class folder
    # (--class-dir, else $HWLAB_CLASS_DIR); a write that still fails afterwards keeps the
    # record in the rescue folder, and the grade is printed either way
    class_named = classroom.class_dir(a.class_dir)
    class_what = "--class-dir folder" if a.class_dir else f"class folder (${classroom.ENV_DIR})"
    if class_named is not None and dropbox.is_dropbox(class_named):
        class_folder = Path(class_named)  # a drop box: the learner writes into inbound/, never the folder
        dropbox.check(class_folder)
    else:
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
    written, err = write_or_rescue(lambda: _write_grade(target, dataclasses.asdict(g)),
                                   dataclasses.asdict(g), "grade", target)
    target = written or target
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


def _submit_served(a, d: drills.Drill) -> int:
    """Submit to the class's grading service: it verifies the seal, grades and records; its reply is shown."""
    if not a.leaf or a.leaf not in LEAVES:
        raise UserInputError(f"submit needs --leaf, one of {', '.join(LEAVES)}")
    ev = read_observations(a.evidence, "evidence file") if a.evidence else None
    got = drillclient.submit(d, a.leaf, ev)
    passed = got.get("passed") is True
    if a.json:
        print_json({**got, "graded_by": "server"})
    else:
        print(("PASSED: " if passed else f"NOT YET ({got.get('status')}): ") + str(got.get("explanation", ""))
              + " (graded and recorded by the class's service)")
    return EXIT_OK if passed else EXIT_FINDING


def _checked_grade(g: drills.Grade) -> drills.Grade:
    """``g`` if its fields are of the kinds `submit` writes (names text, verdicts true/false, the
    time a finite number of seconds >= 0), else TypeError or NumberError naming the field."""
    for k in ("learner", "submitted_leaf"):
        if not isinstance(getattr(g, k), str):
            raise TypeError(f"{k} should be text")
    for k in ("correct_leaf", "evidence_supports"):
        if not isinstance(getattr(g, k), bool):
            raise TypeError(f"{k} should be true or false")
    if g.fix_removes_slowdown not in (True, False, None):
        raise TypeError("fix_removes_slowdown should be true, false or null")
    if g.seconds is not None:
        validate.number(g.seconds, "seconds", lo=0.0, hi=validate.MAX_T_MS / 1e3)
    return g


def _write_grade(target: Path, grade: dict) -> Path:
    """Write a grade under ``target``'s name, or, when a grade of that name exists (a second
    submission within the same second), under the next free ``NAME-2.json``, ``-3``...: every
    submission keeps its own file, none replaces another."""
    for n in range(1, 1000):
        p = target if n == 1 else target.with_name(f"{target.stem}-{n}{target.suffix}")
        try:
            return write_json_atomic(p, grade)
        except RecordExistsError:
            continue
    raise RecordExistsError(f"{target.parent} has 1000 grades named {target.stem}: use another --dir")


def _leaves() -> str:
    return "; ".join(f"{k} {v.title}" for k, v in LEAVES.items())


def add_parser(sub) -> None:
    dr = sub.add_parser("drill", help="diagnosis drills: a hidden fault to find",
                        description="Diagnosis drills: `new` writes a drill (a hidden fault and what the "
                        "probes show), `submit` grades the leaf you reached, `reveal` shows the answer, "
                        "`summary` tallies a folder of grades, `pool` (instructor) lists every fault with its leaf. Exit codes: 0 written or passed, 1 a "
                        "submission that did not find the fault, 2 bad input or a write that failed (the "
                        "result is kept in the rescue folder), 3 internal error.")
    dr.add_argument("action", choices=["new", "submit", "reveal", "summary", "pool"],
                    help="new, submit, reveal, summary or pool (instructor: the fault pool and its leaves, JSON)")
    dr.add_argument("drill", nargs="?", help="submit/reveal: the drill .json")
    dr.add_argument("--seed", type=whole_number,
                    help="new: the drill's number (the same seed gives the same drill; default random)")
    dr.add_argument("--fault", help="instructor: choose the fault (" + ", ".join(drills.FAULTS) + ")")
    dr.add_argument("--leaf", metavar="LEAF", help="submit: the flowchart leaf you reached: " + _leaves())
    dr.add_argument("--evidence", help="submit: a .json of the metrics your diagnosis rests on "
                    "(metric -> value; `hwlab flowchart` lists them)")
    dr.add_argument("--learner", default="anonymous",
                    help="submit: your name in the grade's file name (letters, digits, '.', '-', '_')")
    dr.add_argument("--dir", default="drills", help="where drills and grades are kept")
    dr.add_argument("--force", action="store_true", help="new: replace a drill file of the same seed")
    dr.add_argument("--json", action="store_true", help="new/submit: strict JSON on stdout "
                    "(reveal, summary and pool always print JSON)")
    dr.add_argument("--class-dir", help="submit: also record the graded result here (default: $HWLAB_CLASS_DIR)")
    dr.set_defaults(fn=cmd_drill)
