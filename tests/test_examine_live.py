"""``examine`` on live models on the CPU (issue 63): the dtype lever from measured ceilings, fp64's
own ceiling, fused native ops split by what they run, the CPU's per-op overhead, host time outside
ops, block sizes from the measured spread, and progress that never grows its step count."""
from __future__ import annotations

import io
import sys
import time

import pytest
import torch

from hwlab.core import ceilings
from hwlab.examine import examine
from hwlab.examine.dtype_lever import DTYPE_LEVER_MIN, gemm_ceiling
from hwlab.examine.op_overhead import PER_OP_SHARE_MIN, per_op_share, per_op_us
from hwlab.examine.progress import SUBSTEP, Progress
from hwlab.examine.timing_blocks import MIN_BLOCK_REP, block_size


@pytest.fixture(scope="module")
def cpu_ceilings():
    return ceilings.measure("cpu", quick=True)


def _c(**gemm):
    return ceilings.Ceilings(device="cpu", copy_gbps=20.0, gemm_tflops=dict(gemm))


# ------------------------------------------------------------------ the dtype lever (rules)
def test_fp32_on_a_cpu_is_judged_at_bf16_only_where_bf16_is_native_and_much_faster():
    fast = _c(fp32=0.1, bf16=0.1 * DTYPE_LEVER_MIN * 1.2, fp64=0.05)
    tf, name, lever, gain = gemm_ceiling("float32", fast, gpu=False, bf16_native=True)
    assert name == "bf16" and tf == fast.gemm("bf16") and gain == pytest.approx(DTYPE_LEVER_MIN * 1.2)
    assert "bf16" in lever and "dtype_peak='fp32'" in lever  # the action, and how to refuse it
    assert gemm_ceiling("float32", fast, gpu=False, bf16_native=False)[1] == "fp32"  # emulated bf16: no lever
    slight = _c(fp32=0.1, bf16=0.1 * DTYPE_LEVER_MIN * 0.9)
    assert gemm_ceiling("float32", slight, gpu=False, bf16_native=True)[1:3] == ("fp32", None)
    assert gemm_ceiling("float32", fast, gpu=False, dtype_peak="fp32", bf16_native=True)[1:3] == ("fp32", None)


def test_fp64_has_its_own_ceiling_or_none():
    c = _c(fp32=0.1, bf16=0.2, fp64=0.05)
    assert gemm_ceiling("float64", c, gpu=False, bf16_native=True)[:3] == (0.05, "fp64", None)
    assert gemm_ceiling("float64", _c(fp32=0.1, bf16=0.2), gpu=False)[0] is None  # not fp32's
    assert gemm_ceiling("float64", _c(tf32=400.0, bf16=900.0), gpu=True, fallback="bf16")[0] is None


def test_missing_cpu_gemm_ceilings_are_measured_not_assumed():
    old = ceilings.measure("cpu", quick=True)  # a CPU's cached ceilings: fp32 only
    c, now = ceilings.with_cpu_gemms(old, "cpu")
    want = ceilings.cpu_gemm_dtypes("cpu")
    assert set(now) == set(want) - {"fp32"} and all(c.gemm(d) and c.gemm(d) > 0 for d in want)
    assert ("bf16" in want) == ceilings.bf16_support("cpu")[0]
    assert "measured now" in c.source and old.gemm("bf16") is None  # the given ceilings are left alone


# ------------------------------------------------------------------ the dtype lever, live
@pytest.mark.slow
def test_an_fp32_gemm_part_walks_toward_i_with_the_measured_bf16_gain():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread, as the ceilings are kept per thread count
    try:
        c, _ = ceilings.with_cpu_gemms(ceilings.measure("cpu", quick=True), "cpu")  # as examine does from the cache
        a, b = torch.randn(384, 384), torch.randn(384, 384)
        ex = examine(lambda p, q: p @ q, a, b, ceilings=c, max_total_s=2.0)
    finally:
        torch.set_num_threads(threads)
    native = ceilings.bf16_support("cpu")[0]
    g = next(p for p in ex.parts.parts if p.name.startswith("gemm"))
    used = ex.ceilings["gemm_tflops"]
    if not (native and used["bf16"] >= DTYPE_LEVER_MIN * used["fp32"]):
        assert g.dtype_lever is None and "fp32" in g.floor_source
        pytest.skip("bf16 is not native, or not much faster than fp32, on this CPU: no lever to take")
    used = ex.ceilings["gemm_tflops"]  # as judged: an fp32 ceiling the function beat is raised first
    assert g.dtype_lever and g.lever_gain == pytest.approx(used["bf16"] / used["fp32"])
    assert "bf16" in g.floor_source
    assert g.saved_ms == pytest.approx(g.t_ms - g.flops / (g.ceiling_tflops * 1e9))  # the gain at bf16's ceiling
    # H is asked against bf16's ceiling: a part at its fp32 ceiling runs at 1/gain of it (I below half)
    h = next((st for st in g.walk.steps if st.question == "H"), None)
    if h is not None and h.metric == "tensor_pct_of_peak":
        assert h.value == pytest.approx(100 * g.tflops / g.ceiling_tflops)
        assert (g.leaf_id == "I") == (h.answer == "yes")
    if g.leaf_id in ("I", "J"):
        assert g.actions[0] == g.dtype_lever


