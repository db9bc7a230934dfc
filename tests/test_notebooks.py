"""Every notebook, exercise and solution executes headlessly (nbclient) on this machine, where a
learner runs it: in a working copy made by ``hwlab lab``'s own code, and once more from a wheel
installed without the checkout; exercises say "not done yet" without an error, solutions pass;
pairs stay in step."""
import atexit
import functools
import json
import os
import re
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
import torch

# the notebook tools come with the dev extra (scripts/setup.sh installs it): without them this
# module is skipped with the reason, not a collection error that stops every other test
jupytext = pytest.importorskip("jupytext", reason="jupytext missing: pip install -e '.[dev,lab]'")
nbformat = pytest.importorskip("nbformat", reason="nbformat missing: pip install -e '.[dev,lab]'")
pytest.importorskip("nbclient", reason="nbclient missing: pip install -e '.[dev,lab]'")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from nbwatch import execute_notebook  # noqa: E402  (tools/ is not a package)
ARTIFACTS = ROOT / "test-artifacts" / "notebooks"
NOTEBOOKS = sorted(p for d in ("notebooks", "solutions", "exercises")
                   for p in (ROOT / d).glob("*.ipynb"))


#: the checkpoint answers CI fills in, graded by the checker like a learner's (hwlab.nb.answer)
CHECKPOINT_ANSWERS = ROOT / "solutions" / "checkpoints.json"
#: lab notebooks whose walk waits for a graded checkpoint
CHECKPOINTED = ("01", "02", "03", "04", "08")


@functools.cache
def _learner_copy() -> Path:
    """A fresh working copy made by ``hwlab lab``'s code (:func:`hwlab.cli.workcopy.prepare` under a
    temporary ``HWLAB_HOME``, on the kit's kernel where the venv has it), outside the checkout; the
    solutions beside it the same way (an instructor's copy: ``hwlab lab`` leaves them out)."""
    from hwlab.cli import workcopy

    home = Path(tempfile.mkdtemp(prefix="hwlab-home-"))
    atexit.register(shutil.rmtree, home, True)
    old = os.environ.get("HWLAB_HOME")
    os.environ["HWLAB_HOME"] = str(home)
    try:
        root = workcopy.copy_root(ROOT)
        kernel = workcopy.kit_kernel()
        rep = workcopy.prepare(ROOT, root=root, kernel=kernel)
    finally:
        if old is None:
            os.environ.pop("HWLAB_HOME")
        else:
            os.environ["HWLAB_HOME"] = old
    assert rep.made and ROOT.resolve() not in root.resolve().parents
    for sol in sorted((ROOT / "solutions").glob("*.ipynb")):
        (root / "solutions").mkdir(exist_ok=True)
        (root / "solutions" / sol.name).write_bytes(workcopy.learner_version(sol, kernel))
    return root


def _in_copy(path: Path, copy: Path) -> Path:
    """Where the checkout's ``path`` lies in a working copy."""
    return copy / path.resolve().relative_to(ROOT)


def _kernel_name() -> str:
    from hwlab.cli import workcopy

    return workcopy.KERNEL_NAME if workcopy.kit_kernel() else "python3"


def _execute(path: Path, checkpoint_answers: Path | None = CHECKPOINT_ANSWERS, *, copy: Path | None = None,
             kernel_name: str | None = None, drop_env: tuple[str, ...] = (), tag: str = "") -> nbformat.NotebookNode:
    """Execute the checkout's ``path`` from a learner's working copy (``copy``, default: one made by
    ``hwlab lab``'s code), in that copy's folder; the kernel gets ``HWLAB_CHECKPOINT_ANSWERS`` (None:
    a learner's blanks). A stalled cell (nbwatch's watchdog) is retried once in a fresh kernel and
    reported as a warning."""
    run = _in_copy(path, copy or _learner_copy())
    env = {} if checkpoint_answers is None else {"HWLAB_CHECKPOINT_ANSWERS": str(checkpoint_answers)}
    nb = execute_notebook(run, cwd=run.parent, env=env, drop_env=("HWLAB_CHECKPOINT_ANSWERS", *drop_env),
                          kernel_name=kernel_name or _kernel_name())
    for stall in nb.metadata.get("hwlab_nbwatch", {}).get("stalls", []):
        warnings.warn(f"{path.parent.name}/{path.name}: cell {stall['cell_index']} stalled and the notebook "
                      f"was executed again in a fresh kernel; stacks in {stall['report']}")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, ARTIFACTS / f"{tag}{path.parent.name}__{path.name}")
    return nb


