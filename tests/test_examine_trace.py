"""``hwlab examine --trace``: a trace in, the live examination's parts out.

A hand-written GPU fixture (two steps, shapes present and absent, a kernel without a launch
record, a memcpy overlapping a kernel, device work after the last step's host end, an H100
``deviceProperties`` block) checked against counts the test makes from the raw JSON itself; a
CPU trace this test records with ``torch.profiler(record_shapes=True)``; the shape formulas
against torch's own (FlopCounterMode, the traffic model's span); the annotated copy (every
original event unchanged, the added ranges well formed and read back to the same parts); the
same function examined live and through the trace its live run wrote; the CLI; the trace path
with torch unimportable; and, opt-in (``HWLAB_FOREIGN_TRACES``), traces recorded by others."""
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from public_traces import MI250, PYTORCH18, public_trace  # noqa: F401
import torch
from machine import machine_profiles

from hwlab.traces import trace_shapes
from hwlab.core.profiling import KIT_CACHE_BYTES_KEY, KIT_UNPROFILED_MEDIAN_KEY
from hwlab.examine.trace_enough import MIN_DEVICE_BUSY_US
from hwlab.traces.trace_ops import UNLAUNCHED, read_ops, step_items
from hwlab.examine.from_trace import (
    ANNOTATION_CAT, HEADLINE_MARK, STEP_SUM_TOL_PCT, TRACK_PROCESS, TRACK_THREAD, examine_trace,
    read_annotations, unprofiled_median_ms, write_annotated)

ROOT = Path(__file__).resolve().parents[1]
BASELINE_CPU = ROOT / "tests" / "data" / "baseline_cpu_a.json"
FIXTURE = ROOT / "tests" / "data" / "examine_trace" / "gpu_steps_fixture.json"
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _load(path: Path) -> dict:
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rt") as f:
        return json.load(f)


def _union_us(intervals) -> float:
    tot, end = 0.0, -1e300
    for a, b in sorted(intervals):
        if b > end:
            tot += b - max(a, end)
            end = b
    return tot


# ------------------------------------------------------------------ the hand-written GPU fixture
def test_gpu_fixture_keeps_every_device_event_and_extends_the_last_step():
    raw = _load(FIXTURE)["traceEvents"]
    dev = [e for e in raw if e.get("cat") in DEVICE_CATS]
    steps = sorted((e for e in raw if e.get("name", "").startswith("ProfilerStep#") and e["cat"] == "user_annotation"),
                   key=lambda e: e["ts"])
    launches = {e["args"]["correlation"] for e in raw if e.get("cat") == "cuda_runtime"}
    works = step_items(read_ops(FIXTURE))
    assert [w.step for w in works] == [int(s["name"].split("#")[1]) for s in steps]  # the device copy left out
    items = [it for w in works for it in w.items]
    assert len(items) == len(dev)  # none dropped, none twice
    unlaunched = [e for e in dev if e["args"]["correlation"] not in launches]
    assert unlaunched and sum(w.n_unlaunched for w in works) == len(unlaunched)
    kept = [it for it in items if it["unlaunched"]]
    assert [it["kernel"] for it in kept] == [e["name"] for e in unlaunched] and kept[0]["stack"] == [UNLAUNCHED]
    for w, s in zip(works, steps):
        mine = [e for e in dev if e["args"]["correlation"] in
                {it_corr for it_corr in _corrs_launched_in(raw, s)}] + \
            [e for e in unlaunched if s["ts"] <= e["ts"] < s["ts"] + s["dur"]]
        end = max([s["ts"] + s["dur"]] + [e["ts"] + e["dur"] for e in mine])
        assert w.window_us == pytest.approx(end - s["ts"])
        busy = _union_us([(e["ts"], e["ts"] + e["dur"]) for e in mine])
        assert w.busy_us == pytest.approx(busy)
        assert sum(it["us"] for it in w.items) == pytest.approx(busy)  # overlap split, not counted twice
    last = steps[-1]
    assert works[-1].window_us > last["dur"]  # its add kernel ends after the host range


def _corrs_launched_in(raw, step):
    return [e["args"]["correlation"] for e in raw if e.get("cat") == "cuda_runtime"
            and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]]


def test_gpu_fixture_parts_add_up_and_use_the_shapes_and_the_datasheet():
    ex = examine_trace(FIXTURE)
    for s in ex.per_step:
        assert abs(s["parts_sum_pct"] - 100.0) <= STEP_SUM_TOL_PCT
    d = ex.to_dict()
    assert d["ceilings"]["source"] == "datasheet" and "H100" in d["ceilings"]["label"]
    parts = {p["name"]: p for p in d["parts"]["parts"]}
    g = parts["gemm bfloat16"]  # the dtype came from the recorded Input type
    assert g["flops"] == 2 * 64 * 128 * 256
    assert g["moved_bytes"] == (64 * 128 + 128 * 256 + 64 * 256) * 2
    assert g["floor_ms"] == pytest.approx(g["floor_bytes"] / (d["ceilings"]["copy_gbps"] * 1e6))
    assert g["tensor_core_kernels"] == 1
    assert "datasheet" in g["floor_source"] and "measured" not in g["floor_source"].replace("not measured", "")
    assert all("datasheet" in v for k, v in g["evidence_sources"].items() if "ceiling" in v)
    cc = parts["copy/concat"]  # the cat (a tensor list: no usable shapes) is not floored, and says why
    assert cc["floor_ms"] is None and any("no input shapes" in n for n in cc["notes"])
    # the unlaunched copy kernel is classed by its name (copy), not dropped into idle
    raw = _load(FIXTURE)["traceEvents"]
    step1 = [w for w in ex.works if w.step == 1][0]
    un = [it for it in step1.items if it["unlaunched"]][0]
    assert un["us"] > 0 and ex.per_step[0]["parts"]["copy/concat"]["t_ms"] * 1e3 >= un["us"]
    idle = ex.per_step[0]["parts"]["gpu idle"]["t_ms"] * 1e3
    assert idle == pytest.approx(step1.window_us - step1.busy_us)
    assert len(raw) > 0


