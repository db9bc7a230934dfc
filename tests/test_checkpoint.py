"""Checkpoints graded on the kit's real walks of recorded evidence (Labs 1-4, examine): the leaf, the
deciding metric, the value against the evidence's spread, the prediction band; wrong leaves answered with
the contradicting evidence, never the right leaf; blanks say "fill in"; the walk shown only after a pass;
answers kept in the class folder and counted per leaf and metric by `hwlab class summary`; the notebooks'
cell order (evidence, then the graded answer, then the walk); the one-line walk renderer."""
import json
import re
from pathlib import Path

import pytest

from hwlab import nb
from hwlab.core import evidence
from hwlab.course import checkpoint as C
from hwlab.diagnosis import flowchart
from hwlab.course import classroom, tries

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "solutions" / "checkpoints.json"


def _lab01():
    from hwlab.labs import bandwidth as lab

    r = flowchart.walk_cases(lab.result_from_evidence(evidence.recorded("lab01_bandwidth")))
    return r.evidence["unfused"], r.speedup("unfused", "fused")


def _lab02():
    ev = evidence.recorded("lab02_registers").extra["flowchart_evidence"]
    return ev[next(k for k, v in ev.items() if (v.get("n_spills") or 0) > 0)]


def _lab03(name="naive"):
    return evidence.recorded("lab03_slowlink", "cpu").extra["experiment"][name]["flowchart_evidence"]


def _lab04():
    from hwlab.labs import fp8

    rec = evidence.recorded("lab04_fp8")
    fe = fp8.flowchart_evidence(rec.extra["run"], rec.ceilings["copy_gbps"])
    return fe[min((k for k in fe if k.startswith("mixed")), key=lambda k: int(k.split()[2]))]


def _examine():
    return {e["name"]: e["evidence"] for e in evidence.load(evidence.RECORDED_DIR / "h200" / "examine.json").extra["entries"]}


def _cp(ev, step=None, prediction=None, cid="t"):
    return C.Checkpoint(cid, flowchart.diagnose(ev), ev, step=step, prediction=prediction)


def _right(cp, prediction=None):
    s = cp.asked()
    return C.Answer(cp.walk.leaf_id, s.metric, float(s.value), prediction)


@pytest.fixture(autouse=True)
def no_class_dir(monkeypatch):
    monkeypatch.delenv(classroom.ENV_DIR, raising=False)
    monkeypatch.setattr(tries, "_wrong", {})  # each test starts at its first try


# ---- the checker -------------------------------------------------------------------------------

def test_right_answer_passes_and_shows_the_walk_only_then():
    ev, speedup = _lab01()
    cp = _cp(ev, prediction=C.Prediction("fused speed-up", speedup, "x", band_pct=40))
    blank = C.check(cp, C.Answer())
    assert blank.status == C.FILL_IN and not blank.passed
    assert "walk hidden" in blank.walk() and "->" not in blank.walk()
    assert all(m.startswith("still blank") for m in blank.messages) and len(blank.messages) == 4
    ok = C.check(cp, _right(cp, prediction=speedup * 0.8))
    assert ok.passed, ok.messages
    assert ok.walk() == cp.walk.compact() and ok.walk(full=True) == cp.walk.explain()


def test_wrong_metric_is_refused_even_when_it_is_on_the_walk():
    cp = _cp(_lab02())                                  # B -> F -> H (spills override) -> J
    a = _right(cp)
    res = C.check(cp, C.Answer(a.leaf, "slowdown_vs_floor", cp.walk.steps[0].value))
    assert res.status == C.WRONG and "decides B, not H" in res.messages[0]
    res = C.check(cp, C.Answer(a.leaf, "tensor_pct_of_peak", cp.evidence["tensor_pct_of_peak"]))
    assert res.status == C.WRONG and "does not decide H" in res.messages[0]   # present, but the override decided
    res = C.check(cp, C.Answer(a.leaf, "sector_amplification", 1.0))
    assert res.status == C.WRONG and "not in this evidence" in res.messages[0]


