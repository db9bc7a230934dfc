"""No measured figure is typed into a notebook's markdown: it is rendered from the run or the record.

A typed figure is a number carrying a unit of time, size, rate or work (``3.2 ms``, ``4.8 TB/s``,
``0.5 FLOP/byte``), a ratio (``4.1x``) or a percentage (``-35%``). Typed, such a number drifts from
the output under it the next time the cell runs; rendered (``display(Markdown(f"..."))`` from the
result or the recorded evidence) it cannot. Markdown may still state an expectation before a
measurement, in a paragraph that starts with ``**Prediction:**``, and explain a gap in words.

The check reads the jupytext ``.py`` twin of every notebook, exercise and solution (markdown cells
are the ``# %% [markdown]`` ones); it does not execute anything.
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("notebooks", "exercises", "solutions") for p in (ROOT / d).glob("*.py"))

#: units that make a number a figure: time, size, rate and work, plus "x" and "%". "x"/"×" must
#: touch the number (``4.1x``) so a product written with spaces (``64 × 512``) is not a ratio.
UNITS = (r"TFLOP/s|GFLOP/s|PFLOP/s|TFLOPS|GFLOPS|FLOP/byte|FLOP/B|FLOPs?|GB/s|TB/s|MB/s|GiB/s|Gbit/s|Mbit/s|"
         r"GiB|MiB|KiB|GB|TB|MB|KB|bytes?|ms|us|µs|ns|s|min|W|GHz|MHz")
#: a number starts a token: ``fp8``, ``bf16``, ``H200``, ``sm_90`` and ``v1.2`` hold digits inside a
#: word, so they are names (dtypes, the GPU, an architecture, a version), not figures
FIGURE_RE = re.compile(r"(?<![\w.])[-+~≈−]?\d+(?:[.,]\d+)*(?:\s?(?:" + UNITS + r")(?![\w/])"
                       r"|[x×](?![\w/])|\s?%)")
#: the explicit allow-list of digit+unit tokens that are not figures, each with its reason
ALLOWED = {
    # none needed yet: add a token here only with the reason it is a name, not a measurement
}
PREDICTION = "**Prediction:**"

#: notebooks being rewritten on another branch (issue 36, item 2: notebook 04 and its exercise);
#: ``test_pending_rewrites_still_pending`` fails once they are clean, so the list cannot go stale
PENDING: set[str] = set()


def markdown_cells(text: str) -> list[list[tuple[int, str]]]:
    """The markdown cells of a jupytext percent script: per cell, (line number, text without '# ')."""
    cells, cur = [], None
    for no, line in enumerate(text.splitlines(), 1):
        if line.startswith("# %%"):
            if cur is not None:
                cells.append(cur)
            cur = [] if "[markdown]" in line else None
        elif cur is not None:
            cur.append((no, line[2:] if line.startswith("# ") else line.lstrip("#")))
    if cur is not None:
        cells.append(cur)
    return cells


def typed_figures(text: str) -> list[tuple[int, str]]:
    """(line, token) of each typed figure in the markdown of ``text``, outside prediction paragraphs.

    A paragraph is a run of non-blank lines; it is a prediction when its first line starts with
    ``**Prediction:**``."""
    found = []
    for cell in markdown_cells(text):
        first, in_prediction = True, False
        for no, line in cell:
            if not line.strip():
                first, in_prediction = True, False
                continue
            if first:
                in_prediction, first = line.lstrip().startswith(PREDICTION), False
            if in_prediction:
                continue
            found += [(no, m.group(0)) for m in FIGURE_RE.finditer(line) if m.group(0).strip() not in ALLOWED]
    return found


def _md(*paragraphs: str) -> str:
    body = "\n#\n".join("\n".join("# " + ln for ln in p.splitlines()) for p in paragraphs)
    return "# %%\nx = 1  # 3 ms in code is fine\n\n# %% [markdown]\n" + body + "\n\n# %%\nprint(x)\n"


@pytest.mark.parametrize("line,token", [
    ("The fused kernel runs 4.1x faster.", "4.1x"), ("a step of 3.20 ms", "3.20 ms"),
    ("memory −35%, TPOT -3%", "−35%"), ("at 4,800 GB/s", "4,800 GB/s"), ("near ~0.5 FLOP/byte", "~0.5 FLOP/byte"),
    ("91.3 TFLOP/s of bf16", "91.3 TFLOP/s"), ("the ridge (~180 FLOP/byte)", "~180 FLOP/byte"),
    ("a 32 MiB message", "32 MiB"), ("within 2 s", "2 s"), ("a 100 Mbit/s link", "100 Mbit/s"), ("**0.72x** after a swap", "0.72x"),
    ("52 bytes per element", "52 bytes"), ("takes ~4 min", "~4 min"), ("3×", "3×"),
])
def test_detector_finds_a_typed_figure(line, token):
    assert [t for _, t in typed_figures(_md(line))] [:1] == [token]


@pytest.mark.parametrize("line", [
    "fp8 and bf16 on an H200 (sm_90)", "Lab 1, leaf G, step 2", "a 64 × 512 tile on 128 threads",
    "**9N** elements cross DRAM", "the 2-byte lanes of a 32-byte sector", "the 8-GPU box", "hwlab v1.2",
])
def test_detector_leaves_names_and_counts_alone(line):
    assert typed_figures(_md(line)) == []


def test_only_a_prediction_paragraph_may_hold_a_figure():
    text = _md("**Prediction:** the fused one is ~3x faster,\nat about 4 TB/s.", "Measured: 4.1x.")
    assert [t for _, t in typed_figures(text)] == ["4.1x"]
    # the word "Prediction" elsewhere in a paragraph does not exempt it
    assert [t for _, t in typed_figures(_md("Measured 4.1x. **Prediction:** 3x"))] == ["4.1x", "3x"]


def test_code_cells_are_not_prose():
    assert typed_figures("# %%\nprint('4.1x in 3 ms')\n") == []


@pytest.mark.parametrize("path", [p for p in SOURCES if p.relative_to(ROOT).as_posix() not in PENDING],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_typed_figure_in_markdown(path):
    hits = typed_figures(path.read_text())
    assert not hits, (f"{path.relative_to(ROOT)}: typed figures in markdown "
                      f"{['line %d: %s' % h for h in hits]}: render them from the run or the record "
                      f"(display(Markdown(f'...'))), or state them in a '{PREDICTION}' paragraph")


def test_pending_rewrites_still_pending():
    for rel in PENDING:
        path = ROOT / rel
        if path.exists():
            assert typed_figures(path.read_text()), f"{rel} is clean now: drop it from PENDING"


def test_every_notebook_source_is_checked():
    assert {p.parent.name for p in SOURCES} == {"notebooks", "exercises", "solutions"}
    assert len(SOURCES) >= 12
