"""Node baselines (record on this machine, compare, injected deviations of each class), the
incident record (never overwrites), the small scenarios, and the flowchart walkthrough widget."""
import copy
import json

import pytest

from hwlab import baseline as B
from hwlab import flowchart, incident, nb
from hwlab.evidence import load, recorded
from hwlab.labs import scenarios


@pytest.fixture(scope="module")
def live():
    return B.record(quick=True)


def test_record_has_every_part_or_says_why(live):
    names = {m.name.split("[")[0] for m in live.results}
    assert {"hbm_copy", "gemm", "attention", "rmsnorm", "kv_cache_read", "launch_overhead"} <= names
    for m in live.results:
        if m.name != "launch_overhead":
            assert m.rel_err is not None and m.rel_err <= m.tol
    rp = live.extra["runtime_path"]
    assert rp["gemm_calls"] == 5 and rp["fp8_hits"] == 4 and rp["hit_rate_pct"] == 80.0
    import torch
    if not torch.cuda.is_available():
        assert "p2p" in live.extra["missing"] and "needs" in live.extra["missing"]["p2p"] or \
            live.extra["missing"]["p2p"] == "no GPU"


def test_unchanged_rerun_matches(live, tmp_path):
    p = live.save(tmp_path / "b.json")
    c = B.compare(load(p), load(p))
    assert c.ok and "runtime path" in c.checked


def _inject(ev, kind):
    ev = copy.deepcopy(ev)
    if kind == "hardware":
        for m in ev.results:
            if m.name.startswith("gemm"):
                m.t_ms *= 1.25
    elif kind == "topology":
        ev.extra["topology"] = ev.extra.get("topology") or {}
        ev.extra["topology"]["numa_affinity"] = {"GPU0": 7}
    elif kind == "runtime":
        ev.versions["torch"] = "0.0.1"
        ev.extra["runtime_path"]["hit_rate_pct"] -= 30
    return ev


@pytest.mark.parametrize("kind", ["hardware", "topology", "runtime"])
def test_injected_deviation_is_classified(kind):
    base = recorded("baseline")
    c = B.compare(base, _inject(base, kind))
    assert not c.ok and kind in c.categories()
    assert all(d.next_step for d in c.deviations)


def test_recorded_h200_baseline_and_rerun_agree():
    base, rerun = recorded("baseline"), recorded("baseline_rerun")
    assert base.device == "NVIDIA H200"
    c = B.compare(base, rerun)
    assert c.ok, c.summary()
    assert base.extra["runtime_path"]["hit_rate_pct"] == pytest.approx(80.0)


def test_latency_rise_is_flagged_and_missing_parts_reported(live):
    now = copy.deepcopy(live)
    for m in now.results:
        if m.name == "launch_overhead":
            m.params["us_per_launch"] *= 2.5
    now.results = [m for m in now.results if not m.name.startswith("rmsnorm")]
    c = B.compare(live, now)
    assert any(d.what.startswith("launch_overhead") and d.category == "hardware" for d in c.deviations)
    assert any(d.category == "missing" and d.what.startswith("rmsnorm") for d in c.deviations)
    with pytest.raises(ValueError, match="two baseline records"):
        B.compare(recorded("doctor"), live)