def test_value_inside_the_spread_passes_outside_it_fails():
    cp = _cp(_lab03())                                  # K decided by rank_tail_pct with a measured spread
    s = cp.asked()
    assert s.question == "K" and s.spread is not None
    lo, hi = s.spread
    assert C.check(cp, C.Answer(cp.walk.leaf_id, s.metric, lo)).passed
    assert C.check(cp, C.Answer(cp.walk.leaf_id, s.metric, hi)).passed
    res = C.check(cp, C.Answer(cp.walk.leaf_id, s.metric, hi * 1.2))
    assert res.status == C.WRONG and "outside the reading's spread" in res.messages[0]
    # no spread recorded: the stated tolerance around the value
    cp1 = _cp(_lab01()[0])
    s1 = cp1.asked()
    assert s1.spread is None
    v = float(s1.value)
    assert C.check(cp1, C.Answer(cp1.walk.leaf_id, s1.metric, round(v))).passed
    assert not C.check(cp1, C.Answer(cp1.walk.leaf_id, s1.metric, v * (1 + 2 * C.VALUE_TOL_PCT / 100))).passed


def test_prediction_outside_its_band_fails_and_says_the_band():
    ev, speedup = _lab01()
    cp = _cp(ev, prediction=C.Prediction("fused speed-up", speedup, "x", band_pct=40))
    assert C.check(cp, _right(cp, prediction=speedup * 1.35)).passed
    res = C.check(cp, _right(cp, prediction=speedup * 1.5))
    assert res.status == C.WRONG and "outside the band" in res.messages[0] and "within 40%" in res.messages[0]
    exact = _cp(_lab02(), prediction=C.Prediction("blocks per SM", 1, band_abs=0))
    assert C.check(exact, _right(exact, prediction=1)).passed
    assert not C.check(exact, _right(exact, prediction=2)).passed


def test_asked_step_can_be_one_before_the_leaf():
    cp = _cp(_lab04(), step="D")
    s = cp.asked()
    assert s.question == "D" and s.metric == "e2e_slowdown"
    assert C.check(cp, _right(cp)).passed
    assert not C.check(cp, C.Answer(cp.walk.leaf_id, "rank_tail_pct", 0.0)).passed


def _walks():
    yield "lab01", _lab01()[0]
    yield "lab02", _lab02()
    yield "lab03 naive", _lab03()
    yield "lab04", _lab04()
    yield from _examine().items()


def test_a_wrong_leaf_is_answered_with_its_own_path_never_the_right_leaf():
    n = 0
    for name, ev in _walks():
        cp = _cp(ev)
        right = flowchart.LEAVES[cp.walk.leaf_id]
        s = cp.asked()
        for wrong in set(flowchart.LEAVES) - {right.id}:
            res = C.check(cp, C.Answer(wrong, s.metric, float(s.value)))
            assert res.status == C.WRONG, (name, wrong)
            text = "\n".join(res.messages)
            assert not re.search(rf"\b{re.escape(right.id)}\b", text), (name, wrong, text)
            assert right.title not in text, (name, wrong, text)
            # the learner's own path to their leaf, each question with the rows it reads, to re-check in
            # order: from their leaf alone, so the text is the same whichever leaf is right
            assert res.messages[0] == tries.recheck_own_path(wrong), (name, wrong, text)
            for path in tries.paths_to(wrong):
                for qid, branch in path:
                    assert f"{qid} ({flowchart.QUESTIONS[qid].text}) answered {branch}" in text, (qid, text)
            left = _ruled_out_at(cp, wrong)
            assert left.question in text and left.metric in text, (name, wrong, text)
            n += 1
    assert n >= 5 * 12


