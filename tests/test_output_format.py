"""How results are said: gains one way (hwlab.core.gains), the rank tail as one figure (K's), the
overlap lens in a few words for a one-line walk, and where a walk leaves a predicted leaf's path.
Checked on the library's own figures and the recorded runs the notebooks read."""
import pytest

from hwlab.core import evidence
from hwlab.core.gains import faster, faster_from_change, less_more
from hwlab.diagnosis import flowchart
from hwlab.diagnosis.flowchart_checks import OVERLAP_DID_ITS_PART_PCT, overlap_lens, overlap_verdict
from hwlab.examine.report_text import against_prediction
from hwlab.labs import crosslink


@pytest.mark.parametrize("pct,digits,text", [
    (2.43, 1, "2.4% faster"), (-2.46, 1, "2.5% slower"), (-0.04, 1, "0.0% faster"), (-0.4, 0, "0% faster"),
    (19.07, 0, "19% faster"), (-3.0, 0, "3% slower")])
def test_a_gain_is_said_by_its_word_never_by_a_sign(pct, digits, text):
    assert faster(pct, digits) == text
    assert faster_from_change(-pct, digits) == text


@pytest.mark.parametrize("pct,text", [(-34.297, "34.3% less"), (1.2, "1.2% more"), (-0.01, "0.0% more")])
def test_a_size_change_is_less_or_more(pct, text):
    assert less_more(pct) == text


def _slowlink():
    return evidence.recorded("lab03_slowlink", "cpu").extra["experiment"]


def _calibrated():
    return evidence.recorded("lab03_linksweep", "cpu").extra["calibrated"]


def test_the_rank_tail_of_a_recorded_report_is_the_walks_k_figure():
    for case in (_slowlink(), _calibrated()):
        for name in ("naive", "aware"):
            ev = case[name]["flowchart_evidence"]
            assert crosslink.rank_tail_pct(case[name]["report"]) == pytest.approx(ev["rank_tail_pct"])
            # the tail split's own % (over the on-time ranks' own time) is another, larger quantity
            if case[name]["report"]["tail_ranks"]:
                assert case[name]["report"]["tail_pct"] > ev["rank_tail_pct"]


def test_the_overlap_verdict_agrees_with_the_full_lens():
    for case in (_slowlink(), _calibrated()):
        for name in ("naive", "aware"):
            ev = case[name]["flowchart_evidence"]
            v, lens = overlap_verdict(ev), overlap_lens(ev)
            assert (v is None) == (not lens)
            if v is None:
                continue
            assert "\n" not in v
            if "INVALID" in lens[0]:
                assert "INVALID" in v
            elif ev["overlap_hidden_pct"] < OVERLAP_DID_ITS_PART_PCT:
                assert "did not really happen" in v and "did not really happen" in lens[-1]
            else:
                assert "did not really happen" not in v


def test_the_aware_note_follows_the_branch_its_walk_took():
    for case in (_slowlink(), _calibrated()):
        d = flowchart.diagnose(case["aware"]["flowchart_evidence"])
        note = crosslink.aware_walk_note(case, d)
        assert f"{case['speedup_aware_over_naive']:.2f}x" in note
        assert (f"reaches {d.leaf_id}" in note) or (f"lands on {d.leaf_id}" in note) or d.leaf_id not in ("OK", "L", "M")
        assert ("BORDERLINE" in note) == any(s.question == "D" for s in d.borderline)
    # a walk that crosses D with no tail lands on M, and the note says what is left is the all-reduce
    case = _calibrated()
    ev = {**case["aware"]["flowchart_evidence"], "e2e_slowdown": 1.33}
    ev["metric_spreads"] = {k: v for k, v in ev["metric_spreads"].items() if k != "e2e_slowdown"}
    d = flowchart.diagnose(ev)
    assert d.leaf_id == "M"
    note = crosslink.aware_walk_note({**case, "aware": {**case["aware"], "flowchart_evidence": ev}}, d)
    assert "lands on M" in note and "TP all-reduce itself" in note and "1.33x" in note


def test_against_prediction_names_where_the_walk_left_the_path():
    ex = evidence.recorded("examine", "h200").extra["entries"]
    by = {e["name"]: flowchart.diagnose(e["evidence"]) for e in ex}
    assert "as predicted" in against_prediction(by["unfused_chain"], "G")
    said = against_prediction(by["gemm_fp32"], "G")  # B YES, then F NO: it leaves G's path at F
    assert "**I**" in said and "at F, answered NO" in said
    ok = against_prediction(by["gemm_bf16"], "G")  # B NO: it leaves at B
    assert "at B, answered NO" in ok
    undecided = flowchart.diagnose({"slowdown_vs_floor": 1.0, "e2e_slowdown": 2.0})
    assert undecided.leaf_id is None and "stops at **K**" in against_prediction(undecided, "G")
