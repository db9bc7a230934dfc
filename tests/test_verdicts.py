"""Verdicts at the edges: borderline from measured spreads, validity before verdict, estimates
labelled, overlap against what could hide, the fewer-bytes lens. Recorded runs are re-derived
here from their raw series (CPU records) or their stored run (the H200's Lab 4)."""
import json
import statistics

import pytest

from hwlab.diagnosis import flowchart as F
from hwlab.diagnosis import flowchart_checks as FC
from hwlab.core.evidence import recorded
from hwlab.labs import crosslink as C
from hwlab.labs.fp8.traffic import step_bytes
from hwlab.labs.fp8.model import PATHS, ModelConfig
from hwlab.labs.fp8.walk import flowchart_evidence as lab04_evidence
from hwlab.core.measure import quantile, spread_of


# ------------------------------------------------------------------ synthetic rules
def test_borderline_when_the_threshold_is_inside_the_spread():
    base = {"slowdown_vs_floor": 1.2, "e2e_slowdown": 1.0}
    d = F.diagnose({**base, "metric_spreads": {"slowdown_vs_floor": [1.1, 1.3]}})
    assert d.borderline == [] and "spread 1.1-1.3" in d.explain()
    d = F.diagnose({**base, "metric_spreads": {"slowdown_vs_floor": [1.1, 1.6]}})
    assert [s.question for s in d.borderline] == ["B"]
    txt = d.explain()
    assert "BORDERLINE" in txt and "YES -> F" in txt and "more repeats" in txt
    js = json.loads(json.dumps(d.to_dict(), allow_nan=False))
    assert js["borderline"] == ["B"] and js["steps"][0]["borderline"] is True
    assert js["steps"][0]["other_branch"] == "YES -> F"


def test_no_spread_says_so_and_is_never_invented():
    d = F.diagnose({"slowdown_vs_floor": 1.49, "e2e_slowdown": 1.0})
    assert d.borderline == [] and d.explain().count("spread not recorded") == 2
    assert all(s["spread"] is None for s in d.to_dict()["steps"])


def test_few_repeats_count_their_own_width():
    # two repeats 1.34 and 1.47 do not straddle 1.5, but the next repeat falls outside a range of
    # two as often as not: within its own width of the threshold is borderline
    sp = spread_of([1.34, 1.47], "repeats")
    assert sp["n"] == 2
    d = F.diagnose({"slowdown_vs_floor": 1.47, "e2e_slowdown": 1.0, "metric_spreads": {"slowdown_vs_floor": sp}})
    assert [s.question for s in d.borderline] == ["B"]
    far = spread_of([1.0, 1.02], "repeats")
    d = F.diagnose({"slowdown_vs_floor": 1.01, "e2e_slowdown": 1.0, "metric_spreads": {"slowdown_vs_floor": far}})
    assert d.borderline == []


def test_spread_of_is_the_kits_percentile():
    vals = [5.0, 1.0, 4.0, 2.0, 3.0, 9.0]
    sp = spread_of(vals, "x")
    assert (sp["lo"], sp["hi"]) == (quantile(vals, 0.1), quantile(vals, 0.9))
    assert spread_of([1.0], "x") is None


def test_invalid_metric_is_not_evidence_and_the_walk_says_why():
    ev = {"slowdown_vs_floor": 3.0, "dram_pct_estimated": 169.0, "tensor_pct_of_peak": 20.0}
    d = F.diagnose(ev)
    assert d.leaf is None and d.undecided.id == "F"
    assert [iv.metric for iv in d.invalid] == ["dram_pct_estimated"]
    txt = d.explain()
    assert "NOT evidence" in txt and "cache" in txt and "cannot decide at F" in txt
    # a valid metric at the same question decides instead
    d = F.diagnose({**ev, "dram_pct_required_estimated": 2.0})
    assert d.path == ["B", "F", "H", "I"] and d.invalid[0].metric == "dram_pct_estimated"
    d = F.diagnose({"slowdown_vs_floor": 3.0, "sector_amplification": 0.36, "dram_pct_of_peak": 10.0,
                    "tensor_pct_of_peak": 90.0})
    assert d.path == ["B", "F", "H", "J"] and "sector_amplification" in d.explain().split("NOT evidence")[0]


def test_estimated_metrics_are_never_called_measured():
    d = F.diagnose({"slowdown_vs_floor": 3.0, "dram_pct_estimated": 80.0})
    txt = d.explain()
    assert d.leaf_id == "G" and "every answer on this walk was measured\n" not in txt + "\n"
    assert "ESTIMATED" in txt and "except the estimate at F" in txt
    assert d.to_dict()["steps"][1]["how"] == "estimated"
    d = F.diagnose({"slowdown_vs_floor": 3.0, "dram_pct_of_peak": 80.0})
    assert d.explain().endswith("every answer on this walk was measured")


