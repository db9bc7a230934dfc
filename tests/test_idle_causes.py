"""The device's wait for its host, split by what the host was doing (examine/idle_causes.py), and
warm-up steps left out of the gains. Built traces: the expected cause is the one each was built
with (a DataLoader range, a phase with no op, a collective on the host or a wait for one, launches
back to back, a first step of one-time work)."""
import json

import pytest

from hwlab.examine.from_trace import examine_trace
from hwlab.examine.idle_causes import CPU_PHASE_US

GPU = [{"name": "NVIDIA H100 80GB HBM3"}]
#: a collective the host runs itself (gloo, on the step's process) and a wait for one (TorchRec's awaitable)
COLLECTIVE_PHASES = {"gloo": "gloo:all_reduce", "awaitable": "## KJTAllToAllTensorsAwaitable wait() ##"}


def _trace(tmp_path, name, *, phase_us, phase="dataloader", steps=4, n_kernels=5, first_extra_us=0.0, kernel_us=100.0,
           nccl_us=0.0, wrap=False):
    """Each step: a host phase of ``phase_us`` (a DataLoader range, a CPU-only op, a gloo collective,
    a wait on a collective's awaitable, or nothing recorded), then ``n_kernels`` kernels, each launched 5 us before it runs (the device waits).
    ``first_extra_us``: the first step also sits that long in one-time work (cublasCreate, cudaMalloc).
    ``nccl_us``: each step ends in an NCCL all-reduce kernel that long (launched 5 us before it runs).
    ``wrap``: the phase's range also holds the step's launching ops (a wait that launches work)."""
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
        elif phase in COLLECTIVE_PHASES:
            ev.append({"ph": "X", "cat": "user_annotation", "name": COLLECTIVE_PHASES[phase], "ts": cur,
                       "dur": phase_us, "pid": 1, "tid": 1})
            wrapper = ev[-1] if wrap else None
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
        if nccl_us:
            L = cur + 3
            ev.append({"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "ts": L - 1, "dur": 4, "pid": 1, "tid": 1})
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": L, "dur": 2, "pid": 1,
                       "tid": 1, "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ts": L + 5,
                       "dur": nccl_us, "pid": 0, "tid": 9, "args": {"correlation": corr}})
            corr += 1
            cur = L + 5 + nccl_us
        if wrap and phase in COLLECTIVE_PHASES:
            wrapper["dur"] = cur - wrapper["ts"]
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 1}", "ts": t0, "dur": cur - t0,
                   "pid": 1, "tid": 1})
        t = cur
    f = tmp_path / f"{name}.json"
    f.write_text(json.dumps({"traceEvents": ev, "deviceProperties": GPU}))
    return f


def _idle(ex):
    return next(p for p in ex.parts.parts if p.name == "gpu idle")


@pytest.mark.parametrize("phase,cause", [("dataloader", "data loading"), ("cpu_op", "CPU-only work"),
                                         ("none", "CPU-only work"), ("gloo", "collective wait"),
                                         ("awaitable", "collective wait")])
def test_the_wait_is_named_by_what_the_host_did_and_only_launches_get_cuda_graphs(tmp_path, phase, cause):
    ex = examine_trace(_trace(tmp_path, phase, phase_us=3 * CPU_PHASE_US, phase=phase))
    p = _idle(ex)
    assert p.leaf_id == "J" and p.j["cause"] == cause
    assert p.j["by_cause_ms"][cause] == pytest.approx(3 * CPU_PHASE_US / 1e3, rel=0.02)
    assert not any("CUDA graph" in a for a in p.actions)
    # the whole-step walk does not call the launch path the limiter for a wait its notes give elsewhere
    assert ex.evidence["launch_gap_pct"] == pytest.approx(100 * p.j["by_cause_ms"]["launch"] / ex.parts.t_ms)
    assert "launch path is the limiter" not in ex.diagnosis.explain()
    # a wait on a collective ends when the last rank arrives: the advice reads the whole job, never CUDA graphs
    assert (cause == "collective wait") == any("hwlab ranks --traces" in a for a in p.actions)


def test_launches_inside_a_collective_wait_stay_launch_work(tmp_path):
    """A wait range that also launches kernels: the ops in it that launched are launch work; the
    wait is the rest of the range where the device idled: the phase, and before each of the 40
    launches the 2 us from the last kernel's end to the launching op (built so)."""
    ex = examine_trace(_trace(tmp_path, "wrap", phase_us=2 * CPU_PHASE_US, phase="awaitable", n_kernels=40,
                              kernel_us=5.0, wrap=True))
    by = _idle(ex).j["by_cause_ms"]
    assert by["collective wait"] == pytest.approx((2 * CPU_PHASE_US + 40 * 2.0) / 1e3, rel=1e-6)
    assert by["launch"] == pytest.approx(40 * 1.0 / 1e3, rel=1e-6)  # 1 us of each launching op before its launch


def test_launches_back_to_back_are_the_launch_cause_with_cuda_graph_advice(tmp_path):
    ex = examine_trace(_trace(tmp_path, "launch", phase_us=0.0, phase="none", n_kernels=40, kernel_us=5.0))
    p = _idle(ex)
    assert p.j["cause"] == "launch" and any("CUDA graph" in a for a in p.actions)


def test_idle_beside_a_larger_communication_part_points_at_the_whole_job(tmp_path):
    """Launch-bound gaps beside an all-reduce longer than the idle part's gain: one rank's trace
    cannot say whether that time waited for a late peer, so the idle part says to read the whole
    job; without the all-reduce it does not."""
    ex = examine_trace(_trace(tmp_path, "comm", phase_us=0.0, phase="none", n_kernels=40, kernel_us=5.0,
                              nccl_us=2000.0))
    p, comm = _idle(ex), next(q for q in ex.parts.parts if q.name == "communication")
    assert comm.t_ms >= p.saved_ms and p.j["cause"] == "launch"
    assert any("hwlab ranks --traces" in n and "last rank to arrive" in n for n in p.notes)
    p = _idle(examine_trace(_trace(tmp_path, "alone", phase_us=0.0, phase="none", n_kernels=40, kernel_us=5.0)))
    assert not any("hwlab ranks --traces" in n for n in p.notes)


def test_a_warm_up_step_is_left_out_of_the_parts_and_said(tmp_path):
    f = _trace(tmp_path, "warm", phase_us=0.0, phase="none", n_kernels=40, first_extra_us=50_000.0, kernel_us=5.0)
    ex = examine_trace(f)
    assert any("warm-up" in n and "step(s) 1 " in n for n in ex.notes)
    # the parts are the later steps' mean: the 50 ms of the first step is in none of them
    later = [s["t_ms"] for s in ex.per_step if s["step"] != 1]
    assert ex.parts.t_ms == pytest.approx(sum(later) / len(later), rel=1e-6)
