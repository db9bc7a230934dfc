"""hwlab examine on a CPU: byte/FLOP/traffic counts against hand counts, the evidence and the
walk from a real CPU run (every answer from a measured metric, re-derivable), bad input refused
with one clear line, and the command line. No test judges a CPU timing."""
import json
import re
import math
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

import pytest
import torch

import hwlab
from hwlab.core import ceilings
from hwlab.errors import UserInputError
from hwlab.examine import Examination, build_evidence, examine
from hwlab.examine.estimate import (
    count_flops, count_traffic, gather_amplification, required_bytes, span_bytes, strided_amplification)
from hwlab.examine.torch_profile import ProfileSummary
from hwlab.core.profiling import kernel_class
from hwlab.diagnosis.flowchart import diagnose
from hwlab.core.measure import Measurement, quantile

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cpu_ceilings():
    return ceilings.measure("cpu", quick=True)


# ---------------------------------------------------------------- counting against hand counts
def test_required_bytes_hand_counts():
    a, b = torch.randn(1000), torch.randn(1000)
    assert required_bytes((a, b), a + b) == (8000, 4000)
    x = torch.randn(100, 10)  # two views of one storage are one read
    assert required_bytes((x, x[:, :2]), x[:, 0] * 2) == (4000, 400)
    row = torch.randn(1, 10)  # a broadcast view covers one row: 40 bytes, not 40 kB
    assert span_bytes([row.expand(1000, 10)]) == 40
    assert required_bytes((x,), x.t()) == (4000, 0)  # a returned view writes nothing
    assert span_bytes([x[::2]]) == 99 * 10 * 4  # rows 0, 2, .., 98: the view spans 99 rows


def test_flop_counts_hand_counts():
    a, b = torch.randn(64, 32), torch.randn(32, 16)
    assert count_flops(lambda p, q: p @ q, (a, b), {}) == 2 * 64 * 32 * 16
    bb = torch.randn(3, 32, 8)
    assert count_flops(torch.bmm, (torch.randn(3, 16, 32), bb), {}) == 2 * 3 * 16 * 32 * 8
    assert count_flops(lambda p: p * 2 + 1, (a,), {}) == 0  # elementwise work is not counted


def test_traffic_of_an_unfused_chain_hand_count():
    n = 4096
    x = torch.randn(n)
    t = count_traffic(lambda v: torch.relu(v * 2 + 1) * v, (x,), {})
    # mul: r4n w4n; add: r4n w4n; relu: r4n w4n; mul(y, x): r8n w4n
    assert [o.name for o in t.ops] == ["aten::mul", "aten::add", "aten::relu", "aten::mul"]
    assert t.moved_bytes == (4 + 4 + 4 + 4 + 4 + 4 + 8 + 4) * n
    assert t.sector_amplification == 1.0
    assert t.counts()["matmul"] == 0


def test_sector_amplification_from_strides():
    x = torch.randn(64, 64)
    out = x.t().contiguous()
    assert strided_amplification(x.t(), out) == 8.0  # 32-byte sector / 4-byte item
    assert strided_amplification(x.t().half(), out.half()) == 16.0
    assert strided_amplification(x[:, ::2], x[:, ::2].contiguous()) == 2.0
    assert strided_amplification(x, x + 1) == 1.0
    t = count_traffic(lambda v: v.t().contiguous(), (x,), {})
    assert t.sector_amplification == 8.0
    assert t.moved_bytes == 64 * 64 * 4 * 8 + 64 * 64 * 4


def test_sector_amplification_from_index_values():
    n = 1 << 14
    x = torch.randn(8 * n)
    seq = torch.arange(n)
    assert gather_amplification(torch.ops.aten.index.Tensor, (x, [seq]), {}) == 1.0
    strided = torch.arange(0, 8 * n, 8)  # each lane its own sector: 32 sectors where 4 would do
    assert gather_amplification(torch.ops.aten.index.Tensor, (x, [strided]), {}) == 8.0
    shuffled = torch.randperm(8 * n)[:n]
    assert 6.0 < gather_amplification(torch.ops.aten.index_select.default, (x, 0, shuffled), {}) <= 8.0
    t = count_traffic(lambda v, i: v[i], (x, strided), {})
    # the n touched source elements read at 8x, the int64 index read once; weighted by bytes read
    src, idx = n * 4, n * 8
    assert t.sector_amplification == pytest.approx((src * 8 + idx) / (src + idx))