def _ruled_out_at(cp, leaf):
    """The step where a path to ``leaf`` leaves ``cp``'s walk, found by walking the chart here (the
    first step whose taken branch has no path to ``leaf`` below it)."""
    for s in cp.walk.steps:
        q = flowchart.QUESTIONS[s.question]
        if leaf not in classroom.leaves_under(q.yes if s.answer == "yes" and not s.overridden else q.no):
            return s
    raise AssertionError(f"{leaf} is on the walk")


def _number_forms(x: float) -> set[str]:
    """How a figure can be printed: the forms the kit's tables and messages use."""
    x = float(x)
    forms = {f"{x:.3g}", f"{x:.2f}", f"{x:.1f}", f"{x:g}"}
    return {f for f in forms if len(f.strip("-0.")) >= 2}  # "1" or "0.0" are in any text


def _leaks(text: str, *figures: float) -> list[str]:
    return [f for x in figures for f in _number_forms(x)
            if re.search(rf"(?<![\d.]){re.escape(f)}(?![\d])", text)]


def _checkpoints():
    """Every checkpoint of the notebooks, on the evidence it reads in CI (recorded), with its prediction."""
    ev1, speedup = _lab01()
    yield _cp(ev1, cid="01", prediction=C.Prediction("the fused kernel's speed-up", speedup, "x", band_pct=40))
    ev2 = _lab02()
    occ = next(c["occupancy"] for c in evidence.recorded("lab02_registers").extra["configs"]
               if c["report"]["config"] == next(k for k, v in evidence.recorded("lab02_registers")
                                                .extra["flowchart_evidence"].items() if v is ev2 or v == ev2))
    yield _cp(ev2, cid="02", prediction=C.Prediction("blocks per SM", occ["blocks_per_sm"], " block(s)/SM", band_abs=0))
    yield _cp(_lab03(), cid="03")
    yield _cp(_lab04(), step="D", cid="04")
    yield _cp(_examine()["gemm_fp32"], cid="08")


def test_wrong_answers_at_every_checkpoint_tell_neither_leaf_value_range_nor_measured_figure():
    """A wrong leaf, a wrong value and a wrong prediction at every notebook checkpoint: the feedback
    names none of the right leaf, the deciding value, the accepted range's ends nor the measured figure."""
    n = 0
    for cp in _checkpoints():
        s, right = cp.asked(), cp.walk.leaf_id
        lo, hi = C.value_bounds(s)
        secret = [float(s.value), lo, hi] + list(s.spread or ())
        p = cp.prediction
        good = _right(cp, prediction=p.actual if p else None)
        assert C.check(cp, good).passed, (cp.id, C.check(cp, good).messages)
        wrongs = [C.Answer(w, s.metric, float(s.value), good.prediction) for w in flowchart.LEAVES if w != right]
        wrongs += [C.Answer(right, s.metric, hi * 3 + 7, good.prediction),
                   C.Answer(right, s.metric, lo / 3 - 7, good.prediction)]
        if p:
            pl, ph = p.bounds()
            wrongs += [C.Answer(right, s.metric, float(s.value), ph * 2 + 3),
                       C.Answer(right, s.metric, float(s.value), pl / 2 - 3)]
            secret += [p.actual, pl, ph]
        for a in wrongs:
            res = C.check(cp, a, record=False)
            assert res.status == C.WRONG, (cp.id, a)
            text = str(res)
            assert not re.search(rf"\b{right}\b", text), (cp.id, a, text)
            assert flowchart.LEAVES[right].title not in text, (cp.id, a, text)
            assert not _leaks(text.replace(_fmt_answer(a), ""), *secret), (cp.id, a, text, _leaks(text, *secret))
            assert "walk hidden" in res.walk()
            n += 1
        if p:
            hi_msg = str(C.check(cp, wrongs[-2], record=False))
            lo_msg = str(C.check(cp, wrongs[-1], record=False))
            # no direction: above and below the band read the same but for the learner's own figure
            assert "outside the band" in hi_msg and "Reconsider" in hi_msg
            assert (hi_msg.replace(C._fmt(wrongs[-2].prediction), "#")
                    == lo_msg.replace(C._fmt(wrongs[-1].prediction), "#")), (hi_msg, lo_msg)
    assert n == 5 * (len(flowchart.LEAVES) - 1) + 5 * 2 + 2 * 2   # five checkpoints, two with a prediction