# ------------------------------------------------------------------ recorded: Lab 3 on a CPU
def _rec_case(kind, *path):
    x = recorded(kind, "cpu").extra
    for p in path:
        x = x[p]
    return x


def test_fixed_mapping_recheck_is_borderline_from_its_rounds():
    """The calibrated sweep's aware mapping passes D at e2e below 1.2; its per-round ratios,
    re-derived here from the raw per-rank series, straddle 1.2: the walk says borderline."""
    case = _rec_case("lab03_linksweep", "calibrated")
    ev = case["aware"]["flowchart_evidence"]
    view = C.phase_view(case["ranks"], "step:aware")
    solo = C.phase_view(case["ranks"], "solo")
    ratios = C.report.paired_ratios(view, solo)
    assert ev["e2e_slowdown"] == pytest.approx(statistics.median(ratios))
    lo, hi = quantile(ratios, 0.1), quantile(ratios, 0.9)
    assert ev["metric_spreads"]["e2e_slowdown"]["lo"] == pytest.approx(lo)
    d = F.diagnose(ev)
    step_d = next(s for s in d.steps if s.question == "D")
    assert step_d.answer == ("yes" if ev["e2e_slowdown"] >= 1.2 else "no")
    assert step_d.borderline == (lo < 1.2 <= hi)
    assert step_d.borderline, "the recorded re-check's rounds straddle 1.2"
    assert "BORDERLINE at" in d.explain() and '"borderline"' in json.dumps(d.to_dict())


def test_every_recorded_lab03_tail_sits_inside_its_own_spread():
    """K's figure and its spread come from the same estimator (a lower quartile per rank, over the
    run or over a block of rounds): the figure lies inside the spread the walk reads (few blocks:
    widened by their width, flowchart_checks.spreads_of)."""
    from hwlab.diagnosis.flowchart_checks import spreads_of
    cases = [_rec_case("lab03_slowlink", "experiment")]
    sweep = _rec_case("lab03_linksweep")
    cases += sweep["sweep"] + [sweep["calibrated"]]
    n = 0
    for exp in cases:
        for name in ("naive", "aware", "regressed"):
            if name not in exp:
                continue
            ev = exp[name]["flowchart_evidence"]
            (lo, hi), _ = spreads_of(ev)["rank_tail_pct"]
            assert lo <= ev["rank_tail_pct"] <= hi, (name, ev["rank_tail_pct"], lo, hi)
            n += 1
    assert n == 2 + 2 * len(sweep["sweep"]) + 3


def test_slowlink_aware_recheck_tail_spread_rederived():
    exp = _rec_case("lab03_slowlink", "experiment")
    ev = exp["aware"]["flowchart_evidence"]
    view = C.phase_view(exp["ranks"], "step:aware")
    tails = C.report.rank_tail_pct_by_block(view)
    rounds = min(len(r["step_ms"]) for r in view)
    assert len(tails) == rounds // C.report.SPREAD_BLOCK_ROUNDS
    sp = ev["metric_spreads"]["rank_tail_pct"]
    assert (sp["lo"], sp["hi"]) == pytest.approx((min(tails), max(tails)))  # under five blocks: their range
    d = F.diagnose(ev)
    # K is not reached when D says no; the D step's borderline follows its own spread
    s = next(s for s in d.steps if s.question == "D")
    e = ev["metric_spreads"]["e2e_slowdown"]
    assert s.borderline == (e["lo"] < 1.2 <= e["hi"])