def _text(nb) -> str:
    parts = []
    for c in nb.cells:
        for o in c.get("outputs", []):
            parts.append(o.get("text", ""))
            data = o.get("data", {})
            parts.append(data.get("text/plain", ""))
            parts.append(data.get("text/markdown", ""))
    return "\n".join(parts)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_executes_in_a_learners_working_copy(path):
    _check_executed(path, _execute(path))


@functools.cache
def _wheel_kit() -> tuple[Path, Path, Path]:
    """(venv, working copy, Jupyter path): this tree's wheel installed without the checkout
    (tests/wheel_kit.py), a kernelspec ``hwlab-wheel`` running the venv's Python, and a working copy
    made by the wheel's own ``hwlab.cli.workcopy`` under a temporary ``HWLAB_HOME``."""
    import subprocess

    from wheel_kit import build_wheel, install_in_fresh_venv

    tmp = Path(tempfile.mkdtemp(prefix="hwlab-wheel-"))
    atexit.register(shutil.rmtree, tmp, True)
    venv = tmp / "venv"
    py = install_in_fresh_venv(build_wheel(tmp), venv)
    spec = tmp / "jupyter" / "kernels" / "hwlab-wheel"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(py), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "hwlab (wheel)", "language": "python"}))
    make = ("import sys; from pathlib import Path; from hwlab.cli import workcopy\n"
            "root = workcopy.prepare(Path(sys.argv[1])).root\n"
            "(root / 'solutions').mkdir()\n"
            "for p in sorted((Path(sys.argv[1]) / 'solutions').glob('*.ipynb')):\n"
            "    (root / 'solutions' / p.name).write_bytes(workcopy.learner_version(p, None))\n"
            "print(root)")
    env = {k: v for k, v in os.environ.items() if k not in WHEEL_DROP_ENV}
    r = subprocess.run([str(py), "-c", make, str(ROOT)], cwd=tmp, env=dict(env, HWLAB_HOME=str(tmp / "home")),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    copy = Path(r.stdout.strip().splitlines()[-1])
    assert (tmp / "home") in copy.parents
    return venv, copy, tmp / "jupyter"


#: what the wheel's kernel must not inherit: a path to the checkout's src, a recorded-runs override
WHEEL_DROP_ENV = ("PYTHONPATH", "HWLAB_RECORDED_DIR")


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_executes_from_a_wheel_without_the_checkout(path, monkeypatch):
    """The same notebook, from a working copy the wheel's own code made, on a kernel whose hwlab is
    the installed wheel's (checked in the kernel: ``hwlab.__file__`` lies in the venv)."""
    venv, copy, jupyter_path = _wheel_kit()
    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join([str(jupyter_path), os.environ.get("JUPYTER_PATH", "")]))
    run = _in_copy(path, copy)
    nb = nbformat.read(run, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell("import hwlab; print('HWLAB_FILE', hwlab.__file__)"))
    execute_notebook(nb, cwd=run.parent, env={"HWLAB_CHECKPOINT_ANSWERS": str(CHECKPOINT_ANSWERS)},
                     drop_env=("HWLAB_CHECKPOINT_ANSWERS", *WHEEL_DROP_ENV), kernel_name="hwlab-wheel")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, ARTIFACTS / f"wheel__{path.parent.name}__{path.name}")
    where = nb.cells[0].outputs[0]["text"].split("HWLAB_FILE ", 1)[1].strip()
    assert Path(where).resolve().is_relative_to(venv.resolve()), where  # the wheel's hwlab, not the checkout's
    _check_executed(path, nb)