def test_without_shapes_a_part_is_said_so_and_the_walk_stops_undecided(tmp_path):
    t = _load(FIXTURE)
    for e in t["traceEvents"]:
        for k in ("Input Dims", "Input type", "Input Strides"):
            e.get("args", {}).pop(k, None)
    f = tmp_path / "noshapes.json"
    f.write_text(json.dumps(t))
    ex = examine_trace(f)
    assert all(p.floor_ms is None for p in ex.parts.parts if p.name != "gpu idle")
    assert any("no input shapes in this trace" in n for n in ex.notes)
    assert ex.per_step[0]["ops_with_shapes_pct"] == 0.0
    # the kernel parts stop at B (no floor); the device timeline alone bounds the step's slowdown from
    # below (step / busy) and answers B only where that bound reaches 1.5x
    for p in ex.parts.parts:
        if p.name != "gpu idle" and p.walk is not None:
            assert p.walk.undecided is not None and p.walk.undecided.id == "B"
    t_us = sum(w.window_us for w in ex.works if w.items)
    busy_us = sum(w.busy_us for w in ex.works if w.items)
    bound = t_us / busy_us
    if bound >= 1.5:
        assert ex.evidence["slowdown_vs_floor"] == pytest.approx(bound)
        assert "lower bound from the device timeline" in ex.evidence_sources["slowdown_vs_floor"]
    else:
        assert "slowdown_vs_floor" not in ex.evidence and ex.diagnosis.undecided is not None


def test_device_timeline_bound_walks_the_idle_part_to_J_and_stops_where_it_does_not_reach(tmp_path):
    """A trace whose device idles most of the step (HTA's MI250 toy in shape; here a fixture with its
    kernels shrunk): step / busy >= 1.5 answers B from the timeline, busy share < 60% answers F; the
    idle part walks to J on its own bound; with the kernels filling the step the bound decides nothing."""
    t = _load(FIXTURE)
    kern = [e for e in t["traceEvents"] if e.get("cat") == "kernel"]
    for e in kern:  # halved: the device idles most of the step, its work stays over examine's floor
        e["dur"] = max(1, e["dur"] // 2)
    assert sum(e["dur"] for e in kern) >= MIN_DEVICE_BUSY_US
    f_path = tmp_path / "idle.json"
    f_path.write_text(json.dumps(t))
    ex = examine_trace(f_path)
    idle = [p for p in ex.parts.parts if p.name == "gpu idle"][0]
    assert idle.share_pct >= 50 and idle.leaf_id == "J"
    assert ex.diagnosis.path[:2] == ["B", "F"]
    assert ex.evidence["dram_pct_estimated"] == pytest.approx(100 - idle.share_pct)
    # the whole step blames launches only for the idle that waited on the host's launches (the idle
    # part's host side), not for the device's own gaps: here under half the step, so H stays open
    from test_examine_trace_idle import raw_idle
    r = raw_idle(f_path, ex.works)
    host_pct = 100.0 * (r["host_ms"] + r["in_call_ms"]) / ex.parts.t_ms
    assert ex.evidence["launch_gap_pct"] == pytest.approx(host_pct)
    assert (ex.diagnosis.leaf_id == "J") == (host_pct >= 50.0)
    assert ex.diagnosis.leaf_id == "J" or ex.diagnosis.undecided.id == "H"


def test_baseline_record_gives_measured_ceilings(tmp_path):
    rec = tmp_path / "doctor.json"
    rec.write_text(json.dumps({"ceilings": {"device": "NVIDIA H100", "copy_gbps": 2000.0,
                                            "gemm_tflops": {"bf16": 500.0}}}))
    ex = examine_trace(FIXTURE, baseline=str(rec))
    assert ex.ceilings.source == "measured" and ex.ceilings.copy_gbps == 2000.0
    g = [p for p in ex.parts.parts if p.name == "gemm bfloat16"][0]
    assert g.floor_ms == pytest.approx(g.floor_bytes / (2000.0 * 1e6))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"ceilings": {}}))
    with pytest.raises(Exception, match="no measured copy ceiling"):
        examine_trace(FIXTURE, baseline=str(bad))


def test_step_selection():
    ex = examine_trace(FIXTURE, step=2)
    assert [s["step"] for s in ex.per_step] == [2]
    with pytest.raises(Exception, match="--step 9"):
        examine_trace(FIXTURE, step=9)


# ------------------------------------------------------------------ shapes against torch's formulas
@pytest.mark.parametrize("name,args", [
    ("aten::mm", ([[32, 48], [48, 16]],)),
    ("aten::addmm", ([[16], [32, 48], [48, 16]],)),
    ("aten::bmm", ([[4, 32, 48], [4, 48, 16]],)),
    ("aten::baddbmm", ([[4, 32, 16], [4, 32, 48], [4, 48, 16]],)),
])
def test_flops_from_shapes_equal_torch_flop_counter(name, args):
    from torch.utils.flop_counter import FlopCounterMode

    shapes = args[0]
    ts = [torch.randn(*s) for s in shapes]
    fn = getattr(torch, name.split("::")[1])
    with FlopCounterMode(display=False) as fc:
        out = fn(*ts)
    rec = trace_shapes.ShapeModel().record(name, {"Input Dims": shapes, "Input type": ["float"] * len(shapes)})
    assert rec.flops == fc.get_total_flops()
    assert rec.written_bytes == out.numel() * 4