def _fmt_answer(a):
    """The learner's own figures, which the feedback may quote back."""
    return " ".join(C._fmt(x) for x in (a.value, a.prediction) if x is not None)


def test_three_wrong_tries_may_reveal_the_answer_recorded_as_revealed(tmp_path, monkeypatch):
    d = tmp_path / "class"
    monkeypatch.setenv(classroom.ENV_DIR, str(d))
    cp = _cp(_lab02(), cid="02")
    s = cp.asked()
    wrong = C.Answer("I", s.metric, float(s.value))
    r1 = C.check(cp, wrong)
    assert r1.tries == 1 and "after 3 tries" in r1.reveal() and r1.status == C.WRONG
    C.check(cp, wrong)
    r3 = C.check(cp, wrong)
    assert r3.tries == 3 and "CP.reveal()" in r3.messages[-1]
    shown = r3.reveal()
    assert f"leaf {cp.walk.leaf_id}" in shown and C._fmt(s.value) in shown and cp.walk.compact() in shown
    assert r3.status == C.REVEALED and not r3.passed and r3.walk() == cp.walk.compact() and nb.shows(r3)
    r3.reveal()                                   # asked again: recorded once
    results, _ = classroom.load_results(d)
    assert [x["revealed"] for x in results].count(True) == 1 and len(results) == 4
    assert not any(x["passed"] for x in results)


def test_the_gate_holds_back_output_until_the_checkpoint_passes(capsys):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cp = _cp(_lab03(), cid="03")
    blank = C.check(cp, C.Answer())
    n_figs = len(plt.get_fignums())
    with nb.gated(blank, "the tail") as shown:
        print("rank tail 68.5%")
        plt.figure()
    out = capsys.readouterr().out
    assert shown is False and "68.5" not in out and "answer the checkpoint above first" in out
    assert len(plt.get_fignums()) == n_figs          # the figure is not left to be drawn
    ok = C.check(cp, _right(cp))
    with nb.gated(ok, "the tail") as shown:
        print("rank tail 68.5%")
    assert shown is True and "rank tail 68.5%" in capsys.readouterr().out


def test_a_borderline_step_is_named_in_the_pass_never_in_a_wrong_leaf_message():
    cp = _cp(_lab03("aware"))                          # D NO with a spread that contains D's threshold
    d = cp.walk.steps[1]
    assert d.question == "D" and d.borderline
    res = C.check(cp, C.Answer("L", d.metric, float(d.value)))
    # which question is borderline would tell where the walk runs: the wrong leaf is told its own path only
    assert res.status == C.WRONG and "BORDERLINE" not in res.messages[0]
    assert not re.search(rf"\b{cp.walk.leaf_id}\b", res.messages[0])
    ok = C.check(cp, _right(cp))
    assert ok.passed and "BORDERLINE at D" in ok.messages[0]
    assert "BORDERLINE" not in C.check(_cp(_lab03()), _right(_cp(_lab03()))).messages[0]



