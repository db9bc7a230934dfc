"""Shares that survive preemption, BORDERLINE in every run alike, and the dtype lever's gain at a part's
present efficiency (issue 63): synthetic profiled calls and parts, judged by the kit's own rules."""
from __future__ import annotations

import pytest

from hwlab.diagnosis.flowchart import diagnose
from hwlab.examine.part_record import Part, Parts
from hwlab.examine.part_walk import gain
from hwlab.examine.parts import call_share_spread, op_medians, walk_part
from hwlab.examine.repeats import RUN_TO_RUN, spreads_over


def _item(op: str, us: float, ts: float) -> dict:
    return {"stack": [op], "op_ids": [int(ts)], "us": us, "kernel": None, "compiled": False, "args": None, "ts": ts,
            "dur": us}


def _call(times: dict[str, float], gaps_us: list[float] | None = None) -> list[dict]:
    """Ops one after another from t=0, ``gaps_us[k]`` of host time before op k+1 (10 us each by default)."""
    out, t = [], 0.0
    for k, (op, us) in enumerate(times.items()):
        out.append(_item(op, us, t))
        t += us + (gaps_us[k] if gaps_us and k < len(gaps_us) else 10.0)
    return out


def _call_us(call: list[dict], tail_us: float = 5.0) -> float:
    return call[-1]["ts"] + call[-1]["dur"] + tail_us


STEADY = {"aten::addmm": 600.0, "aten::gelu": 100.0, "aten::add": 50.0, "aten::mm": 200.0}


def test_a_preempted_op_in_one_call_leaves_the_op_medians_unchanged():
    times = [dict(STEADY) for _ in range(5)]
    times[1]["aten::gelu"] += 5000.0  # preempted inside gelu in one call
    times[3]["aten::add"] += 3000.0  # and inside add in another
    calls = [_call(t) for t in times]
    call_us = [_call_us(c) for c in calls]
    call_us[4] += 4000.0  # preempted after the last op once
    items, total_us, n = op_medians(calls, call_us)
    assert n == 5 and [i["us"] for i in items] == list(STEADY.values())
    assert total_us == pytest.approx(sum(STEADY.values()) + 3 * 10.0 + 5.0)
    # a repeat's three calls: its own and the next two
    items, _, n = op_medians(calls, call_us, [1, 2, 3])
    assert n == 3 and [i["us"] for i in items] == list(STEADY.values())


def test_a_preemption_between_ops_in_most_calls_leaves_the_time_outside_ops_unchanged():
    # three of five calls preempted between ops, each in a different gap: the median of each call's
    # whole time outside ops would hold a preemption; each gap's median does not
    gaps = [[10.0, 10.0, 10.0] for _ in range(5)]
    gaps[0][0] += 4000.0
    gaps[2][1] += 3000.0
    gaps[4][2] += 5000.0
    calls = [_call(STEADY, g) for g in gaps]
    call_us = [_call_us(c) for c in calls]
    items, total_us, _ = op_medians(calls, call_us)
    assert total_us - sum(i["us"] for i in items) == pytest.approx(3 * 10.0 + 5.0)
    # items without durations (an older trace): the median of each call's whole time outside ops
    for c in calls:
        for it in c:
            del it["dur"]
    items, total_us, _ = op_medians(calls, call_us)
    assert total_us - sum(i["us"] for i in items) == pytest.approx(sorted(
        u - sum(i["us"] for i in c) for c, u in zip(calls, call_us))[2])


def test_calls_that_ran_different_ops_or_too_few_calls_give_no_op_medians():
    calls = [_call(STEADY) for _ in range(4)] + [_call({**STEADY, "aten::cat": 10.0})]
    call_us = [1000.0] * 5
    assert op_medians(calls, call_us) is None
    assert op_medians(calls[:4], call_us[:4], [0, 1]) is None  # a median of two is a mean of two


def test_the_calls_disagreement_on_a_part_sets_its_least_run_to_run_spread():
    calls, call_us = [], []
    for share in (0.10, 0.20, 0.30, 0.40, 0.90):  # the elementwise part's share in each call
        ew = 1000.0 * share
        calls.append(_call({"aten::addmm": 1000.0 - ew, "aten::gelu": ew}))
        call_us.append(1000.0)
    sp = call_share_spread(calls, call_us, [])
    # the highest and lowest share left out: 0.2-0.4 around 0.3, half its range over it
    assert sp["elementwise/reduction"] == pytest.approx((0.4 - 0.2) / (2 * 0.3))
    steady = call_share_spread([_call(STEADY) for _ in range(5)], [1000.0] * 5, [])
    assert all(v == pytest.approx(0.0) for v in steady.values())


