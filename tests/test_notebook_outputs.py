"""What the notebooks print, read from a real execution (tools/nbwatch.py), on whatever this machine
is (CPU or GPU): gains said one way, every walk on one line unless asked, one figure per quantity,
readings rounded for a reader, and output short enough to read.

Each property is checked on the outputs of the run, never on the notebook's typed text: the figures
the assertions compare come from the same run (or the record the notebook reads)."""
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("nbclient", reason="nbclient missing: pip install -e '.[dev,lab]'")
import nbformat  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from nbwatch import execute_notebook  # noqa: E402  (tools/ is not a package)

CHECKPOINT_ANSWERS = ROOT / "solutions" / "checkpoints.json"

#: a signed figure beside a word that already gives its direction: "-2.5% faster", "+3% slower", "+0% more"
DOUBLE_SIGN = re.compile(r"[-+−]\d+(?:\.\d+)?\s?% (?:faster|slower|less|more)\b")
#: a walk printed step by step (Diagnosis.explain): "B. Slow even in ...? -> YES (...)"
MULTI_LINE_STEP = re.compile(r"^\s*[A-Z]{1,2}\. [^\n]*\? -> (?:YES|NO|NOT APPLICABLE|takes the NO branch)", re.M)
#: the lines a whole walk adds after its steps (leaf and actions, lenses, borderline and provenance notes)
WALK_TAIL = re.compile(r"^\s*(?:=> [A-Z]{1,2}: |OVERLAP: |FEWER BYTES: |BORDERLINE at |every answer on this walk)", re.M)
#: an instructor reads notebook 06 in one sitting: each of its four cases (two incidents, two leaves)
#: fits about one screen, some 400 words, so 1,600 for the notebook; its walks whole and its records
#: whole stay one toggle away (DETAILS). Before walks went to one line it printed about 3,960 words.
CASE_STUDIES_MAX_WORDS = 1600


def _texts(nb) -> list[str]:
    out = []
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        for o in c.get("outputs", []):
            if o.get("name") == "stderr":
                continue
            data = o.get("data", {})
            out.append(o.get("text") or data.get("text/markdown") or data.get("text/plain", ""))
    return out


_CACHE: dict[str, str] = {}


def _run(name: str) -> str:
    """Execute notebooks/NAME.ipynb once per session (the solutions' checkpoint answers filled in,
    as CI and the executed copies run it) and return its outputs' text."""
    if name not in _CACHE:
        path = ROOT / "notebooks" / f"{name}.ipynb"
        nb = execute_notebook(path, cwd=path.parent, env={"HWLAB_CHECKPOINT_ANSWERS": str(CHECKPOINT_ANSWERS)})
        _CACHE[name] = "\n".join(_texts(nb))
    return _CACHE[name]


LABS = ["03_cross_link_tp", "04_fp8_dequant_fallback", "05_node_baseline", "06_case_studies", "07_drills",
        "08_examine"]


@pytest.mark.slow
@pytest.mark.parametrize("name", LABS)
def test_gains_are_signed_one_way_and_walks_are_one_line(name):
    out = _run(name)
    assert "Traceback" not in out
    assert not DOUBLE_SIGN.findall(out), DOUBLE_SIGN.findall(out)
    assert not MULTI_LINE_STEP.findall(out), MULTI_LINE_STEP.findall(out)[:3]
    assert not WALK_TAIL.findall(out), WALK_TAIL.findall(out)[:3]