def test_overlap_measured_against_what_could_hide_on_the_slow_link():
    """Re-derived from the raw series: on the slow link the all-reduce alone outlasts the
    compute; measured against min(comm, compute) the share is at its limit, and the walk says
    overlap did what it could and the link is the limiter; a share over 100% is marked invalid,
    and the link is still the limiter from the two times alone."""
    exp = _rec_case("lab03_slowlink", "experiment")
    slow = exp["overlap"]["slow"]
    raw = [slow] + slow["other_repeats"]
    again = sorted(C.overlap_report(r["ranks_raw"], "pair", [0, 1])["hidden_pct"] for r in raw)
    assert again == pytest.approx(sorted(slow["hidden_pct_repeats"]))
    t = slow
    assert t["t_comm_alone_ms"] > t["t_compute_alone_ms"]
    old = 100 * (t["t_comm_alone_ms"] + t["t_compute_alone_ms"] - t["t_overlapped_ms"]) / t["t_comm_alone_ms"]
    assert old < 50  # what the comm-only denominator said: "overlap did not happen"
    ev = exp["naive"]["flowchart_evidence"]
    assert ev["overlap_hidden_pct"] == pytest.approx(slow["hidden_pct"])
    d = F.diagnose(ev)
    assert d.leaf_id == "L"
    lens = "\n".join(d.lens_notes)
    if not 0 <= slow["hidden_pct"] <= 100:  # a share above its whole is not evidence (issue 44)
        assert "INVALID, not evidence" in lens and "overlap did what it could" not in lens
        assert "the link is the limiter" in lens  # from the two times alone, which stay valid
    elif min(slow["hidden_pct_repeats"]) >= FC.OVERLAP_DID_ITS_PART_PCT:
        assert "min(comm alone" in lens
        assert "overlap did what it could" in lens and "the link is the limiter" in lens


def test_fast_link_overlap_is_borderline_from_its_launches():
    exp = _rec_case("lab03_slowlink", "experiment")
    fast = exp["overlap"]["fast"]
    reps = fast["hidden_pct_repeats"]
    lens = "\n".join(F.diagnose(exp["aware"]["flowchart_evidence"]).lens_notes)
    w = max(reps) - min(reps)
    straddles = min(reps) - (w if len(reps) < FC.FEW_REPEATS else 0) < 50 <= max(reps) + (
        w if len(reps) < FC.FEW_REPEATS else 0)
    assert ("BORDERLINE" in lens) == straddles
    assert straddles, "the recorded fast-link launches straddle 50%"


def test_counter_example_lands_through_valid_metrics():
    """The seed's 反例 (a regressed kernel, CPU cache): its moved-bytes DRAM share is over 100%
    and is not used; the required bytes and the GEMM rate decide, and the walk lands on a kernel leaf."""
    ev = _rec_case("lab03_linksweep", "calibrated", "regressed", "flowchart_evidence")
    base = _rec_case("lab03_linksweep", "calibrated", "single_device", "regressed")
    assert ev["dram_pct_estimated"] > 100
    req = 100 * base["required_bytes"] / (base["t_ms"] * 1e-3) / 1e9 / base["ceilings"]["copy_gbps"]
    assert ev["dram_pct_required_estimated"] == pytest.approx(req)
    d = F.diagnose(ev)
    assert d.leaf_id in ("G", "I", "J")
    assert [iv.metric for iv in d.invalid] == ["dram_pct_estimated"]
    used = {s.metric for s in d.steps}
    assert "dram_pct_estimated" not in used
    for s in d.steps:
        assert FC.check_range(s.question, s.metric, s.value) is None


@pytest.mark.parametrize("kind,where", [("lab03_slowlink", "cpu"), ("lab03_linksweep", "cpu"),
                                        ("lab01_bandwidth", "h200"), ("lab02_registers", "h200"),
                                        ("scenarios", "h200"), ("lab04_fp8", "h200")])
def test_no_recorded_walk_rests_on_an_invalid_metric(kind, where):
    ev = recorded(kind, where) if where == "cpu" else recorded(kind)
    walks = []

    def find(x):
        if isinstance(x, dict):
            if "flowchart_evidence" in x and isinstance(x["flowchart_evidence"], dict):
                fe = x["flowchart_evidence"]
                walks.extend(fe.values() if all(isinstance(v, dict) for v in fe.values()) else [fe])
            for v in x.values():
                find(v)
        elif isinstance(x, list):
            for v in x:
                find(v)
    find(ev.extra)
    assert walks
    for w in walks:
        d = F.diagnose(w)
        for s in d.steps:
            if not s.by_hand:
                assert FC.check_range(s.question, s.metric, s.value) is None, (kind, s)


# ------------------------------------------------------------------ recorded: Lab 4 on the H200
@pytest.fixture(scope="module")
def lab04():
    r = recorded("lab04_fp8")
    return r, lab04_evidence(r.extra["run"], r.ceilings["copy_gbps"])


