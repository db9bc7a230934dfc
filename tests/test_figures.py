"""Every run figure marked in README.md and docs/*.md is the one its record renders to
(tools/render_figures.py); a stale or unknown span is reported."""
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("render_figures", ROOT / "tools" / "render_figures.py")
rf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rf)


def test_every_marked_figure_matches_its_record():
    assert rf.stale() == []


def test_every_figure_is_shown_somewhere():
    used = {m.group(1) for p in rf.docs() for m in rf.SPAN.finditer(p.read_text())}
    assert set(rf.FIGURES) <= used


def test_a_typed_edit_or_an_unknown_name_is_reported(tmp_path):
    text = (ROOT / "README.md").read_text()
    m = next(m for m in rf.SPAN.finditer(text) if m.group(1) == "h200.scenarios")
    typed = text[:m.start(2)] + re.sub(r"(\d+\.\d+)x slower", "1.44x slower", m.group(2)) + text[m.end(2):]
    (tmp_path / "a.md").write_text(typed + "\n<!-- fig:no.such -->3x<!-- /fig -->\n")
    got = rf.stale([tmp_path / "a.md"])
    assert any("fig:h200.scenarios is stale" in x and "1.44x" in x for x in got), got
    assert any("no figure named 'no.such'" in x for x in got), got
    assert len(got) == 2


def test_an_out_of_range_share_is_named_invalid():
    """The overlap share is shown with the library's range verdict, not as evidence."""
    assert "not a valid share" in rf._share(140.0, [130.0, 150.0])
    assert rf._share(54.0, [37.0, 65.0]) == "54%"
