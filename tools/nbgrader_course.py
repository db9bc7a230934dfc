"""Build an nbgrader course from the kit's exercises and their solutions.

    python tools/nbgrader_course.py OUT [--force]
    cd OUT && nbgrader generate_assignment ex01_bandwidth_bound      # the learners' release
    # collect submissions into OUT/submitted/<student>/<assignment>/, then
    cd OUT && nbgrader autograde ex01_bandwidth_bound --create   # --create: students new to the gradebook

For instructors who grade with nbgrader (``pip install 'hwlab[grade]'``). One assignment per
exercise, ``source/exNN_<name>/exNN_<name>.ipynb``, built from ``solutions/exNN_<name>.ipynb`` and
``exercises/exNN_<name>.ipynb``:

* **answer cells**: the cells tagged ``learner`` (the k-th in the exercise is the k-th in the
  solution; the kit's tests keep the two notebooks differing only there). Lines both versions
  share stay visible (signatures, names); each run of lines only the solution has is wrapped in
  ``### BEGIN SOLUTION`` / ``### END SOLUTION``, which nbgrader replaces with its stub in the
  release. An answer cell both versions write alike is left as it is (not a solution cell).
* **graded cells**: the code cells after an answer cell, up to the next one, that build a grade
  (an :class:`hwlab.core.grading.ExerciseResult`: the kit's checkers). Each becomes an nbgrader
  test cell worth one point per result it builds, wrapped in ``_hw_begin()`` / ``_hw_end()``
  (defined in a locked setup cell, :data:`SETUP`): every result the cell builds (collected through
  :func:`hwlab.core.grading.on_graded`) must have passed. nbgrader gives no credit to a cell that
  wrote to stderr; torch's profiler logs there from C++, so the cell's stderr (file descriptor 2 and
  ``sys.stderr``) is moved into its printed output, where the instructor still reads it, and only
  the checks decide the grade. A cell that builds no result is not graded. Which cells build a result is found
  by running the solution once (``find_graded``), not by reading cell text, so checkers may
  change without this file changing.

Nothing here reads a cell's wording; a notebook whose ``learner`` tags disagree between exercise
and solution is refused with the reason.
"""
from __future__ import annotations

import argparse
import ast
import difflib
import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/nbwatch.py (tools/ is not a package)
TAG = "learner"
BEGIN_SOL, END_SOL = "### BEGIN SOLUTION", "### END SOLUTION"
COURSE_ID = "hwlab"

#: the first code cell of every assignment, locked (autograde restores it if edited): what each graded
#: cell calls first (``_hw_begin()``) and last (``_hw_end()``). Visible, not hidden tests: nbgrader
#: stores a locked cell's checksum before it clears hidden tests, so every submission of a cell with
#: hidden tests would be reported as "checksum has changed" (jupyter/nbgrader#1961), a warning on
#: every autograde that would drown a real one (a learner who edited a graded cell)
SETUP = """# grading (nbgrader): each graded cell below starts with _hw_begin() and ends with _hw_end(), which
# requires every check the cell ran to have passed. A graded cell's stderr (torch's profiler logs there
# from C++, and nbgrader scores any stderr as a failure) is shown in its printed output instead.
import io as _hw_io, os as _hw_os, sys as _hw_sys, tempfile as _hw_tf
from IPython.display import display as _hw_display
from hwlab.core import grading as _hw_grading
_hw_seen, _hw_redirect, _hw_mark = [], None, 0
_hw_grading.on_graded(_hw_seen.append)


def _hw_restore():  # stderr back where it was; what the cell wrote there, as text
    global _hw_redirect
    if not _hw_redirect:
        return ""
    fd2, saved_fd, pyerr = _hw_redirect
    _hw_redirect = None
    text = _hw_sys.stderr.getvalue()
    _hw_sys.stderr = pyerr
    _hw_os.dup2(saved_fd, 2)
    _hw_os.close(saved_fd)
    fd2.seek(0)
    return text + fd2.read().decode(errors="replace")


def _hw_begin():
    global _hw_redirect, _hw_mark
    _hw_restore()  # a graded cell that raised before its end left stderr redirected
    fd2 = _hw_tf.TemporaryFile()
    _hw_redirect = (fd2, _hw_os.dup(2), _hw_sys.stderr)
    _hw_os.dup2(fd2.fileno(), 2)
    _hw_sys.stderr = _hw_io.StringIO()
    _hw_mark = len(_hw_seen)


def _hw_show(value):  # what the cell's last line showed, shown before _hw_end() checks
    if value is not None:
        _hw_display(value)


def _hw_end():
    text = _hw_restore()
    if text.strip():
        print("[this cell's stderr, shown here: only the checks decide its grade]\\n" + text)
    new = _hw_seen[_hw_mark:]
    assert new, "this cell ran no check: run the answer cells above first"
    assert all(r.passed for r in new), "; ".join(str(r) for r in new if not r.passed)"""