def test_lab04_borderline_follows_its_profiled_kernel_sums(lab04):
    """B's spread on every recorded Lab 4 walk is the range of that bucket's profiled kernel sums
    over its floor; with fewer than 5 repeats a threshold within the range's own width is
    borderline. The fixed path's short bucket straddles B's 1.5 in the record: its walk says so."""
    r, fe = lab04
    buckets = {f"{p} ctx {b['profile']['ctx']} x{b['profile']['batch']}": b
               for p, v in r.extra["run"]["stream"]["paths"].items() for b in v["buckets"]}
    flagged = []
    for key, ev in fe.items():
        totals = buckets[key]["profile"]["breakdown"]["total_us_of_profiles"]
        repeats = sorted(t / ev["floor_us"] for t in totals)
        sp = ev["metric_spreads"]["slowdown_vs_floor"]
        assert (sp["lo"], sp["hi"]) == pytest.approx((repeats[0], repeats[-1])) and sp["n"] == len(repeats)
        w = repeats[-1] - repeats[0]
        step_b = F.diagnose(ev).steps[0]
        assert step_b.borderline == (repeats[0] - w < 1.5 <= repeats[-1] + w), key
        if step_b.borderline:
            assert "BORDERLINE" in str(step_b)
            flagged.append(key)
    short = min(b["profile"]["ctx"] for b in buckets.values())
    assert any(k.startswith(f"fixed ctx {short} ") for k in flagged), flagged


@pytest.mark.parametrize("bucket", ["short", "long"])
def test_fewer_bytes_lens_on_lab04_bf16(lab04, bucket):
    r, fe = lab04
    ctxs = sorted(b["profile"]["ctx"] for b in r.extra["run"]["stream"]["paths"]["bf16"]["buckets"])
    ctx = ctxs[0] if bucket == "short" else ctxs[-1]
    key = next(k for k in fe if k.startswith(f"bf16 ctx {ctx} "))
    ev = fe[key]
    cfg = ModelConfig(**r.extra["run"]["stream"]["config"])
    b = int(key.split(" x")[1])
    pos = b * (ctx + 1)
    fp8_kv_us = step_bytes(cfg, PATHS["bf16"], b, pos, True) / r.ceilings["copy_gbps"] / 1e3
    assert ev["alt_floors_us"]["an FP8 KV cache"] == pytest.approx(fp8_kv_us)
    assert fp8_kv_us < ev["floor_us"]
    d = F.diagnose(ev)
    lens = "\n".join(d.lens_notes)
    assert ev["slowdown_vs_floor"] < FC.NEAR_FLOOR  # bf16 sits near its own floor in the record
    assert "OK at its bytes" in lens
    assert f"an FP8 KV cache: floor {fp8_kv_us:.0f} us = {100 * fp8_kv_us / ev['kernel_us']:.0f}% of this step" in lens
    # a path already on an FP8 cache has no FP8-cache alternative to offer
    fixed = fe[next(k for k in fe if k.startswith(f"fixed ctx {ctx} "))]
    if ctx + 1 >= PATHS["fixed"]["kv_fp8_from_ctx"]:
        assert "an FP8 KV cache" not in fixed["alt_floors_us"]


# ------------------------------------------------------------------ drills: feedback that teaches
def test_wrong_drill_answer_names_evidence_never_the_leaf(tmp_path, monkeypatch):
    """Every recorded fault, every wrong leaf: the feedback names the questions of the learner's own
    path to re-check (or says the evidence cannot decide), never a measured value, and a
    learner cannot read the right leaf (its id or title) from it."""
    import re

    from hwlab.course import drills
    monkeypatch.setenv("HWLAB_DRILL_KEY_FILE", str(tmp_path / "k"))
    rec = recorded("drills").extra["runs"]
    for name, f in drills.FAULTS.items():
        if f"{f.scenario}/{f.case}" not in rec and f.scenario != "slowlink":
            continue
        d = drills.new(seed=7, fault=name, live=False)
        for leaf in F.LEAVES:
            if leaf == f.leaf:
                continue
            g = drills.grade(d, leaf)
            assert not g.correct_leaf
            txt = g.explanation
            assert not re.search(rf"(?<![\w/]){re.escape(f.leaf)}(?![\w/])", txt), (name, leaf, txt)
            assert F.LEAVES[f.leaf].title not in txt
            assert f"Your path to {leaf} needs" in txt or "cannot decide" in txt, txt  # its own path, to re-check
            assert " = " not in txt and not re.search(r"\b(YES|NO)\b", txt), txt  # no value, no answer
            assert g.fix_evidence is None  # no fix is run, so none of its leaves leaks either


# ------------------------------------------------------------------ the two new drills, recorded on the H200
def _drill_run(key):
    return recorded("drills").extra["runs"][key]


