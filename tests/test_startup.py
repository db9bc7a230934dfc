"""The commands that measure nothing load no torch, triton or numpy, and work where none is installed.

Two fast checks of the import graph (which module would load torch at import, named; and a fresh
interpreter's ``sys.modules`` after importing the CLI), and a slow one that runs the commands on real
inputs in a subprocess where importing torch, triton or numpy fails, comparing each answer with the
same command run here, where torch is installed. The start-up budget itself is measured and recorded
by ``tools/startup_bench.py``, not asserted here (a wall-clock figure on a busy CI machine says little).
"""
from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from hwlab.cli import main
from hwlab.course import drills

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
HEAVY = ("torch", "triton", "numpy")
#: what the non-measuring commands import: the CLI and its command modules, the package, and the
#: modules those commands call at run time (records, traces, step logs, drills, incidents)
ROOTS = ["hwlab", "hwlab.cli", "hwlab.cli.console", "hwlab.cli.bundle",
         *sorted(f"hwlab.cli.{p.stem}" for p in (SRC / "hwlab" / "cli").glob("cmd_*.py")),
         "hwlab.core.evidence", "hwlab.traces.kineto", "hwlab.core.steplog", "hwlab.core.capture",
         "hwlab.diagnosis.flowchart", "hwlab.diagnosis.ranks", "hwlab.diagnosis.ranks_traces",
         "hwlab.diagnosis.incident", "hwlab.course.drills", "hwlab.course.classroom",
         "hwlab.diagnosis.baseline_compare", "hwlab.labs.drillruns", "hwlab.examine",
         "hwlab.examine.report_text", "hwlab.examine.parts", "hwlab.examine.torch_profile"]


def _file_of(mod: str) -> Path | None:
    base = SRC.joinpath(*mod.split("."))
    for p in (base / "__init__.py", base.with_suffix(".py")):
        if p.is_file():
            return p
    return None


def _load_time_imports(path: Path, mod: str) -> set[str]:
    """Modules ``path`` imports when it is loaded: module and class bodies, ``if``/``try`` blocks
    at those levels; not function bodies, not ``if TYPE_CHECKING:`` blocks."""
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1])
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module or ""
                out.add(target)
                out.update(f"{target}.{a.name}" for a in node.names)  # a submodule, where it is one
            elif isinstance(node, ast.If):
                test = ast.unparse(node.test)
                if "TYPE_CHECKING" not in test:
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for h in node.handlers:
                    visit(h.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, (ast.ClassDef, ast.With)):
                visit(node.body)

    visit(ast.parse(path.read_text(), str(path)).body)
    return out


def heavy_chains() -> list[str]:
    """Each way a root reaches torch/triton/numpy at import time, as ``a -> b -> torch``."""
    found, seen = [], set()
    todo = [(r, (r,)) for r in ROOTS]
    while todo:
        mod, chain = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        # importing a.b.c runs the packages a and a.b first
        parts = mod.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            todo.append((parent, chain + (parent,)))
        path = _file_of(mod)
        if path is None:
            continue
        for imp in _load_time_imports(path, mod):
            if imp.split(".")[0] in HEAVY:
                found.append(" -> ".join(chain + (imp,)))
            elif imp.startswith("hwlab") and _file_of(imp) is not None:
                todo.append((imp, chain + (imp,)))
    return sorted(found)


def test_no_command_module_loads_torch_triton_or_numpy_at_import():
    assert heavy_chains() == []


