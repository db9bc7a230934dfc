"""Nothing a learner reads before a checkpoint names the leaf a lab lands on (issue 60, item 1): the
``hwlab flowchart`` command describes each leaf by its cause and fix, and the README, the learner's docs
and the glossary state no lab-to-leaf fact. A lab's own results live on ``docs/EVIDENCE.md``, read after
its checkpoint; ``docs/INSTRUCTOR.md`` is the instructor's."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hwlab.cli import main
from hwlab.diagnosis import flowchart, leaf_causes

ROOT = Path(__file__).resolve().parents[1]
#: pages a learner reaches after a lab (its recorded results) or that are the instructor's
AFTER_THE_LAB = {"EVIDENCE.md", "INSTRUCTOR.md"}
LEAF_IDS = "|".join(sorted(flowchart.LEAVES, key=len, reverse=True))
#: a leaf named as where something lands: "leaf G", "→ I", "-> J", "lands on **M**"
LEAF_NAMED = re.compile(rf"(\bleaf\s+|(?:→|(?<!-)->)\s*|\blands?\s+on\s+)\**({LEAF_IDS})\**(?![\w])")
#: a lab, a lab's notebook or exercise, or one of the kit's scenarios
LAB_NAMED = re.compile(r"\bLab \d|\blab\s*0\d|\b0\d_[a-z]|notebooks?/?\s*0\d|\bexercise|\bscenario|"
                       r"\bcase stud|\bunfused_chain|\bgemm_fp32|\bgemm_misaligned|\btiny_kernels|\btriton_spill",
                       re.I)


def lab_to_leaf(text: str) -> list[str]:
    """Lines (or table rows) that name a lab and a leaf it lands on, or a walk into a leaf."""
    out = []
    for line in text.splitlines():
        if LEAF_NAMED.search(line) and LAB_NAMED.search(line):
            out.append(line.strip()[:160])
        elif re.search(rf"\bB\s*(→|->)\s*[A-Z]+(\s*(→|->)\s*[A-Z]+)*\s*(→|->)\s*\**({LEAF_IDS})\b", line):
            out.append(line.strip()[:160])
    return out


def _learner_pages() -> list[Path]:
    return [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").glob("*.md")) if p.name not in AFTER_THE_LAB)]


@pytest.mark.parametrize("page", _learner_pages(), ids=lambda p: p.name)
def test_no_learner_page_says_which_lab_lands_on_which_leaf(page):
    assert lab_to_leaf(page.read_text(encoding="utf-8")) == []


def test_the_scan_finds_a_lab_to_leaf_statement():
    for text in ("| launch, occupancy, registers | 寄存器 | leaf J (Lab 2) |",
                 "unfused_chain, shuffled_gather → G; gemm_fp32 → I",
                 "at 100 Mbit/s the naive mapping is the tail (walk B → D → K → L)",
                 "the mixed model's whole-function walk lands on **I** (notebook 08)"):
        assert lab_to_leaf(text), text
    assert lab_to_leaf("hwlab drill submit DRILL.json --leaf G") == []


def test_the_flowchart_command_gives_each_leaf_its_cause_and_fix_never_a_lab(capsys):
    assert main(["flowchart"]) == 0
    text = capsys.readouterr().out
    assert main(["flowchart", "--json"]) == 0
    chart = json.loads(capsys.readouterr().out)
    leaves_part = text.split("\nleaves:\n", 1)[1]
    assert not LAB_NAMED.search(leaves_part) and "lab" not in leaves_part.lower(), leaves_part
    for lf in chart["leaves"]:
        assert set(lf) == {"id", "title", "cause", "actions"}, lf
        assert lf["cause"] == leaf_causes.cause(lf["id"]) and lf["cause"], lf
        assert f"   cause: {lf['cause']}" in text and all(f"   fix: {a}" in text for a in lf["actions"])
        assert not LAB_NAMED.search(json.dumps(lf)), lf
    assert set(leaf_causes.CAUSES) == set(flowchart.LEAVES)


def test_the_glossary_describes_each_leaf_by_its_cause_not_a_lab():
    rows = [r for r in (ROOT / "docs" / "GLOSSARY.md").read_text(encoding="utf-8").splitlines()
            if LEAF_NAMED.search(r)]
    assert {LEAF_NAMED.search(r).group(2) for r in rows} >= set(flowchart.LEAVES) - {"OK"}
    assert [r for r in rows if LAB_NAMED.search(r)] == []


@pytest.mark.slow
def test_passing_shows_the_held_back_outputs_in_place_without_re_running_them(tmp_path):
    """In a real kernel: a blank checkpoint holds back a gated cell's print and plot and the walk; the next
    cell answers it right, and the earlier cells' outputs now show what they held, though they never ran
    again (the kernel updates their display in place)."""
    nbformat = pytest.importorskip("nbformat")
    import sys
    sys.path.insert(0, str(ROOT / "tools"))
    from nbwatch import execute_notebook

    setup = '''from hwlab import nb
from hwlab.core import evidence
from hwlab.diagnosis import flowchart
ev = evidence.recorded("lab03_slowlink", "cpu").extra["experiment"]["naive"]["flowchart_evidence"]
walk = flowchart.diagnose(ev)
s = walk.steps[-1]
CP = nb.checkpoint("t", nb.answer("t"), walk, ev)'''
    gated = '''import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
with nb.gated(CP, "the tail"):
    print("held figure @@" + s.metric)
    plt.plot([1, 2])'''
    right = '''CP = nb.checkpoint("t", nb.answer("t", walk.leaf_id, s.metric, float(s.value)), walk, ev)'''
    cells = [nbformat.v4.new_code_cell(c) for c in (setup, gated, "nb.walk(CP, 'naive')", right)]
    book = execute_notebook(nbformat.v4.new_notebook(cells=cells), cwd=tmp_path, drop_env=("HWLAB_CHECKPOINT_ANSWERS",))

    def shown(cell):
        return "\n".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") + o.get("data", {}).get("text/html", "")
                         for o in cell.get("outputs", []))
    assert "passed" in shown(book.cells[3])
    held, walk_out = shown(book.cells[1]), shown(book.cells[2])
    assert "held figure @@" in held and "data:image/png;base64" in held and "hidden" not in held, held
    assert "->" in walk_out and "hidden" not in walk_out, walk_out
    assert [c.execution_count for c in book.cells] == [1, 2, 3, 4]   # each cell ran once


@pytest.mark.slow
def test_a_working_copy_notebook_carries_what_its_kernel_reports_and_no_machine_path(tmp_path):
    """The copy's notebook metadata is what the kit's kernel reports on start (kernelspec and language_info),
    so opening it and starting the kernel changes nothing (it opens unmodified); the name shown carries no
    path of this machine."""
    from jupyter_client.manager import start_new_kernel

    from hwlab.cli import workcopy

    kernel = workcopy.kit_kernel() or {"name": "python3", "display_name": workcopy.KERNEL_DISPLAY_NAME,
                                       "language": "python"}
    meta = json.loads(workcopy.learner_version(ROOT / "notebooks" / "01_bandwidth_bound.ipynb", kernel))["metadata"]
    assert "/" not in meta["kernelspec"]["display_name"] and str(ROOT) not in json.dumps(meta)
    km, kc = start_new_kernel(kernel_name=kernel["name"])
    try:
        reply = kc.kernel_info(reply=True, timeout=60)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert meta["language_info"] == reply["content"]["language_info"]
    assert "jupytext" not in meta


# ---------------------------------------------------------------- a verdict that flips between blocks
def test_a_verdict_the_blocks_disagree_on_is_said_to_be_unsupported_here():
    """Notebook 08 says a live walk is not supported on this machine when the timing blocks' own walks
    reach different ends, and says nothing when they agree (blocks that did not walk it left out)."""
    from hwlab.examine.report_text import repeats_disagree

    assert repeats_disagree(["G", "G", "G"]) == "" and repeats_disagree(["G", None, "G"]) == ""
    said = repeats_disagree(["G", "J", "G"], "the chain")
    assert "Not supported on this machine" in said and "G, J, G" in said and "the chain" in said
    assert "undecided at D" in repeats_disagree(["G", "undecided at D", None])


def test_an_examination_keeps_each_blocks_walk_of_the_whole_function():
    """What the notebook renders the flip from: one end per timing block, and every end other than the
    pooled walk's is among the whole function's alternatives (so a flip is also BORDERLINE)."""
    import torch

    import hwlab
    from hwlab.core import ceilings
    from hwlab.examine.repeats import N_REPEATS, leaf_name

    ex = hwlab.examine(lambda v: (v * 3).sin() + 1, torch.randn(4096), ceilings=ceilings.measure("cpu", quick=True))
    assert len(ex.whole_repeat_leaves) == N_REPEATS
    d = ex.diagnosis
    mine = leaf_name(d.leaf_id, d.undecided.id if d.undecided else None)
    assert set(x for x in ex.whole_repeat_leaves if x) - {mine} <= set(ex.whole_alternatives)
