"""The instructor and learner pack: the run-time table is generated from the recorded notebook-times
file, the commands and files the docs name exist, the README links the pack."""
import importlib.util
import json
import re
from pathlib import Path

import pytest

from hwlab.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACK = ["LEARNING_PATH.md", "INSTRUCTOR.md", "RUNBOOK.md", "GLOSSARY.md"]


def _bench_module(name: str):
    """A script under tools/ (not a package) loaded as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def _times_module():
    return _bench_module("notebook_times")


def test_time_table_is_rendered_from_the_recorded_file():
    nt = _times_module()
    times = json.loads((DOCS / "notebook_times.json").read_text())
    doc = (DOCS / "LEARNING_PATH.md").read_text()
    block = doc[doc.index(nt.BEGIN):doc.index(nt.END) + len(nt.END)]
    assert block == nt.render(times), "re-render with: python tools/notebook_times.py --render"
    # H200 figures are the executed copies' own (latest run wins), CPU figures a real run's summary
    assert times["h200"]["runs"] == nt.h200_times(), "run: python tools/notebook_times.py --refresh-h200"
    assert times["cpu"]["runs"] and all(r["seconds"] > 0 for r in times["cpu"]["runs"].values())
    lab_nbs = [f"notebooks/{p.name}" for p in sorted((ROOT / "notebooks").glob("*.ipynb"))]
    new = set(lab_nbs) - set(times["cpu"]["runs"])
    assert not new and set(lab_nbs) <= set(times["notebooks"]), \
        f"{sorted(new)} never timed on a CPU: see tools/notebook_times.py (--merge)"
    for nb in lab_nbs:
        assert f"| `{nb}` |" in block


def test_readme_links_the_pack():
    readme = (ROOT / "README.md").read_text()
    for name in PACK:
        assert f"(docs/{name})" in readme


def test_commands_and_files_named_in_the_docs_exist():
    sub = next(a for a in build_parser()._actions if a.dest == "cmd")
    commands = set(sub.choices)
    for name in PACK:
        text = (DOCS / name).read_text()
        code = "\n".join(re.findall(r"```.*?```", text, re.S) + re.findall(r"`[^`\n]+`", text))
        for cmd in re.findall(r"\bhwlab ([a-z]+)\b", code):
            if cmd not in ("lab",) and cmd not in commands:
                pytest.fail(f"{name} names `hwlab {cmd}`, which is not a command ({sorted(commands)})")
        for path in re.findall(r"`((?:examples|benchmarks|notebooks|exercises|solutions|src/hwlab|scripts)/[\w./-]+)`",
                               text):
            p = path.split(" ")[0]
            assert (ROOT / p).exists() or (ROOT / (p + ".py")).exists(), f"{name} names {p}, which does not exist"


def _copies_module():
    return _bench_module("executed_copies")


def test_h200_copies_older_than_their_source_are_named_in_the_readme():
    ec = _copies_module()
    text = (DOCS / "executed-h200" / "README.md").read_text()
    block = text[text.index(ec.BEGIN):text.index(ec.END) + len(ec.END)]
    assert block == ec.render(ec.status()), "re-render with: python tools/executed_copies.py --render"


def test_an_edited_notebook_makes_its_copy_older(tmp_path):
    ec = _copies_module()
    (tmp_path / "notebooks").mkdir()
    src = ROOT / "notebooks" / "00_start_here.ipynb"
    nb = json.loads(src.read_text())
    (tmp_path / "notebooks" / src.name).write_text(json.dumps(nb))
    copies = tmp_path / "copies"
    copies.mkdir()
    (copies / f"notebooks__{src.name}").write_text(json.dumps(nb))
    assert ec.status(tmp_path, copies)[0]["in_step"]
    nb["cells"][-1]["source"] = "print('edited after the run')"
    (tmp_path / "notebooks" / src.name).write_text(json.dumps(nb))
    row = ec.status(tmp_path, copies)[0]
    assert not row["in_step"] and row["cells_not_in_copy"] == 1
    assert "older than its source" in ec.render([row])
