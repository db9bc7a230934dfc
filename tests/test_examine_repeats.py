"""Verdicts of `hwlab examine` that hold run to run: a walk of repeated measurements whose
disagreement marks the leaf BORDERLINE with its alternatives named, no rank-tail question for one
process, fixes checked against the machine (bf16, ceilings keyed by thread count), J's detail
matching the part's kind, the incident's fix from the headline part, and wasted traffic by the
per-op cache bound on both sides of it. Live tests run on a shared, busy CPU and assert no timing."""
import json

import pytest
import torch

from hwlab.core import ceilings
from hwlab.diagnosis.flowchart import diagnose
from hwlab.examine import examine
from hwlab.examine.part_advice import actions_for, j_detail
from hwlab.examine.part_record import Part
from hwlab.examine.rates import CACHE_BOUND_RULE, WASTE_RATIO, dram_bytes_lower_bound, traffic_ratio
from hwlab.examine.repeats import RUN_TO_RUN, alternatives, ceiling_band, merge_spreads, spreads_over

MIB = 2**20


# ------------------------------------------------------------- wasted traffic: the per-op cache bound
def test_the_cache_bound_is_moved_bytes_less_one_cache_per_op_boundary():
    assert dram_bytes_lower_bound(1000, 100, 3) == 700
    assert dram_bytes_lower_bound(1000, 100, 20) == 0  # never below nothing
    assert dram_bytes_lower_bound(1000, None, 3) is None and dram_bytes_lower_bound(1000, 100, None) is None
    assert "moved - cache x op boundaries" in CACHE_BOUND_RULE


def test_a_12_op_chain_of_32_mib_tensors_is_wasted_traffic_past_a_32_mb_cache_not_past_a_300_mib_one():
    """Each op reads one 32 MiB tensor and writes one (the issue's chain): moved 24 tensors, required 2
    (x in, the result out). With a 32 MiB cache the bound leaves 12 tensors that must cross DRAM: 6x
    the required bytes, F answers YES. With a 300 MiB cache (this VM's L3) 12 boundaries could
    serve it all: no waste is proven and no ratio is given."""
    t = 8 * MIB * 4
    moved, required = 24 * t, 2 * t
    r = traffic_ratio(moved, required, 32 * MIB, 12)
    assert r == pytest.approx(6.0) and r >= WASTE_RATIO
    d = diagnose({"slowdown_vs_floor": 10.0, "traffic_ratio_estimated": r})
    assert d.path == ["B", "F", "G"] and "moved - cache x op boundaries" in d.steps[1].reason
    assert traffic_ratio(moved, required, 300 * MIB, 12) is None


def test_either_side_of_the_waste_threshold_by_the_bound():
    cache, n_ops, required = 10 * MIB, 4, 100 * MIB
    at = 2 * required + cache * n_ops  # the bound lands exactly on 2x the required bytes
    assert traffic_ratio(at, required, cache, n_ops) == pytest.approx(WASTE_RATIO)
    below = traffic_ratio(at - MIB, required, cache, n_ops)
    assert below is not None and below < WASTE_RATIO
    for r, leaf_f in ((traffic_ratio(at, required, cache, n_ops), "yes"), (below, "no")):
        d = diagnose({"slowdown_vs_floor": 4.0, "traffic_ratio_estimated": r, "dram_pct_estimated": 10.0})
        assert d.steps[1].question == "F" and d.steps[1].answer == leaf_f
    # a bound at or under the required bytes proves nothing: no ratio
    assert traffic_ratio(required + cache * n_ops, required, cache, n_ops) is None


# ------------------------------------------------------------- one process: K is not asked
def test_one_process_never_reaches_the_rank_tail_question():
    ev = {"slowdown_vs_floor": 1.1, "e2e_slowdown": 2.3, "n_ranks": 1}
    d = diagnose(ev)
    assert d.leaf_id == "M" and d.undecided is None
    k = next(s for s in d.steps if s.question == "K")
    assert k.answer == "not applicable" and k.metric == "n_ranks"
    assert diagnose({**ev, "n_ranks": 4}).undecided.id == "K"  # with ranks and no tail figure: asked