@pytest.mark.slow
def test_03_prints_one_rank_tail_figure_the_walks_k_reads():
    out = _run("03_cross_link_tp")
    assert "over the others" not in out
    # section 2 prints each mapping's tail; the evidence table beside the checkpoint is what K reads
    shown = {m.group(1): float(m.group(2)) for m in re.finditer(
        r"^(naive|aware): tail ranks \[[\d, ]*\], rank tail ([\d.]+)% of the step", out, re.M)}
    table = re.search(r"^\s+rank_tail_pct\s+([\d.e+]+)\s", out, re.M)
    assert set(shown) == {"naive", "aware"} and table
    assert shown["naive"] == pytest.approx(float(table.group(1)), rel=5e-3, abs=0.05)
    assert not re.search(r";\s*$", out, re.M), "a line ends on a dangling '; ' (a list joined onto nothing)"
    # where section 2's walk is shown (its source is the one section 2 printed), its K step carries the same figure
    src = re.search(r"^throughput naive / aware: [^\n]*  \[(.*)\]$", out, re.M).group(1)
    k = re.search(r"^naive \[" + re.escape(src) + r"\]: [^\n]*K (?:YES|NO) ([\d.]+)%", out, re.M)
    if k:
        assert float(k.group(1)) == pytest.approx(shown["naive"], rel=5e-3, abs=0.05)


@pytest.mark.slow
def test_04_states_the_records_gains_one_way():
    from hwlab.core import evidence
    from hwlab.core.gains import faster, less_more
    from hwlab.labs import fp8

    out = _run("04_fp8_dequant_fallback")
    sig = fp8.seed_signature(evidence.recorded("lab04_fp8").extra["run"])
    import torch
    if not torch.cuda.is_available():  # on a CPU the figures are the H200 record's
        assert f"({faster(sig['gain_p50_pct'])})" in out and f"({faster(sig['gain_p99_pct'])})" in out
        assert f"holds {less_more(sig['memory_change_pct'])} weight memory" in out


@pytest.mark.slow
def test_05_says_each_deviation_in_one_direction():
    out = _run("05_node_baseline")
    dev = [ln for ln in out.splitlines() if ln.startswith("[hardware] hbm_copy")]
    assert dev, "the injected hardware deviation is shown"
    for ln in dev:
        assert "down" in ln and "drop >" not in ln and "rise +" not in ln
    # this machine against the H200: a different machine's long list of differences is shortened with
    # a count, never cut mid-word, so the verdict's advice is still printed
    for ln in out.splitlines():
        if ln.startswith("NOT COMPARABLE"):
            # the advice, whole: record both alike, and after an upgrade compare the job's own traces
            assert "(record both with or both without --quick)." in ln, ln[-300:]
            assert ln.endswith("set their parts side by side"), ln[-200:]


@pytest.mark.slow
def test_06_output_is_short_enough_to_read():
    out = _run("06_case_studies")
    assert len(out.split()) < CASE_STUDIES_MAX_WORDS


@pytest.mark.slow
def test_07_rounds_the_drills_readings_for_display():
    out = _run("07_drills")
    block = out.split("what the probes show", 1)[1].split("\n\n", 1)[0]
    values = re.findall(r"^  \w+ = (\S+)", block, re.M)
    assert values
    for v in values:  # a fraction carries at most three significant digits; whole numbers stay whole
        if re.fullmatch(r"-?\d+", v) or not v.lstrip("-")[:1].isdigit():
            continue
        digits = re.sub(r"e[-+]\d+$", "", v).lstrip("-").replace(".", "").lstrip("0")
        assert len(digits) <= 3, v


@pytest.mark.slow
def test_08_says_of_each_live_walk_what_it_printed():
    out = _run("08_examine")
    walk = re.search(r"^walk: .* -> (\?|[A-Z]{1,2})(?: at ([A-Z]))?", out, re.M)
    said = re.search(r"the walk (?:lands on|stops at) \*\*([A-Z?]{1,2})\*\*", out)
    assert walk and said
    assert said.group(1) == (walk.group(2) if walk.group(1) == "?" else walk.group(1))
    # the model's whole-function walk: a leaf, or where it stopped undecided, said as such
    whole = re.search(r"the whole-function walk (lands on \*\*[A-Z]{1,2}\*\*|stops undecided at \*\*[A-Z]\*\* "
                      r"\(`[^`]*\? at [A-Z][^`]*`\)|reaches no leaf)", out)
    assert whole and "**no leaf**" not in out