def test_quant_dequant_and_fallback_from_real_tensors():
    w8 = torch.randn(32, 32).to(torch.float8_e4m3fn)
    x = torch.randn(8, 32)
    t = count_traffic(lambda a, w: a @ w.to(torch.float32).t(), (x, w8), {})
    c = t.counts()
    assert (c["dequant"], c["matmul"], c["matmul_on_dequantized"], c["quant"]) == (1, 1, 1, 0)
    assert t.matmul_dtype() == "float32"
    t = count_traffic(lambda a: a.to(torch.float8_e4m3fn), (x,), {})
    assert t.counts()["quant"] == 1


def test_kernel_classes_by_name():
    assert kernel_class("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT") == ("gemm", True)
    assert kernel_class("ampere_sgemm_128x64_nn") == ("gemm", False)
    assert kernel_class("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n") == ("fp8-gemm", True)
    assert kernel_class("cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128>")[1] is True
    assert kernel_class("splitKreduce_kernel")[0] != "gemm"
    assert kernel_class("triton_poi_fused_add_mul_0")[0] == "triton"
    assert kernel_class("void at::native::vectorized_elementwise_kernel<4>")[0] == "elementwise"


# ---------------------------------------------------------------- evidence and walk
def _m(t_ms, n_bytes, n_flops, gbps=1000.0, tflops=100.0):
    return Measurement(name="f", t_ms=t_ms, t_p10_ms=t_ms, t_p90_ms=t_ms, n_bytes=n_bytes,
                       n_flops=n_flops, device="test", timer="cuda-event", n_rep=10,
                       ceiling_gbps=gbps, ceiling_tflops=tflops)


def _prof(busy_ms, triton=()):
    return ProfileSummary(on_gpu=True, n_calls=3, kernels_per_call=1, busy_ms_per_call=busy_ms,
                          triton=list(triton))


def test_build_evidence_uses_each_measured_metric_and_names_its_source():
    # 1 GB at 1000 GB/s is a 1 ms floor; 4 ms measured; 3.5 GB moved
    ev, src = build_evidence(_m(4.0, 10**9, 0), moved=35 * 10**8, amp=1.0, prof=_prof(3.9), wall_chunks_ms=[4.0] * 15,
                             flop_bound=False, ncu=None, on_gpu=True)
    assert ev["slowdown_vs_floor"] == pytest.approx(4.0)
    assert ev["dram_pct_estimated"] == pytest.approx(87.5)
    assert ev["launch_gap_pct"] == pytest.approx(2.5)
    assert "tensor_pct_of_peak" not in ev and set(src) == set(ev) - {"metric_spreads"}
    assert diagnose(ev).leaf_id == "G"
    # matmul-heavy: 1e12 FLOPs at 100 TFLOP/s is a 10 ms floor, 40 ms measured: 25% of the GEMM ceiling
    ev, _ = build_evidence(_m(40.0, 10**8, 10**12), moved=10**8, amp=None, prof=_prof(39.9), wall_chunks_ms=[40.0] * 15,
                           flop_bound=True, ncu=None, on_gpu=True)
    assert ev["tensor_pct_of_peak"] == pytest.approx(25.0) and diagnose(ev).leaf_id == "I"
    # the GPU idles 80% of the call: the launch path, whatever the tensor cores do
    ev, _ = build_evidence(_m(1.0, 10**6, 0), moved=10**6, amp=1.0, prof=_prof(0.2), wall_chunks_ms=[1.0] * 15,
                           flop_bound=False, ncu=None, on_gpu=True)
    assert ev["launch_gap_pct"] == pytest.approx(80.0) and diagnose(ev).leaf_id == "J"
    # a Triton kernel that spills
    ev, src = build_evidence(_m(40.0, 10**8, 10**12), moved=10**8, amp=None,
                             prof=_prof(39.9, [{"name": "k", "n_regs": 255, "n_spills": 300}]),
                             wall_chunks_ms=[40.0] * 15, flop_bound=True, ncu=None, on_gpu=True)
    assert ev["n_spills"] == 300 and "ptxas" in src["n_spills"] and diagnose(ev).leaf_id == "J"
    # counted figures are kept apart and named; a tensor pipe figure is ignored for non-matmul work
    ncu = {"evidence": {"dram_pct_of_peak": 80.0, "tensor_pipe_pct": 0.0}}
    ev, src = build_evidence(_m(4.0, 10**9, 0), moved=10**9, amp=None, prof=_prof(3.9), wall_chunks_ms=[4.0] * 15,
                             flop_bound=False, ncu=ncu, on_gpu=True)
    assert "Nsight" in src["dram_pct_of_peak"] and "tensor_pipe_pct" not in ev


