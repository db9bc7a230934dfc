import pytest

from hwlab.diagnosis import flowchart as F


@pytest.mark.parametrize("ev,leaf,path", [
    ({"slowdown_vs_floor": 3.0, "dram_pct_estimated": 85.0}, "G", ["B", "F", "G"]),
    ({"slowdown_vs_floor": 6.0, "dram_pct_estimated": 5.0, "sector_amplification": 8.0}, "G", ["B", "F", "G"]),
    ({"slowdown_vs_floor": 4.0, "dram_pct_of_peak": 10.0, "tensor_pct_of_peak": 12.0}, "I", ["B", "F", "H", "I"]),
    ({"slowdown_vs_floor": 4.0, "dram_pct_of_peak": 10.0, "tensor_pct_of_peak": 70.0}, "J", ["B", "F", "H", "J"]),
    ({"slowdown_vs_floor": 1.1, "e2e_slowdown": 1.4, "rank_tail_pct": 25.0}, "L", ["B", "D", "K", "L"]),
    ({"slowdown_vs_floor": 1.1, "e2e_slowdown": 1.4, "rank_tail_pct": 2.0}, "M", ["B", "D", "K", "M"]),
    ({"slowdown_vs_floor": 1.1, "e2e_slowdown": 1.0}, "OK", ["B", "D", "OK"]),
    ({"slowdown_vs_floor": 5.4, "dram_pct_estimated": 3.0, "tensor_pct_of_peak": 18.0, "n_spills": 174}, "J", ["B", "F", "H", "J"]),
    ({"slowdown_vs_floor": 40.0, "dram_pct_estimated": 1.0, "launch_gap_pct": 80.0}, "J", ["B", "F", "H", "J"]),
    ({"slowdown_vs_floor": 5.4, "dram_pct_estimated": 3.0, "tensor_pct_of_peak": 18.0, "n_spills": 0}, "I", ["B", "F", "H", "I"]),
    ({"single_gpu_slow": False, "multi_gpu_or_service_slow": True, "rank_tail": True}, "L", ["B", "D", "K", "L"]),
])
def test_each_leaf(ev, leaf, path):
    d = F.diagnose(ev)
    assert d.leaf_id == leaf and d.path == path
    assert all(s.reason for s in d.steps)


def test_counted_metric_can_say_yes_when_estimate_says_no():
    d = F.diagnose({"slowdown_vs_floor": 2.0, "dram_pct_estimated": 40.0, "dram_pct_of_peak": 75.0})
    assert d.leaf_id == "G" and d.steps[1].metric == "dram_pct_of_peak"


def test_cannot_decide_names_the_probe():
    d = F.diagnose({})
    assert d.leaf is None and d.undecided.id == "B"
    assert "cannot decide at B" in d.explain() and "slowdown_vs_floor" in d.explain()
    d = F.diagnose({"slowdown_vs_floor": 2.0})
    assert d.undecided.id == "F" and "ncu" in d.explain()


def test_mermaid_highlights_path():
    d = F.diagnose({"slowdown_vs_floor": 3.0, "dram_pct_estimated": 85.0})
    src = d.mermaid()
    assert src.startswith("flowchart TD") and "class B,F,G hit" in src
    for q in F.QUESTIONS.values():
        assert q.yes in F.QUESTIONS or q.yes in F.LEAVES
        assert q.no in F.QUESTIONS or q.no in F.LEAVES


def test_evidence_from_measurement_floor():
    from hwlab.core.measure import Measurement
    m = Measurement(name="k", t_ms=3.0, t_p10_ms=3.0, t_p90_ms=3.0, n_bytes=3 * 10**9,
                    n_flops=0, device="d", timer="t", n_rep=1)
    ev = F.evidence_from_measurement(m, ceiling_gbps=3000.0, bytes_moved=9 * 10**9)
    assert ev["slowdown_vs_floor"] == pytest.approx(3.0)     # floor 1 ms
    assert ev["dram_pct_estimated"] == pytest.approx(100.0)  # 9 GB in 3 ms = 3000 GB/s


def test_by_hand_answers_are_labelled_and_measured_ones_name_their_source():
    d = F.diagnose({"single_gpu_slow": False, "e2e_slowdown": 2.0, "rank_tail_pct": 40.0, "n_ranks": 6,
                    "metric_sources": {"e2e_slowdown": "TP step vs one-GPU prediction"}})
    assert d.leaf_id == "L" and not d.fully_measured
    assert [s.question for s in d.by_hand] == ["B"] and d.steps[0].how == F.BY_HAND
    assert [s.how for s in d.steps[1:]] == [F.MEASURED, F.MEASURED]
    text = d.explain()
    lines = text.splitlines()
    assert "BY HAND" in lines[0] and "BY HAND" not in lines[1]
    assert "[measured: TP step vs one-GPU prediction]" in lines[1]
    assert "over 6 ranks" in lines[2]
    assert "NOTE: answered by hand, not measured, at B (single_gpu_slow)" in text
    assert d.measured() == {"e2e_slowdown": 2.0, "rank_tail_pct": 40.0}
    assert F.by_hand_keys({"single_gpu_slow": False, "rank_tail": True}) == ["single_gpu_slow", "rank_tail"]


def test_fully_measured_walk_says_so_and_one_rank_has_no_rank_tail_to_ask():
    d = F.diagnose({"slowdown_vs_floor": 1.1, "e2e_slowdown": 1.4, "rank_tail_pct": 40.0, "n_ranks": 1})
    assert d.leaf_id == "M" and d.fully_measured and d.by_hand == []  # a one-process "tail" never reaches L
    k = d.steps[2]
    assert k.question == "K" and k.answer == "not applicable" and k.metric == "n_ranks"
    assert "BY HAND" not in d.explain()
    d = F.diagnose({"slowdown_vs_floor": 1.1, "e2e_slowdown": 1.4, "rank_tail_pct": 40.0, "n_ranks": 2})
    assert d.leaf_id == "L" and "over 2 ranks]" in d.explain()  # two ranks: K is asked
    d = F.diagnose({"slowdown_vs_floor": 1.1, "e2e_slowdown": 1.4, "rank_tail_pct": 0.0, "n_ranks": 1})
    assert d.explain().endswith("every answer on this walk was measured")
    # numeric evidence wins over a by-hand answer given beside it
    d = F.diagnose({"slowdown_vs_floor": 1.1, "single_gpu_slow": True, "e2e_slowdown": 1.0})
    assert d.path == ["B", "D", "OK"] and d.fully_measured
    assert not F.diagnose({"slowdown_vs_floor": 2.0}).fully_measured  # undecided: no leaf