def test_flops_of_linear_conv_and_attention_equal_torch():
    from torch.utils.flop_counter import FlopCounterMode

    x, w, b = torch.randn(8, 12, 32), torch.randn(24, 32), torch.randn(24)
    with FlopCounterMode(display=False) as fc:
        torch.nn.functional.linear(x, w, b)
    r = trace_shapes.ShapeModel().record("aten::linear", {"Input Dims": [[8, 12, 32], [24, 32], [24]],
                                                          "Input type": ["float"] * 3})
    assert r.flops == fc.get_total_flops()
    xi, wi = torch.randn(2, 3, 17, 19), torch.randn(8, 3, 3, 5)
    with FlopCounterMode(display=False) as fc:
        out = torch.nn.functional.conv2d(xi, wi, stride=2, padding=1)
    r = trace_shapes.ShapeModel().record("aten::convolution", {
        "Input Dims": [[2, 3, 17, 19], [8, 3, 3, 5], [], [], [], [], [], [], []],
        "Input type": ["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList",
                       "Scalar"],
        "Concrete Inputs": ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]})
    assert r.flops == fc.get_total_flops() and r.written_bytes == out.numel() * 4
    from torch.utils.flop_counter import sdpa_flop_count  # the formula torch registers for the GPU kernels

    q, k, v = (2, 4, 16, 8), (2, 4, 24, 8), (2, 4, 24, 6)
    r = trace_shapes.ShapeModel().record("aten::_scaled_dot_product_flash_attention", {
        "Input Dims": [list(q), list(k), list(v)], "Input type": ["c10::BFloat16"] * 3})
    assert r.flops == sdpa_flop_count(torch.Size(q), torch.Size(k), torch.Size(v))
    assert r.written_bytes == 2 * 4 * 16 * 6 * 2


def test_span_bytes_equal_the_traffic_model_span():
    from hwlab.examine.estimate import span

    base = torch.randn(64, 96)
    for t in (base, base.t(), base[:, ::3], base[5:40:2, 10:20]):
        lo, hi = span(t)
        assert trace_shapes.span_bytes(list(t.shape), list(t.stride()), 4) == hi - lo


def test_peak_and_lab_tables_match_the_live_examination():
    import hwlab.examine as live
    from hwlab.diagnosis.flowchart import LEAVES
    from hwlab.examine import from_trace

    assert from_trace.PEAK_FOR_DTYPE == live.PEAK_FOR_DTYPE
    assert all(from_trace.leaf_lab(k) == live.leaf_lab(k) for k in LEAVES)


