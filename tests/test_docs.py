"""The instructor and learner pack: run times come from the recorded notebook-times file (never typed),
the glossary pairs terms with the seed's own Chinese, commands and files the docs name exist, README links."""
import glob
import importlib.util
import json
import re
from pathlib import Path

import pytest

from hwlab.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACK = ["LEARNING_PATH.md", "INSTRUCTOR.md", "RUNBOOK.md", "GLOSSARY.md"]
SEED = sorted(glob.glob("/work/shared/seed/*.txt"))


def _bench_module(name: str):
    """A script under benchmarks/ (not a package) loaded as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
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
    assert block == nt.render(times), "re-render with: python benchmarks/notebook_times.py --render"
    # H200 figures are the executed copies' own (latest run wins), CPU figures a real run's summary
    assert times["h200"]["runs"] == nt.h200_times(), "run: python benchmarks/notebook_times.py --refresh-h200"
    assert times["cpu"]["runs"] and all(r["seconds"] > 0 for r in times["cpu"]["runs"].values())
    lab_nbs = [f"notebooks/{p.name}" for p in sorted((ROOT / "notebooks").glob("*.ipynb"))]
    new = set(lab_nbs) - set(times["cpu"]["runs"])
    assert not new and set(lab_nbs) <= set(times["notebooks"]), \
        f"{sorted(new)} never timed on a CPU: see benchmarks/notebook_times.py (--merge)"
    for nb in lab_nbs:
        assert f"| `{nb}` |" in block


TIME_RE = re.compile(r"~?\b\d+(?:\.\d+)?\s?(?:s|sec|secs|seconds|min|mins|minutes|h|hours)\b")


@pytest.mark.parametrize("name", PACK)
def test_no_hand_typed_run_times_outside_the_generated_table(name):
    nt = _times_module()
    text = (DOCS / name).read_text()
    if nt.BEGIN in text:
        text = text[:text.index(nt.BEGIN)] + text[text.index(nt.END):]
    assert not TIME_RE.findall(text), f"{name}: times belong in the generated table (docs/notebook_times.json)"


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


def _glossary_rows():
    rows = []
    for line in (DOCS / "GLOSSARY.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 3 and cells[0] != "term" and not set(cells[0]) <= set("-"):
            rows.append(cells)
    return rows


CJK = re.compile(r"[\u4e00-\u9fff]")
#: the seed's flowchart labels and incident-record fields, as the seed writes them
SEED_LABELS = ["性能异常", "单卡 microbenchmark 也慢吗？", "多卡或服务态才慢吗？", "DRAM 吞吐接近上限？",
               "Tensor Core 利用率低？", "rank 间拖尾？", "带宽 / layout / fusion", "tile、dtype、MMA 路径",
               "launch、occupancy、寄存器", "NCCL / NVLink / NUMA / rank mapping", "shape bucket / cache / fallback",
               "机器与拓扑", "症状范围", "关键证据", "修复动作", "复验方式", "节点健康基线"]


def test_glossary_pairs_each_term_with_the_seeds_chinese():
    rows = _glossary_rows()
    assert len(rows) >= 40
    seed_col = [r[1] for r in rows]
    for label in SEED_LABELS:
        assert label in seed_col, f"the glossary lacks the seed's {label!r}"
    assert sum(bool(CJK.search(c)) for c in seed_col) >= 0.6 * len(rows)
    assert all(r[0] and r[1] and r[2] for r in rows)


@pytest.mark.skipif(not SEED, reason="the seed text is not on this machine (/work/shared/seed)")
def test_glossary_chinese_is_verbatim_from_the_seed():
    seed = "".join(Path(p).read_text() for p in SEED)
    missing = [r[1] for r in _glossary_rows() if r[1] not in seed]
    assert not missing, f"not in the seed verbatim: {missing}"


def _copies_module():
    return _bench_module("executed_copies")


def test_h200_copies_older_than_their_source_are_named_in_the_readme():
    ec = _copies_module()
    text = (DOCS / "executed-h200" / "README.md").read_text()
    block = text[text.index(ec.BEGIN):text.index(ec.END) + len(ec.END)]
    assert block == ec.render(ec.status()), "re-render with: python benchmarks/executed_copies.py --render"


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