def test_a_wider_run_to_run_spread_widens_a_timed_metric_and_never_narrows_it():
    ev = {"slowdown_vs_floor": 2.0, "dram_pct_estimated": 60.0}
    wide = spreads_over([ev, ev, ev], ev, None, 0.4)["slowdown_vs_floor"]
    assert (wide["lo"], wide["hi"]) == (pytest.approx(1.2), pytest.approx(2.8))
    narrow = spreads_over([ev, ev, ev], ev, None, 0.01)["slowdown_vs_floor"]
    assert narrow["lo"] == pytest.approx(2.0 * (1 - RUN_TO_RUN))
    assert narrow["hi"] == pytest.approx(2.0 * (1 + RUN_TO_RUN))


def _part(slowdown: float) -> Part:
    p = Part(name="elementwise/reduction", t_ms=5.0, share_pct=30.0, n_items=1, attributable=True)
    p.evidence = {"slowdown_vs_floor": slowdown, "dram_pct_estimated": 90.0}
    return p


def _walked(slowdown: float, run_to_run: float) -> Part:
    """A part walked beside three repeats that read what it read (their blocks agreed)."""
    reps = []
    for _ in range(3):
        q = _part(slowdown)
        q.walk = diagnose(q.evidence)
        reps.append(Parts([q], 10.0, "", None))
    p = _part(slowdown)
    walk_part(p, reps, None, run_to_run)
    return p


def test_a_part_its_calls_disagree_on_is_borderline_in_every_run_near_a_threshold():
    # two runs of the same part, one reading its slowdown just over the 1.5x threshold, one well over:
    # with the run-to-run floor alone the second states its leaf plainly (a one-sided pair); D is
    # undecided here (no back-to-back figure), so the walk's other end is 'undecided at D'
    runs = [_walked(1.7, 0.0), _walked(2.2, 0.0)]
    assert runs[0].borderline and not runs[1].borderline
    # the calls disagreeing by +-40% on its share: both runs name the other leaf
    runs = [_walked(1.7, 0.4), _walked(2.2, 0.4)]
    assert all(p.borderline for p in runs)
    assert runs[0].alternatives == runs[1].alternatives and "undecided at D" in runs[0].alternatives
    assert not _walked(6.0, 0.25).borderline  # far from every threshold: still plain


def test_the_dtype_lever_gain_is_the_part_at_its_present_efficiency_and_the_floor_gain_an_upper_bound():
    # a GEMM part of 8 of 10 ms at 25% of its (bf16) floor: reaching that floor would save 6 ms, but at
    # its present efficiency bf16's 2x ceiling halves its 8 ms
    p = Part(name="gemm float32", t_ms=8.0, share_pct=80.0, n_items=1, attributable=True, floor_ms=2.0)
    p.lever_gain = 2.0
    gain(p, 10.0)
    assert p.speedup == pytest.approx(10.0 / 4.0)
    assert p.lever_speedup == pytest.approx(10.0 / 6.0)
    assert "upper bound" in p.gain_bound and f"{10.0 / 6.0:.2f}x" in p.gain_bound
    q = Part(name="gemm float32", t_ms=8.0, share_pct=80.0, n_items=1, attributable=True, floor_ms=2.0)
    gain(q, 10.0)  # no faster precision measured: no lever estimate, no bound claimed
    assert q.lever_speedup is None and q.gain_bound == ""


def test_a_part_floored_by_its_fused_bytes_says_its_gain_is_an_upper_bound():
    from hwlab.examine.part_walk import FUSED_FLOOR, floor_part

    p = Part(name="elementwise/reduction", t_ms=3.0, share_pct=30.0, n_items=6, attributable=True,
             moved_bytes=6 * 4 << 20, floor_bytes=2 * 4 << 20)
    floor_part(p, None, 10.0, None, None)  # 8 MiB at 10 GB/s: a 0.84 ms floor
    assert p.floor_source == FUSED_FLOOR
    gain(p, 10.0)
    assert p.saved_ms == pytest.approx(3.0 - 8 * 2**20 / 10e6) and "upper bound" in p.gain_bound
    q = Part(name="elementwise/reduction", t_ms=0.5, share_pct=5.0, n_items=6, attributable=True,
             moved_bytes=6 * 4 << 20, floor_bytes=2 * 4 << 20)
    floor_part(q, None, 10.0, None, None)
    gain(q, 10.0)  # measured under its floor: no gain, no bound
    assert q.saved_ms is None and q.gain_bound == ""


def test_a_part_the_calls_put_on_either_side_of_the_walk_share_is_walked_in_every_run():
    from hwlab.examine.parts import WALK_SHARE_PCT, walks

    def part(share: float) -> Part:
        return Part(name="elementwise/reduction", t_ms=share / 10, share_pct=share, n_items=1, attributable=True)

    below = 0.85 * WALK_SHARE_PCT
    assert not walks(part(below), [], 0.0)  # steady calls, under the cut: not walked
    assert walks(part(below), [], 0.3)  # the calls disagree by +-30%: a re-run may read it over the cut
    assert walks(part(below), [Parts([part(1.1 * WALK_SHARE_PCT)], 10.0, "", None)], 0.0)  # a repeat did
    assert not walks(part(0.3 * WALK_SHARE_PCT), [], 0.3)  # far under it: still not walked
