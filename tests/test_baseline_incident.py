"""Node baselines (record on this machine, compare, injected deviations of each class), the
incident record (never overwrites), the small scenarios, and the flowchart walkthrough widget."""
import copy
import json
from pathlib import Path

import pytest

from hwlab.diagnosis import baseline as B
from hwlab.diagnosis import flowchart, incident
from hwlab import nb
from hwlab.core import profiling
from hwlab.core.evidence import load, recorded
from hwlab.labs import scenarios


@pytest.fixture(scope="module")
def live():
    return B.record(quick=True)


@pytest.mark.slow
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


@pytest.mark.slow
def test_unchanged_rerun_matches(live, tmp_path):
    p = live.save(tmp_path / "b.json")
    c = B.compare(load(p), load(p))
    assert c.ok and "runtime path" in c.checked


def _inject(ev, kind):
    ev = copy.deepcopy(ev)
    if kind == "hardware":  # a slower card is slower in every repeat: the whole band moves
        for m in ev.results:
            if m.name.startswith("gemm"):
                m.t_ms, m.t_p10_ms, m.t_p90_ms = m.t_ms * 1.25, m.t_p10_ms * 1.25, m.t_p90_ms * 1.25
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


@pytest.mark.slow
def test_latency_rise_is_flagged_and_missing_parts_reported(live):
    base = recorded("baseline")
    now = copy.deepcopy(base)
    for m in now.results:
        if m.name == "launch_overhead":  # every launch 2.5x slower
            m.params["us_per_launch"] *= 2.5
            m.t_ms, m.t_p10_ms, m.t_p90_ms = m.t_ms * 2.5, m.t_p10_ms * 2.5, m.t_p90_ms * 2.5
    now.results = [m for m in now.results if not m.name.startswith("rmsnorm")]
    c = B.compare(base, now)
    assert any(d.what.startswith("launch_overhead") and d.category == "hardware" for d in c.deviations)
    assert any(d.category == "missing" and d.what.startswith("rmsnorm") for d in c.deviations)
    with pytest.raises(ValueError, match="two baseline records"):
        B.compare(recorded("doctor"), live)