def test_d_on_a_busy_host_reads_borderline_from_the_chunks_spread():
    """D for one function: a host that preempts a few back-to-back chunks lifts their median over
    1.2x the single calls; the chunks' p10-p90 over the single calls' p90-p10 contains 1.2, so D
    says BORDERLINE and names the re-run, instead of a confident "slow in service". A steady host's
    chunks keep D a plain NO."""
    from hwlab.examine.walk_metrics import e2e_spread
    m = Measurement(name="f", t_ms=4.0, t_p10_ms=3.9, t_p90_ms=4.3, n_bytes=10**9, n_flops=0, device="test",
                    timer="cuda-event", n_rep=20, ceiling_gbps=1000.0, ceiling_tflops=100.0)
    busy = [4.1, 4.2, 4.3, 4.4, 4.5, 5.0, 5.1, 5.2, 5.3, 5.4, 5.6, 6.0, 6.5, 7.0, 8.0]  # preempted chunks
    ev, _ = build_evidence(m, moved=10**9, amp=1.0, prof=_prof(3.9), wall_chunks_ms=busy, flop_bound=False,
                           ncu=None, on_gpu=True)
    sp = ev["metric_spreads"]["e2e_slowdown"]
    assert ev["e2e_slowdown"] == pytest.approx(statistics.median(busy) / 4.0) and ev["e2e_slowdown"] >= 1.2
    assert sp["lo"] == pytest.approx(quantile(busy, 0.1) / 4.3) and sp["hi"] == pytest.approx(quantile(busy, 0.9) / 3.9)
    d = diagnose({**ev, "slowdown_vs_floor": 1.0})
    step_d = next(s for s in d.steps if s.question == "D")
    assert step_d.answer == "yes" and step_d.borderline and "BORDERLINE" in d.explain()
    steady = [4.0, 4.05, 4.1] * 5
    ev, _ = build_evidence(m, moved=10**9, amp=1.0, prof=_prof(3.9), wall_chunks_ms=steady, flop_bound=False,
                           ncu=None, on_gpu=True)
    step_d = next(s for s in diagnose({**ev, "slowdown_vs_floor": 1.0}).steps if s.question == "D")
    assert step_d.answer == "no" and not step_d.borderline
    assert e2e_spread([4.0], m) is None  # one chunk has no spread, and none is invented