def _check_executed(path: Path, nb) -> None:
    out = _text(nb)
    assert "Traceback" not in out
    if path.parent.name == "exercises":
        assert "not done yet" in out
    if path.parent.name == "solutions":
        assert "not done yet" not in out and "status='wrong'" not in out and ": wrong." not in out
        assert out.count("passed") >= 2
    if path.parent.name == "notebooks":
        # every figure is labelled: recorded (with its machine) or measured live (with this machine)
        assert "recorded on NVIDIA H200" in out or "measured live on" in out
        has_png = any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
        # the drills notebook shows a learner only the drill's evidence; its plot was the instructor's
        # pool check, which names every fault's leaf (now `hwlab drill pool`)
        assert has_png or path.name.startswith("07_"), "each lab shows at least one plot"
        if path.name[:2] in CHECKPOINTED:  # the solutions' answer passed the checker, so the walk is shown
            assert f"checkpoint {path.name[:2]}: passed" in out and "answer the checkpoint above first" not in out
    if path.name == "04_fp8_dequant_fallback.ipynb" and path.parent.name == "notebooks" and not torch.cuda.is_available():
        # without a GPU the notebook reads the recorded H200 run: the seed's symptom, as the library derives it
        # said one way (hwlab.core.gains): "x% faster" / "x% slower", memory "x% less" / "x% more"
        from hwlab.core import evidence
        from hwlab.core.gains import faster, less_more
        from hwlab.labs import fp8
        rec = evidence.recorded("lab04_fp8")
        sig = fp8.seed_signature(rec.extra["run"])
        assert f"({faster(sig['gain_p50_pct'])})" in out and f"{less_more(sig['memory_change_pct'])}" in out


#: put first in a notebook by the blank-run test: every graded check the notebook calls (through the
#: module, as the notebooks do) is recorded with its arguments, so the last cell can ask its reference
_RECORD_CELL = """import hwlab.course.exercise_checks as _xc, hwlab.course.reading_checks as _rc
_graded_calls = []
def _record(mod):
    for _n in dir(mod):
        _f = getattr(mod, _n)
        if callable(_f) and hasattr(_f, "reference"):
            def _w(*a, _f=_f, **k):
                _r = _f(*a, **k)
                _graded_calls.append((_f.reference, a, k, getattr(_r, "status", "")))
                return _r
            _w.reference = _f.reference
            setattr(mod, _n, _w)
_record(_xc)
_record(_rc)"""

#: appended to a notebook by the blank-run test: what each unpassed item of the run asks, read from the
#: run's own objects: the checkpoint's leaf, walk and deciding figures; a drill's leaf and walk; each
#: exercise check's reference (its leaf, and its measured figures: the non-whole numbers; whole numbers
#: there are counts and sizes the question itself shows); of a reading check, the statistics the kit
#: derives (median, p10-p90, the accepted range), not the raw figures the learner reads off the output
_SECRETS_CELL = """import json as _json
from hwlab.diagnosis import flowchart as _fc
_out = {"leaves": [], "walks": [], "figures": [], "status": None}
if "CP" in globals() and hasattr(CP, "_cp"):
    _cp, _s = CP._cp, CP._cp.asked()
    _out["status"] = CP.status
    _out["leaves"].append(_cp.walk.leaf_id)
    _out["walks"].append(_cp.walk.compact())
    _out["figures"].append([float(_s.value), ""])
    if _cp.prediction is not None:
        _out["figures"].append([float(_cp.prediction.actual), _cp.prediction.unit])
if "drill" in globals() and globals().get("MY_LEAF") is None:
    _out["leaves"].append(drill.fault().leaf)
    _out["walks"].append(_fc.diagnose(drill.observations).compact())
for _ref, _a, _k, _st in _graded_calls:
    if _st == "passed":
        continue
    for _key, _v in _ref(*_a, **_k).answer.items():
        if "leaf" in str(_key).lower() and _v in _fc.LEAVES:
            _out["leaves"].append(_v)
        elif isinstance(_v, float) and not _v.is_integer() and (
                getattr(_ref, "__module__", "").endswith("_checks") and not _ref.__module__.endswith("reading_checks")
                or any(w in str(_key) for w in ("median", "p10", "p90", "accepted"))):
            _out["figures"].append([_v, ""])
print("@@secrets@@" + _json.dumps(_out))"""


