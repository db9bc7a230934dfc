"""Profiled calls that resemble the timed ones on a CPU (issue 63): page faults counted and costed,
the least disturbed calls read, op times taken without ``record_shapes`` and the shapes copied on
from a call of their own. Real faults, real profiles, real traces."""
from __future__ import annotations

import json
import mmap
import sys
from pathlib import Path

import pytest
import torch

from hwlab.core import hostwait
from hwlab.core.profiling import KIT_CALL_FAULT_KEY, KIT_CALL_WAIT_KEY, OP_SHAPE_ARGS, quiet_profile
from hwlab.examine.parts import N_STEADY_CALLS, call_disturbance_us, steady_calls
from hwlab.examine.shape_merge import merge_shapes, shapes_call

ROOT = Path(__file__).resolve().parents[1]
needs_faults = pytest.mark.skipif(hostwait.faults() is None, reason="this OS counts no page faults per thread")


@needs_faults
def test_faults_counts_the_fresh_pages_this_thread_writes():
    pages = 256
    m = mmap.mmap(-1, pages * mmap.PAGESIZE)
    try:
        f0 = hostwait.faults()
        for i in range(0, len(m), mmap.PAGESIZE):
            m[i] = 1
        f1 = hostwait.faults()
        for i in range(0, len(m), mmap.PAGESIZE):
            m[i] = 2  # present now: no more faults
        f2 = hostwait.faults()
    finally:
        m.close()
    assert pages * 0.9 <= f1 - f0 <= pages * 1.5
    assert f2 - f1 < pages * 0.1


@needs_faults
def test_a_faults_cost_is_measured_once_and_kept():
    c = hostwait.fault_us()
    assert c is not None and 0.0 < c < 1000.0  # a page fault costs ns to us, never nothing or a ms
    assert hostwait.fault_us() == c


def test_the_parts_read_the_least_disturbed_calls_in_call_order():
    n = N_STEADY_CALLS + 3
    disturb = [900.0, 0.0, 5.0, 0.0, 300.0, 0.0, 0.0, 2000.0][:n]
    keep = steady_calls(n, disturb)
    assert keep == sorted(sorted(range(n), key=lambda k: disturb[k])[:N_STEADY_CALLS])
    assert 0 not in keep and 7 not in keep and len(keep) == N_STEADY_CALLS
    assert steady_calls(n, []) == list(range(n))  # not measured: every call
    assert steady_calls(N_STEADY_CALLS, [9.0] * N_STEADY_CALLS) == list(range(N_STEADY_CALLS))


def test_a_calls_disturbance_is_its_wait_plus_its_fault_time():
    class Prof:
        call_wait_us = [1.0, 2.0, 3.0]
        call_fault_us = [10.0, 0.0, 5.0]

    assert call_disturbance_us(Prof(), 3) == [11.0, 2.0, 8.0]
    Prof.call_fault_us = []  # faults not counted: the wait alone
    assert call_disturbance_us(Prof(), 3) == [1.0, 2.0, 3.0]
    Prof.call_wait_us = [1.0, 2.0]  # not one per call: nothing
    assert call_disturbance_us(Prof(), 3) == []


MARK = "hwlab::test_call"


def _timed_trace(fn, args, n: int, tmp_path: Path) -> dict:
    from torch.profiler import ProfilerActivity, record_function
    with quiet_profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
        for _ in range(n):
            with record_function(MARK):
                fn(*args)
    p = tmp_path / "t.json"
    prof.export_chrome_trace(str(p))
    return json.loads(p.read_text())


def _ops_of_calls(trace: dict) -> list[list[dict]]:
    ev = trace["traceEvents"]
    calls = sorted((e for e in ev if e.get("name") == MARK and e.get("ph") == "X"), key=lambda e: e["ts"])
    return [sorted((e for e in ev if e.get("cat") == "cpu_op" and c["ts"] <= e["ts"] <= c["ts"] + c["dur"]),
                   key=lambda e: (e["ts"], -e["dur"])) for c in calls]


