"""The floors of the house (docs/CONTRIBUTING.md): a module's floor is its folder, and nothing
imports a module on a higher floor.

Walks every module under src/hwlab with ``ast`` (function-local imports included, since those
are how an upward import hides) and fails on an upward import that is not in ``DEBTS``.
"""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "hwlab"

CORE, TRACES, LABS, DIAGNOSIS, COURSE, TOP = 0, 1, 2, 3, 4, 5
FLOOR_NAMES = {CORE: "core", TRACES: "traces", LABS: "labs", DIAGNOSIS: "diagnosis",
               COURSE: "course/examine", TOP: "CLI/notebooks"}
#: a module's floor is its folder (the package right below ``hwlab``); the few modules at the
#: package root are placed by name: ``errors`` (exit codes, the user-input error) is imported by
#: every floor, ``nb`` (notebook helpers) and the package entry sit at the top.
FOLDERS = {"core": CORE, "traces": TRACES, "labs": LABS, "diagnosis": DIAGNOSIS, "course": COURSE,
           "examine": COURSE, "cli": TOP}
ROOT_MODULES = {"errors": CORE, "nb": TOP, "__init__": TOP, "__main__": TOP}


def _modules():
    """Every module of the house: the .py files under src/hwlab, less ``examples/`` (the learner's
    examples, shipped as data beside the modules and examined, never imported by the kit)."""
    return (p for p in SRC.rglob("*.py") if p.relative_to(SRC).parts[0] != "examples")


def floor_of(mod: str) -> int:
    head = mod.split(".")[0]
    if head in FOLDERS:
        return FOLDERS[head]
    if mod in ROOT_MODULES:
        return ROOT_MODULES[mod]
    raise AssertionError(f"hwlab.{mod} is on no floor: put it in a floor's folder ({sorted(FOLDERS)})")


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """hwlab modules imported by ``path`` (absolute or relative, anywhere in the file)."""
    me = module_name(path)
    pkg = me.split(".")[:-1] if path.name != "__init__.py" else me.split(".")
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else list(pkg)
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("hwlab"):
                target = node.module[len("hwlab"):].lstrip(".")
            else:
                continue
            # "from .labs import crosslink" names module labs.crosslink; "from .measure import
            # bench" names measure.bench, which _resolves() cuts back to the module measure
            out.update(f"{target}.{a.name}".lstrip(".") for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name[len("hwlab."):] for a in node.names if a.name.startswith("hwlab."))
    return {m for m in out if m and m != me}


def _resolves(mod: str) -> str:
    """Drop a trailing attribute (``from . import x`` gives module x, ``from .m import f`` gives m)."""
    parts = mod.split(".")
    while parts:
        cand = SRC.joinpath(*parts)
        if cand.with_suffix(".py").exists() or (cand / "__init__.py").exists():
            return ".".join(parts)
        parts = parts[:-1]
    return "__init__"  # a name defined in hwlab/__init__.py (e.g. __version__)


def upward_imports() -> set[tuple[str, str]]:
    found = set()
    for path in sorted(_modules()):
        me = module_name(path)
        if me in ("__init__", "__main__") or me.endswith("__main__"):
            continue
        for target in imports_of(path):
            target = _resolves(target)
            if floor_of(target) > floor_of(me):
                found.add((me, target))
    return found


#: upward imports allowed knowingly; empty: a new upward import fails the test.
DEBTS: set[tuple[str, str]] = set()


def test_every_module_is_on_a_floor():
    for path in _modules():
        floor_of(module_name(path))


def test_no_new_upward_import():
    found = upward_imports()
    new = sorted(found - DEBTS)
    assert not new, "upward imports (module -> module on a higher floor): " + ", ".join(
        f"{a} ({FLOOR_NAMES[floor_of(a)]}) -> {b} ({FLOOR_NAMES[floor_of(b)]})" for a, b in new)


def test_module_names_are_unique():
    """One name, one module: a reader who sees ``ranks`` knows which file it is. Each lab package
    keeps the same few role names (its kernels, its report, its grader), as Triton's tutorials keep
    one layout per lesson; packages' ``__init__``/``__main__`` are not names."""
    roles = {"__init__", "__main__", "kernels", "report", "grader"}
    seen: dict[str, list[str]] = {}
    for path in _modules():
        if path.stem not in roles:
            seen.setdefault(path.stem, []).append(module_name(path))
    clashes = {k: v for k, v in seen.items() if len(v) > 1}
    assert not clashes, f"module names used twice: {clashes}"


def test_debts_list_only_shrinks():
    paid = sorted(DEBTS - upward_imports())
    assert not paid, f"paid off, remove from DEBTS: {paid}"


def test_walker_finds_a_function_local_upward_import(tmp_path):
    """A core module that imports a lab inside a function is caught (the way #16's cycle hid)."""
    pkg = tmp_path / "hwlab"
    (pkg / "labs").mkdir(parents=True)
    (pkg / "core").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "labs" / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "labs" / "lab.py").write_text("from ..core.measure import bench\n")
    (pkg / "core" / "measure.py").write_text("def bench():\n    from ..labs import lab\n    return lab\n")
    globals()["SRC"], saved = pkg, SRC
    try:
        assert upward_imports() == {("core.measure", "labs.lab")}
    finally:
        globals()["SRC"] = saved