def test_one_process_per_node_records(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert not B.should_record_on_this_rank()
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert B.should_record_on_this_rank()


def test_fleet_table(live, tmp_path):
    p1 = live.save(tmp_path / "n1.json")
    p2 = _inject(live, "hardware").save(tmp_path / "n2.json")
    rows = B.fleet_table([p1, p2], live)
    assert [r["verdict"] for r in rows] == ["ok", "hardware"]


def test_hit_rate_counting_on_gpu_kernel_names():
    ev = [("nvjet_sm90_qqtst_128x128_64x4_1x2_h_bz_coopA_TNT", "CUDA"),
          ("nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopB_NNT", "CUDA"),
          ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(...)>", "CUDA"),
          ("aten::mm", "CPU")]
    r = B.hit_rate_from_events(ev, gpu=True)
    assert r["gemm_calls"] == 2 and r["fp8_hits"] == 1 and r["dequant_copies"] == 1


def test_hit_rate_ignores_ranges_mirrored_on_the_gpu_timeline():
    # names as the H200 profile of Lab 4's mixed path showed them: the kit's record_function
    # ranges appear as CUDA events too, and "hwlab::quant_fp8" contains "fp8"
    ev = [("hwlab::quant_fp8", "CUDA"), ("_row_amax_kernel", "CUDA"), ("_quant_tensor_kernel", "CUDA"),
          ("nvjet_sm90_qqtst_128x128_128x6_1x1_h_bz_coopA_algo2_ovscale_TNT", "CUDA"),
          ("hwlab::dequant_fp8", "CUDA"), ("_dequant_rows_kernel", "CUDA"),
          ("nvjet_sm90_tst_512x8_64x3_2x1_v_bz_TNT", "CUDA"),
          ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>(...)", "CUDA"),
          ("_fp8w_gemm_kernel", "CUDA")]
    r = B.hit_rate_from_events(ev, gpu=True)
    assert r["gemm_calls"] == 3 and r["fp8_hits"] == 2 and r["dequant_copies"] == 1
    assert set(r["gemm_names"]) == {ev[3][0], ev[6][0], ev[8][0]}


def test_recorded_h200_recheck_passes_with_the_stated_tolerance():
    # recorded on the H200 after the latency tolerance became 100%: baseline, then an
    # unchanged re-run in the same session, compared there and here
    base, rerun = recorded("baseline_recheck"), recorded("baseline_recheck_rerun")
    assert base.device == rerun.device == "NVIDIA H200" and base.recorded_at < rerun.recorded_at
    c = B.compare(base, rerun)
    assert c.ok, c.summary()
    lat = {m.name: m.t_ms for m in base.results if "launch" in m.name}
    assert lat, "the recheck must include the launch-overhead probe the first re-run flagged"


def test_incident_record_never_overwrites(tmp_path):
    d = flowchart.diagnose({"single_gpu_slow": False, "e2e_slowdown": 2.0, "rank_tail_pct": 40})
    inc = incident.from_diagnosis("t", recorded("doctor"), d, symptom_scope="multi-GPU", symptom="s",
                                  fix="f", reverify="r")
    md1, js1 = incident.save(inc, tmp_path)
    first = md1.read_text()
    md2, js2 = incident.save(inc, tmp_path)
    assert md1 != md2 and md1.read_text() == first
    assert "NCCL / NVLink / NUMA / rank mapping" in first and "NVIDIA H200" in first
    assert incident.load(js1).diagnosis_path == ["B", "D", "K", "L"]
    with pytest.raises(ValueError, match="symptom_scope"):
        incident.from_diagnosis("t", None, d, symptom_scope="galaxy", symptom="", fix="", reverify="")


def test_cli_baseline_and_incident(tmp_path, monkeypatch):
    import subprocess
    import sys
    run = lambda *a: subprocess.run([sys.executable, "-m", "hwlab.cli", *a], capture_output=True, text=True)  # noqa: E731
    r = run("baseline", "record", "--quick", "--out", str(tmp_path / "b.json"))
    assert r.returncode == 0, r.stderr
    r = run("baseline", "compare", str(tmp_path / "b.json"), str(tmp_path / "b.json"), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["ok"] is True
    assert run("baseline", "record", "--quick", "--out", str(tmp_path / "b.json")).returncode == 2  # exists
    obs = tmp_path / "obs.json"
    obs.write_text(json.dumps({"slowdown_vs_floor": 3.0, "dram_pct_estimated": 80}))
    r = run("incident", "--title", "x", "--scope", "single-card", "--symptom", "s", "--fix", "fuse",
            "--reverify", "lab01 probe", "--observations", str(obs), "--out", str(tmp_path / "inc"))
    assert r.returncode == 0 and "bandwidth / layout / fusion" in r.stdout
    assert len(list((tmp_path / "inc").glob("*.md"))) == 1


def test_scenarios_on_cpu_and_recorded():
    d = scenarios.dtype_path(size=128, copy_gbps=10.0)
    assert set(d["flowchart_evidence"]) == {"fp32", "bf16", "bf16_unaligned"}
    for m in d["measurements"].values():
        assert m.rel_err <= m.tol
    sc = recorded("scenarios")
    fe = sc.extra["dtype_path"]["flowchart_evidence"]
    assert flowchart.diagnose(fe["fp32"]).leaf_id == "I"
    assert flowchart.diagnose(fe["bf16"]).leaf_id == "OK"
    w = sc.extra["workload"]["flowchart_evidence"]
    assert flowchart.diagnose(w["tuned-shape prediction"]).leaf_id == "M"
    assert flowchart.diagnose(w["bucketed prediction"]).leaf_id == "OK"


def test_every_leaf_has_a_recorded_scenario():
    leaves = set()
    leaves |= {flowchart.diagnose(v).leaf_id for v in recorded("lab01_bandwidth").extra["flowchart_evidence"].values()}
    leaves |= {flowchart.diagnose(v).leaf_id for v in recorded("lab02_registers").extra["flowchart_evidence"].values()}
    exp = recorded("lab03_slowlink", "cpu").extra["experiment"]
    leaves |= {flowchart.diagnose(exp[k]["flowchart_evidence"]).leaf_id for k in ("naive", "aware")}
    sc = recorded("scenarios").extra
    leaves |= {flowchart.diagnose(v).leaf_id for v in sc["dtype_path"]["flowchart_evidence"].values()}
    leaves |= {flowchart.diagnose(v).leaf_id for v in sc["workload"]["flowchart_evidence"].values()}
    assert leaves == set(flowchart.LEAVES)


def test_walkthrough_widget_follows_the_evidence_and_hand_answers():
    ev = recorded("lab01_bandwidth").extra["flowchart_evidence"]["unfused"]
    w = nb.flowchart_walkthrough(ev, "recorded")
    for _ in range(2):
        w.children[2].children[2].click()  # "Use the evidence"
    assert "Leaf G" in w.children[0].value
    w2 = nb.flowchart_walkthrough()
    for b in (0, 1, 1):  # yes (slow), no (memory), no (tensor core) -> J
        w2.children[2].children[b].click()
    assert "Leaf J" in w2.children[0].value and "B:yes" in w2.children[3].value