def test_the_other_branch_of_a_borderline_step_is_a_reading_not_a_mistake():
    """At a BORDERLINE step the run cannot tell its two branches apart: the leaf the far end of the
    measured spread walks to passes, graded on that walk's own deciding metric and value, and says
    BORDERLINE; a leaf neither end reaches is still wrong."""
    ev = _lab03("aware")
    cp = _cp(ev)
    d = cp.walk.steps[1]
    lo, hi = d.spread
    far = flowchart.diagnose({**ev, d.metric: hi if d.answer == "no" else lo})   # D's other branch
    assert far.leaf_id not in (None, cp.walk.leaf_id), far.compact()
    s = far.steps[-1]
    ok = C.check(cp, C.Answer(far.leaf_id, s.metric, float(s.value)))
    assert ok.passed and "BORDERLINE at D" in ok.messages[0], ok
    wrong_value = C.check(cp, C.Answer(far.leaf_id, s.metric, float(s.value) * 3 + 10))
    assert wrong_value.status == C.WRONG and "outside the reading's spread" in wrong_value.messages[0]
    neither = next(x for x in flowchart.LEAVES if x not in (cp.walk.leaf_id, far.leaf_id)
                   and C._ruled_out_by(cp.walk, x) is not None and C._ruled_out_by(far, x) is not None)
    assert C.check(cp, C.Answer(neither, s.metric, float(s.value))).status == C.WRONG
    clear = _cp(_lab01()[0])                          # no borderline step: only the walk's own leaf passes
    assert not clear.walk.borderline and C.borderline_alternative(clear, "L") is None


def test_an_undecided_walk_grades_nothing_and_shows_what_to_measure():
    ev = {"slowdown_vs_floor": 3.0}                        # F has no metric: the walk stops there
    cp = _cp(ev)
    res = C.check(cp, C.Answer("G", "slowdown_vs_floor", 3.0))
    assert res.status == C.UNDECIDED and not res.passed
    assert res.walk() == "B YES 3x -> ? at F (not measured)" and "run" in res.walk(full=True)


def test_a_non_leaf_and_a_lower_case_leaf():
    cp = _cp(_lab03())
    s = cp.asked()
    assert "not a leaf" in C.check(cp, C.Answer("K", s.metric, float(s.value))).messages[0]
    assert C.check(cp, C.Answer(cp.walk.leaf_id.lower(), s.metric, float(s.value))).passed


# ---- notebook helpers: blanks, the solutions file, reading a value off the evidence --------------

def test_blank_answer_prints_fill_in_and_raises_nothing(capsys, monkeypatch):
    monkeypatch.delenv(nb.ENV_CHECKPOINT_ANSWERS, raising=False)
    ev = _lab03()
    a = nb.answer("03", evidence=ev)
    assert a == C.Answer()
    res = nb.checkpoint("03", a, flowchart.diagnose(ev), ev)
    assert res.status == C.FILL_IN and "fill in your answer" in capsys.readouterr().out


