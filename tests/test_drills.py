import json
import subprocess
import sys

import pytest

from hwlab import drills as D
from hwlab import flowchart


@pytest.mark.parametrize("name", list(D.FAULTS))
def test_every_fault_lands_on_its_leaf_and_its_fix_leaves_it(name):
    f = D.FAULTS[name]
    obs, src = f.observe()
    assert flowchart.diagnose(obs).leaf_id == f.leaf, (name, flowchart.diagnose(obs).explain())
    fixed, _ = f.fixed()
    assert flowchart.diagnose(fixed).leaf_id == "OK" or f.leaf == "OK"
    assert src.startswith(("recorded on", "measured live on"))


def test_no_fault_is_not_misdiagnosed():
    d = D.new(seed=5, fault="none")
    assert flowchart.diagnose(d.observations).leaf_id == "OK"
    assert D.grade(d, "OK").passed
    g = D.grade(d, "G")
    assert not g.passed and "says NO" in g.explanation


def test_sealed_and_reproducible():
    a, b = D.new(seed=42), D.new(seed=42)
    assert a.sealed == b.sealed and D.reveal(a) == D.reveal(b)
    raw = json.dumps(a.__dict__)
    fault = D.reveal(a)["fault"]
    assert f'"{fault}"' not in raw  # the fault is not stored by name
    assert D.new(seed=43, fault="strided_layout").fault().name == "strided_layout"
    with pytest.raises(ValueError, match="unknown fault"):
        D.new(fault="cosmic_rays")


def test_wrong_answer_says_why():
    d = D.new(seed=1, fault="oversized_tile")
    g = D.grade(d, "I")
    assert not g.correct_leaf and not g.passed
    assert "at H" in g.explanation and "n_spills" in g.explanation
    right = D.grade(d, "J")
    assert right.passed and right.fix_removes_slowdown is True


def test_evidence_must_match_the_probes():
    d = D.new(seed=1, fault="unfused_chain")
    forged = dict(d.observations, slowdown_vs_floor=1.0)
    g = D.grade(d, "G", forged)
    assert g.correct_leaf and not g.evidence_supports and "differs" in g.explanation
    g = D.grade(d, "G", dict(d.observations, rank_tail_pct=50.0))
    assert not g.evidence_supports and "did not show" in g.explanation
    with pytest.raises(ValueError, match="leaf must be one of"):
        D.grade(d, "Z")


def test_class_summary():
    d = D.new(seed=9, fault="slow_link_rank")
    gs = [D.grade(d, "L", learner="ana"), D.grade(d, "M", learner="bo"), D.grade(d, "J", learner="bo")]
    s = D.class_summary(gs)
    assert s["learners"]["ana"]["passed"] == 1 and s["learners"]["bo"]["wrong_leaves"] == ["M", "J"]
    assert s["wrong_leaf_counts"] == {"M": 1, "J": 1}


def test_cli_round_trip(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "hwlab.cli", "drill", *a, "--dir", str(tmp_path)],  # noqa: E731
                                    capture_output=True, text=True)
    r = run("new", "--seed", "3", "--fault", "dtype_mma_miss")
    assert r.returncode == 0 and "GEMM-heavy" in r.stdout
    p = next(tmp_path.glob("drill-*.json"))
    assert run("submit", str(p), "--leaf", "I", "--learner", "ana").returncode == 0
    assert run("submit", str(p), "--leaf", "G", "--learner", "bo").returncode == 1
    s = json.loads(run("summary").stdout)
    assert s["n"] == 2 and s["wrong_leaf_counts"] == {"G": 1}
    assert json.loads(run("reveal", str(p)).stdout)["leaf"] == "I"


def test_one_drill_per_fault_ran_on_the_h200():
    """recorded/h200/drills.json: the refresh script drew one drill per fault on the H200
    (live where one GPU reproduces the fault), graded the right answer (fix applied and
    re-measured there) and a wrong one. Re-derived here with this version's flowchart."""
    from hwlab import flowchart
    from hwlab.evidence import recorded

    ev = recorded("drills")
    assert ev.device == "NVIDIA H200"
    rows = {r["fault"]: r for r in ev.extra["drills"]}
    assert set(rows) == set(D.FAULTS)
    for name, r in rows.items():
        drill = D.Drill(**r["drill"])
        assert drill.fault().name == name  # the seal opens to this fault
        assert flowchart.diagnose(drill.observations).leaf_id == D.FAULTS[name].leaf
        assert r["right"]["correct_leaf"] and r["right"]["evidence_supports"]
        if D.FAULTS[name].leaf != "OK":  # the fix, re-measured on the H200, leaves the leaf
            assert r["right"]["fix_removes_slowdown"] is True
            assert flowchart.diagnose(r["right"]["fix_evidence"]).leaf_id != D.FAULTS[name].leaf
        assert not r["wrong"]["correct_leaf"] and " is not it: " in r["wrong"]["explanation"]
        # live unless the fault has no one-GPU form (the slow-link rank needs several ranks/links)
        assert drill.live == (name != "slow_link_rank"), name
