"""The exercises as an nbgrader course (tools/nbgrader_course.py): answer cells carry solution
markers, graded cells hidden tests; nbgrader's own generate_assignment and autograde run on it."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("nbgrader_course", ROOT / "tools" / "nbgrader_course.py")
nc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nc)


def test_only_solution_lines_go_between_markers_and_the_exercise_hint_stays():
    ex = "def f(x):\n    # YOUR CODE HERE: double it\n    pass\n\n\nANSWER = None  # e.g. 3"
    so = "def f(x):\n    return 2 * x\n\n\nANSWER = 4"
    got = nc.solution_region(ex, so).split("\n")
    assert got[0] == "def f(x):" and "    # YOUR CODE HERE: double it" in got
    i = got.index("    ### BEGIN SOLUTION")
    assert got[i + 1:i + 3] == ["    return 2 * x", "    ### END SOLUTION"]
    assert "# ANSWER = None  # e.g. 3" in got and "ANSWER = 4" in got and "    pass" not in got
    assert nc.solution_region(so, so) is None


def test_a_solution_that_marks_its_own_blocks_is_marked_once():
    """scripts/make_exercises.py writes each exercise from a solution whose blocks carry nbgrader's
    markers already: the course keeps one pair per block (nbgrader refuses nested markers)."""
    ex = "A = None  # YOUR ANSWER HERE"
    so = "A = None  # YOUR ANSWER HERE\n### BEGIN SOLUTION\nA = 4\n### END SOLUTION"
    got = nc.solution_region(ex, so)
    assert got.count(nc.BEGIN_SOL) == 1 and got.count(nc.END_SOL) == 1
    assert got.split("\n") == ["A = None  # YOUR ANSWER HERE", nc.BEGIN_SOL, "A = 4", nc.END_SOL]


def _nb(*cells):
    return {"cells": [dict(c, metadata=dict(c.get("metadata", {}))) for c in cells], "metadata": {},
            "nbformat": 4, "nbformat_minor": 5}


def _code(src, learner=False):
    return {"cell_type": "code", "source": src, "outputs": [], "execution_count": None,
            "metadata": {"tags": ["learner"]} if learner else {}}


def test_answer_and_graded_cells_are_marked_for_nbgrader():
    ex = _nb(_code("import x"), _code("A = None", True), _code("check(A)"), _code("same = 1", True))
    so = _nb(_code("import x"), _code("A = 3", True), _code("check(A)"), _code("same = 1", True))
    src = nc.build_source(ex, so, {2: 2}, "exT")
    c = src["cells"]
    assert "nbgrader" not in c[0]["metadata"] and "nbgrader" not in c[3]["metadata"]  # alike: not an answer
    assert c[1]["metadata"]["nbgrader"]["solution"] and nc.BEGIN_SOL in c[1]["source"]
    g = c[2]["metadata"]["nbgrader"]
    assert g["grade"] and g["locked"] and g["points"] == 2
    assert c[2]["source"].count(nc.BEGIN_HID) == 2 and "check(A)" in c[2]["source"]


def test_exercise_and_solution_that_disagree_on_answer_cells_are_refused():
    ex = _nb(_code("A = None", True))
    so = _nb(_code("A = 3"))
    with pytest.raises(nc.CourseError, match="answer cells"):
        nc.build_source(ex, so, {}, "exT")


def _nbgrader(args, cwd):
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("nbgrader") is None,
                    reason="needs nbgrader (pip install '.[grade]'); CI installs .[dev,lab] only")
@pytest.mark.parametrize("name", ["ex03_cross_link_tp", "ex04_fp8_dequant_fallback"])
def test_generate_assignment_and_autograde_on_the_course(tmp_path, monkeypatch, name):
    """Through nbgrader for real: the release holds no solution and no hidden test; autograde gives
    the solution full marks and the blank release none. Exercise 03 (recorded data only): a wrong
    answer on the groups crossing the slow link loses exactly that cell's point. Exercise 04 profiles a decoder, and torch's
    profiler writes to stderr from C++, which nbgrader scores as a failure unless moved."""
    from nbgrader.api import Gradebook

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    course = tmp_path / "course"
    assert nc.build(course, only=[name]) == [name]
    _nbgrader(["generate_assignment", name, "--force"], course)
    src = next((course / "source" / name).glob("*.ipynb"))
    rel = course / "release" / name / src.name
    released = rel.read_text()
    assert nc.BEGIN_SOL not in released and nc.BEGIN_HID not in released and "_hw_seen" not in released
    solved = json.loads(src.read_text())
    answers = [c for c in solved["cells"] if c["metadata"].get("nbgrader", {}).get("solution")]
    assert answers and all(("".join(c["source"]).split(nc.BEGIN_SOL)[1].split(nc.END_SOL)[0].strip()
                            not in released) for c in answers)
    students = {"good": solved, "blank": json.loads(released)}
    if name.startswith("ex03"):
        wrong = json.loads(released)
        for c in wrong["cells"]:  # the solution's answers, except the groups on the slow link: a group on NVLink
            gid = c["metadata"].get("nbgrader", {}).get("grade_id")
            if gid and gid.startswith("answer_"):
                sol = next(s for s in answers if s["metadata"]["nbgrader"]["grade_id"] == gid)
                c["source"] = ('CROSSING = [[4, 5]]\nEVIDENCE = {(2, 3): "NV2"}\nLEAF = "L"' if gid == "answer_1"
                               else "".join(sol["source"]))
        students["wrong"] = wrong
    for student, nb in students.items():
        d = course / "submitted" / student / name
        d.mkdir(parents=True)
        (d / rel.name).write_text(json.dumps(nb))
    _nbgrader(["autograde", name, "--create", "--force"], course)
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        score = {s: gb.find_submission(name, s).score for s in students}
        top = gb.find_submission(name, "good").max_score
    assert top >= 2 and score["good"] == top and score["blank"] == 0, score
    if "wrong" in score:
        assert score["wrong"] == top - 1, score
    shutil.rmtree(course / "autograded")
