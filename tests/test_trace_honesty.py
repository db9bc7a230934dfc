"""``examine --trace`` on traces with too little in them: an honest nothing (exit 0, no leaf, no
gain), never a finding; and the whole-step GEMM rate over GEMM kernel time, not the step's."""
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hwlab.examine.from_trace import MIN_STEP_US, NothingToDiagnose, examine_trace

ROOT = Path(__file__).resolve().parents[1]


def _tiny(path: Path, kernel_ns: float = 20.0, span_ns: float = 130.0) -> Path:
    """A unit-test-sized trace: one ProfilerStep of ``span_ns`` with one kernel launched inside."""
    us = 1e-3
    ev = [{"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 1000.0,
           "dur": span_ns * us, "args": {}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1000.01,
           "dur": 0.03, "args": {"correlation": 5}},
          {"ph": "X", "cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel<4, add>",
           "pid": 0, "tid": 7, "ts": 1000.05, "dur": kernel_ns * us, "args": {"correlation": 5, "stream": 7}}]
    path.write_text(json.dumps({"deviceProperties": [{"name": "NVIDIA H100 80GB HBM3"}], "traceEvents": ev}))
    return path


def test_a_trace_too_short_to_diagnose_says_so_with_its_facts(tmp_path):
    with pytest.raises(NothingToDiagnose) as e:
        examine_trace(_tiny(tmp_path / "tiny.json"))
    d = e.value.to_dict()
    assert d["verdict"] == "nothing to diagnose" and d["leaf"] is None
    assert d["trace"]["mean_step_us"] == pytest.approx(0.13, abs=0.01) and MIN_STEP_US > 0.13


def test_a_long_window_with_little_device_work_is_nothing_too(tmp_path):
    """A 500 us step whose device ran 60 us in all (a unit test's setup): no idle finding."""
    from hwlab.examine.trace_enough import MIN_DEVICE_BUSY_US
    p = _tiny(tmp_path / "sparse.json", kernel_ns=30_000.0, span_ns=500_000.0)
    doc = json.loads(p.read_text())
    k = dict(doc["traceEvents"][-1], ts=1000.2 + 300.0, args={"correlation": 6, "stream": 7})
    doc["traceEvents"] += [dict(doc["traceEvents"][1], ts=1300.0, args={"correlation": 6}), k]
    p.write_text(json.dumps(doc))
    with pytest.raises(NothingToDiagnose, match="device work in all"):
        examine_trace(p)
    assert 60.0 < MIN_DEVICE_BUSY_US


@pytest.mark.slow
def test_the_command_exits_0_with_strict_json_on_a_tiny_trace(tmp_path):
    r = subprocess.run([sys.executable, "-m", "hwlab", "examine", "--trace", str(_tiny(tmp_path / "t.json")),
                        "--json"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["verdict"] == "nothing to diagnose" and d["leaf"] is None and "why" in d


def test_the_whole_step_gemm_rate_is_over_gemm_kernel_time(tmp_path):
    """A step of one bf16 GEMM (400 µs) and attention (400 µs): the tensor % of peak is the GEMM's
    FLOPs over the GEMM kernel's 400 µs, not over the 800 µs step."""
    m = n = k = 8192
    ev, t = [], 1000.0
    ev.append({"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": t, "dur": 900.0,
               "args": {}})
    ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t + 1, "dur": 5.0,
               "args": {"Input Dims": [[m, k], [k, n]], "Input type": ["c10::BFloat16", "c10::BFloat16"],
                        "External id": 1}})
    ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 2,
               "dur": 2.0, "args": {"correlation": 11}})
    ev.append({"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
               "pid": 0, "tid": 7, "ts": t + 10, "dur": 400.0, "args": {"correlation": 11, "stream": 7}})
    ev.append({"ph": "X", "cat": "kernel", "name": "void flash_fwd_kernel<Flash_fwd_kernel_traits<128>>",
               "pid": 0, "tid": 7, "ts": t + 410, "dur": 400.0, "args": {"stream": 7}})
    p = tmp_path / "gemm_attn.json"
    p.write_text(json.dumps({"deviceProperties": [{"name": "NVIDIA H100 80GB HBM3"}], "traceEvents": ev}))
    ex = examine_trace(p)
    pct = ex.evidence.get("tensor_pct_of_peak")
    assert pct is not None, ex.evidence
    peak = ex.ceilings.gemm_tflops["bf16"]
    assert pct == pytest.approx(100 * 2 * m * n * k / (400e-6 * 1e12) / peak, rel=0.02)
    assert "GEMM-class kernels' own time" in ex.evidence_sources["tensor_pct_of_peak"]