# ------------------------------------------------------------------ a CPU trace recorded here
def _record_cpu_trace(path: Path, n_steps: int = 3, n: int = 384) -> None:
    """A CPU trace with shapes: n_steps steps of a GEMM, an elementwise chain and a cat; n sized so a
    step lasts well over trace_enough.MIN_STEP_US on any CPU (the honest-nothing floor)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    a, b, x = torch.randn(n, n), torch.randn(n, n), torch.randn(1 << 14)

    def step():
        y = a @ b
        z = torch.relu(x * 1.5 + 0.25)
        return y, torch.cat([z, z])

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=n_steps, repeat=1)) as p:
        for _ in range(n_steps + 1):
            step()
            p.step()
    p.export_chrome_trace(str(path))


def test_cpu_trace_recorded_with_shapes(tmp_path):
    f = tmp_path / "cpu.pt.trace.json"
    _record_cpu_trace(f)
    raw = _load(f)["traceEvents"]
    n_steps = sum(1 for e in raw if e.get("name", "").startswith("ProfilerStep#") and e.get("ph") == "X")
    ex = examine_trace(f)
    assert not ex.on_gpu and len(ex.per_step) == n_steps >= 2
    for s in ex.per_step:
        assert abs(s["parts_sum_pct"] - 100.0) <= STEP_SUM_TOL_PCT
    mm = [p for p in ex.parts.parts if p.name == "gemm float32"]
    assert mm and mm[0].flops == 2 * 384 ** 3  # from the recorded shapes of aten::mm
    cc = [p for p in ex.parts.parts if p.name == "copy/concat"]
    # cat's tensor list records dims only: its members take the dtype of relu's output of that size
    assert cc and cc[0].moved_bytes == 3 * (1 << 14) * 4 and cc[0].floor_ms is None  # no --baseline: no ceiling


# ------------------------------------------------------------------ the annotated copy
@pytest.mark.parametrize("which", ["hand-written", "recorded-here"])
def test_annotated_copy_keeps_every_event_and_reads_back_the_same_parts(tmp_path, which):
    if which == "hand-written":
        src = FIXTURE
    else:
        src = tmp_path / "cpu.json"
        _record_cpu_trace(src)
    ex = examine_trace(src)
    out = write_annotated(ex, tmp_path / "x.annotated.trace.json.gz")
    orig = _load(Path(src))
    ann = _load(out)
    added = [e for e in ann["traceEvents"] if e.get("cat") == ANNOTATION_CAT or
             (e.get("ph") == "M" and e.get("pid") == _track_pid(ann))]
    kept = [e for e in ann["traceEvents"] if e not in added]
    assert kept == orig["traceEvents"]  # count and content, in order
    assert {k: v for k, v in ann.items() if k != "traceEvents"} == {k: v for k, v in orig.items() if k != "traceEvents"}
    pid = _track_pid(ann)
    assert pid not in {e.get("pid") for e in orig["traceEvents"]}
    meta = {e["name"]: e["args"]["name"] for e in added if e["ph"] == "M" and "name" in e.get("args", {})}
    assert meta == {"process_name": TRACK_PROCESS, "thread_name": TRACK_THREAD}
    ranges = [e for e in added if e["ph"] == "X"]
    for e in ranges:
        assert e["pid"] == pid and e["tid"] == 0 and isinstance(e["ts"], (int, float)) and e["dur"] > 0
    want = sum(1 for s in ex.per_step for v in s["parts"].values() if v["t_ms"] > 0)
    assert len(ranges) == want == len(read_annotations(out))
    head = ex.parts.headline
    marked = [e for e in ranges if e["name"].endswith(HEADLINE_MARK)]
    assert (len(marked) == len(ex.per_step)) if head else not marked
    for w in ex.works:  # each step's ranges are laid end to end from its start and fill its time
        mine = sorted((e for e in ranges if e["args"]["step"] == w.step), key=lambda e: e["ts"])
        assert mine[0]["ts"] == pytest.approx(w.ts)
        assert sum(e["dur"] for e in mine) == pytest.approx(
            [s for s in ex.per_step if s["step"] == w.step][0]["parts_sum_ms"] * 1e3)
    again = examine_trace(out)
    a, b = again.to_dict()["parts"], ex.to_dict()["parts"]
    assert a == b
    with pytest.raises(Exception, match="exists"):
        write_annotated(ex, out)


def _track_pid(t: dict):
    return next(e["pid"] for e in t["traceEvents"] if e.get("ph") == "M" and e.get("name") == "process_name"
                and e.get("args", {}).get("name") == TRACK_PROCESS)


# ------------------------------------------------------------------ live and trace agree (CPU)
def _agree(p_leaf, p_alts, q_leaf, q_alts) -> bool:
    """Two readings of one part agree: the same leaf, or one BORDERLINE with the other's leaf
    among its alternatives (the evidence straddles a threshold, and says so)."""
    return p_leaf == q_leaf or q_leaf in (p_alts or []) or p_leaf in (q_alts or [])


@pytest.mark.slow
@pytest.mark.parametrize("profile", machine_profiles(), ids=lambda m: m.name)
@pytest.mark.parametrize("module,fn", [("gemm_plus_chain", "gemm_plus_chain"), ("row_gather", "row_gather")])
def test_live_examination_and_its_trace_give_the_same_parts_and_leaves(tmp_path, module, fn, profile):
    """One examination, read twice: live (traffic model, measured median) and from the trace its
    profiler wrote (recorded shapes, the trace's own step times), on this machine's last-level
    cache and on a second machine profile's (a cache far from this one's, so a rule that only
    holds for one cache size fails here). The ceilings are fixed for the test (far above what this
    CPU reaches: what is compared is the two readers, not this CPU's speed). The trace carries the
    cache the live walk used, so both judge wasted traffic on the same fact; the floors depend only
    on bytes and FLOPs, so they must agree closely."""
    import importlib

    from hwlab.core.ceilings import Ceilings
    from hwlab.examine import examine

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        m = importlib.import_module(module)
    finally:
        sys.path.pop(0)
    c = Ceilings(device="CPU (fixed for the test)", copy_gbps=500.0, gemm_tflops={"fp32": 50.0},
                 source="fixed for the test")
    ex = examine(getattr(m, fn), make_inputs=m.inputs, ceilings=c, max_total_s=1.0, cache_bytes=profile.cache_bytes)
    assert ex.counts["cache_bytes"] == profile.cache_bytes
    assert _load(Path(ex.trace_path))[KIT_CACHE_BYTES_KEY] == profile.cache_bytes
    rec = tmp_path / "live.json"
    rec.write_text(ex.to_json())  # the live examination's record is the --baseline (its ceilings, its cache)
    alone = examine_trace(ex.trace_path)  # no --baseline: the cache from the trace, no ceilings (a CPU trace)
    assert alone.ceilings.cache_bytes == profile.cache_bytes and alone.ceilings.copy_gbps is None
    assert {p.name for p in alone.parts.parts} == {p.name for p in ex.parts.parts}
    for tx in (examine_trace(ex.trace_path, baseline=str(rec)),):
        assert tx.ceilings.cache_bytes == profile.cache_bytes
        live = {p.name: p for p in ex.parts.parts}
        from_trace = {p.name: p for p in tx.parts.parts}
        assert set(live) == set(from_trace)
        for name, p in live.items():
            q = from_trace[name]
            assert abs(p.share_pct - q.share_pct) <= 5.0, name
            assert _agree(p.leaf_id, p.alternatives, q.leaf_id, q.alternatives), (
                profile.name, name, p.walk and p.walk.path, p.alternatives, q.walk and q.walk.path, q.alternatives)
            assert (p.floor_ms is None) == (q.floor_ms is None), name
            if p.floor_ms:
                assert q.floor_ms == pytest.approx(p.floor_ms, rel=0.10), name
            assert (p.traffic_ratio is None) == (q.traffic_ratio is None), (name, p.traffic_ratio, q.traffic_ratio)
        hl, ht = ex.parts.headline, tx.parts.headline
        assert (hl.name if hl else None) == (ht.name if ht else None)
        if hl is not None:
            assert _agree(hl.leaf_id, ex.parts.headline_alternatives, ht.leaf_id, tx.parts.headline_alternatives)
    # the live run's unprofiled median travels in its trace and is the step time the trace's parts share
    assert _load(Path(ex.trace_path))[KIT_UNPROFILED_MEDIAN_KEY] == pytest.approx(ex.measurement.t_ms)
    assert tx.parts.t_ms == pytest.approx(ex.measurement.t_ms)


def test_a_trace_without_its_machines_cache_says_F_is_judged_without_the_bound(tmp_path):
    """A trace nobody's examine wrote carries no cache: the reading never borrows this machine's
    (the trace may come from any machine), computes no wasted-traffic ratio, and says why and what
    to pass; with the kit's key present it uses that cache and says where it came from."""
    f = tmp_path / "cpu.pt.trace.json"
    _record_cpu_trace(f, n=384)  # steps well over trace_enough.MIN_STEP_US on any CPU
    ex = examine_trace(f, baseline=str(BASELINE_CPU))
    assert ex.ceilings.cache_bytes is None
    assert all(p.traffic_ratio is None for p in ex.parts.parts)
    assert any("cache is not in this trace" in n for n in ex.notes)
    t = _load(f)
    t[KIT_CACHE_BYTES_KEY] = 3 * 2 ** 20
    f.write_text(json.dumps(t))
    ex = examine_trace(f, baseline=str(BASELINE_CPU))
    assert ex.ceilings.cache_bytes == 3 * 2 ** 20 and ex.to_dict()["ceilings"]["cache_bytes"] == 3 * 2 ** 20
    assert any("3 MiB (the cache hwlab examine wrote into this trace)" in n for n in ex.notes)
    for bad in (True, -1, "8MB", 2 ** 60):  # not a cache size: unknown, never a crash
        t[KIT_CACHE_BYTES_KEY] = bad
        f.write_text(json.dumps(t))
        assert examine_trace(f, baseline=str(BASELINE_CPU)).ceilings.cache_bytes is None


def test_only_the_kits_own_trace_gives_an_unprofiled_median(tmp_path):
    """A ProfilerStep trace is read on its own step times even if it carries the kit's key: the
    unprofiled median belongs to the kit's examine_call ranges only."""
    f = tmp_path / "cpu.pt.trace.json"
    _record_cpu_trace(f)
    assert unprofiled_median_ms(read_ops(f)) is None
    t = _load(f)
    t[KIT_UNPROFILED_MEDIAN_KEY] = 0.001
    f.write_text(json.dumps(t))
    ex = examine_trace(f)
    assert unprofiled_median_ms(ex.ot) is None and ex.parts.t_ms > 0.001


# ------------------------------------------------------------------ the command
def _cli(*args, env=None):
    e = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "hwlab", "examine", *args], capture_output=True, text=True,
                          env=e, timeout=300)


