"""The device's wait for its host, split by what the host was doing (examine/idle_causes.py), and
warm-up steps left out of the gains. Built traces: the expected cause is the one each was built
with (a DataLoader range, a phase with no op, launches back to back, a first step of one-time work)."""
import json

import pytest

from hwlab.examine.from_trace import examine_trace
from hwlab.examine.idle_causes import CPU_PHASE_US

GPU = [{"name": "NVIDIA H100 80GB HBM3"}]


def _trace(tmp_path, name, *, phase_us, phase="dataloader", steps=4, n_kernels=5, first_extra_us=0.0, kernel_us=100.0):
    """Each step: a host phase of ``phase_us`` (a DataLoader range, a CPU-only op, or nothing
    recorded), then ``n_kernels`` kernels, each launched 5 us before it runs (the device waits).
    ``first_extra_us``: the first step also sits that long in one-time work (cublasCreate, cudaMalloc)."""
    ev, corr, t = [], 1, 1000.0
    for s in range(steps):
        t0 = t
        cur = t0
        if s == 0 and first_extra_us:
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMalloc", "ts": cur, "dur": first_extra_us,
                       "pid": 1, "tid": 1, "args": {"correlation": 90000 + s}})
            cur += first_extra_us
        if phase == "dataloader":
            ev.append({"ph": "X", "cat": "user_annotation", "name":
                       "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "ts": cur, "dur": phase_us,
                       "pid": 1, "tid": 1})
        elif phase == "cpu_op":
            ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::sort", "ts": cur, "dur": phase_us, "pid": 1, "tid": 1})
        cur += phase_us
        for _ in range(n_kernels):
            L = cur + 3
            ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": L - 1, "dur": 4, "pid": 1, "tid": 1})
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": L, "dur": 2, "pid": 1,
                       "tid": 1, "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel<4>()",
                       "ts": L + 5, "dur": kernel_us, "pid": 0, "tid": 7, "args": {"correlation": corr}})
            corr += 1
            cur = L + 5 + kernel_us
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 1}", "ts": t0, "dur": cur - t0,
                   "pid": 1, "tid": 1})
        t = cur
    f = tmp_path / f"{name}.json"
    f.write_text(json.dumps({"traceEvents": ev, "deviceProperties": GPU}))
    return f


def _idle(ex):
    return next(p for p in ex.parts.parts if p.name == "gpu idle")


@pytest.mark.parametrize("phase,cause", [("dataloader", "data loading"), ("cpu_op", "CPU-only work"),
                                         ("none", "CPU-only work")])
def test_the_wait_is_named_by_what_the_host_did_and_only_launches_get_cuda_graphs(tmp_path, phase, cause):
    ex = examine_trace(_trace(tmp_path, phase, phase_us=3 * CPU_PHASE_US, phase=phase))
    p = _idle(ex)
    assert p.leaf_id == "J" and p.j["cause"] == cause
    assert p.j["by_cause_ms"][cause] == pytest.approx(3 * CPU_PHASE_US / 1e3, rel=0.02)
    assert not any("CUDA graph" in a for a in p.actions)
    # the whole-step walk does not call the launch path the limiter for a wait its notes give elsewhere
    assert ex.evidence["launch_gap_pct"] == pytest.approx(100 * p.j["by_cause_ms"]["launch"] / ex.parts.t_ms)
    assert "launch path is the limiter" not in ex.diagnosis.explain()


def test_launches_back_to_back_are_the_launch_cause_with_cuda_graph_advice(tmp_path):
    ex = examine_trace(_trace(tmp_path, "launch", phase_us=0.0, phase="none", n_kernels=40, kernel_us=5.0))
    p = _idle(ex)
    assert p.j["cause"] == "launch" and any("CUDA graph" in a for a in p.actions)


def test_a_warm_up_step_is_left_out_of_the_parts_and_said(tmp_path):
    f = _trace(tmp_path, "warm", phase_us=0.0, phase="none", n_kernels=40, first_extra_us=50_000.0, kernel_us=5.0)
    ex = examine_trace(f)
    assert any("warm-up" in n and "step(s) 1 " in n for n in ex.notes)
    # the parts are the later steps' mean: the 50 ms of the first step is in none of them
    later = [s["t_ms"] for s in ex.per_step if s["step"] != 1]
    assert ex.parts.t_ms == pytest.approx(sum(later) / len(later), rel=1e-6)