BEGIN_CALL, END_CALL = "_hw_begin()", "_hw_end()"


class CourseError(ValueError):
    """The exercise and its solution cannot be paired."""


def _src(cell) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def _is_learner(cell) -> bool:
    return TAG in (cell.get("metadata", {}).get("tags") or [])


def solution_region(exercise: str, solution: str) -> str | None:
    """The solution's source with every run of solution-only lines between solution markers
    (indented as its first line); None when the two are alike."""
    ex = exercise.split("\n")
    # a solution may already mark its blocks (scripts/make_exercises.py writes the exercise from them):
    # the markers go, and the lines they held are marked below like any solution-only lines
    so = [x for x in solution.split("\n") if x.strip() not in (BEGIN_SOL, END_SOL)]
    if ex == so:
        return None
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, ex, so, autojunk=False).get_opcodes():
        if op == "equal":
            out += so[j1:j2]
            continue
        out += [_as_comment(x) for x in ex[i1:i2] if not _is_stub(x)]  # the exercise's hint stays
        if op in ("replace", "insert"):
            lines = so[j1:j2]
            indent = re.match(r"\s*", next((x for x in lines if x.strip()), "")).group(0)
            out += [indent + BEGIN_SOL, *lines, indent + END_SOL]
    return "\n".join(out)


def _is_stub(line: str) -> bool:
    t = line.strip()
    return t in ("pass", "...") or t.startswith("raise NotImplementedError")


def _as_comment(line: str) -> str:
    """An exercise-only line kept for its hint, as a comment (it must not run beside the answer)."""
    indent = re.match(r"\s*", line).group(0)
    body = line[len(indent):]
    return line if not body or body.startswith("#") else f"{indent}# {body}"


def _meta(cell, **nbg) -> None:
    cell.setdefault("metadata", {})["nbgrader"] = {"schema_version": 3, **nbg}