def _gemm_part(name: str, pct: float):
    from hwlab.examine.part_record import Part
    p = Part(name=name, t_ms=16.9, share_pct=36.0, n_items=243, attributable=True, flops=10 ** 13,
             floor_source="FLOPs at the measured GEMM ceiling")
    p.evidence = {"slowdown_vs_floor": 100.0 / pct, "dram_pct_estimated": 10.0, "tensor_pct_of_peak": pct,
                  "matmul_flops": 10 ** 13, "tensor_core_kernels": 243, "n_ranks": 1}
    p.sources = {"slowdown_vs_floor": "part time / its floor (FLOPs at the measured GEMM ceiling)",
                 "tensor_pct_of_peak": "part FLOPs / its time vs the measured GEMM ceiling at its dtype"}
    return p


def test_mma_gemm_under_a_datasheet_peak_stops_at_h_instead_of_leaf_i():
    """A bf16 GEMM part (MFMA / tensor cores by its dtype) at 25% of a datasheet peak: the walk on
    measured ceilings says I; relabelled for a datasheet it stops at H naming the measurement, while
    an fp32 part (SIMT or TF32: the dtype does not prove the MMA path) keeps its answer."""
    from types import SimpleNamespace

    from hwlab.diagnosis.flowchart import diagnose
    from hwlab.examine.from_trace import _relabel
    bf16, fp32, fast = _gemm_part("gemm bfloat16", 25.0), _gemm_part("gemm float32", 25.0), _gemm_part("gemm bfloat16", 70.0)
    for p in (bf16, fp32, fast):
        p.walk = diagnose({**p.evidence, "metric_sources": p.sources})
    assert bf16.walk.leaf.id == "I"  # what the measured-ceiling walk says
    _relabel(SimpleNamespace(parts=[bf16, fp32, fast]), {})
    assert bf16.walk.leaf is None and bf16.walk.undecided is not None and "H" in str(bf16.walk.undecided)
    assert "tensor_pct_of_peak" not in bf16.evidence
    assert any("datasheet" in n and "--baseline" in n for n in bf16.notes)
    assert fp32.walk.leaf.id == "I" and "datasheet" in fp32.sources["tensor_pct_of_peak"]
    assert fast.evidence["tensor_pct_of_peak"] == 70.0 and (fast.walk.leaf is None or fast.walk.leaf.id != "I")


def test_attention_under_a_datasheet_peak_stops_at_h_and_on_a_measured_one_keeps_its_answer():
    """An attention part at 25% of a datasheet GEMM peak stops at H naming the measurement; the same
    part against measured ceilings (no relabelling) keeps its I, and one at 70% is untouched."""
    from types import SimpleNamespace

    from hwlab.diagnosis.flowchart import diagnose
    from hwlab.examine.from_trace import _relabel
    low, fast, measured = _gemm_part("attention", 25.0), _gemm_part("attention", 70.0), _gemm_part("attention", 25.0)
    for p in (low, fast, measured):
        p.walk = diagnose({**p.evidence, "metric_sources": p.sources})
    assert low.walk.leaf.id == "I" and measured.walk.leaf.id == "I"
    _relabel(SimpleNamespace(parts=[low, fast]), {})
    assert low.walk.leaf is None and "H" in str(low.walk.undecided) and "tensor_pct_of_peak" not in low.evidence
    assert any("datasheet" in n and "--baseline" in n for n in low.notes)
    assert fast.evidence["tensor_pct_of_peak"] == 70.0
    assert measured.walk.leaf.id == "I" and measured.evidence["tensor_pct_of_peak"] == 25.0


def test_an_mma_gemm_at_over_half_a_datasheet_peak_does_not_decide_b_against_it():
    """An fp16 GEMM part at 66% of a datasheet peak (1.52x its datasheet floor, over B's 1.5x line):
    measured GEMMs fall that short of a datasheet, so B stays open naming the measurement instead of
    walking on to J (registers); the same part on measured ceilings keeps its walk."""
    from types import SimpleNamespace

    from hwlab.diagnosis.flowchart import diagnose
    from hwlab.examine.from_trace import _relabel
    ds, measured = _gemm_part("gemm float16", 66.0), _gemm_part("gemm float16", 66.0)
    for p in (ds, measured):
        p.walk = diagnose({**p.evidence, "metric_sources": p.sources})
    assert measured.walk.leaf is not None and measured.evidence["slowdown_vs_floor"] > 1.5
    _relabel(SimpleNamespace(parts=[ds]), {})
    assert "slowdown_vs_floor" not in ds.evidence and ds.walk.leaf is None and ds.walk.undecided.id == "B"
    assert any("--baseline" in n and "decide B" in n for n in ds.notes)