def test_examine_on_cpu_is_labelled_measured_and_rederivable(cpu_ceilings):
    def chain(x):
        return torch.sigmoid(torch.relu(x * 2 + 1) * x)

    ex = examine(chain, make_inputs=lambda: (torch.randn(1 << 14),), ceilings=cpu_ceilings)
    assert isinstance(ex, Examination) and not ex.on_gpu and "CPU" in ex.label and "indicative" in ex.label
    m = ex.measurement
    assert m.n_bytes == 2 * 4 * (1 << 14) and "estimated" in ex.counts["n_bytes_source"]
    floor_ms = m.n_bytes / (cpu_ceilings.copy_gbps * 1e9) * 1e3
    assert ex.evidence["slowdown_vs_floor"] == pytest.approx(m.t_ms / floor_ms)
    moved = ex.counts["moved_bytes"]
    assert moved == (4 + 4 + 4 + 4 + 4 + 4 + 8 + 4 + 4 + 4) * (1 << 14)
    assert ex.evidence["dram_pct_estimated"] == pytest.approx(100 * moved / (m.t_ms * 1e-3) / 1e9
                                                             / cpu_ceilings.copy_gbps)
    assert "launch_gap_pct" not in ex.evidence and "n_spills" not in ex.evidence  # no GPU here
    assert set(ex.evidence) - {"metric_spreads"} == set(ex.evidence_sources)
    assert ex.diagnosis.steps, "the walk answered at least the first question"
    for s in ex.diagnosis.steps:  # every answer from a metric this run measured
        assert s.metric in ex.evidence_sources and s.value == ex.evidence[s.metric]
        assert s.how == "measured" and s.source == ex.evidence_sources[s.metric]
    assert diagnose(ex.evidence).path == ex.diagnosis.path
    d = json.loads(ex.to_json(), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert d["walk"]["path"] == ex.diagnosis.path and d["on_gpu"] is False
    assert all(st["source"] != "by hand" and st["how"] == ("estimated" if s.estimated else "measured")
               for st, s in zip(d["walk"]["steps"], ex.diagnosis.steps))  # an estimate says so (issue 44)
    assert ex.incident.diagnosis_path == ex.diagnosis.path and ex.incident.symptom_scope == "single-card"
    assert "CPU" in ex.report() and "walk" in ex.report()
    assert m.params["n_rotating_sets"] == 1  # no L2 model on a CPU


@pytest.mark.slow
def test_caller_counts_win_and_the_gemm_floor_follows_the_dtype(cpu_ceilings):
    a, b = torch.randn(128, 128), torch.randn(128, 128)
    ex = examine(lambda p, q: p @ q, a, b, n_bytes=10**6, n_flops=2 * 128**3, ceilings=cpu_ceilings)
    assert ex.counts["n_bytes"] == 10**6 and ex.counts["n_bytes_source"] == "given by the caller"
    assert ex.counts["n_flops"] == 2 * 128**3
    assert ex.measurement.params["gemm_ceiling_dtype"] == "fp32"  # a CPU has one GEMM ceiling
    ex = examine(lambda p, q: p @ q, a, b, ceilings=cpu_ceilings)
    assert ex.counts["n_flops"] == 2 * 128**3 and "flop_counter" in ex.counts["n_flops_source"]
    m = ex.measurement  # judged against the ceilings the measurement carries (re-timed on a busy CPU)
    assert ("tensor_pct_of_peak" in ex.evidence) == (m.n_flops / (m.ceiling_tflops * 1e12) >= m.n_bytes / (m.ceiling_gbps * 1e9))
    if "tensor_pct_of_peak" in ex.evidence:
        assert ex.evidence["tensor_pct_of_peak"] == pytest.approx(m.pct_of_flops_ceiling)
    with pytest.raises(UserInputError, match="no measured ceiling"):
        examine(lambda p, q: p @ q, a, b, dtype_peak="fp8", ceilings=cpu_ceilings)


def test_hwlab_examine_is_callable_from_the_package(cpu_ceilings):
    ex = hwlab.examine(lambda v: v * 3, torch.randn(256), ceilings=cpu_ceilings)
    assert ex.counts["n_bytes"] == 2 * 4 * 256


# ---------------------------------------------------------------- bad input, one clear line
@pytest.mark.parametrize("fn,args,match", [
    (42, (torch.randn(8),), "not callable"),
    (lambda x: (_ for _ in ()).throw(ValueError("bad shape")), (torch.randn(8),), "raised ValueError: bad shape"),
    (lambda x: None, (torch.randn(8),), "returned None"),
    (lambda x: 3.0, (torch.randn(8),), "no tensor in it"),
    (lambda x: x * 2, (np.ones(8),), "numpy.ndarray"),
    (lambda n: torch.randn(n), (8,), "no tensor among the inputs"),
    (lambda x: x.add_(1), (torch.randn(8),), "changed its input"),
    (lambda x: x * 2, (torch.zeros(64),), "constant"),
])
def test_bad_input_is_refused_with_one_line(fn, args, match, cpu_ceilings):
    with pytest.raises(UserInputError, match=match) as e:
        examine(fn, *args, ceilings=cpu_ceilings)
    assert "\n" not in str(e.value)


def test_a_function_writing_an_input_through_a_raw_pointer_is_caught_by_its_checksum(cpu_ceilings):
    def sneaky(x):
        x.data.mul_(2)  # .data bypasses the version counter; the checksum still sees it
        return x + 1
    with pytest.raises(UserInputError, match="changed its input"):
        examine(sneaky, torch.randn(64), ceilings=cpu_ceilings)


def test_input_factory_errors(cpu_ceilings):
    with pytest.raises(UserInputError, match="returned int"):
        examine(lambda x: x, make_inputs=lambda: 3, ceilings=cpu_ceilings)
    with pytest.raises(UserInputError, match="either arguments or make_inputs"):
        examine(lambda x: x, torch.randn(4), make_inputs=lambda: (torch.randn(4),), ceilings=cpu_ceilings)


# ---------------------------------------------------------------- the command line
def _hwlab(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-c", "import sys; from hwlab.cli import main; sys.exit(main())",
                           *args], cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_cli_examine_json_and_exit_code(tmp_path, monkeypatch):
    out = tmp_path / "ex.json"
    r = _hwlab("examine", "examples/unfused_chain.py:unfused_chain", "--json", "--out", str(out))
    assert r.returncode in (0, 1, 4), r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["on_gpu"] is False and "CPU" in d["label"]
    leaf = d["walk"]["leaf"]
    assert r.returncode == (0 if leaf == "OK" else 4 if leaf is None else 1)
    assert diagnose(d["evidence"]).path == d["walk"]["path"]
    assert json.loads(out.read_text())["walk"]["path"] == d["walk"]["path"]
    assert list(tmp_path.glob("incident-*.md")), "a draft incident record beside the examination"
    r2 = _hwlab("examine", "examples/unfused_chain.py:unfused_chain", "--out", str(out))
    assert r2.returncode == 2 and "already exists" in r2.stderr and len(r2.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("target,match", [
    ("examples/unfused_chain.py", "MODULE:FUNC"),
    ("examples/nope.py:f", "does not exist"),
    ("examples/unfused_chain.py:nope", "has no 'nope'"),
    ("no_such_module_hwlab:f", "cannot import"),
])
def test_cli_bad_targets_exit_2_with_one_line(target, match):
    r = _hwlab("examine", target)
    # a progress line may come first on a slow host (held HOLD_S while the target imports); the refusal is one line
    said = [ln for ln in r.stderr.strip().splitlines() if not re.match(r"hwlab examine: \[\d+/\d+\] ", ln)]
    assert r.returncode == 2 and match in r.stderr and len(said) == 1, r.stderr


@pytest.mark.slow
def test_cli_without_inputs_says_what_to_pass(tmp_path):
    (tmp_path / "mine.py").write_text("def f(x):\n    return x * 2\n")
    r = _hwlab("examine", f"{tmp_path / 'mine.py'}:f")
    assert r.returncode == 2 and "--inputs" in r.stderr
    (tmp_path / "inp.py").write_text("import torch\n\ndef make():\n    return (torch.randn(1024),)\n")
    r = _hwlab("examine", f"{tmp_path / 'mine.py'}:f", "--inputs", f"{tmp_path / 'inp.py'}:make", "--json")
    assert r.returncode in (0, 1, 4), r.stderr[-1000:]
    assert not math.isnan(json.loads(r.stdout)["measurement"]["t_ms"])


MYMOD = "import torch\n\ndef f(x):\n    return x * 2.0\n\ndef inputs():\n    return (torch.randn(1 << 16),)\n"


@pytest.mark.slow
def test_cli_imports_a_module_from_the_current_folder_and_undecided_is_exit_4(tmp_path):
    """`hwlab examine mymod:f` from mymod's own folder, through the installed console script
    (whose sys.path, unlike `python -c`'s, does not start with the current folder). A bytes-only
    function on a CPU walks B, F and stops at H (no matmul FLOPs): exit 4, not a finding's 1."""
    (tmp_path / "mymod.py").write_text(MYMOD)
    script = Path(sys.executable).parent / "hwlab"
    r = subprocess.run([str(script), "examine", "mymod:f", "--json"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600)
    d = json.loads(r.stdout)
    assert d["measurement"]["t_ms"] > 0
    assert r.returncode == (4 if d["walk"]["leaf"] is None else 0 if d["walk"]["leaf"] == "OK" else 1), r.stderr
    if d["walk"]["leaf"] is None:
        assert d["walk"]["undecided_at"] in d["walk"]["path"]


def test_a_target_that_exits_on_import_is_reported(tmp_path, monkeypatch, capsys):
    """A module that calls sys.exit(0) while imported: one line naming it, exit 2, not a silent 0."""
    from hwlab import cli
    (tmp_path / "exiter.py").write_text("import sys\nsys.exit(0)\n\ndef f(x):\n    return x\n")
    monkeypatch.chdir(tmp_path)
    for target in ("exiter:f", f"{tmp_path / 'exiter.py'}:f"):
        rc = cli.main(["examine", target])
        err = capsys.readouterr().err
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "sys.exit(0)" in err, err
    assert "exiter" not in sys.modules


def test_gpu_profile_summary_from_a_profiler_shaped_event_list():
    """The GPU summariser's arithmetic (busy time as a union, per-call counts, attribution, the
    launching op) on events shaped like torch.profiler's FunctionEvents; the real CUPTI capture is
    exercised by the H200 recording (examine.json)."""
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType

    from hwlab.examine.torch_profile import CALL_MARK, _summarise_gpu

    def ev(name, dev, start=0.0, end=0.0, kernels=(), parent=None):
        return NS(name=name, device_type=dev, time_range=NS(start=start, end=end),
                  kernels=[NS(name=k) for k in kernels], cpu_parent=parent)

    call = ev(CALL_MARK, DeviceType.CPU)
    mm = ev("aten::mm", DeviceType.CPU, kernels=["nvjet_tst_128x256_h_bz"], parent=call)
    launch = ev("cuLaunchKernelEx", DeviceType.CPU, kernels=["my_triton_kernel"], parent=call)
    events = [call, mm, launch,
              ev(CALL_MARK, DeviceType.CUDA, 0, 500),  # the range mirrored on the GPU: not a kernel
              ev("nvjet_tst_128x256_h_bz", DeviceType.CUDA, 0, 100),
              ev("nvjet_tst_128x256_h_bz", DeviceType.CUDA, 50, 150),  # overlaps the first: busy once
              ev("my_triton_kernel", DeviceType.CUDA, 300, 400)]
    s = _summarise_gpu(events, n_calls=2, compiled=False)
    assert s.kernels_per_call == 1.5
    assert s.busy_ms_per_call == pytest.approx(250 / 2 / 1e3)
    assert s.attributable_pct == pytest.approx(100 * 200 / 300)  # the Triton launch has no aten op above it
    assert s.top[0]["name"].startswith("nvjet") and s.top[0]["launched_by"] == "aten::mm"
    assert s.top[0]["class"] == "gemm" and s.top[0]["tensor_core"] is True and s.top[0]["per_call"] == 1
    assert s.launch_gap_pct(0.5) == pytest.approx(75.0)
    assert s.gemm_kernels == 1 and s.tensor_core_gemm_kernels == 1


def test_ncu_rows_become_time_weighted_counted_evidence():
    from hwlab.examine.ncu_counters import summarise
    from hwlab.core.ncu import TENSOR_METRIC

    rows = [{"kernel": "a", "gpu__time_duration.sum": 3000.0,
             "dram__throughput.avg.pct_of_peak_sustained_elapsed": 80.0,
             "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": 3200.0,
             "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": 100.0, TENSOR_METRIC: 0.0,
             "launch__registers_per_thread": 40.0, "memory_l2_theoretical_sectors_global": 3200.0,
             "memory_l2_theoretical_sectors_global_ideal": 400.0},
            {"kernel": "b", "gpu__time_duration.sum": 1000.0,
             "dram__throughput.avg.pct_of_peak_sustained_elapsed": 20.0,
             "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": 0.0,
             "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": 0.0, TENSOR_METRIC: 60.0,
             "launch__registers_per_thread": 128.0}]
    s = summarise(rows)
    assert s["evidence"]["dram_pct_of_peak"] == pytest.approx((3 * 80 + 20) / 4)
    assert s["evidence"]["sector_amplification"] == pytest.approx(3200 / 400)  # 8x: a sector per 4-byte item
    assert s["evidence"]["tensor_pipe_pct"] == pytest.approx(60 / 4)
    assert s["registers_per_thread_max"] == 128.0 and s["n_kernels"] == 2


@pytest.mark.slow
def test_a_compiled_function_is_timed_compiled_and_stays_compiled(cpu_ceilings):
    """Counting runs a function under dispatch modes; a torch.compile'd function called under one
    runs eagerly from then on. examine counts last and holds compiled code eager while counting."""
    from torch.profiler import ProfilerActivity, profile

    def chain(x):
        return torch.sigmoid(torch.relu(x * 2 + 1))

    cc = torch.compile(chain, dynamic=False)
    x = torch.randn(4096)
    ex = examine(cc, x, ceilings=cpu_ceilings)
    assert ex.profile.compiled_region, "the timed and profiled calls ran the compiled graph"
    assert "not attributable" in ex.counts["moved_bytes_source"]  # the traffic model did not see them
    with profile(activities=[ProfilerActivity.CPU]) as p:
        cc(x)
    assert any(e.name.startswith("Torch-Compiled Region") for e in p.events())


def test_captured_weights_are_required_reads(cpu_ceilings):
    lin = torch.nn.Linear(32, 16)
    x = torch.randn(8, 32)
    t = count_traffic(lin, (x,), {})
    assert t.captured_read_bytes((x,)) == (32 * 16 + 16) * 4  # weight and bias, not the input
    w = torch.randn(32, 32)
    t = count_traffic(lambda v: torch.relu(v @ w) @ w, (x,), {})  # a closure: w read twice, counted once
    assert t.captured_read_bytes((x,)) == 32 * 32 * 4
    ex = examine(lin, x, ceilings=cpu_ceilings)
    assert ex.name == "Linear"
    assert ex.counts["n_bytes"] == 8 * 32 * 4 + (32 * 16 + 16) * 4 + 8 * 16 * 4


def test_the_triton_kernel_scan_survives_dead_weak_proxies():
    """torch.compile leaves weakref proxies whose referent is gone; the H200 recording's profile
    of the compiled chain once failed on one (ReferenceError from isinstance)."""
    import weakref

    from hwlab.examine.torch_profile import triton_kernels

    class Obj:
        pass

    o = Obj()
    proxy = weakref.proxy(o)
    del o
    holder = [proxy]  # keep the dead proxy where gc.get_objects() finds its container
    assert triton_kernels(["no_such_kernel"]) == []
    assert holder


def test_a_lookup_needs_only_the_rows_it_touches():
    table_ = torch.randn(1000, 64)
    idx = torch.tensor([3, 3, 10, 999] * 8)  # 3 distinct rows of a 1000-row table
    t = count_traffic(lambda w, i: w[i], (table_, idx), {})
    assert t.input_read_bytes((table_, idx)) == 3 * 64 * 4 + idx.numel() * 8
    assert t.ops[0].read_bytes == 3 * 64 * 4 + idx.numel() * 8  # the op's traffic too
    emb = torch.nn.Embedding(1000, 64)  # captured weights: the same rule
    t = count_traffic(emb, (idx,), {})
    assert t.captured_read_bytes((idx,)) == 3 * 64 * 4
    t = count_traffic(lambda w, i: w[i] + w.sum(), (table_, idx), {})  # read whole elsewhere: all of it
    assert t.input_read_bytes((table_, idx)) == 1000 * 64 * 4 + idx.numel() * 8


def test_dominating_ops_carry_their_dtypes(cpu_ceilings):
    a, b = torch.randn(128, 128).bfloat16(), torch.randn(128, 128).bfloat16()
    ex = examine(lambda p, q: (p @ q).float(), a, b, ceilings=cpu_ceilings)
    mm = next(k for k in ex.profile.top if k["class"] == "matmul")
    assert mm["dtypes"] == ["bfloat16"]
    assert ex.counts["by_op"]["aten::mm"]["count"] == 1


@pytest.mark.slow
def test_import_hwlab_loads_examine_only_when_used():
    code = ("import sys, hwlab; assert 'hwlab.examine' not in sys.modules; f = hwlab.examine; "
            "assert callable(f) and 'hwlab.examine' in sys.modules; from hwlab.examine import Examination")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-1000:]