def build_source(exercise_nb: dict, solution_nb: dict, graded: set[int], stem: str) -> dict:
    """The nbgrader source notebook: ``solution_nb`` with answer and test cells marked.
    ``graded`` holds the indices of the cells that build a grade (:func:`find_graded`)."""
    ex_answers = [c for c in exercise_nb["cells"] if _is_learner(c)]
    so_answers = [i for i, c in enumerate(solution_nb["cells"]) if _is_learner(c)]
    if len(ex_answers) != len(so_answers):
        raise CourseError(f"{stem}: {len(ex_answers)} answer cells (tag {TAG!r}) in the exercise, "
                          f"{len(so_answers)} in the solution")
    nb = json.loads(json.dumps(solution_nb))
    nb["metadata"].pop("jupytext", None)
    k = 0
    for i, cell in enumerate(nb["cells"]):
        if _is_learner(cell):
            ex_cell = ex_answers[k]
            k += 1
            if ex_cell["cell_type"] != cell["cell_type"]:
                raise CourseError(f"{stem}: answer cell {k} is {ex_cell['cell_type']} in the exercise, "
                                  f"{cell['cell_type']} in the solution")
            region = solution_region(_src(ex_cell), _src(cell))
            if region is not None:
                cell["source"] = region
                _meta(cell, grade=False, solution=True, locked=False, grade_id=f"answer_{k}")
        elif i in graded and cell["cell_type"] == "code":
            cell["source"] = "\n".join([BEGIN_CALL, show_last(_src(cell).rstrip("\n")), END_CALL])
            _meta(cell, grade=True, solution=False, locked=True, points=graded_points(graded, i),
                  grade_id=f"check_{i}")
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    if graded:
        setup = {"cell_type": "code", "id": "hwlab-grading-setup", "source": SETUP, "outputs": [],
                 "execution_count": None, "metadata": {}}
        _meta(setup, grade=False, solution=False, locked=True, grade_id="grading_setup")
        first_code = next((i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"), len(nb["cells"]))
        nb["cells"].insert(first_code, setup)
    return nb


def show_last(source: str) -> str:
    """``source`` with its last statement, if a bare expression (a checker call the notebook displays),
    wrapped in ``_hw_show(...)``: followed by ``_hw_end()`` it would no longer be the cell's last line,
    and Jupyter shows only the last line's value."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    last = tree.body[-1] if tree.body else None
    if (not isinstance(last, ast.Expr) or last.col_offset != 0
            or (len(tree.body) > 1 and tree.body[-2].end_lineno >= last.lineno)):
        return source
    lines = source.split("\n")
    first, end = last.lineno - 1, last.end_lineno - 1
    tail = lines[end].encode()  # end_col_offset counts UTF-8 bytes
    lines[end] = (tail[:last.end_col_offset] + b")" + tail[last.end_col_offset:]).decode()
    lines[first] = "_hw_show(" + lines[first]
    return "\n".join(lines)


def graded_points(graded, i) -> int:
    return graded[i] if isinstance(graded, dict) else 1


def find_graded(solution_path: Path, timeout_s: int = 300) -> dict[int, int]:
    """cell index -> number of grades it builds, found by executing the solution once (nbclient,
    in the solution's folder) with a recorder on :func:`hwlab.core.grading.on_graded`."""
    import nbformat
    from nbwatch import execute_notebook  # the one way a notebook is executed (a watchdog on each cell)

    nb = nbformat.read(solution_path, as_version=4)
    probe = ("from hwlab.core import grading as _g\n_hw_probe = []\n_g.on_graded(_hw_probe.append)\n"
             "_hw_probe_n = 0")
    cells = [nbformat.v4.new_code_cell(probe)]
    index = {}
    for i, c in enumerate(nb.cells):
        cells.append(c)
        if c.cell_type == "code":
            index[len(cells)] = i
            cells.append(nbformat.v4.new_code_cell(
                f"print('HWLAB_GRADED', {i}, len(_hw_probe) - _hw_probe_n); _hw_probe_n = len(_hw_probe)"))
    nb.cells = cells
    execute_notebook(nb, cwd=solution_path.parent, cell_timeout_s=timeout_s,
                     label=f"graded__{solution_path.stem}")
    out = {}
    for c in nb.cells:
        for o in c.get("outputs", []):
            m = re.match(r"HWLAB_GRADED (\d+) (\d+)", o.get("text", "") if o.get("output_type") == "stream" else "")
            if m and int(m.group(2)) > 0:
                out[int(m.group(1))] = int(m.group(2))
    return out


def pairs(root: Path = ROOT) -> list[tuple[str, Path, Path]]:
    """(assignment name, exercise, solution) for every exercise with a solution."""
    out = []
    for ex in sorted((root / "exercises").glob("*.ipynb")):
        so = root / "solutions" / ex.name
        if so.exists():
            out.append((ex.stem, ex, so))  # exNN_<name>: its own name
    return out


CONFIG = '''import warnings

c = get_config()  # noqa: F821 (nbgrader's config file)
# nbgrader 0.9 builds a submission's records under SQLAlchemy 2, which warns that they are not in the
# session yet; nbgrader adds the submission to the session right after, so nothing is lost
warnings.filterwarnings("ignore", message=r"Object of type <Submitted\\w+> not in session", module=r"nbgrader\\.api")
c.CourseDirectory.course_id = "{course}"
# each graded cell's checks need the kit's hwlab (installed in this environment)
c.ExecutePreprocessor.timeout = 900
'''


def build(out: Path, *, root: Path = ROOT, only: list[str] | None = None, force: bool = False,
          graded: dict[str, dict[int, int]] | None = None) -> list[str]:
    """Write the course to ``out``; returns the assignment names."""
    if out.exists() and any(out.iterdir()) and not force:
        raise CourseError(f"{out} is not empty: pass --force to replace its source/ and config")
    built = []
    for name, ex, so in pairs(root):
        if only and name not in only:
            continue
        g = graded[name] if graded and name in graded else find_graded(so)
        nb = build_source(json.loads(ex.read_text()), json.loads(so.read_text()), g, name)
        dest = out / "source" / name
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        (dest / so.name).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        built.append(name)
    (out / "nbgrader_config.py").write_text(CONFIG.format(course=COURSE_ID))
    return built


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", action="append", help="an assignment name (exNN_name); repeatable")
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args(argv)
    try:
        names = build(a.out, only=a.only, force=a.force)
    except CourseError as e:
        print(f"nbgrader_course: {e}", file=sys.stderr)
        return 2
    print(f"course {COURSE_ID!r} in {a.out}: " + ", ".join(names))
    print(f"next: cd {a.out} && nbgrader generate_assignment {names[0] if names else 'NAME'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
