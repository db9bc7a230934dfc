"""hwlab examine, part by part: the part classes, the fused floor against hand counts, the Chrome
trace read on a real CPU profile and on a Kineto-shaped GPU trace, H answered "not applicable"
without matmul work, Nsight Compute's sector amplification never below 1, models and decode
steps, the trace file beside --out, and a function built from two parts of known cost whose
parts match the parts examined alone. No test judges a CPU timing against a fixed figure."""
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hwlab.core import ceilings
from hwlab.diagnosis import flowchart
from hwlab.examine import examine
from hwlab.examine.estimate import count_traffic
from hwlab.examine.ncu_counters import kernel_filter, summarise
from hwlab.examine.parts import (
    COVERAGE_TOL_PCT, WALK_SHARE_PCT, build_parts, fused_floor_bytes, j_detail, Part)
from hwlab.examine.torch_profile import CALL_MARK, profile_calls
from hwlab.core.profiling import part_class, trace_calls

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cpu_ceilings():
    return ceilings.measure("cpu", quick=True)


def test_part_classes_come_from_the_one_core_table():
    assert part_class("aten::mm", "sm90_xmma_gemm_bf16bf16_bf16f32", ("bfloat16",)) == "gemm bfloat16"
    assert part_class("aten::addmm", None, ("float32",)) == "gemm float32"
    assert part_class("aten::_flash_attention_forward", "flash_fwd_kernel") == "attention"
    assert part_class("aten::index_select", "indexSelectLargeIndex") == "gather/scatter"
    assert part_class("aten::cat", "CatArrayBatchedCopy") == "copy/concat"
    assert part_class("aten::mul", "vectorized_elementwise_kernel") == "elementwise/reduction"
    assert part_class("aten::_to_copy", "unrolled_elementwise_kernel", ("bfloat16", "float8_e4m3fn")) == \
        "quant/dequant"
    assert part_class(None, "triton_poi_fused_add_0") == "triton/compiled"
    assert part_class("aten::add", "triton_poi_fused_add_0", compiled=True) == "triton/compiled"
    assert part_class(None, "ncclDevKernel_AllReduce_Sum_f32") == "communication"
    assert part_class(None, "Memcpy DtoD (Device -> Device)") == "copy/concat"


def test_fused_floor_counts_each_run_of_consecutive_ops_once():
    n = 1 << 12
    x, w = torch.randn(n), torch.randn(64, 64)

    def chain(x):
        y = torch.relu(x * 2 + 1)
        return torch.sigmoid(y * x)

    t = count_traffic(chain, (x,), {})
    assert fused_floor_bytes(t.ops, t.ops, t.out_keys) == 2 * 4 * n  # read x once, write the result once

    def split(x, a):  # elementwise, a matmul between, elementwise again: two runs, floored apart
        y = x * 2 + 1
        z = a @ a
        return z, torch.relu(y) * x

    a = torch.randn(64, 64)
    t = count_traffic(split, (x, a), {})
    ew = [o for o in t.ops if o.kind != "matmul"]
    # run 1 (mul, add): read x, write y (read by run 2); run 2 (relu, mul): read y and x, write out
    assert fused_floor_bytes(ew, t.ops, t.out_keys) == 4 * n * (2 + 3)
    mm = [o for o in t.ops if o.kind == "matmul"]
    assert fused_floor_bytes(mm, t.ops, t.out_keys) == 2 * 4 * 64 * 64
    assert sum(o.flops for o in mm) == 2 * 64 ** 3  # per-op FLOPs from torch's own formulas


def test_cpu_trace_gives_each_aten_op_its_self_time_once():
    w = torch.randn(64, 64)

    def f(x):
        return torch.relu(torch.nn.functional.linear(x, w) * 2)

    s = profile_calls(f, [(torch.randn(32, 64),)], {}, torch.device("cpu"))
    assert s.trace_path and json.load(open(s.trace_path))["traceEvents"]
    assert len(s.calls) == 3 and len(s.call_us) == 3
    for items, call_us in zip(s.calls, s.call_us):
        assert 0 < sum(it["us"] for it in items) <= call_us + 1.0  # self times nest inside the call
        stacks = [it["stack"] for it in items]
        assert ["aten::mm", "aten::matmul", "aten::linear"] in stacks or \
            any(st[0] in ("aten::mm", "aten::addmm") for st in stacks)
        assert any(st == ["aten::relu"] for st in stacks) and all(it["kernel"] is None for it in items)