def test_the_shapes_of_one_call_land_on_every_timed_calls_ops(tmp_path):
    w = torch.randn(48, 32)

    def fn(x):
        return torch.relu(x @ w) + 1.0

    x = torch.randn(16, 48)
    trace = _timed_trace(fn, (x,), 3, tmp_path)
    assert not any("Input Dims" in e.get("args", {}) for c in _ops_of_calls(trace) for e in c)
    shapes = shapes_call(fn, (x,), {})
    assert shapes and merge_shapes(trace, MARK, shapes) and trace["record_shapes"] == 1
    calls = _ops_of_calls(trace)
    assert len(calls) == 3
    for ops in calls:
        assert [e["name"] for e in ops] == [n for n, _ in shapes]
        mm = next(e for e in ops if e["name"] == "aten::mm")
        assert mm["args"]["Input Dims"] == [[16, 48], [48, 32]]
        for e, (_, rec) in zip(ops, shapes):
            assert {k: e["args"][k] for k in OP_SHAPE_ARGS if k in rec} == rec


def test_calls_that_ran_other_ops_than_the_shapes_call_get_no_shapes(tmp_path):
    state = {"n": 0}

    def fn(x):
        state["n"] += 1
        return x * 2.0 if state["n"] % 2 else torch.sigmoid(x)

    x = torch.randn(64)
    trace = _timed_trace(fn, (x,), 2, tmp_path)
    before = json.dumps(trace, sort_keys=True)
    assert merge_shapes(trace, MARK, shapes_call(fn, (x,), {})) is False
    assert json.dumps(trace, sort_keys=True) == before


@pytest.mark.slow
def test_a_trace_read_alone_leaves_out_the_calls_its_faults_disturbed(tmp_path):
    """A live CPU examination's trace, its elementwise ops slowed tenfold in the profiled calls beyond
    the five it reads: marked as faulted (the fault key), the trace's parts equal those of the same
    trace before the slow-down; unmarked, the slowed calls are among those read and the elementwise
    share moves."""
    import importlib

    from hwlab.core.ceilings import Ceilings
    from hwlab.examine import N_PROFILED, examine
    from hwlab.examine.from_trace import examine_trace

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        m = importlib.import_module("gemm_plus_chain")
    finally:
        sys.path.pop(0)
    c = Ceilings(device="CPU (fixed for the test)", copy_gbps=500.0, gemm_tflops={"fp32": 50.0},
                 source="fixed for the test")
    ex = examine(m.gemm_plus_chain, make_inputs=m.inputs, ceilings=c, max_total_s=1.0)
    t = json.loads(Path(ex.trace_path).read_text())
    assert len(t[KIT_CALL_WAIT_KEY]) == len(t[KIT_CALL_FAULT_KEY]) == N_PROFILED
    calls = _ops_of_calls_marked(t, "hwlab::examine_call")
    assert all("Input Dims" in e["args"] for ops in calls for e in ops)  # the shapes call's, copied on
    bad = list(range(N_PROFILED - N_STEADY_CALLS))  # the calls the least disturbed leave out
    t[KIT_CALL_WAIT_KEY] = [0.0] * N_PROFILED
    t[KIT_CALL_FAULT_KEY] = [5000.0 if k in bad else 0.0 for k in range(N_PROFILED)]
    clean = tmp_path / "clean.json"  # the same calls read, none of them slowed yet
    clean.write_text(json.dumps(t))
    base = {p.name: p.share_pct for p in examine_trace(clean).parts.parts}
    for k in bad:  # the chain's ops (no ops under them) ten times slower in the first calls
        for e in [e for e in calls[k] if e["name"] in ("aten::mul", "aten::add", "aten::sigmoid")]:
            _slow_down(t["traceEvents"], e, 9.0 * e["dur"])
    marked = tmp_path / "marked.json"
    t[KIT_CALL_FAULT_KEY] = [5000.0 if k in bad else 0.0 for k in range(N_PROFILED)]
    marked.write_text(json.dumps(t))
    unmarked = tmp_path / "unmarked.json"
    t[KIT_CALL_FAULT_KEY] = [0.0] * N_PROFILED
    unmarked.write_text(json.dumps(t))
    ew = "elementwise/reduction"
    read_marked = {p.name: p.share_pct for p in examine_trace(marked).parts.parts}
    read_unmarked = {p.name: p.share_pct for p in examine_trace(unmarked).parts.parts}
    assert read_marked == pytest.approx(base, abs=1e-6)  # the same calls read
    assert read_unmarked[ew] > base[ew] + 5.0


