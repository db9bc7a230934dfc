"""The acceptance figures of the recorded H200 runs, re-derived from raw timings.

These read committed evidence (recorded on the H200 by tools/refresh_gpu_evidence.py);
ratios are recomputed from the stored medians, not trusted from stored summaries.
"""
import pytest

from hwlab.core.evidence import recorded
from hwlab.diagnosis.flowchart import diagnose


def test_copy_probe_reaches_95pct_of_torch_copy():
    ev = recorded("probe_vs_torch")
    comp = next(c for c in ev.extra["comparisons"] if c["what"].startswith("copy"))
    probe = ev.result("hbm_copy[triton]")
    assert probe.gbps == pytest.approx(comp["probe_gbps"])
    best_torch = max(v for k, v in comp.items() if k.startswith("torch_copy") and k.endswith("gbps"))
    assert probe.gbps / best_torch >= 0.95


def test_bf16_gemm_probe_within_5pct_of_torch_matmul():
    ev = recorded("probe_vs_torch")
    comp = next(c for c in ev.extra["comparisons"] if "GEMM" in c["what"])
    g = ev.result("gemm[bf16]")
    assert g.params["m"] == g.params["n"] == g.params["k"] == 8192
    assert g.tflops == pytest.approx(2 * 8192**3 / (g.t_ms * 1e-3) / 1e12)
    assert abs(g.tflops / comp["torch_matmul_utils_benchmark_tflops"] - 1) <= 0.05


def test_doctor_ceilings_are_plausible_for_an_h200():
    ev = recorded("doctor")
    c = ev.ceilings
    spec = ev.extra["spec"]
    assert spec["name"] == "H200"
    assert 0.7 * spec["hbm_gbps"] <= c["copy_gbps"] <= spec["hbm_gbps"]
    assert c["gemm_tflops"]["bf16"] <= spec["bf16_tflops"]
    assert c["gemm_tflops"]["fp32"] < c["gemm_tflops"]["tf32"] < c["gemm_tflops"]["bf16"] < c["gemm_tflops"]["fp8"]


def test_lab01_acceptance():
    ev = recorded("lab01_bandwidth")
    t = {r.name: r for r in ev.results}
    copy = ev.ceilings["copy_gbps"]
    assert t["unfused"].t_ms / t["fused"].t_ms >= 2.5
    assert t["fused"].gbps >= 0.8 * copy
    assert t["strided"].t_ms / t["coalesced"].t_ms >= 3.0
    for r in t.values():
        assert r.device == "NVIDIA H200" and r.timer == "cuda-event"
        assert r.rel_err is not None and r.rel_err <= r.tol


def test_lab01_lands_on_the_bandwidth_leaf_and_the_fix_leaves_it():
    ev = recorded("lab01_bandwidth")
    fe = ev.extra["flowchart_evidence"]
    assert diagnose(fe["unfused"]).leaf_id == "G"
    assert diagnose(fe["strided"]).leaf_id == "G"
    assert diagnose(fe["fused"]).leaf_id != "G"
    assert diagnose(fe["coalesced"]).leaf_id != "G"
    # the counted figures (ncu) agree with the estimate's story
    c = ev.extra["counters"]
    assert c["strided"]["sector_amplification"] > 4 * c["coalesced"]["sector_amplification"]


def test_lab01_walks_answer_every_question_by_measurement():
    """recorded/h200/lab01_bandwidth.json: every case's D and K come from its one-process
    service step recorded in the same run (re-derived: the step over the case's own median x
    calls; one rank, so no tail), no walk holds a by-hand answer, and every walk that reaches D
    is fully measured. Fails on a file recorded before Lab 1 measured D/K: re-record with
    --only lab01."""
    ev = recorded("lab01_bandwidth")
    t = {r.name: r for r in ev.results}
    svc = ev.extra.get("service", {})
    for k, fe in ev.extra["flowchart_evidence"].items():
        assert not {"single_gpu_slow", "multi_gpu_or_service_slow", "rank_tail"} & set(fe), k
        assert k in svc, f"{k}: no service step recorded (re-record with --only lab01)"
        s = svc[k]
        assert s["service_predicted_ms"] == pytest.approx(s["service_calls"] * t[k].t_ms)
        assert fe["e2e_slowdown"] == pytest.approx(s["service_step_ms"] / s["service_predicted_ms"])
        assert fe["n_ranks"] == 1 and fe["rank_tail_pct"] == 0.0
        walk = diagnose(fe)
        assert not walk.by_hand, walk.explain()
        if "D" in walk.path:
            assert walk.fully_measured, walk.explain()
    assert "D" in diagnose(ev.extra["flowchart_evidence"]["fused"]).path, "the fused chain sits within its floor"