@pytest.mark.slow
def test_an_fp64_gemm_is_floored_at_fp64_and_never_told_to_use_bf16(cpu_ceilings):
    c, _ = ceilings.with_cpu_gemms(cpu_ceilings, "cpu")
    a, b = torch.randn(256, 256, dtype=torch.float64), torch.randn(256, 256, dtype=torch.float64)
    ex = examine(lambda p, q: p @ q, a, b, ceilings=c, max_total_s=2.0)
    g = next(p for p in ex.parts.parts if p.name == "gemm float64")
    assert "fp64" in g.floor_source and g.dtype_lever is None
    assert ex.measurement.params["gemm_ceiling_dtype"] == "fp64"
    assert not any("run the matmul in bf16" in x for x in g.actions)


# ------------------------------------------------------------------ fused native ops
@pytest.mark.slow
def test_the_encoder_fast_path_splits_into_gemm_attention_and_elementwise(cpu_ceilings):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(128, 4, 512, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    ex = examine(enc, torch.randn(2, 64, 128), ceilings=cpu_ceilings, max_total_s=2.0)
    by = {p.name: p for p in ex.parts.parts}
    assert "gemm float32" in by and "attention" in by, list(by)
    g = by["gemm float32"]
    # its FLOPs counted from the recorded shapes: two layers of in/out projections and the MLP
    want = 2 * 2 * 64 * 2 * (128 * 3 * 128 + 128 * 128 + 2 * 128 * 512)
    assert g.flops == pytest.approx(want, rel=0.01)
    assert by["attention"].flops > 0  # the batched matmuls of attention, counted in its part
    # the whole function's count sees them too (the counter alone sees one op with none)
    assert ex.counts["n_flops"] == pytest.approx(g.flops + by["attention"].flops, rel=0.01)
    assert ex.evidence["matmul_flops"] == ex.counts["n_flops"]


# ------------------------------------------------------------------ per-op overhead and host time
def test_per_op_share_is_ops_times_the_measured_cost_over_the_time():
    cost = per_op_us(torch.device("cpu"))
    assert cost["us_p10"] <= cost["us"] <= cost["us_p90"] and cost["us"] > 0
    assert per_op_share(100, cost["us"] * 100 / 1e3, cost) == pytest.approx(1.0)
    assert per_op_share(100, cost["us"] * 400 / 1e3, cost) == pytest.approx(0.25)
    assert per_op_share(None, 1.0, cost) is None and per_op_us(torch.device("cuda")) is None


@pytest.mark.slow
def test_a_loop_of_tiny_ops_reaches_j_for_per_op_overhead(cpu_ceilings):
    def loop(x):
        for _ in range(300):
            x = x * 1.0001
        return x

    ex = examine(loop, torch.randn(16), ceilings=cpu_ceilings, max_total_s=2.0)
    ew = next(p for p in ex.parts.parts if p.name == "elementwise/reduction")
    assert ew.n_ops == 300
    if ew.leaf_id == "J":
        share = ew.j["figures"]["per_op_overhead_pct"]
        assert (ew.j["cause"] == "per-op overhead") == (share >= 100 * PER_OP_SHARE_MIN)
    assert any(n.startswith("per-op overhead: 300 aten ops") for n in ex.notes)


@pytest.mark.slow
def test_host_time_outside_ops_is_its_share_of_the_profiled_calls(cpu_ceilings):
    def python_between(x):
        y = x * 2.0
        t = time.perf_counter()
        while time.perf_counter() - t < 0.003:  # Python between two ops, no aten op under it
            pass
        return y + 1.0

    ex = examine(python_between, torch.randn(64), ceilings=cpu_ceilings, max_total_s=2.0)
    host = next(p for p in ex.parts.parts if p.name == "host outside ops")
    assert host.share_pct > 50.0  # the 3 ms of Python against two ops on 64 floats


# ------------------------------------------------------------------ block size, progress
def test_later_blocks_take_as_many_calls_as_the_first_blocks_spread_needs():
    assert block_size([10.0, 10.1, 10.05, 9.98, 10.02], 7) == MIN_BLOCK_REP  # tight: three suffice
    assert block_size([10.0, 14.0, 8.0, 12.0, 9.0], 7) == 7  # wide: the full count
    assert MIN_BLOCK_REP <= block_size([10.0, 10.6, 10.3], 7) <= 7


def test_progress_lines_within_a_step_do_not_count_as_steps():
    from hwlab.cli.console import SUBSTEP as CLI_SUBSTEP, Steps

    assert CLI_SUBSTEP == SUBSTEP
    err = io.StringIO()
    old, sys.stderr = sys.stderr, err
    try:
        st = Steps("t", 3, terminal=False)
        for label in ("a", f"{SUBSTEP}ceiling: copy", f"{SUBSTEP}ceiling: gemm fp32", "b", "c"):
            st.step(label)
    finally:
        sys.stderr = old
    assert st.total == 3 and st.done == 2
    assert [ln.split("]")[0] for ln in err.getvalue().splitlines()] == ["t: [1/3", "t: [1/3", "t: [1/3", "t: [2/3",
                                                                        "t: [3/3"]
    seen = []
    p = Progress(seen.append, 5, ("one", "two", "three", "four", "five", "six"))
    p.step("one")
    p.probe(0.1, 0.1)
    left_first = p.left_s()
    p.step(f"{SUBSTEP}inside")
    assert p.phase == "one" and seen == ["one (estimating the time left)", f"{SUBSTEP}inside"]
    p.step("five")
    assert p.left_s() < left_first and "s left, estimated" in p.line() and p.line().startswith(SUBSTEP)