# ------------------------------------------------------------- repeats, spreads, alternatives
def test_repeats_that_differ_name_the_other_leaf_and_agreeing_clear_ones_do_not():
    ev = {"slowdown_vs_floor": 3.0, "dram_pct_estimated": 20.0, "tensor_pct_of_peak": 40.0}
    reps = [{**ev, "tensor_pct_of_peak": v} for v in (38.0, 45.0, 62.0)]  # one repeat crosses H's 50%
    sp = spreads_over(reps, ev)
    assert sp["tensor_pct_of_peak"]["lo"] == 38.0 and sp["tensor_pct_of_peak"]["hi"] == 62.0
    full = {**ev, "metric_spreads": sp}
    d = diagnose(full)
    assert d.leaf_id == "I" and any(s.borderline for s in d.steps)
    assert alternatives(full, d, ["I", "I", "J"]) == ["J"]
    steady = [{**ev, "tensor_pct_of_peak": v} for v in (10.0, 11.0, 12.0)]
    full = {**ev, "tensor_pct_of_peak": 11.0, "metric_spreads": spreads_over(steady, {**ev, "tensor_pct_of_peak": 11.0})}
    d = diagnose(full)
    assert d.leaf_id == "I" and alternatives(full, d, ["I", "I", "I"]) == [] and not d.borderline


def test_a_ceilings_own_spread_widens_the_metrics_judged_against_it():
    bands = {"copy": {"t_ms": 10.0, "t_p10_ms": 8.0, "t_p90_ms": 20.0}}
    lo, hi = ceiling_band(bands, ("copy",))
    assert lo == pytest.approx(0.5) and hi == pytest.approx(1.25)
    ev = {"slowdown_vs_floor": 2.0, "dram_pct_estimated": 50.0, "e2e_slowdown": 1.0}
    sp = spreads_over([ev, ev], ev, (lo, hi))
    r = RUN_TO_RUN  # identical repeats still spread run to run, then times the ceiling's own band
    assert sp["slowdown_vs_floor"]["lo"] == pytest.approx(2.0 * (1 - r) * 0.5)
    assert sp["slowdown_vs_floor"]["hi"] == pytest.approx(2.0 * (1 + r) * 1.25)
    assert "n" not in sp["slowdown_vs_floor"]  # widened here, once: flowchart_checks does not widen it again
    assert sp["dram_pct_estimated"]["lo"] == pytest.approx(50.0 * (1 - r) / 1.25)
    assert sp["dram_pct_estimated"]["hi"] == pytest.approx(50.0 * (1 + r) / 0.5)
    assert (sp["e2e_slowdown"]["lo"], sp["e2e_slowdown"]["hi"]) == (pytest.approx(1 - r), pytest.approx(1 + r))
    assert ceiling_band({}, ("copy",)) is None


def test_a_ceiling_re_timed_in_another_load_phase_widens_its_band():
    """Its p10-p90 came from calls milliseconds apart; the rates re-timed across the examination
    join the band, so a threshold the re-timed ceiling moves a metric across is BORDERLINE."""
    bands = {"gemm fp32": {"t_ms": 1.0, "t_p10_ms": 0.95, "t_p90_ms": 1.05}}
    lo, hi = ceiling_band(bands, ("gemm fp32",))
    assert lo == pytest.approx(1 / 1.05) and hi == pytest.approx(1 / 0.95)
    band = ceiling_band(bands, ("gemm fp32",), {"gemm fp32": [0.06, 0.1, 0.12]}, {"gemm fp32": 0.1})
    assert band == (pytest.approx(0.6), pytest.approx(1.2))
    ev = {"slowdown_vs_floor": 2.5, "dram_pct_estimated": 10.0, "tensor_pct_of_peak": 66.0}
    steady = diagnose({**ev, "metric_spreads": spreads_over([ev, ev, ev], ev, (lo, hi))})
    assert steady.leaf_id == "J" and not steady.borderline  # 66%: past run to run and its p10-p90, clear
    sp = spreads_over([ev, ev, ev], ev, band)
    tensor = sp["tensor_pct_of_peak"]
    assert tensor["lo"] == pytest.approx(66.0 * (1 - RUN_TO_RUN) / 1.2)
    assert tensor["hi"] == pytest.approx(66.0 * (1 + RUN_TO_RUN) / 0.6)
    full = {**ev, "metric_spreads": sp}
    d = diagnose(full)
    assert d.leaf_id == "J" and d.borderline and "I" in alternatives(full, d, ["J", "J", "J"])
    assert ceiling_band(bands, ("gemm fp32",), {"gemm fp32": [0.1]}, {"gemm fp32": None}) == (lo, hi)  # no rate in use