def test_the_import_walk_sees_a_top_level_torch_import(tmp_path, monkeypatch):
    """The walk above can fail: a module importing torch at its top is found, through a package."""
    pkg = tmp_path / "src" / "hwlab" / "fakepkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from hwlab.fakepkg.inner import x\n")
    (pkg / "inner.py").write_text("import os\nif os.name:\n    import torch.profiler\nx = 1\n")
    (pkg / "typed.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n"
                                  "def f():\n    import numpy\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path / "src")
    monkeypatch.setattr(sys.modules[__name__], "ROOTS", ["hwlab.fakepkg.typed"])
    assert heavy_chains() == ["hwlab.fakepkg.typed -> hwlab.fakepkg -> hwlab.fakepkg.inner -> torch.profiler"]


def test_a_fresh_interpreter_importing_the_cli_has_no_torch():
    code = ("import sys, importlib\n"
            f"for m in {ROOTS!r}: importlib.import_module(m)\n"
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(SRC)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------ the commands, torch absent
#: a Python where torch, triton and numpy cannot be imported (as on a laptop without them), then
#: `hwlab ARGS`
NO_TORCH = """
import sys
class NotInstalled:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "triton", "numpy"):
            raise ModuleNotFoundError(f"No module named {name!r} (not installed here)", name=name)
        return None
sys.meta_path.insert(0, NotInstalled)
from hwlab.cli import main
sys.exit(main(sys.argv[1:]))
"""


def no_torch(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_TORCH, *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env={**os.environ, "PYTHONPATH": str(SRC)})


def here(*args: str) -> tuple[int, str]:
    """The same command in this process, where torch is installed (and loaded by the test run)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(list(map(str, args)))
    return rc, buf.getvalue()


@pytest.mark.slow
def test_the_blocker_blocks():
    r = subprocess.run([sys.executable, "-c", NO_TORCH.replace("from hwlab.cli import main\nsys.exit(main(sys.argv[1:]))",
                                                               "import torch")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "ModuleNotFoundError" in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ["flowchart", "--json"],
    ["evidence", "list", "--json"],
    ["evidence", "show", "doctor", "--json"],
    ["evidence", "show", "lab01_bandwidth", "--json"],
    ["baseline", "compare", "tests/data/baseline_cpu_a.json", "tests/data/baseline_cpu_b.json", "--json"],
    ["ranks", "--traces", "src/hwlab/recorded/traces/slow_rank", "--json"],
    ["ranks", "src/hwlab/recorded/runs/straggler_nccl_h200", "--json"],
], ids=lambda a: " ".join(x.rsplit("/", 1)[-1] for x in a[:3]))
def test_reading_commands_answer_without_torch_as_they_do_with_it(args, monkeypatch):
    monkeypatch.chdir(ROOT)
    r = no_torch(*args)
    rc, out = here(*args)
    assert r.returncode == rc, r.stderr
    got, want = json.loads(r.stdout), json.loads(out)
    if isinstance(want, dict) and "incident_draft" in want:
        # the draft's machine facts describe the machine that ran the command; everything else is
        # read from the traces / step logs and must match
        got.pop("incident_draft"), want.pop("incident_draft")
    assert got == want


@pytest.mark.slow
def test_version_help_and_the_text_forms_run_without_torch():
    assert no_torch("--version").stdout.strip().startswith("hwlab ")
    r = no_torch("--help")
    assert r.returncode == 0 and "flowchart" in r.stdout and "ranks" in r.stdout
    r = no_torch("flowchart")
    assert r.returncode == 0 and "start at B" in r.stdout
    r = no_torch("evidence", "show", "doctor")
    assert r.returncode == 0 and "ceilings: copy" in r.stdout and "RECORDED" in r.stdout
    r = no_torch("examine", "--help")  # the examine command module loads torch only to examine live
    assert r.returncode == 0 and "examine" in r.stdout
    r = no_torch("ranks", "--traces", "src/hwlab/recorded/traces/slow_rank")
    assert r.returncode == here("ranks", "--traces", "src/hwlab/recorded/traces/slow_rank")[0]
    assert "rank 2" in r.stdout


@pytest.mark.slow
def test_drills_grades_class_and_incident_without_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("HWLAB_DRILL_KEY_FILE", str(tmp_path / "drill.key"))  # the subprocesses inherit it
    d = drills.new(seed=5, live=False)  # its observations are the recorded runs: nothing measured
    f = d.save(tmp_path / "drills")
    r = no_torch("drill", "reveal", f)
    assert r.returncode == 0 and json.loads(r.stdout)["leaf"] == d.fault().leaf
    wrong = next(x for x in ("G", "J", "I") if x != d.fault().leaf)
    r = no_torch("drill", "submit", f, "--leaf", wrong, "--dir", tmp_path / "grades", "--learner", "ann",
                 "--class-dir", tmp_path / "class")
    assert r.returncode == 1 and r.stdout.startswith("NOT YET")
    r = no_torch("drill", "submit", f, "--leaf", d.fault().leaf, "--dir", tmp_path / "grades", "--learner",
                 "bob", "--class-dir", tmp_path / "class")  # right: the fix's recorded re-run is read
    assert r.returncode == 0 and r.stdout.startswith("PASSED"), r.stdout + r.stderr
    r = no_torch("drill", "summary", "--dir", tmp_path / "grades")
    s = json.loads(r.stdout)
    assert r.returncode == 0 and s["n"] == 2 and s["learners"]["ann"]["passed"] == 0
    assert s["learners"]["bob"]["passed"] == 1
    r = no_torch("class", "summary", tmp_path / "class", "--json")
    item = json.loads(r.stdout)["items"][f"drill: {d.fault().name}"]
    assert r.returncode == 0 and (item["attempts"], item["learners"], item["passed"]) == (2, 2, 1)

    obs = tmp_path / "obs.json"
    obs.write_text(json.dumps({"slowdown_vs_floor": 3.0, "dram_pct_estimated": 85.0}))
    r = no_torch("incident", "--title", "t", "--scope", "single-card", "--symptom", "slow", "--fix", "fuse",
                 "--reverify", "examine", "--observations", obs, "--out", tmp_path / "inc", "--json",
                 "--evidence", "src/hwlab/recorded/h200/baseline.json")
    assert r.returncode == 0, r.stderr
    rec = json.loads(Path(json.loads(r.stdout)["json"]).read_text())
    assert "H200" in json.dumps(rec["machine"]) and json.loads(r.stdout)["path"][:2] == ["B", "F"]


@pytest.mark.slow
def test_bundle_without_doctor_gathers_without_torch(tmp_path):
    out = tmp_path / "b.tar.gz"
    r = no_torch("bundle", out, "--no-doctor", "--run-dir", "src/hwlab/recorded/traces/slow_rank", "--json")
    assert r.returncode == 0, r.stderr
    with tarfile.open(out) as t:
        names = {Path(n).name for n in t.getnames()}
        vers = json.loads(t.extractfile(next(m for m in t.getmembers() if m.name.endswith("versions.json"))).read())
    assert "versions.json" in names and vers["torch"] is None  # said absent, not invented


@pytest.mark.slow
def test_examine_trace_reads_a_recorded_trace_without_torch(monkeypatch):
    """`examine --trace` (issue 45) reads a trace where torch is not installed, with the answer it
    gives where torch is: same exit code, same headline leaf."""
    monkeypatch.chdir(ROOT)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        main(["examine", "--help"])
    if "--trace" not in buf.getvalue():
        pytest.skip("this hwlab's examine has no --trace yet")
    trace = sorted((ROOT / "src" / "hwlab" / "recorded" / "traces" / "slow_rank").glob("*.json.gz"))[0]
    args = ["examine", "--trace", str(trace), "--json"]
    r = no_torch(*args)
    rc, out = here(*args)
    assert r.returncode == rc, r.stderr
    assert json.loads(r.stdout).get("leaf") == json.loads(out).get("leaf")