def test_sync_point_drill_recorded_lands_on_j_and_its_fix_leaves():
    sync, fixed = _drill_run("syncpoint/item")["evidence"], _drill_run("syncpoint/async")["evidence"]
    for ev in (sync, fixed):  # re-derived from the step and kernel times the run measured
        assert ev["slowdown_vs_floor"] == pytest.approx(ev["step_ms"] / ev["kernel_busy_ms"])
        assert ev["launch_gap_pct"] == pytest.approx(100 * (1 - ev["kernel_busy_ms"] / ev["step_ms"]))
    d = F.diagnose(sync)
    assert d.leaf_id == "J" and d.fully_measured
    h = next(s for s in d.steps if s.question == "H")
    assert h.overridden and h.metric == "launch_gap_pct"
    assert F.diagnose(fixed).leaf_id not in (None, "J")
    # the host's step time shows the sync: with it the host waits for the kernels
    assert sync["host_step_ms"] > sync["host_work_ms"] + 0.5 * sync["kernel_busy_ms"]
    assert fixed["host_step_ms"] < sync["host_step_ms"]
    assert "constructed load" in sync["metric_sources"]["host_work_ms"]


def test_bad_card_drill_recorded_is_labelled_constructed_and_rederives():
    from hwlab.labs import drillruns
    bad, good = _drill_run("badcard/throttled")["evidence"], _drill_run("badcard/healthy")["evidence"]
    assert "CONSTRUCTED" in bad["metric_sources"]["hw_deviations_vs_baseline"]
    assert "CONSTRUCTED" not in good["metric_sources"]["hw_deviations_vs_baseline"]
    assert "constructed" in bad["nvml_state"] and "constructed" not in good["nvml_state"]
    for ev in (bad, good):
        again = drillruns.rederive_card_state(ev)
        assert again["hw_deviations_vs_baseline"] == ev["hw_deviations_vs_baseline"]
    assert bad["hw_deviations_vs_baseline"] > 0 and good["hw_deviations_vs_baseline"] == 0
    # the kernels on the card are fine: the chart's walk says OK and points at the node baseline
    assert F.diagnose(bad).leaf_id == "OK" and "node baseline" in " ".join(F.LEAVES["OK"].actions)


def test_bad_card_power_cap_is_not_a_fault_sign():
    from hwlab.labs import drillruns
    base = {"clock_event_reasons": ["none"], "ecc_errors_volatile": {"uncorrected": 0}}
    capped = {**base, "clock_event_reasons": ["sw_power_cap"]}
    assert drillruns.card_state_vs_baseline(capped, base)["hw_deviations_vs_baseline"] == 0
    hot = {**base, "clock_event_reasons": ["sw_thermal_slowdown"]}
    assert drillruns.card_state_vs_baseline(hot, base)["hw_deviations_vs_baseline"] == 1
    built = drillruns.constructed_bad_card(base)
    assert drillruns.card_state_vs_baseline(built, base)["hw_deviations_vs_baseline"] == 3


def test_new_drills_grade_from_the_record(tmp_path, monkeypatch):
    from hwlab.course import drills
    monkeypatch.setenv("HWLAB_DRILL_KEY_FILE", str(tmp_path / "k"))
    for name in ("sync_point", "bad_card"):
        f = drills.FAULTS[name]
        d = drills.new(seed=3, fault=name, live=False)
        g = drills.grade(d, f.leaf)
        assert g.passed and g.fix_removes_slowdown is True, g.explanation


def test_every_drill_shows_measurements_that_do_not_decide_it(tmp_path, monkeypatch):
    """Distractors: each drill's observations hold measured metrics its walk never reads, so the
    learner must pick the deciding ones; none of them is typed in (each has a source or is a
    flowchart metric the run measured)."""
    from hwlab.course import drills
    monkeypatch.setenv("HWLAB_DRILL_KEY_FILE", str(tmp_path / "k"))
    for name in drills.FAULTS:
        d = drills.new(seed=5, fault=name, live=False)
        used = {s.metric for s in F.diagnose(d.observations).steps}
        off_path = [k for k, v in d.observations.items() if k not in F.META_KEYS and k not in used
                    and isinstance(v, (int, float)) and not isinstance(v, bool)]
        assert off_path, name


def test_incident_reverification_says_when_it_passed_inside_its_spread():
    from hwlab.diagnosis import incident
    rec = recorded("lab03_linksweep", "cpu")
    exp = rec.extra["calibrated"]
    after = F.diagnose(exp["aware"]["flowchart_evidence"])
    inc = incident.from_diagnosis("t", rec, F.diagnose(exp["naive"]["flowchart_evidence"]), symptom_scope="multi-GPU",
                                  symptom="s", fix="f", reverify="r", reverify_evidence=exp["aware"]["flowchart_evidence"])
    assert len(inc.reverify_result["borderline"]) == len(after.borderline)
    assert ("BORDERLINE at" in inc.to_markdown()) == bool(after.borderline)