def test_a_leaf_a_re_run_can_change_is_borderline_even_when_the_repeats_agree():
    """Three blocks in one load phase can agree closely while the next run's medians differ by
    RUN_TO_RUN: a threshold inside that is BORDERLINE in this run too, with the other leaf named."""
    ev = {"slowdown_vs_floor": 1.4, "e2e_slowdown": 1.0}  # under B's 1.5x: OK
    d = diagnose({**ev, "metric_spreads": spreads_over([ev, ev, ev], ev)})
    assert d.leaf_id == "OK" and d.borderline
    full = {**ev, "metric_spreads": spreads_over([ev, ev, ev], ev)}
    far = {"slowdown_vs_floor": 1.1, "e2e_slowdown": 1.0}  # a re-run 15% slower stays under 1.5x
    assert not diagnose({**far, "metric_spreads": spreads_over([far] * 3, far)}).borderline
    assert alternatives(full, d, ["OK", "OK", "OK"]) != []


def test_the_retimer_re_times_both_cpu_ceilings_at_their_recorded_sizes():
    from hwlab.examine.repeats import Retimer

    bands = {"copy": {"params": {"size_mib": 4}}, "gemm fp32": {"params": {"m": 64, "n": 64, "k": 64}},
             "gemm bf16": {"params": {"m": 64, "n": 64, "k": 64}}}
    rates = Retimer(bands, torch.device("cpu"))()
    assert set(rates) == {"copy", "gemm fp32"} and all(v > 0 for v in rates.values())
    assert Retimer({"copy": {"params": {}}}, torch.device("cpu"))() == {}  # no recorded size: not re-timed


def test_the_pooled_parts_are_read_from_a_call_that_did_not_wait_for_a_cpu():
    from hwlab.examine.parts import QUIET_WAIT_SHARE, quiet_calls

    assert quiet_calls([10.0, 12.0, 30.0], [0.0, 0.5, 20.0]) == [0, 1]  # 0%, 4%; 67% waited inside its ops
    assert quiet_calls([10.0, 12.0, 30.0], []) == [0, 1, 2]  # not reported: any call
    assert quiet_calls([10.0, 10.0], [0.0, 10.0 * QUIET_WAIT_SHARE]) == [0, 1]
    # an evenly loaded host (every call waited about as long) keeps every call; a preempted one is left out
    assert quiet_calls([10.0] * 5, [8.0, 8.2, 7.9, 8.1, 8.3]) == [0, 1, 2, 3, 4]
    assert quiet_calls([10.0] * 5, [0.2, 0.1, 5.0, 0.3, 0.2]) == [0, 1, 3, 4]


def test_a_part_that_heads_a_repeat_lends_the_headline_its_leaf_and_alternatives():
    from hwlab.examine.part_record import Parts

    def walked(name: str, ev: dict, saved: float, alts: list) -> Part:
        p = Part(name=name, t_ms=10.0, share_pct=45.0, n_items=1, attributable=True, saved_ms=saved)
        p.evidence, p.walk, p.alternatives = ev, diagnose(ev), alts
        return p

    gemm_ev = {"slowdown_vs_floor": 3.0, "dram_pct_estimated": 10.0, "tensor_pct_of_peak": 20.0}
    elem_ev = {"slowdown_vs_floor": 3.0, "dram_pct_estimated": 80.0}
    pooled = [walked("gemm float32", gemm_ev, 5.0, []), walked("elementwise/reduction", elem_ev, 4.0, ["J"])]
    same = Parts([walked("gemm float32", gemm_ev, 5.0, []), walked("elementwise/reduction", elem_ev, 1.0, [])],
                 20.0, "", None)
    other = Parts([walked("gemm float32", gemm_ev, 1.0, []), walked("elementwise/reduction", elem_ev, 5.0, [])],
                  20.0, "", None)
    assert Parts(pooled, 20.0, "", None, repeats=[same, same, same]).headline_alternatives == []
    parts = Parts(pooled, 20.0, "", None, repeats=[same, other, same])
    assert parts.headline.name == "gemm float32" and parts.headline.leaf_id == "I"
    assert parts.headline_alternatives == ["G", "J"]  # a re-run may head with the chain, on G or its J


def test_a_runs_own_spread_and_the_repeats_range_are_joined_not_one_dropped():
    own = {"e2e_slowdown": {"lo": 0.9, "hi": 1.1, "n": 15, "what": "p10-p90 over 15 chunks"}}
    reps = {"e2e_slowdown": {"lo": 1.0, "hi": 2.4, "n": 4, "what": "range over 3 repeats"}}
    m = merge_spreads(reps, own)["e2e_slowdown"]
    assert m["lo"] == 0.0 and m["hi"] == pytest.approx(3.8)  # the repeats' range widened once, held >= 0
    ev = {"slowdown_vs_floor": 1.0, "e2e_slowdown": 2.3, "n_ranks": 1, "metric_spreads": merge_spreads(reps, own)}
    d = diagnose(ev)
    assert d.steps[1].question == "D" and d.steps[1].borderline  # 2.3x under load, but 1.2 is inside its spread
    assert "OK" in alternatives(ev, d, [])