def _kineto_trace():
    """A trace shaped as Kineto writes one on a GPU: ops, runtime launches, kernels linked by
    correlation, one call range. Times in µs."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": CALL_MARK, "ts": 0, "dur": 100, "tid": 1, "args": {}},
          {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 1, "dur": 20, "tid": 1,
           "args": {"External id": 10}},
          {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": 2, "dur": 18, "tid": 1,
           "args": {"External id": 11}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 5, "dur": 3, "tid": 1,
           "args": {"correlation": 100}},
          {"ph": "X", "cat": "cpu_op", "name": "aten::gelu", "ts": 30, "dur": 10, "tid": 1,
           "args": {"External id": 12}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 32, "dur": 3, "tid": 1,
           "args": {"correlation": 101}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cuLaunchKernel", "ts": 50, "dur": 3, "tid": 1,
           "args": {"correlation": 102}},
          {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32", "ts": 10, "dur": 40, "tid": 7,
           "args": {"correlation": 100, "registers per thread": 168, "est. achieved occupancy %": 12}},
          {"ph": "X", "cat": "kernel", "name": "vectorized_elementwise_kernel", "ts": 52, "dur": 20, "tid": 7,
           "args": {"correlation": 101, "registers per thread": 24, "est. achieved occupancy %": 90}},
          {"ph": "X", "cat": "kernel", "name": "triton_poi_fused_0", "ts": 75, "dur": 10, "tid": 7,
           "args": {"correlation": 102}}]
    return {"traceEvents": ev}


def test_gpu_trace_joins_kernels_to_their_launching_ops_and_adds_idle():
    calls = trace_calls(_kineto_trace(), CALL_MARK)
    assert len(calls) == 1 and len(calls[0]) == 3
    gemm, gelu, tri = sorted(calls[0], key=lambda it: it["ts"])
    assert gemm["stack"] == ["aten::addmm", "aten::linear"] and gemm["us"] == 40
    assert gelu["stack"] == ["aten::gelu"] and gelu["args"]["est. achieved occupancy %"] == 90
    assert tri["stack"] == [] and tri["kernel"].startswith("triton")

    # the traffic records the dispatch mode would see for this call
    def rec(name, reads, writes, flops=0, dt="bfloat16"):
        return SimpleNamespace(name=name, reads=reads, writes=writes, flops=flops, in_dtypes=[dt],
                               read_bytes=sum(b for _, b in reads), amplification=1.0,
                               moved_bytes=sum(b for _, b in reads) + sum(b for _, b in writes),
                               kind="matmul" if name == "aten::addmm" else "other")
    mb = 1 << 20
    ops = [rec("aten::addmm", [("a", 8 * mb), ("w", 8 * mb)], [("h", 8 * mb)], flops=2 * 10 ** 10),
           rec("aten::gelu", [("h", 8 * mb)], [("g", 8 * mb)])]
    prof = SimpleNamespace(calls=calls, call_us=[100.0], busy_ms_per_call=0.070, error=None, n_spills=None)
    traffic = SimpleNamespace(ops=ops)
    parts = build_parts(prof=prof, traffic=traffic, t_ms=0.100, gpu=True, copy_gbps=4000.0,
                        gemm_tflops_for=lambda dt: 800.0 if dt == "bfloat16" else None, whole_floor_ms=None,
                        whole_slowdown=4.0, e2e_slowdown=1.0, out_keys={"g"})
    by = {p.name: p for p in parts.parts}
    assert set(by) == {"gemm bfloat16", "elementwise/reduction", "triton/compiled", "gpu idle"}
    assert by["gemm bfloat16"].t_ms == pytest.approx(0.040) and by["gpu idle"].t_ms == pytest.approx(0.030)
    assert parts.coverage_pct == pytest.approx(100.0)  # kernels 70 µs + idle 30 µs = the measured 100 µs
    g = by["gemm bfloat16"]
    assert g.floor_ms == pytest.approx(2e10 / 800e12 * 1e3) and g.floor_source.startswith("FLOPs")
    assert g.saved_ms == pytest.approx(0.040 - 0.025) and g.speedup == pytest.approx(0.1 / (0.1 - g.saved_ms))
    assert g.evidence["tensor_pct_of_peak"] == pytest.approx(100 * (2e10 / 40e-6 / 1e12) / 800)
    e = by["elementwise/reduction"]
    assert e.floor_bytes == 16 * mb and e.evidence["matmul_flops"] == 0 and e.evidence["tensor_core_kernels"] == 0
    assert not by["triton/compiled"].attributable and by["triton/compiled"].floor_ms is None
    assert all(p.walk is not None for p in parts.parts if p.share_pct >= WALK_SHARE_PCT)
    h = parts.headline
    assert h.saved_ms == max(p.saved_ms for p in parts.walked if p.leaf_id and p.saved_ms is not None)
    assert parts.ranked[0] is h and json.dumps(parts.to_dict())


def test_tensor_core_question_is_not_applicable_without_matmul_work():
    ev = {"slowdown_vs_floor": 40.0, "dram_pct_estimated": 5.0, "sector_amplification": 1.0,
          "matmul_flops": 0, "tensor_core_kernels": 0}
    d = flowchart.diagnose(ev)
    assert d.path == ["B", "F", "H", "J"] and d.steps[2].answer == flowchart.NOT_APPLICABLE
    assert "NOT APPLICABLE" in d.explain() and d.steps[2].how == "measured"
    # matmul work present: H is asked, and without its metric the walk stops there
    d = flowchart.diagnose({**ev, "matmul_flops": 10 ** 9})
    assert d.undecided is not None and d.undecided.id == "H"
    # a tensor-core kernel ran though no FLOPs were counted (a matmul hidden from the counter): asked
    assert flowchart.diagnose({**ev, "tensor_core_kernels": 2}).undecided.id == "H"


def test_j_detail_names_the_cause_from_measured_figures():
    p = Part(name="gather/scatter", t_ms=1.0, share_pct=90.0, n_items=1, attributable=True, gbps=200.0)
    j = j_detail(p, idle_pct=3.0, copy_gbps=4000.0, n_spills=None, ncu=None,
                 kernel_args=[(10.0, {"est. achieved occupancy %": 80, "registers per thread": 30})])
    assert j["cause"] == "memory latency" and j["figures"]["bandwidth_pct_of_copy"] == pytest.approx(5.0)
    j = j_detail(p, 3.0, 4000.0, None, None, [(10.0, {"est. achieved occupancy %": 12, "registers per thread": 30})])
    assert j["cause"] == "occupancy"
    j = j_detail(p, 3.0, 4000.0, None, {"registers_per_thread_max": 168.0}, [])
    assert j["cause"] == "registers" and "Nsight" in j["sources"]["registers_per_thread"]
    assert j_detail(p, 70.0, 4000.0, None, None, [])["cause"] == "launch"


def test_ncu_sector_amplification_cannot_fall_below_one():
    base = {"kernel": "indexSelectLargeIndex", "gpu__time_duration.sum": 1000.0,
            "dram__throughput.avg.pct_of_peak_sustained_elapsed": 5.0,
            "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": 360.0,
            "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": 250.0}
    s = summarise([{**base, "memory_l2_theoretical_sectors_global": 4000.0,
                    "memory_l2_theoretical_sectors_global_ideal": 1000.0}])
    assert s["evidence"]["sector_amplification"] == pytest.approx(4.0)
    assert s["sectors_per_request"] == pytest.approx(360 / 250)  # shown, not used: not a coalescing ratio
    s = summarise([{**base, "memory_l2_theoretical_sectors_global": 360.0,
                    "memory_l2_theoretical_sectors_global_ideal": 1000.0}])
    assert "sector_amplification" not in s["evidence"] and "< 1" in s["invalid"]["sector_amplification"]
    s = summarise([base])  # without the source counters: no counted amplification at all
    assert "sector_amplification" not in s["evidence"] and not s["invalid"]
    assert kernel_filter(["void at::native::indexSelectLargeIndex<float, long>(x)", "nvjet_tst_128x64"]) == \
        "regex:indexSelectLargeIndex|nvjet_tst_128x64"


def test_a_row_gather_on_cpu_lands_on_a_leaf_with_an_action_that_fits(cpu_ceilings):
    """The gather part is walked on its own metrics (no matmul: H not applicable) to a leaf whose
    action fits a gather. Which part heads the report is not asserted here: on a busy 2-core host
    the time outside ops can outgrow a small gather (the headline rule is tested on its own)."""
    n_rows, n_idx = 1 << 20, 1 << 18  # a 32 MiB table of 32-byte rows, past this CPU's caches
    ex = examine(lambda t, i: t.index_select(0, i), make_inputs=lambda: (
        torch.randn(n_rows, 8), torch.randint(0, n_rows, (n_idx,))), ceilings=cpu_ceilings, max_total_s=1.0,
        name="row_gather")
    assert ex.evidence["matmul_flops"] == 0 and ex.evidence["tensor_core_kernels"] == 0
    parts = {p.name: p for p in ex.parts.parts}
    assert "gather/scatter" in parts, (ex.parts.error, [(p.name, p.share_pct, p.notes) for p in ex.parts.parts])
    g = parts["gather/scatter"]
    assert g.walk is not None and g.leaf_id is not None, (g.share_pct, g.notes)
    if g.leaf_id in ("G", "J"):
        assert any("indices" in a or "rows" in a for a in g.actions)
    assert ex.headline is not None and ex.leaf_id == ex.headline.leaf_id
    d = json.loads(ex.to_json())
    row = next(r for r in d["parts"]["parts"] if r["name"] == "gather/scatter")
    assert row["walked"] and row["leaf"] == g.leaf_id


@pytest.mark.slow
def test_parts_of_a_composed_function_match_the_parts_examined_alone(cpu_ceilings):
    """A GEMM and an unfused chain: the composed function's parts against each examined alone, in
    two mixes, one GEMM-heavy and one chain-heavy by two orders of magnitude of work. What is
    counted must match exactly: ops per call, FLOPs, fused floor bytes, floors. Times are not
    compared as fractions between runs: on a CPU the same ops run at different speeds composed and
    alone (cache and allocator state, and the profiler's per-op overhead, which weighs on small
    ops; a busy host moves one run against the other). One thread runs every op: on a busy host a
    parallel op waits a whole time slice for its preempted thread, which decides nothing about the
    split. What must hold is where the time goes:
    the part that dominates alone (by more than 10x) holds most of the composed function's time.
    The headline is the part with the larger gain when the parts alone differ clearly."""
    def gemm(a, b):
        return a @ b

    def chain(x):
        y = x * 1.5
        y = y + 0.25
        y = torch.relu(y)
        y = y * x
        return torch.sigmoid(y) + 1.0

    def both(a, b, x):
        return gemm(a, b), chain(x)

    G, E = "gemm float32", "elementwise/reduction"
    def examined(n, m):
        ins = lambda: (torch.randn(n, n), torch.randn(n, n), torch.randn(m))  # noqa: E731
        return [examine(f, make_inputs=mk, ceilings=cpu_ceilings, max_total_s=1.0) for f, mk in (
            (both, ins), (gemm, lambda: ins()[:2]), (chain, lambda: ins()[2:]))]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a parallel op on a busy host waits a whole time slice for a preempted thread
    try:
        runs = [(n, m, *examined(n, m)) for n, m in ((1024, 1 << 16), (64, 1 << 21))]
    finally:
        torch.set_num_threads(threads)
    for n, m, whole, g, c in runs:
        w = {p.name: p for p in whole.parts.parts}
        ga, ca = {p.name: p for p in g.parts.parts}[G], {p.name: p for p in c.parts.parts}[E]
        # ops, bytes and FLOPs attributed to each part are those of the part alone
        assert w[G].n_items == ga.n_items and w[E].n_items == ca.n_items
        assert w[G].flops == ga.flops == 2 * n ** 3 and w[E].flops == ca.flops == 0
        for a, b in ((w[G], ga), (w[E], ca)):  # floors equal, unless a rate above a ceiling raised it (rates)
            if a.ceilings_raised or b.ceilings_raised:  # then the floor follows a timed rate: within the ceiling
                assert all(x.tflops <= x.ceiling_tflops * (1 + 1e-6) for x in (a, b) if x.tflops and x.ceiling_tflops)
            else:
                assert a.floor_ms == pytest.approx(b.floor_ms)
        assert w[E].floor_bytes == ca.floor_bytes == 2 * 4 * m
        # where the time goes: the part dominating alone dominates the composed function
        big, small = (G, E) if g.measurement.t_ms > c.measurement.t_ms else (E, G)
        alone = {G: g.measurement.t_ms, E: c.measurement.t_ms}
        assert alone[big] > 10 * alone[small], (n, m, alone)  # the mixes are built that far apart
        assert w[big].t_ms > w[small].t_ms and w[big].share_pct >= 50.0, (
            n, m, alone, [(p.name, p.share_pct, p.n_items) for p in whole.parts.parts], whole.parts.notes)
        assert abs(sum(p.share_pct for p in whole.parts.parts) - 100) <= COVERAGE_TOL_PCT
        gains = {G: ga.saved_ms or 0.0, E: ca.saved_ms or 0.0}
        bigger, smaller = sorted(gains, key=gains.get, reverse=True)
        if gains[bigger] > 3 * gains[smaller] and w[bigger].leaf_id and whole.headline is not None:
            assert whole.headline.name == bigger and whole.leaf_id == w[bigger].leaf_id


@pytest.mark.slow
def test_module_and_decode_step_paths_on_cpu(cpu_ceilings):
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import small_transformer as st
    finally:
        sys.path.remove(str(ROOT / "examples"))
    m, make = st.model()
    m.train()
    ex = examine(m, make_inputs=make, ceilings=cpu_ceilings, max_total_s=1.0)
    assert not m.training  # examined in eval mode
    params = sum(p.numel() * p.element_size() for p in m.parameters())
    emb = m.emb.weight.numel() * m.emb.weight.element_size()
    cap = ex.counts["captured_read_bytes"]
    assert params - emb <= cap <= params  # weights once; the embedding only where looked up
    names = {p.name for p in ex.parts.parts}
    assert {"gemm float32", "attention", "elementwise/reduction"} <= names
    step, make = st.decode()
    ex = examine(step, make_inputs=make, ceilings=cpu_ceilings, max_total_s=1.0)
    assert "copy/concat" in {p.name for p in ex.parts.parts}  # the cache grows by torch.cat
    assert abs(sum(p.share_pct for p in ex.parts.parts) - 100) <= COVERAGE_TOL_PCT


@pytest.mark.slow
def test_cli_model_factory_writes_the_trace_beside_the_json(tmp_path):
    out = tmp_path / "dec.json"
    r = subprocess.run([sys.executable, "-m", "hwlab", "examine", "examples/small_transformer.py:decode", "--model",
                        "--json", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 1), r.stderr
    d = json.loads(r.stdout)
    assert r.returncode == (0 if d["leaf"] == "OK" else 1)
    trace = json.loads((tmp_path / "dec.trace.json").read_text())
    assert any(e.get("cat") == "cpu_op" for e in trace["traceEvents"])
    for p in d["parts"]["parts"]:
        assert {"share_pct", "pct_of_floor", "leaf", "saved_ms", "speedup"} <= set(p)
    # the same destination again is refused before anything is measured, the trace left alone
    r2 = subprocess.run([sys.executable, "-m", "hwlab", "examine", "examples/small_transformer.py:decode",
                         "--model", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r2.returncode == 2 and len(r2.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_transformers_example_when_that_library_is_installed(cpu_ceilings):
    pytest.importorskip("transformers")
    from hwlab.examine.target import load_model

    module, args, make = load_model(f"{ROOT / 'examples' / 'hf_gpt2.py'}:model")
    ex = examine(module, *args, make_inputs=make, ceilings=cpu_ceilings, max_total_s=1.0)
    assert any(p.name.startswith("gemm") for p in ex.parts.parts)
    assert abs(sum(p.share_pct for p in ex.parts.parts) - 100) <= COVERAGE_TOL_PCT


# ------------------------------------------------------------ the H200 recording, re-derived on a CPU
RECORDED_PARTS = ROOT / "src" / "hwlab" / "recorded" / "h200" / "examine_parts.json"
needs_record = pytest.mark.skipif(not RECORDED_PARTS.exists(), reason="examine_parts.json not recorded on the "
                                  "H200 yet (tools/record_examine.py --parts)")


def _rec():
    from hwlab.core import evidence
    return evidence.load(RECORDED_PARTS)


def _check_parts(e):
    P, T = e["parts"], e["t_ms"]
    assert P["error"] is None and P["t_ms"] == T
    assert abs(sum(p["share_pct"] for p in P["parts"]) - 100) <= COVERAGE_TOL_PCT, e["name"]
    assert P["coverage_pct"] == pytest.approx(100 * sum(p["t_ms"] for p in P["parts"]) / T)
    for p in P["parts"]:
        assert p["share_pct"] == pytest.approx(100 * p["t_ms"] / T)
        if p["saved_ms"] is not None:
            assert p["saved_ms"] == pytest.approx(p["t_ms"] - p["floor_ms"])
            assert p["pct_of_floor"] == pytest.approx(100 * p["floor_ms"] / p["t_ms"]) and p["pct_of_floor"] <= 100
            assert p["speedup"] == pytest.approx(T / (T - p["saved_ms"]))
        ev = p["evidence"]  # nothing outside its physical range is evidence
        assert ev.get("dram_pct_estimated", 0) <= 100 and ev.get("tensor_pct_of_peak", 0) <= 100
        assert ev.get("sector_amplification", 1) >= 1 and ev.get("slowdown_vs_floor", 1) > 0
        assert p["walked"] == (p["share_pct"] >= WALK_SHARE_PCT)
        if p["walked"]:
            d = flowchart.diagnose(ev)
            assert d.leaf_id == p["leaf"] and d.path == p["path"], (e["name"], p["name"])
    walked = [p for p in P["parts"] if p["walked"] and p["leaf"] and p["saved_ms"] is not None]
    if walked:
        best = max(walked, key=lambda p: p["saved_ms"])
        assert P["headline"] == best["name"] and P["ranked"][0] == best["name"] and e["leaf"] == best["leaf"]


@needs_record
def test_recorded_parts_add_up_and_every_walk_rederives():
    rec = _rec()
    assert rec.is_gpu and "H200" in rec.device and rec.extra["on_gpu"] and not rec.extra["tiny"]
    for name, e in rec.extra["entries"].items():
        assert e["error"] is None, (name, e.get("error"))
        _check_parts(e)


@needs_record
def test_recorded_mixed_model_ranks_fusion_first_and_the_fix_meets_its_prediction():
    rec = _rec()
    ent, fix = rec.extra["entries"], rec.extra["fix"]
    model, fused = ent["model"], ent["model_fused"]
    head = next(p for p in model["parts"]["parts"] if p["name"] == model["parts"]["headline"])
    assert head["name"] == "elementwise/reduction" and head["leaf"] == "G"
    assert fix["headline"] == head["name"] and fix["predicted_saving_ms"] == head["saved_ms"]
    measured = model["t_ms"] - fused["t_ms"]
    assert fix["measured_saving_ms"] == pytest.approx(measured)
    assert abs(head["saved_ms"] - measured) <= 0.25 * measured  # predicted within 25% of measured
    # the fix did not just move time: the spreads of before and after do not overlap
    assert fix["after_ms"][2] < fix["before_ms"][0]
    d = ent["decode"]
    assert "copy/concat" in {p["name"] for p in d["parts"]["parts"]} and d["leaf"] is not None
    tr = rec.extra["cli"]["model_out"]
    assert tr["rc"] in (0, 1) and tr["trace"]["n_events"] > 0 and tr["trace"]["kernel_events"] > 0


@needs_record
def test_recorded_row_gather_lands_with_h_not_applicable_with_and_without_ncu():
    rec = _rec()
    runs = [rec.extra["entries"]["row_gather"], rec.extra["cli"]["row_gather_ncu"]]
    for e in runs:
        g = next(p for p in e["parts"]["parts"] if p["name"] == "gather/scatter")
        assert g["leaf"] in ("G", "J") and e["leaf"] == g["leaf"]
        assert any("indices" in a for a in g["actions"]) and any("rows" in a for a in g["actions"])
        assert g["evidence"]["matmul_flops"] == 0 and g["evidence"]["tensor_core_kernels"] == 0
        if g["leaf"] == "J":
            assert "H" in g["path"] and g["j_detail"]["cause"] != "not decided"
        steps = e["walk"]["steps"]
        h = [s for s in steps if s["question"] == "H"]
        assert not h or h[0]["answer"] == flowchart.NOT_APPLICABLE
    ncu = runs[1]["ncu"]
    assert ncu and not ncu["invalid"] and ncu["evidence"]["sector_amplification"] >= 1.0
    assert ncu["sectors_theoretical"] / ncu["sectors_ideal"] == pytest.approx(ncu["evidence"]["sector_amplification"])


@needs_record
def test_recorded_composed_function_matches_its_parts_alone():
    ent = _rec().extra["entries"]
    whole = {p["name"]: p for p in ent["gemm_plus_chain"]["parts"]["parts"]}
    alone = {"gemm bfloat16": ent["gemm_only"], "elementwise/reduction": ent["chain_only"]}
    tot = sum(e["t_ms"] for e in alone.values())
    gains = {}
    for name, e in alone.items():
        assert whole[name]["share_pct"] == pytest.approx(100 * e["t_ms"] / tot, abs=10)
        assert whole[name]["t_ms"] == pytest.approx(e["t_ms"], rel=0.25)
        gains[name] = next(p for p in e["parts"]["parts"] if p["name"] == name)["saved_ms"] or 0.0
    bigger = max(gains, key=gains.get)
    assert ent["gemm_plus_chain"]["parts"]["headline"] == bigger
    assert whole[bigger]["saved_ms"] == pytest.approx(gains[bigger], rel=0.25)
