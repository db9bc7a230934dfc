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
    setup = src["cells"].pop(0)  # the locked cell defining what graded cells call, before any code
    assert setup["metadata"]["nbgrader"]["locked"] and not setup["metadata"]["nbgrader"]["grade"]
    assert "def _hw_begin" in setup["source"] and "def _hw_end" in setup["source"]
    c = src["cells"]
    assert "nbgrader" not in c[0]["metadata"] and "nbgrader" not in c[3]["metadata"]  # alike: not an answer
    assert c[1]["metadata"]["nbgrader"]["solution"] and nc.BEGIN_SOL in c[1]["source"]
    g = c[2]["metadata"]["nbgrader"]
    assert g["grade"] and g["locked"] and g["points"] == 2
    assert c[2]["source"].split("\n") == [nc.BEGIN_CALL, "_hw_show(check(A))", nc.END_CALL]


def test_a_graded_cells_last_expression_is_still_shown_before_its_end_check():
    """Jupyter shows only the last line's value: the checker call a cell ends with is shown through
    _hw_show, so the learner still sees its verdict with _hw_end() after it."""
    assert nc.show_last("x = 1\ncheck(a,\n      b)  # ≥ 5") == "x = 1\n_hw_show(check(a,\n      b))  # ≥ 5"
    assert nc.show_last("for r in rs:\n    display(r)") == "for r in rs:\n    display(r)"  # not an expression
    assert nc.show_last("a = 1; b") == "a = 1; b"  # shares its line: left alone


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
    log = r.stdout + r.stderr
    warned = [ln for ln in log.splitlines() if "WARNING" in ln or "Warning" in ln or "not recognized" in ln]
    assert not warned, warned[:5]  # nbgrader's own warnings included (config, checksums)
    return r


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("nbgrader") is None,
                    reason="needs nbgrader (pip install '.[grade]'); scripts/setup.sh installs it")
@pytest.mark.parametrize("name", [n for n, _ex, _so in nc.pairs()])
def test_generate_assignment_and_autograde_on_the_course(tmp_path, monkeypatch, name):
    """Through nbgrader for real, every exercise: the release holds no solution; autograde gives a
    learner who typed the solution's answers into the release full marks and the blank release none,
    and no nbgrader command warns. Exercise 03 (recorded data only): a wrong answer on the groups
    crossing the slow link loses exactly that cell's point. Exercise 04 profiles a decoder, and
    torch's profiler writes to stderr from C++, which nbgrader scores as a failure unless moved.
    Exercise 05 reads the recorded traces from the package, whatever folder nbgrader runs it in."""
    from nbgrader.api import Gradebook

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    course = tmp_path / "course"
    assert nc.build(course, only=[name]) == [name]
    _nbgrader(["generate_assignment", name, "--force"], course)
    src = next((course / "source" / name).glob("*.ipynb"))
    rel = course / "release" / name / src.name
    released = rel.read_text()
    assert nc.BEGIN_SOL not in released
    solved = json.loads(src.read_text())
    answers = {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"]) for c in solved["cells"]
               if c["metadata"].get("nbgrader", {}).get("solution")}
    assert answers and all(a.split(nc.BEGIN_SOL)[1].split(nc.END_SOL)[0].strip() not in released
                           for a in answers.values())

    def typed(change=None):  # the release with the solution's answers typed in (markers dropped)
        nb = json.loads(released)
        for c in nb["cells"]:
            gid = c["metadata"].get("nbgrader", {}).get("grade_id")
            if gid in answers:
                c["source"] = (change or {}).get(gid) or "\n".join(
                    x for x in answers[gid].split("\n") if x.strip() not in (nc.BEGIN_SOL, nc.END_SOL))
        return nb

    students = {"good": typed(), "blank": json.loads(released)}
    if name.startswith("ex03"):  # the solution's answers, except the groups on the slow link: a group on NVLink
        students["wrong"] = typed({"answer_1": 'CROSSING = [[4, 5]]\nEVIDENCE = {(2, 3): "NV2"}\nLEAF = "L"'})
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