def test_scenarios_answer_every_question_by_measurement():
    """recorded/h200/scenarios.json: B, D and K of every scenario walk re-derived from the
    recorded timings (dtype path: each GEMM against bf16's rate, its service step over its own
    median x calls; workload: the tuned shape against this machine's floor, the measured mixed
    step over the single-shape prediction, the one process's steps for the rank tail). Fails on
    a scenarios.json recorded before the scenarios measured B/D/K: re-record with --only scenarios."""
    import statistics

    from hwlab.labs.scenarios import floor_ms, rank_tail_pct

    sc = recorded("scenarios")
    assert sc.device == "NVIDIA H200"
    dtype_ms = dict(zip(("fp32", "tf32", "bf16", "bf16_unaligned"), sc.results[:4]))
    dp = sc.extra["dtype_path"]
    for k, ev in dp["flowchart_evidence"].items():
        m, svc = dtype_ms[k], dp["service"][k]
        assert ev["slowdown_vs_floor"] == pytest.approx(dtype_ms["bf16"].tflops / m.tflops)
        assert ev["tensor_pct_of_peak"] == pytest.approx(100 * m.tflops / dtype_ms["bf16"].tflops)
        assert svc["service_predicted_ms"] == pytest.approx(svc["service_calls"] * m.t_ms)
        assert ev["e2e_slowdown"] == pytest.approx(svc["service_step_ms"] / svc["service_predicted_ms"])
        assert ev["n_ranks"] == 1 and ev["rank_tail_pct"] == 0.0
        walk = diagnose(ev)
        assert walk.fully_measured and not any(b in ev for b in ("single_gpu_slow", "multi_gpu_or_service_slow")), \
            walk.explain()
    fe = dp["flowchart_evidence"]
    assert diagnose(fe["fp32"]).leaf_id == "I" and diagnose(fe["bf16"]).leaf_id == "OK"

    w = sc.extra["workload"]
    tuned, buckets = sc.results[4], sc.results[5:]
    rate, copy = w["ceilings"]["gemm_tflops"], w["ceilings"]["copy_gbps"]
    mix = w["mix"]
    flops = sum(2 * M * N * K * c for _l, M, N, K, c in mix)
    assert w["measured_step_ms"] == pytest.approx(statistics.median(w["step_samples_ms"]))
    pred_tuned = flops / (tuned.tflops * 1e12) * 1e3
    pred_buckets = sum(b.t_ms * row[4] for b, row in zip(buckets, mix))
    t, bk = w["flowchart_evidence"]["tuned-shape prediction"], w["flowchart_evidence"]["bucketed prediction"]
    assert t["slowdown_vs_floor"] == pytest.approx(tuned.t_ms / floor_ms(tuned.n_flops, tuned.n_bytes, rate, copy))
    assert t["e2e_slowdown"] == pytest.approx(w["measured_step_ms"] / pred_tuned)
    assert bk["e2e_slowdown"] == pytest.approx(w["measured_step_ms"] / pred_buckets)
    floor_b = sum(floor_ms(b.n_flops, b.n_bytes, rate, copy) * row[4] for b, row in zip(buckets, mix))
    assert bk["slowdown_vs_floor"] == pytest.approx(pred_buckets / floor_b)
    for ev in (t, bk):
        assert ev["n_ranks"] == 1 and ev["rank_tail_pct"] == pytest.approx(rank_tail_pct([w["step_samples_ms"]]))
        assert diagnose(ev).fully_measured
    assert diagnose(t).leaf_id == "M" and diagnose(bk).leaf_id != "M"