def _ops_of_calls_marked(trace: dict, mark: str) -> list[list[dict]]:
    ev = trace["traceEvents"]
    calls = sorted((e for e in ev if e.get("name") == mark and e.get("ph") == "X"), key=lambda e: e["ts"])
    return [[e for e in ev if e.get("cat") == "cpu_op" and c["ts"] <= e["ts"] <= c["ts"] + c["dur"]] for c in calls]


def _slow_down(events: list[dict], op: dict, delta_us: float) -> None:
    """``op`` takes ``delta_us`` longer: what ran after it starts later, what holds it lasts longer."""
    start, end = op["ts"], op["ts"] + op["dur"]
    for e in events:
        if e.get("ph") != "X" or e is op:
            continue
        if e["ts"] >= end:
            e["ts"] += delta_us
        elif e["ts"] <= start and e["ts"] + e.get("dur", 0) >= end:
            e["dur"] += delta_us
    op["dur"] += delta_us


def _item(op: str, us: float, ts: float) -> dict:
    return {"stack": [op], "op_ids": [int(ts)], "us": us, "kernel": None, "compiled": False, "args": None, "ts": ts,
            "dur": us}


def test_calls_most_of_which_waited_take_each_ops_least_time():
    """Most calls preempted: the long op caught a wait in three of five calls, so its median holds one;
    its least time does not. Where at most half the calls waited, the median stands."""
    from hwlab.examine.parts import WAITED_SHARE, most_waited, op_medians

    steady = {"aten::addmm": 900.0, "aten::gelu": 60.0, "aten::add": 30.0}
    calls, call_us = [], []
    for k in range(5):
        t, items = 0.0, []
        for op, us in steady.items():
            waited = (op == "aten::addmm" and k < 3) or (op == "aten::add" and k == 4)
            us = us + (3000.0 if waited else 0.0)
            items.append(_item(op, us, t))
            t += us + 10.0
        calls.append(items)
        call_us.append(t)
    waits = [3000.0, 3000.0, 3000.0, 0.0, 3000.0]
    assert min(w / u for w, u in zip(waits, call_us) if w) >= WAITED_SHARE
    assert most_waited(call_us, waits)
    assert not most_waited(call_us, [3000.0, 3000.0, 0.0, 0.0, 0.0])  # two of five: the median holds no wait
    assert not most_waited(call_us, [])
    items, total_us, _ = op_medians(calls, call_us, least=True)
    assert [i["us"] for i in items] == list(steady.values())
    assert total_us == pytest.approx(sum(steady.values()) + 3 * 10.0)
    items, _, _ = op_medians(calls, call_us)
    assert items[0]["us"] == 3900.0  # the median holds the wait


def test_the_unprofiled_calls_own_faults_are_named_from_their_share_of_the_call():
    from hwlab.examine.torch_profile import CHURN_SHARE, ProfileSummary

    p = ProfileSummary(on_gpu=False, n_calls=8, kernels_per_call=0.0, busy_ms_per_call=0.0,
                       call_faults=[2000] * 8, ref_faults=2000.0, fault_cost_us=2.5, call_fault_us=[0.0] * 8)
    line = p.churn_note(20.0)  # 2000 faults x 2.5 us = 5 ms of a 20 ms call
    assert line and "5 ms, 25% of the call" in line and "an estimate" in line
    edge_ms = 2000 * 2.5 / 1e3 / CHURN_SHARE
    assert p.churn_note(edge_ms * 1.01) is None and p.churn_note(edge_ms * 0.99)
    assert ProfileSummary(on_gpu=False, n_calls=8, kernels_per_call=0.0, busy_ms_per_call=0.0).churn_note(20.0) is None