def test_solutions_fill_only_blank_answers_and_pass_through_the_checker(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(nb.ENV_CHECKPOINT_ANSWERS, str(SOLUTIONS))
    ev1, speedup = _lab01()
    cases = {"01": (ev1, None, C.Prediction("fused speed-up", speedup, "x", band_pct=40)),
             "02": (_lab02(), None, C.Prediction("blocks per SM", 1, band_abs=0)),
             "03": (_lab03(), None, None), "04": (_lab04(), "D", None),
             "08": (_examine()["gemm_fp32"], None, None)}
    sol = json.loads(SOLUTIONS.read_text())
    assert set(cases) <= set(sol)
    for cid, (ev, step, pred) in cases.items():
        res = nb.checkpoint(cid, nb.answer(cid, evidence=ev), flowchart.diagnose(ev), ev, step=step, prediction=pred)
        assert res.passed, (cid, res.messages)
    # the solutions' answers are not kept in a class folder as anybody's; a learner's are
    d = tmp_path / "class"
    monkeypatch.setenv(classroom.ENV_DIR, str(d))
    ev3 = _lab03()
    assert nb.checkpoint("03", nb.answer("03", evidence=ev3), flowchart.diagnose(ev3), ev3).passed
    assert not d.exists() or not list(d.iterdir())
    # a learner's own answer is graded as given, even with the solutions file set
    mine = nb.answer("03", leaf="M", metric="rank_tail_pct", value=1.0, evidence=_lab03())
    assert mine == C.Answer("M", "rank_tail_pct", 1.0)
    assert not nb.checkpoint("03", mine, flowchart.diagnose(_lab03()), _lab03()).passed
    assert [r["leaf"] for r in classroom.load_results(d)[0]] == ["M"]


def test_evidence_table_lists_what_the_walk_reads_without_a_verdict():
    ev = _lab02()
    text = C.render_evidence(ev, "src")
    for s in flowchart.diagnose(ev).steps:
        assert s.metric in text
    assert "->" not in text and "YES" not in text and "leaf" not in text.lower()
    assert "OUTSIDE" not in text
    bad = C.render_evidence({"slowdown_vs_floor": 0.56, "dram_pct_estimated": 1160.0})
    assert "OUTSIDE its physical range" in next(ln for ln in bad.splitlines() if "dram_pct_estimated" in ln)
    assert "OUTSIDE" not in next(ln for ln in bad.splitlines() if "slowdown_vs_floor" in ln)


# ---- class folder: each graded answer kept, summary per leaf and metric ---------------------------

def test_answers_are_recorded_and_summarised_per_leaf_and_metric(tmp_path, monkeypatch, capsys):
    from hwlab.cli import main

    d = tmp_path / "class"
    monkeypatch.setenv(classroom.ENV_DIR, str(d))
    cp = _cp(_lab02(), cid="02")
    s = cp.asked()
    for who, ans in (("ana", C.Answer("I", "tensor_pct_of_peak", 39.2)), ("ana", _right(cp)),
                     ("bo", C.Answer("I", "tensor_pct_of_peak", 39.2)), ("cy", C.Answer("J", "slowdown_vs_floor", 4.66))):
        monkeypatch.setenv(classroom.ENV_LEARNER, who)
        C.check(cp, ans)
    C.check(cp, C.Answer())                      # a blank is not an answer: not recorded
    results, bad = classroom.load_results(d)
    assert len(results) == 4 and not bad
    r = next(x for x in results if x["learner"] == "ana" and x["passed"])
    assert (r["kind"], r["item"], r["leaf"], r["metric"], r["value"]) == ("checkpoint", "02", "J", s.metric, float(s.value))
    wrong = [x for x in results if x["leaf"] == "I"]
    assert all(x["first_wrong_branch"]["question"] == "H" for x in wrong)
    capsys.readouterr()
    assert main(["class", "summary", str(d), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["items"]["checkpoint: 02"]
    assert row["attempts"] == 4 and row["passed"] == 1 and row["learners"] == 3
    assert row["leaves_picked"] == {"I": 2, "J": 2}
    assert row["metrics_cited"] == {"tensor_pct_of_peak": 2, s.metric: 1, "slowdown_vs_floor": 1}
    assert main(["class", "summary", str(d)]) == 0
    text = capsys.readouterr().out
    assert "leaves picked: I x2, J x2" in text and "evidence cited: tensor_pct_of_peak x2" in text


# ---- notebooks: the evidence, then the graded answer, then the walk -------------------------------

WALK_RE = re.compile(r"\.explain\(\)|\.walk\(|\.render\(|\.compact\(\)|\.report\(\)|show_walk\(|\.mermaid\(\)|"
                     r"leaf_id|\.path\b")


@pytest.mark.parametrize("stem", ["01_bandwidth_bound", "02_registers_occupancy", "03_cross_link_tp",
                                  "04_fp8_dequant_fallback", "08_examine"])
def test_checkpoint_precedes_every_walk_in_the_notebook(stem):
    jupytext = pytest.importorskip("jupytext", reason="jupytext missing: pip install -e '.[dev,lab]'")
    cells = [c for c in jupytext.read(ROOT / "notebooks" / f"{stem}.py").cells if c.cell_type == "code"]
    graded = [i for i, c in enumerate(cells) if "nb.checkpoint(" in c.source]
    assert graded, f"{stem} has no graded checkpoint"
    first = graded[0]
    assert "nb.answer(" in cells[first].source and "=None" in cells[first].source.replace(" ", "")
    shown = [i for i, c in enumerate(cells) if "nb.show_evidence(" in c.source]
    assert shown and shown[0] <= first, f"{stem}: the evidence is not shown before the answer"
    walks = [i for i, c in enumerate(cells) if WALK_RE.search(c.source)]
    assert walks and min(walks) > first, f"{stem}: a walk is rendered in code cell {min(walks)} before the checkpoint"


# ---- the one-line walk ---------------------------------------------------------------------------

def test_compact_walk_on_real_walks():
    assert flowchart.diagnose(_lab01()[0]).compact() == "B YES 4.23x -> F YES 60.8% -> G"
    assert flowchart.diagnose(_lab02()).compact().endswith("-> H NO (n_spills 178) -> J")
    aware = flowchart.diagnose(_lab03("aware"))
    assert aware.borderline and "D NO 1.16x BORDERLINE -> OK" in aware.compact()
    assert "F NO ~" in flowchart.diagnose(_examine()["gemm_fp32"]).compact()   # an estimate is marked
    for _, ev in _walks():
        d = flowchart.diagnose(ev)
        line = d.render()
        assert "\n" not in line and line.count("->") == len(d.steps) and line.endswith(d.leaf_id)
        assert ("BORDERLINE" in line) == bool(d.borderline)
        assert d.render(full=True) == d.explain()


def test_compact_walk_marks_not_applicable_invalid_and_undecided():
    na = {"slowdown_vs_floor": 3.0, "dram_pct_estimated": 5.0, "matmul_flops": 0, "tensor_core_kernels": 0,
          "launch_gap_pct": 10.0}
    assert "H N/A" in flowchart.diagnose(na).compact()
    bad = flowchart.diagnose({"slowdown_vs_floor": 3.0, "dram_pct_estimated": 180.0})
    assert bad.compact() == "B YES 3x -> ? at F (INVALID dram_pct_estimated)"
    assert flowchart.diagnose({"slowdown_vs_floor": 3.0}).compact() == "B YES 3x -> ? at F (not measured)"
    assert "(by hand)" in flowchart.diagnose({"single_gpu_slow": False, "multi_gpu_or_service_slow": False}).compact()


def test_every_metric_that_decides_the_asked_step_passes_on_its_value_and_fails_on_a_wrong_one():
    """Checkpoint 01 asks for F's deciding metric: F answers YES when any one of its criteria holds, so
    each criterion that holds on this evidence decides it (dram_pct_of_peak, dram_pct_estimated, ...):
    each passes on its own value and is refused on a value outside its reading; a metric of F's rule
    that does not hold here is refused."""
    for cp in _checkpoints():
        s = cp.asked()
        q = flowchart.QUESTIONS[s.question]
        p = cp.prediction.actual if cp.prediction else None
        holding = {c.metric for c in q.criteria if s.answer == "yes" and not s.overridden
                   and isinstance(cp.evidence.get(c.metric), (int, float)) and c.holds(float(cp.evidence[c.metric]))}
        assert set(C.accepted_metrics(cp)) == {s.metric} | holding, cp.id
        for m in {s.metric} | holding:
            v = float(cp.evidence[m])
            assert C.check(cp, C.Answer(cp.walk.leaf_id, m, v, p), record=False).passed, (cp.id, m)
            bad = C.check(cp, C.Answer(cp.walk.leaf_id, m, v * 3 + 7, p), record=False)
            assert bad.status == C.WRONG and "outside the reading's spread" in bad.messages[0], (cp.id, m)
        for c in q.criteria:
            v = cp.evidence.get(c.metric)
            if c.metric not in holding | {s.metric} and isinstance(v, (int, float)):
                assert not C.check(cp, C.Answer(cp.walk.leaf_id, c.metric, float(v), p), record=False).passed
    cp01 = next(_checkpoints())
    assert {"dram_pct_of_peak", "dram_pct_estimated"} <= set(C.accepted_metrics(cp01))