def test_one_process_per_node_records(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert not B.should_record_on_this_rank()
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert B.should_record_on_this_rank()


def test_fleet_table(tmp_path):
    base = recorded("baseline")
    p1 = copy.deepcopy(base).save(tmp_path / "n1.json")
    p2 = _inject(base, "hardware").save(tmp_path / "n2.json")
    rows = B.fleet_table([p1, p2], base)
    assert [r["verdict"] for r in rows] == ["ok", "hardware"]


def test_an_injected_cpu_slowdown_is_never_gpu_node_advice(live):
    """The same injection into this machine's own CPU record: never a hardware verdict or
    "drain and swap"; a CPU baseline says so."""
    c = B.compare(live, _inject(live, "hardware"))
    assert c.cpu and "hardware" not in c.categories() and "drain" not in c.summary()
    assert c.summary().startswith("CPU baseline")


def test_hit_rate_counting_on_gpu_kernel_names():
    ev = [("nvjet_sm90_qqtst_128x128_64x4_1x2_h_bz_coopA_TNT", "CUDA"),
          ("nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopB_NNT", "CUDA"),
          ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(...)>", "CUDA"),
          ("aten::mm", "CPU")]
    r = profiling.hit_rate_from_events(ev, gpu=True)
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
    r = profiling.hit_rate_from_events(ev, gpu=True)
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
    assert "[BY HAND: not measured]" in first  # the by-hand B answer is labelled in the record
    assert incident.load(js1).diagnosis_path == ["B", "D", "K", "L"]
    with pytest.raises(ValueError, match="symptom_scope"):
        incident.from_diagnosis("t", None, d, symptom_scope="galaxy", symptom="", fix="", reverify="")


def test_incident_table_rows_survive_pipes_backslashes_and_line_breaks(tmp_path):
    """Text with ``|``, a backslash before a pipe and line breaks stays in its own cell: the record is
    rendered by a real Markdown parser (markdown-it, GFM tables) and every cell read back."""
    from html.parser import HTMLParser

    markdown_it = pytest.importorskip("markdown_it")
    d = flowchart.diagnose({"slowdown_vs_floor": 3.0, "dram_pct_estimated": 80.0})
    symptom = "p99 | p50 went 2x\\|3x\nafter the\r\nupgrade"
    fix = "pin | unpin\\ the thread\nthen re-run"
    inc = incident.from_diagnosis("two\nlines | title", recorded("doctor"), d, symptom_scope="single-card",
                                  symptom=symptom, fix=fix, reverify="r|e")
    md, _ = incident.save(inc, tmp_path)
    text = md.read_text()
    assert text.splitlines()[0] == "# Incident: two lines | title"  # a heading stays one line
    html = markdown_it.MarkdownIt("commonmark").enable("table").render(text)

    class Cells(HTMLParser):
        def __init__(self):
            super().__init__()
            self.rows, self.cell = [], None

        def handle_starttag(self, tag, attrs):
            if tag == "tr":
                self.rows.append([])
            elif tag in ("td", "th"):
                self.cell = ""
            elif tag == "br" and self.cell is not None:
                self.cell += "\n"

        def handle_endtag(self, tag):
            if tag in ("td", "th"):
                self.rows[-1].append(self.cell)
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell += data

    p = Cells()
    p.feed(html)
    fields = [r[0] for r in p.rows]
    assert fields == ["field", "machine and topology", "symptom scope", "key evidence", "fix", "re-verification"]
    assert all(len(r) == 2 for r in p.rows), p.rows
    cell = dict(p.rows)
    assert cell["symptom scope"] == "single-card: " + symptom.replace("\r\n", "\n")
    assert cell["fix"] == fix
    assert cell["re-verification"] == "r|e"


def _no_unknowns(inc):
    blob = json.dumps({"machine": inc.machine, "topology": inc.topology, "rank_mapping": inc.rank_mapping})
    assert "null" not in blob and "unknown" not in blob.lower() and "?" not in blob, blob


def test_incident_on_this_cpu_machine_says_what_it_is():
    import torch
    d = flowchart.diagnose({"slowdown_vs_floor": 3.0, "dram_pct_estimated": 80.0})
    inc = incident.from_diagnosis("t", None, d, symptom_scope="single-card", symptom="s", fix="f", reverify="r")
    _no_unknowns(inc)
    if not torch.cuda.is_available():
        assert inc.machine["gpu_model"] == f"no GPU: {incident.cpu_model()}"
        assert inc.topology == "none: CPU only" and inc.rank_mapping == "1 process on CPU"
        assert inc.machine["driver"].startswith("none: no NVIDIA driver")
    assert inc.measured["slowdown_vs_floor"]["value"] == 3.0 and inc.measured["slowdown_vs_floor"]["how"] == "measured"


def test_incident_from_a_recorded_gpu_run_fills_machine_from_its_snapshot():
    """Lab 4's record has no NVML snapshot: driver, clocks and topology come from the kit's doctor
    record of the same host and GPU, and the record says so. Re-verification is data."""
    rec = recorded("lab04_fp8")
    doc = recorded("doctor")
    d = flowchart.diagnose({"slowdown_vs_floor": 1.1, "e2e_slowdown": 1.5, "rank_tail_pct": 0.0, "n_ranks": 1,
                            "metric_sources": {"e2e_slowdown": "stream TPOT p50 over prediction"}})
    after = {"slowdown_vs_floor": 1.1, "e2e_slowdown": 1.05, "rank_tail_pct": 0.0, "n_ranks": 1}
    inc = incident.from_diagnosis("t", rec, d, symptom_scope="inference", symptom="s", fix="f",
                                  reverify="Lab 4 stream", reverify_evidence=after, reverify_probe="Lab 4 stream, fixed")
    _no_unknowns(inc)
    assert inc.machine["gpu_model"] == "NVIDIA H200 x1" and inc.machine["driver"] == doc.versions["driver"]
    assert "doctor record of the same host" in inc.machine["source"]
    assert "single GPU" in inc.topology and inc.rank_mapping.startswith("1 process: rank 0 -> GPU0 (")
    g = doc.snapshot["gpus"][0]
    state = next(x for x in inc.key_evidence if x.startswith("state: "))
    assert f"SM clock {g['sm_clock_mhz']}/{g['sm_clock_max_mhz']} MHz" in state and f"{g['temperature_c']} C" in state
    assert "clock events: " in state
    assert "[measured: stream TPOT p50 over prediction]" in "\n".join(inc.key_evidence)
    assert inc.measured["e2e_slowdown"]["value"] == 1.5 and inc.measured["n_ranks"]["how"] == "measured"
    assert d.path == ["B", "D", "K", "M"] and d.steps[2].answer == "not applicable"  # one rank: no tail to ask
    r = inc.reverify_result
    assert r["probe"] == "Lab 4 stream, fixed" and r["measured"]["e2e_slowdown"] == 1.05 and r["leaf"] == "OK"
    assert inc.reverified is True and "re-measured with Lab 4 stream, fixed" in inc.to_markdown()


def test_a_borderline_recheck_is_not_called_recovered():
    """Lab 3's recorded fix re-checks to OK only inside the spreads of B and D: the incident stays
    open and says why, even when the caller claims the fix worked."""
    exp = recorded("lab03_linksweep", "cpu").extra["calibrated"]
    d = flowchart.diagnose(exp["naive"]["flowchart_evidence"])
    after = exp["aware"]["flowchart_evidence"]
    assert flowchart.diagnose(after).borderline
    for claimed in (None, True):
        inc = incident.from_diagnosis("t", None, d, symptom_scope="multi-GPU", symptom="s", fix="f", reverify="r",
                                      reverify_evidence=after, reverified=claimed)
        assert inc.reverified is None and inc.reverify_result["borderline"]
        md = inc.to_markdown()
        assert "recovered (re-verified)" not in md and "the re-check is borderline" in md


def test_incident_multi_rank_wait_per_rank(tmp_path):
    d = flowchart.diagnose({"slowdown_vs_floor": 1.0, "e2e_slowdown": 3.6, "rank_tail_pct": 337.0, "n_ranks": 6})
    inc = incident.from_diagnosis("t", recorded("lab03_slowlink", "cpu"), d, symptom_scope="multi-GPU", symptom="s",
                                  fix="f", reverify="r", collective_wait_ms={0: 4.9, 2: 87.2})
    _no_unknowns(inc)
    assert inc.collective_wait_ms == {"0": 4.9, "2": 87.2}
    assert "collective wait per rank: rank 0 4.9 ms, rank 2 87.2 ms" in inc.key_evidence
    assert inc.machine["gpu_model"].startswith("no GPU: ")
    _, js = incident.save(inc, tmp_path)
    assert incident.load(js).collective_wait_ms == {"0": 4.9, "2": 87.2}


@pytest.mark.slow
def test_cli_baseline_and_incident(tmp_path, monkeypatch):
    import subprocess
    import sys
    run = lambda *a: subprocess.run([sys.executable, "-m", "hwlab", *a], capture_output=True, text=True)  # noqa: E731
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
    rec = json.loads(next((tmp_path / "inc").glob("*.json")).read_text())  # filled from this machine
    for v in (rec["machine"]["gpu_model"], rec["machine"]["driver"], rec["topology"], rec["rank_mapping"]):
        assert v and "unknown" not in v.lower()


@pytest.mark.slow
def test_scenarios_on_cpu_measure_every_answer():
    d = scenarios.dtype_path(size=128, copy_gbps=10.0)
    assert set(d["flowchart_evidence"]) == {"fp32", "bf16", "bf16_unaligned"}
    for m in d["measurements"].values():
        assert m.rel_err <= m.tol
    for k, ev in d["flowchart_evidence"].items():
        assert not flowchart.by_hand_keys(ev) and ev["n_ranks"] == 1
        svc = d["service"][k]  # D re-derived from the service step the run measured
        assert ev["e2e_slowdown"] == pytest.approx(svc["service_step_ms"] / svc["service_predicted_ms"])
        walk = flowchart.diagnose(ev)
        assert walk.steps and not walk.by_hand
    w = scenarios.workload_mix()
    for k, ev in w["flowchart_evidence"].items():
        walk = flowchart.diagnose(ev)  # CPU speeds against cached CPU ceilings: any leaf, all measured
        assert walk.fully_measured, walk.explain()
        assert ev["rank_tail_pct"] == pytest.approx(scenarios.rank_tail_pct([w["step_samples_ms"]])) == 0.0
    t = w["flowchart_evidence"]["tuned-shape prediction"]
    assert t["slowdown_vs_floor"] == pytest.approx(w["tuned"].t_ms / w["floor_tuned_ms"])
    assert t["e2e_slowdown"] == pytest.approx(w["measured_step_ms"] / w["predicted_from_tuned_ms"])
    assert scenarios.rank_tail_pct([[1.0, 1.0], [1.5, 1.5], [1.0]]) == pytest.approx(50.0)


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
    pytest.importorskip("ipywidgets", reason="ipywidgets missing: pip install -e '.[lab]'")
    ev = recorded("lab01_bandwidth").extra["flowchart_evidence"]["unfused"]
    w = nb.flowchart_walkthrough(ev, "recorded")
    w.children[2].children[2].click()  # "Hint": one measured answer, the walk does not move
    assert w.children[0].value.startswith("<b>B.") and "points to YES at B" in w.children[3].value
    assert "slowdown_vs_floor" in w.children[3].value and "Leaf" not in w.children[3].value
    w.children[2].children[0].click()  # the learner presses YES themself
    w.children[2].children[2].click()
    assert w.children[0].value.startswith("<b>F.") and "at F" in w.children[3].value
    assert "at B" not in w.children[3].value  # one answer at a time
    w2 = nb.flowchart_walkthrough()
    for b in (0, 1, 1):  # yes (slow), no (memory), no (tensor core) -> J
        w2.children[2].children[b].click()
    assert "Leaf J" in w2.children[0].value and "B:yes" in w2.children[4].value


# ---------------------------------------------------------------- typed observations are given, not measured
def _incident(tmp_path, capsys, obs):
    from hwlab.cli import main

    f = tmp_path / "obs.json"
    f.write_text(json.dumps(obs))
    rc = main(["incident", "--title", "t", "--scope", "single-card", "--symptom", "slow", "--fix", "fuse",
               "--reverify", "examine", "--observations", str(f), "--out", str(tmp_path / "inc"), "--json"])
    return rc, capsys.readouterr()


def test_typed_observations_are_labelled_as_given_not_measured(tmp_path, capsys):
    rc, out = _incident(tmp_path, capsys, {"slowdown_vs_floor": 3.2, "dram_pct_of_peak": 85.0,
                                           "metric_sources": {"dram_pct_of_peak": "ncu on node 7"}})
    assert rc == 0, out.err
    j = json.loads(out.out)
    rec = json.loads(Path(j["json"]).read_text())
    md = Path(j["markdown"]).read_text()
    assert j["path"] == ["B", "F", "G"]
    walk = [e for e in rec["key_evidence"] if e.startswith(("B:", "F:"))]
    assert len(walk) == 2 and all("[GIVEN by the user" in e and "[measured" not in e for e in walk), walk
    assert "ncu on node 7" in walk[1]  # the user's own word on what measured it is kept
    assert {v["how"] for v in rec["measured"].values()} == {"given"}
    for text in (md, j["explanation"]):
        assert "every answer on this walk was measured" not in text and "[measured" not in text
        assert "given by the user, not measured by hwlab, at B (slowdown_vs_floor), F (dram_pct_of_peak)" in text


def test_unknown_observation_names_are_refused_in_one_line(tmp_path, capsys):
    rc, out = _incident(tmp_path, capsys, {"slowdown_vs_floor": 3.2, "dram_pct": 85.0, "tail": 1})
    assert rc == 2 and out.out == ""
    line = out.err.strip()
    assert "\n" not in line and "'dram_pct', 'tail'" in line
    assert "dram_pct_of_peak" in line and "rank_tail_pct" in line  # the known names, listed
    assert not (tmp_path / "inc").exists()  # refused before anything was written


def test_measured_evidence_still_reads_measured():
    """The label follows the evidence's own word: a walk on a probe's evidence stays measured."""
    from hwlab.diagnosis import flowchart

    d = flowchart.diagnose({"slowdown_vs_floor": 3.2, "dram_pct_of_peak": 85.0})
    assert all(s.how == "measured" for s in d.steps) and "every answer on this walk was measured" in d.explain()
    g = flowchart.diagnose({"slowdown_vs_floor": 3.2, "dram_pct_of_peak": 85.0, "metric_given": ["dram_pct_of_peak"]})
    assert [s.how for s in g.steps] == ["measured", "given"] and not g.fully_measured