def _figure_forms(x: float, unit: str = "") -> set[str]:
    """How a figure is printed in the notebooks (three significant digits, one or two decimals); the
    short forms ("1", "0.0") are in any text, so they count only with their unit."""
    forms = {f"{x:.3g}", f"{x:.2f}", f"{x:.1f}", f"{x:g}"}
    return {f + unit for f in forms if unit.strip() or len(f.strip("-0.")) >= 2}


def _named(text: str, secrets: dict) -> list[str]:
    """An unpassed item's leaf named anywhere: its walk line, an arrow into it ("-> J", "→ M"), "leaf I",
    "lands on I", the letter in bold, or its title (outside a legend of every leaf). A Mermaid chart (its edges "-->", every leaf's title)
    draws the chart itself, which every notebook shows before any answer, so it is left out."""
    from hwlab.diagnosis import flowchart

    text = re.sub(r"```mermaid.*?```", "", text, flags=re.S)
    found = [w for w in secrets["walks"] if w and w in text]
    for leaf in dict.fromkeys(x for x in secrets["leaves"] if x):
        found += [m.group(0) for m in re.finditer(
            rf"((?<!-)->|→|\bleaf|\blands? on)\s*\**{leaf}\**(?![\w])|\*\*{leaf}\*\*", text)]
        title = flowchart.LEAVES[leaf].title
        # a line that lists every leaf's title is the chart's legend (a menu to choose from), not an answer
        found += [ln for ln in text.splitlines() if title in ln and not all(
            x.title in ln for x in flowchart.LEAVES.values())][:1]
    return found


def _leaked(text: str, secrets: dict) -> list[str]:
    found = _named(text, secrets)
    figures = set().union(*(_figure_forms(x, unit) for x, unit in secrets["figures"]))
    found += [f for f in figures if re.search(rf"(?<![\d.]){re.escape(f)}(?![\d])", text)]
    return found


#: every notebook and exercise a learner opens (the solutions are the instructor's)
LEARNER_NOTEBOOKS = [p for p in NOTEBOOKS if p.parent.name in ("notebooks", "exercises")]


@pytest.mark.slow
@pytest.mark.parametrize("path", LEARNER_NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_blank_run_all_shows_nothing_of_an_unpassed_answer(path):
    """Run All in a learner's kernel (no solutions file), in a working copy made by ``hwlab lab``'s
    code, of every notebook and exercise: every cell runs, and no output names the leaf, the walk or
    the deciding figures of an item the learner has not passed: the checkpoint (after it, and its leaf
    or walk before it too), a drill not yet answered, an exercise check left blank. What each asks is
    read from the same run's objects (the checkpoint, the drill, each check's reference), not typed here."""
    run = _in_copy(path, _learner_copy())
    nb = nbformat.read(run, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(_RECORD_CELL))
    nb.cells.append(nbformat.v4.new_code_cell(_SECRETS_CELL))
    nb = execute_notebook(nb, cwd=run.parent, drop_env=("HWLAB_CHECKPOINT_ANSWERS",), kernel_name=_kernel_name())
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, ARTIFACTS / f"blank__{path.parent.name}__{path.name}")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code)  # every cell ran: Run All went on
    secrets = json.loads(_text(nbformat.v4.new_notebook(cells=code[-1:])).split("@@secrets@@")[1])
    shown = code[1:-1]
    assert "Traceback" not in _text(nbformat.v4.new_notebook(cells=shown))
    if path.parent.name == "notebooks" and path.name[:2] in CHECKPOINTED:
        assert secrets["status"] == "fill in"
        at = next(i for i, c in enumerate(shown) if "nb.checkpoint(" in c.source)
        before = _text(nbformat.v4.new_notebook(cells=shown[:at + 1]))
        after = _text(nbformat.v4.new_notebook(cells=shown[at + 1:]))
        assert "still blank: leaf" in before and "answer the checkpoint above first" in after
        # before the checkpoint the evidence table shows the value to read, never the leaf or its walk
        assert not _named(before, secrets), (_named(before, secrets), secrets)
    else:
        after = _text(nbformat.v4.new_notebook(cells=shown))
    if path.parent.name == "exercises":
        assert secrets["leaves"] or secrets["figures"] or "not done yet" in after  # its checks ran blank
    assert not _leaked(after, secrets), (_leaked(after, secrets), secrets)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_ipynb_matches_its_py_and_has_no_stale_outputs(path):
    nb = nbformat.read(path, as_version=4)
    py = jupytext.read(path.with_suffix(".py"))
    assert [c.source for c in nb.cells] == [c.source for c in py.cells], \
        f"{path.name} and its .py differ: run scripts/sync_notebooks.sh"
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_markdown_heading_sits_in_a_code_cell(path):
    """A heading commented into a code cell renders as code, not as a section (jupytext keeps a
    ``# ## Title`` line in the code cell it follows): headings belong in markdown cells."""
    nb = nbformat.read(path, as_version=4)
    for c in nb.cells:
        if c.cell_type == "code":
            heads = [ln for ln in c.source.splitlines() if re.match(r"^# #{1,4} \S", ln)]
            assert not heads, f"{path.name}: heading in a code cell: {heads}"