# ------------------------------------------------------------- fixes checked against the machine
def test_bf16_support_reads_the_cpu_flags():
    ok, why = ceilings.bf16_support("cpu", cpuinfo="flags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n")
    assert ok and "avx512_bf16" in why
    ok, why = ceilings.bf16_support("cpu", cpuinfo="flags\t\t: fpu sse2 avx2 avx512f\n")
    assert not ok and "emulated" in why


def test_a_bf16_gemm_measured_no_faster_than_fp32_is_not_offered(monkeypatch):
    monkeypatch.setattr(ceilings, "bf16_support", lambda device=None, cpuinfo=None: (True, "flags"))
    c = ceilings.Ceilings(device="cpu", copy_gbps=10.0, gemm_tflops={"fp32": 0.1, "bf16": 0.02})
    ok, why = ceilings.bf16_gain(c, "cpu")
    assert not ok and "not above fp32" in why
    c.gemm_tflops["bf16"] = 0.5
    assert ceilings.bf16_gain(c, "cpu")[0]
    p = Part(name="gemm float32", t_ms=1.0, share_pct=90.0, n_items=1, attributable=True, flops=10**9)
    acts = actions_for(p, "I", lambda: (False, "no AMX_BF16 in the CPU flags"))
    assert not any(a.startswith("run the matmul in bf16") for a in acts)
    assert any("not bf16 here" in a for a in acts) and any("withheld" in n for n in p.notes)
    assert any(a.startswith("run the matmul in bf16") for a in actions_for(p, "I", lambda: (True, "AMX")))


def test_cpu_ceilings_are_cached_per_thread_count(tmp_path, monkeypatch):
    monkeypatch.setenv("HWLAB_CACHE", str(tmp_path))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ceilings.cache_path("cpu")
        ceilings.save(ceilings.Ceilings(device="cpu", copy_gbps=5.0, gemm_tflops={"fp32": 0.01}, n_threads=1))
        assert ceilings.load_cached("cpu").n_threads == 1
        torch.set_num_threads(2)
        assert ceilings.cache_path("cpu") != one and ceilings.load_cached("cpu") is None
        # a cache file of another thread count under this key is not used either
        ceilings.cache_path("cpu").write_text(json.dumps(
            {"device": "cpu", "copy_gbps": 5.0, "gemm_tflops": {"fp32": 0.01}, "n_threads": 1}))
        assert ceilings.load_cached("cpu") is None
    finally:
        torch.set_num_threads(before)


def test_a_gemm_part_faster_than_its_byte_floor_with_cache_resident_weights_is_floored_on_flops():
    from hwlab.examine.part_walk import floor_part
    p = Part(name="gemm float32", t_ms=100.0, share_pct=80.0, n_items=50, attributable=True,
             moved_bytes=100 * 10**6, floor_bytes=100 * 10**6, flops=4 * 10**9, n_ops=50)
    floor_part(p, "float32", copy_gbps=0.5, gemm_tflops=0.16, cache_bytes=300 * MIB)  # bytes alone: 200 ms
    assert p.floor_source.startswith("FLOPs") and p.floor_ms == pytest.approx(25.0)
    assert any("not DRAM's" in n for n in p.notes)
    q = Part(name="gemm float32", t_ms=100.0, share_pct=80.0, n_items=50, attributable=True,
             moved_bytes=100 * 10**6, floor_bytes=100 * 10**6, flops=4 * 10**9, n_ops=50)
    floor_part(q, "float32", copy_gbps=0.5, gemm_tflops=0.16, cache_bytes=8 * MIB)  # past the cache: DRAM's
    assert q.floor_source.startswith("bytes") and q.ceilings_raised  # the rate proves the copy ceiling low
    assert q.floor_ms == pytest.approx(100.0, rel=1e-6) and not any("not DRAM's" in n for n in q.notes)


# ------------------------------------------------------------- J's detail by the part's kind
def test_j_detail_never_calls_a_dense_gemm_random_rows():
    gemm = Part(name="gemm float32", t_ms=1.0, share_pct=90.0, n_items=1, attributable=True, gbps=1.0,
                flops=10**9, floor_source="FLOPs at the measured fp32 GEMM ceiling")
    j = j_detail(gemm, None, 10.0, None, None, [])
    assert j["cause"] == "GEMM efficiency" and "random rows" not in j["why"]
    gather = Part(name="gather/scatter", t_ms=1.0, share_pct=90.0, n_items=1, attributable=True, gbps=1.0)
    assert j_detail(gather, None, 10.0, None, None, [])["cause"] == "memory latency"