@pytest.mark.slow
def test_cli_trace_json_out_and_bad_input(tmp_path):
    out = tmp_path / "x.json"
    r = _cli("--trace", str(FIXTURE), "--json", "--out", str(out))
    d = json.loads(r.stdout)
    # the device idles most of the step: the idle part walks to J on its own bound (exit 1, a finding);
    # the whole step's launch share is its host side only (under half the step), so its walk stays open at H
    idle = next(p for p in d["parts"]["parts"] if p["name"] == "gpu idle")
    assert r.returncode == 1 and d["leaf"] == "J" and idle["leaf"] == "J", r.stderr
    assert d["evidence"]["launch_gap_pct"] < 50 and d["whole_function_leaf"] is None
    assert "device timeline" in d["evidence_sources"]["slowdown_vs_floor"]
    assert d["source"] == "trace" and d["parts"]["parts"] and json.loads(out.read_text()) == d
    assert (tmp_path / "x.annotated.trace.json.gz").is_file()
    rank3 = tmp_path / "r.json"
    rank3.write_text(json.dumps({**_load(FIXTURE), "distributedInfo": {"rank": 3}}))
    again = _cli("--trace", str(FIXTURE), "--out", str(out))
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1
    for bad in (["examples/unfused_chain.py:unfused_chain", "--trace", str(FIXTURE)],
                ["--trace", str(FIXTURE), "--step", "9"], ["--trace", str(tmp_path / "missing.json")],
                ["--trace", str(FIXTURE), "--ncu"], ["--trace", str(rank3), "--rank", "1"]):
        r = _cli(*bad)
        assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, (bad, r.stderr)
    trunc = tmp_path / "trunc.json"
    trunc.write_text(FIXTURE.read_text()[:1500])
    r = _cli("--trace", str(trunc))
    assert r.returncode == 2 and "truncated" in r.stderr or "malformed" in r.stderr


@pytest.mark.slow
def test_trace_path_runs_where_torch_cannot_be_imported(tmp_path):
    """A finder that refuses torch; the trace path must not need it. Where hwlab's own package
    imports (outside the trace modules) still pull torch in, the test says which and skips:
    that is the start-up work of issue 45, not this path's."""
    block = tmp_path / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ModuleNotFoundError(\"No module named 'torch' (blocked by the test)\")\n"
        "sys.meta_path.insert(0, _NoTorch())\n")
    env = {"PYTHONPATH": f"{block}{os.pathsep}{ROOT / 'src'}"}
    r = _cli("--trace", str(FIXTURE), "--json", env=env)
    if r.returncode not in (1, 4):
        mine = ("trace_ops.py", "trace_shapes.py", "from_trace.py")
        frames = [ln for ln in r.stderr.splitlines() if ln.strip().startswith("File ") and "hwlab" in ln]
        assert "blocked by the test" in r.stderr, r.stderr[-2000:]
        last = frames[-1] if frames else ""
        assert not any(m in last for m in mine), f"a trace module imports torch: {last}"
        pytest.skip(f"hwlab's package imports still pull torch in outside the trace path ({last.strip()})")
    assert json.loads(r.stdout)["source"] == "trace"