def test_each_exercise_has_a_solution_differing_only_in_learner_cells():
    exercises = sorted((ROOT / "exercises").glob("*.ipynb"))
    assert exercises
    for ex in exercises:
        sol = ROOT / "solutions" / ex.name
        assert sol.exists(), f"{ex.name} has no solution"
        a, b = nbformat.read(ex, as_version=4), nbformat.read(sol, as_version=4)
        assert len(a.cells) == len(b.cells)
        learner = 0
        for i, (x, y) in enumerate(zip(a.cells, b.cells)):
            tagged = "learner" in x.metadata.get("tags", [])
            learner += tagged
            if i == 0:  # title line names Exercise / Solution
                assert x.source.splitlines()[1:] == y.source.splitlines()[1:]
            elif not tagged:
                assert x.source == y.source, f"{ex.name} cell {i} differs but is not a learner cell"
        assert learner >= 1


def test_executed_h200_copies_ran_clean_and_say_where():
    """docs/executed-h200 keeps notebooks executed on the H200: each ran without error and its
    outputs name their source (the H200, or a labelled CPU recording)."""
    import nbformat

    folder = ROOT / "docs" / "executed-h200"
    copies = sorted(folder.glob("notebooks__*.ipynb"))  # the labs; exercises print their checker's verdict
    assert {p.name.split("__")[1] for p in copies} >= {f"{n}.ipynb" for n in (
        "00_start_here", "01_bandwidth_bound", "02_registers_occupancy", "03_cross_link_tp",
        "04_fp8_dequant_fallback", "05_node_baseline", "06_case_studies", "07_drills")}
    for p in copies:
        nb = nbformat.read(p, as_version=4)
        assert nb.metadata["hwlab_executed"]["error"] is None, p.name
        text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
        # each names its source: live/recorded on the H200, or (Lab 3's slow link) recorded on a CPU
        assert "NVIDIA H200" in text or "recorded on CPU" in text, p.name


def test_no_notebook_reads_a_recording_an_exercise_reads():
    """An exercise is a case no notebook shows: a recorded run an exercise reads (through
    ``evidence.recorded_traces`` or the recorded folders) appears in no notebook's code."""
    pat = re.compile(r"""recorded_traces\(\s*["']([\w.-]+)["']""")
    used_by_exercises = {m for p in (ROOT / "exercises").glob("*.py") for m in pat.findall(p.read_text())}
    assert used_by_exercises, "no exercise reads a recorded trace: the pattern above no longer matches"
    for nb_py in sorted((ROOT / "notebooks").glob("*.py")):
        code = nb_py.read_text()
        shown = {name for name in used_by_exercises if re.search(rf"""["']{re.escape(name)}["']""", code)}
        assert not shown, f"{nb_py.name} shows {shown}, which an exercise asks the learner to read"