# ------------------------------------------------------------- live: a GPT-2-like block, a small conv net
class _Block(torch.nn.Module):
    """A GPT-2-shaped block (hidden 768, 12 heads, MLP 4x) at 64 tokens."""

    def __init__(self, d: int = 768, heads: int = 12):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


def _convnet():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, stride=2, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(64, 10))


def _no_k(ex) -> bool:
    walks = [ex.diagnosis] + [p.walk for p in ex.parts.parts if p.walk is not None]
    return all(s.answer == "not applicable" for w in walks for s in w.steps if s.question == "K") and \
        all(w.undecided is None or w.undecided.id != "K" for w in walks)


def _examine_twice(which, tmp_path, monkeypatch):
    monkeypatch.setenv("HWLAB_CACHE", str(tmp_path))
    torch.manual_seed(0)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = _Block() if which == "gpt2_block" else _convnet()
        x = torch.randn(1, 64, 768) if which == "gpt2_block" else torch.randn(1, 3, 64, 64)
        runs = [examine(model, x, max_total_s=4.0, name=which) for _ in range(2)]
    finally:
        torch.set_num_threads(before)
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("which", ["gpt2_block", "convnet"])
def test_each_examination_marks_borderline_from_its_own_repeats_and_never_asks_k(which, tmp_path, monkeypatch):
    """The same model examined twice (one thread): each run names a headline and a leaf, says
    BORDERLINE exactly when it names alternatives, walks every part with its spread, never asks K,
    and drafts the headline part's fix."""
    runs = _examine_twice(which, tmp_path, monkeypatch)
    for ex in runs:
        assert _no_k(ex), ex.report()
        assert ex.evidence["n_ranks"] == 1
        assert ex.headline is not None and ex.leaf_id is not None, ex.report()
        assert ex.headline.name in ex.incident.fix and f"leaf {ex.leaf_id}" in ex.incident.fix
        d = ex.to_dict()
        assert d["borderline"] == bool(d["alternatives"]) and len(d["parts"]["repeat_headlines"]) == 3
        walk = ex.headline.walk.explain()
        assert "spread not recorded" not in walk.split("=>")[0], walk  # every answer before the leaf has its spread


@pytest.mark.slow
@pytest.mark.parametrize("which", ["gpt2_block", "convnet"])
def test_two_identical_examinations_agree_or_both_say_borderline(which, tmp_path, monkeypatch):
    """The same headline leaf twice, or a BORDERLINE headline both times whose alternatives cover the
    other run's leaf; on a busy host too (CPU times net of the run-queue wait, ceilings re-timed
    across the examination: :mod:`hwlab.examine.repeats`)."""
    a, b = _examine_twice(which, tmp_path, monkeypatch)
    if a.leaf_id != b.leaf_id:
        assert a.borderline and b.borderline, (a.leaf_id, a.alternatives, b.leaf_id, b.alternatives)
        assert b.leaf_id in a.alternatives or a.leaf_id in b.alternatives


@pytest.mark.slow
def test_a_12_op_chain_over_8m_floats_lands_on_g_past_a_32_mb_cache():
    """The issue's chain: 12 elementwise ops over 8 M floats (32 MiB a tensor) against a 32 MiB
    last-level cache (given: this VM's is larger). The bound (moved - cache x op boundaries) is
    load-free, so the walk lands on G idle or busy, by the traffic ratio alone if need be."""
    def chain12(x):
        y = torch.relu(x * 1.5 + 0.25) * x
        y = torch.sigmoid(y) + 1.0
        y = torch.tanh(y * 0.5 - 0.1) * x
        return (y + 0.3) * 2.0

    n = 8 * MIB
    ex = examine(chain12, make_inputs=lambda: (torch.randn(n),), max_total_s=2.0, cache_bytes=32 * MIB)
    assert ex.counts["n_ops"] == 12 and ex.counts["cache_bytes"] == 32 * MIB
    assert ex.evidence["traffic_ratio_estimated"] >= WASTE_RATIO, ex.counts
    assert ex.diagnosis.leaf_id == "G" and ex.leaf_id == "G", ex.report()
    chain = ex.headline
    assert chain.name == "elementwise/reduction" and chain.traffic_ratio >= WASTE_RATIO
    assert "fuse the chain" in ex.incident.fix