# ------------------------------------------------------------------ traces recorded by others (opt-in)
def _honest_nothing(raw_events, e) -> bool:
    """An honest nothing is due: the raw device time (union of device intervals) is under examine's
    floor, or the steps are too short or too sparse (examine/trace_enough.py)."""
    from hwlab.examine.trace_enough import MIN_DEVICE_BUSY_US, MIN_ITEMS_PER_STEP, MIN_STEP_US
    iv, busy, end = sorted((float(x["ts"]), float(x["ts"]) + float(x.get("dur", 0))) for x in raw_events
                           if x.get("ph") == "X" and str(x.get("cat")).lower() in
                           ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset")), 0.0, None
    for a, b in iv:
        if end is None or a > end:
            busy, end = busy + (b - a), b
        elif b > end:
            busy, end = busy + (b - end), b
    f = e.facts
    lone_us = f["busy_us_per_step"] if f["on_gpu"] else f["mean_step_us"]
    return busy < MIN_DEVICE_BUSY_US or f["mean_step_us"] < MIN_STEP_US or (
        f["items_per_step"] < MIN_ITEMS_PER_STEP and lone_us < MIN_STEP_US)


FOREIGN = ("critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
           "triton_example/triton_example.json.gz",
           "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
           "trace_filter/sampled_rank-0.json.gz",
           "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")


@pytest.mark.slow
@pytest.mark.parametrize("rel", FOREIGN)
def test_foreign_traces(rel, tmp_path):
    root = os.environ.get("HWLAB_FOREIGN_TRACES")
    if not root:
        pytest.skip("set HWLAB_FOREIGN_TRACES to a folder of public traces (e.g. HolisticTraceAnalysis' "
                    "tests/data) to run this")
    f = Path(root) / rel
    if not f.is_file():
        pytest.skip(f"{rel} is not under {root}")
    raw = _load(f)["traceEvents"]
    from hwlab.examine.trace_enough import NothingToDiagnose
    try:
        ex = examine_trace(f)
    except NothingToDiagnose as e:  # too little to diagnose: only where the raw device time says so
        assert _honest_nothing(raw, e), e.facts
        return
    for s in ex.per_step:  # every step's parts add up to its time
        assert abs(s["parts_sum_pct"] - 100.0) <= STEP_SUM_TOL_PCT, s
    steps = ex.ot.steps
    dev = [e for e in raw if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS]
    launches = {e["args"].get("correlation") for e in raw if e.get("ph") == "X" and "correlation" in e.get("args", {})
                and e.get("cat") not in DEVICE_CATS}
    lo = steps[0]["ts"]
    inside = [e for e in dev if (e["args"].get("correlation") in launches and any(
        s["ts"] <= _launch_ts(raw, e) <= s["ts"] + s["dur"] for s in steps)) or
        (e["args"].get("correlation") not in launches and e["ts"] >= lo)]
    n_items = sum(len(w.items) for w in ex.works)
    if dev:  # kernels without a launch record are kept, not dropped
        assert n_items == len(inside)
    shaped = [e for e in raw if e.get("cat") == "cpu_op" and str(e.get("name", "")).startswith("aten::")
              and e.get("args", {}).get("Input Dims")]
    if shaped:  # shapes are used where present (aten ops: a Triton launch's arguments are not an op's inputs)
        assert any(s["ops_with_shapes_pct"] > 0 for s in ex.per_step)
        assert any(p.moved_bytes for p in ex.parts.parts if p.name not in ("gpu idle", "host outside ops"))
    if dev:  # the same trace with every other launch record removed: those kernels are kept, unlaunched
        full = _load(f)
        by_corr = {e["args"].get("correlation") for e in dev}
        cut = sorted(c for c in by_corr if c in launches)[::2]
        drop = set(cut)
        full["traceEvents"] = [e for e in full["traceEvents"] if not (
            e.get("ph") == "X" and e.get("cat") not in DEVICE_CATS and e.get("args", {}).get("correlation") in drop)]
        g = tmp_path / "cut.json"
        g.write_text(json.dumps(full))
        cx = examine_trace(g)
        orphans = [e for e in dev if e["args"].get("correlation") in drop or
                   e["args"].get("correlation") not in launches]
        kept = [e for e in orphans if e["ts"] >= lo]
        assert sum(w.n_unlaunched for w in cx.works) == len(kept)
        assert sum(len(w.items) for w in cx.works) >= len(kept)
        for s in cx.per_step:
            assert abs(s["parts_sum_pct"] - 100.0) <= STEP_SUM_TOL_PCT, s


_LAUNCH_CACHE: dict = {}


def _launch_ts(raw, e):
    key = id(raw)
    if key not in _LAUNCH_CACHE:
        _LAUNCH_CACHE.clear()
        _LAUNCH_CACHE[key] = {x["args"]["correlation"]: x["ts"] for x in raw if x.get("ph") == "X"
                              and x.get("cat") not in DEVICE_CATS and "correlation" in x.get("args", {})}
    return _LAUNCH_CACHE[key].get(e["args"].get("correlation"), -1)


def test_a_folder_needs_the_rank_and_finds_it_by_name_or_content(tmp_path):
    from hwlab.traces.trace_ops import find_trace

    t = _load(FIXTURE)
    (tmp_path / "job_rank0.json").write_text(json.dumps(t))
    with gzip.open(tmp_path / "worker-b.pt.trace.json.gz", "wt") as f:  # rank only in its content
        json.dump({**t, "distributedInfo": {"rank": 3, "world_size": 4}}, f)
    assert find_trace(tmp_path, 0).name == "job_rank0.json"
    assert find_trace(tmp_path, 3).name == "worker-b.pt.trace.json.gz"
    with pytest.raises(Exception, match="--rank"):
        find_trace(tmp_path)
    with pytest.raises(Exception, match="rank 7"):
        find_trace(tmp_path, 7)
    assert examine_trace(find_trace(tmp_path, 3)).ot.rank == 3


TRACE_MODULES = ("src/hwlab/traces/trace_ops.py", "src/hwlab/traces/trace_shapes.py", "src/hwlab/examine/from_trace.py")


def test_trace_modules_import_no_torch_anywhere():
    import ast

    for rel in TRACE_MODULES:
        tree = ast.parse((ROOT / rel).read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names] + \
            [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n.split(".")[0] in ("torch", "numpy", "triton")], rel


@pytest.mark.slow
def test_trace_modules_run_without_torch_beside_the_package_imports(tmp_path):
    """The trace modules and what they import (parts, flowchart, profiling, kineto, specs, store)
    run with torch unimportable. Three package-level imports that pull torch in today are set
    aside by name (hwlab/__init__, hwlab/examine/__init__, and flowchart's re-export of
    core.roofline): they are issue 45's start-up work, checked by the CLI test above once done."""
    script = tmp_path / "run.py"
    script.write_text(
        "import sys, types, json\n"
        "class _NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'triton'):\n"
        "            raise ModuleNotFoundError('blocked by the test: ' + name)\n"
        "sys.meta_path.insert(0, _NoTorch())\n"
        f"src = {str(ROOT / 'src' / 'hwlab')!r}\n"
        "for name, p in (('hwlab', src), ('hwlab.examine', src + '/examine')):\n"
        "    m = types.ModuleType(name); m.__path__ = [p]; sys.modules[name] = m\n"
        "r = types.ModuleType('hwlab.core.roofline'); r.evidence_from_measurement = None\n"
        "sys.modules['hwlab.core.roofline'] = r\n"
        "from pathlib import Path\n"
        "from hwlab.examine.from_trace import examine_trace, write_annotated\n"
        "ex = examine_trace(sys.argv[1])\n"
        "write_annotated(ex, Path(sys.argv[2]))\n"
        "print(ex.to_json())\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'torch']\n")
    r = subprocess.run([sys.executable, str(script), str(FIXTURE), str(tmp_path / "a.trace.json.gz")],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["parts"]["parts"] and (tmp_path / "a.trace.json.gz").is_file()


TRACES = Path(__file__).parent / "data" / "traces"


def _device_idle_pct(path: Path, works) -> float:
    """GPU idle over the selected steps on the raw device timeline, from the JSON alone."""
    import gzip
    raw = json.load(gzip.open(path))["traceEvents"]
    lo = min(w.ts for w in works)
    hi = max(w.ts + w.window_us for w in works)
    iv = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in raw if e.get("ph") == "X"
                and str(e.get("cat")).lower() in ("kernel", "memcpy", "memset", "gpu_memcpy", "gpu_memset"))
    busy, cur = 0.0, None
    for a, b in iv:
        a, b = max(a, lo), min(b, hi)
        if b <= a:
            continue
        if cur and a <= cur[1]:
            cur[1] = max(cur[1], b)
        else:
            busy += (cur[1] - cur[0]) if cur else 0.0
            cur = [a, b]
    busy += (cur[1] - cur[0]) if cur else 0.0
    return 100.0 * (1 - busy / (hi - lo))


@pytest.mark.slow
def test_a_pytorch_18_trace_is_read_with_convolutions_as_gemm_work():
    """PyTorch 1.8's categories (Operator, Kernel, Runtime) are read; cuDNN convolution kernels
    (scudnn, implicit_convolve, winograd, wgrad/dgrad engines) land in the GEMM part; idle is the
    device timeline's own, within 2 points of a raw union over the same steps."""
    f = public_trace(PYTORCH18)
    ex = examine_trace(f)
    assert ex.on_gpu and ex.ot.step_source.startswith("ProfilerStep") and len(ex.works) >= 5
    conv = [it for w in ex.works for it in w.items
            if any(m in it["kernel"] for m in ("scudnn", "implicit_convolve", "winograd", "wgrad_alg0"))]
    assert conv
    gemm_ms = sum(p.t_ms for p in ex.parts.parts if p.name.startswith("gemm"))
    conv_ms = sum(it["us"] for it in conv) / len([w for w in ex.works if w.items]) / 1e3
    assert gemm_ms >= conv_ms > 0
    idle = [p for p in ex.parts.parts if p.name == "gpu idle"][0]
    assert abs(idle.share_pct - _device_idle_pct(f, [w for w in ex.works if w.items])) <= 2.0
    assert ex.ot.meta.get("schemaVersion") == 1 and any("sync points" in n for n in ex.notes)
    # 1.8 recorded dims without dtypes: the note names the recording that would floor the parts
    assert any("input dims but no dtypes" in n and "record_shapes=True" in n for n in ex.notes)
    # the 29.6%-idle step bounds its slowdown at 1.42x (< 1.5): the step's bound decides nothing, the whole-step
    # walk stays open at B (its idle part's own floor decides: test_examine_trace_idle)
    assert "slowdown_vs_floor" not in ex.evidence and ex.diagnosis.undecided.id == "B"


def test_an_amd_trace_reaches_a_leaf_on_what_its_device_timeline_measures():
    f = public_trace(MI250)
    ex = examine_trace(f)
    # the whole step answers B on the device timeline's bound; its idle is mostly a first call's long launch
    # (one-time work), so it stops at H instead of blaming launches (test_examine_trace_idle)
    assert ex.diagnosis.path[:1] == ["B"] and ex.diagnosis.undecided is not None
    assert "device timeline" in ex.evidence_sources["slowdown_vs_floor"]
    # 'AMD Radeon Graphics' names no part: its 104 compute units and 64 GiB match one datasheet entry only
    assert ex.ceilings.source == "datasheet" and "MI250 GCD" in ex.ceilings.label and "104 compute units" in \
        ex.ceilings.label
    assert not any("datasheet" in v for k, v in ex.evidence_sources.items() if k != "matmul_flops" and
                   "device timeline" in v)  # a timeline bound uses no peak: it is not relabelled as one


def test_conv_flops_from_recorded_shapes():
    """A 7x7 stride-2 pad-3 convolution as torch records it: 2 * N*Cout*Hout*Wout * Cin*kh*kw."""
    from hwlab.traces.trace_shapes import ShapeModel
    args = {"Input Dims": [[8, 3, 224, 224], [64, 3, 7, 7], [], [], [], [], []],
            "Input type": ["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Scalar"],
            "Concrete Inputs": ["", "", "", "[2, 2]", "[3, 3]", "[1, 1]", "1"]}
    r = ShapeModel().record("aten::conv2d", args)
    assert r is not None and r.flops == 2 * 8 * 64 * 112 * 112 * 3 * 7 * 7
    from hwlab.core.profiling import part_class
    assert part_class("aten::conv2d", "volta_scudnn_128x64_relu_interior_nn_v1", ("float32",)).startswith("gemm")
    assert part_class("aten::add", "void at::native::convert_kernel<float>", ()) != "gemm"


def test_conv_backward_flops_and_class():
    """A convolution's backward (grad_input and grad_weight) counts two forwards' FLOPs, and is
    GEMM-class whichever name it carries (aten op, cuDNN wgrad/dgrad kernel)."""
    from hwlab.traces.trace_shapes import ShapeModel
    go, x, w = [8, 64, 56, 56], [8, 64, 56, 56], [64, 64, 3, 3]
    args = {"Input Dims": [go, x, w, [], [], [], [], [], [], [], []],
            "Input type": ["float", "float", "float", "", "", "", "", "", "", "", ""]}
    r = ShapeModel().record("aten::convolution_backward", args)
    assert r is not None and r.shapes and r.kind == "matmul"
    assert r.flops == 2 * (2 * 8 * 64 * 56 * 56 * 64 * 3 * 3)
    assert r.written_bytes == 8 * 64 * 56 * 56 * 4  # grad_input; grad_weight left out (a lower bound)
    from hwlab.core.profiling import part_class
    assert part_class("aten::cudnn_convolution_backward", "void cudnn::detail::dgrad_engine<float>()").startswith("gemm")


def test_a_part_stopped_at_B_names_the_recording_that_would_decide_it(tmp_path):
    """No shapes and no device name: each walked kernel part says it needs record_shapes=True and a
    doctor record of the machine; with shapes and a datasheet GPU none is asked for."""
    t = _load(FIXTURE)
    for e in t["traceEvents"]:
        for k in ("Input Dims", "Input type", "Input Strides"):
            e.get("args", {}).pop(k, None)
    t.pop("deviceProperties", None)
    f = tmp_path / "bare.json"
    f.write_text(json.dumps(t))
    ex = examine_trace(f)
    stopped = [p for p in ex.parts.parts if p.walk is not None and p.walk.undecided is not None
               and p.name != "gpu idle"]
    assert stopped
    for p in stopped:
        assert any("record_shapes=True" in n and "doctor record" in n for n in p.notes), p.name
    full = examine_trace(FIXTURE)
    assert not any("to decide B this part needs" in n for p in full.parts.parts for n in p.notes)


def test_nan_and_negative_times_in_a_trace_leave_the_shares_unchanged(tmp_path):
    """A kernel with a NaN start and one with a negative duration would shift every share: both are
    left out, counted in a note, and the parts equal those of the trace without them."""
    t = _load(FIXTURE)
    k = next(e for e in t["traceEvents"] if e.get("cat") == "kernel")
    bad = dict(t)
    bad["traceEvents"] = t["traceEvents"] + [{**k, "ts": float("nan")}, {**k, "dur": -3}]
    f = tmp_path / "nan.json"
    f.write_text(json.dumps(bad))  # json writes NaN as the bare literal, which Python's reader accepts
    ex, clean = examine_trace(f), examine_trace(FIXTURE)
    assert any("2 event(s) with a NaN, infinite or negative time" in n for n in ex.notes)
    assert {p.name: round(p.share_pct, 9) for p in ex.parts.parts} == \
        {p.name: round(p.share_pct, 9) for p in clean.parts.parts}
