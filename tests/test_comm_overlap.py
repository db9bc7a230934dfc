"""``hwlab examine --trace``: how much of the communication ran under compute (examine/comm_overlap),
re-derived from the built trace's raw intervals."""
import json
import re

import pytest

from hwlab.examine.from_trace import examine_trace


def _trace(tmp_path, kernels, steps=2):
    """``steps`` steps of the same kernels, each ``(name, start_us, dur_us, stream)`` relative to the
    step's start, each launched 3 us before it starts."""
    ev, corr = [], 1
    for s in range(steps):
        t0 = 1000.0 + s * 2000.0
        end = max(st + d for _, st, d, _ in kernels)
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 1}", "ts": t0 - 10, "dur": end + 15,
                   "pid": 1, "tid": 1})
        for name, st, d, stream in kernels:
            L = t0 + st - 3
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": L, "dur": 1, "pid": 1,
                       "tid": 1, "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": name, "ts": t0 + st, "dur": d, "pid": 0, "tid": stream,
                       "args": {"correlation": corr}})
            corr += 1
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H100 80GB HBM3"}]}))
    return f


GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def _raw(kernels):
    """Communication time, and of it the time inside other kernels, from the kernel list itself."""
    comm = [(st, st + d) for n, st, d, _ in kernels if n.startswith("nccl")]
    other = [(st, st + d) for n, st, d, _ in kernels if not n.startswith("nccl")]
    tot = sum(b - a for a, b in comm)  # the built comm kernels do not overlap each other
    hidden = sum(max(0.0, min(b, y) - max(a, x)) for a, b in comm for x, y in other)  # nor do the others
    return tot, hidden


@pytest.mark.parametrize("kernels", [
    [(GEMM, 0, 300, 7), (NCCL, 250, 150, 20)],                          # mostly exposed
    [(GEMM, 0, 300, 7), (NCCL, 20, 200, 20), (GEMM, 300, 100, 7)],      # wholly hidden
    [(GEMM, 0, 100, 7), (NCCL, 50, 100, 20), (GEMM, 160, 50, 7), (NCCL, 180, 60, 20)],
])
def test_the_communication_part_says_how_much_of_it_ran_under_compute(tmp_path, kernels):
    ex = examine_trace(_trace(tmp_path, kernels))
    comm = next(p for p in ex.parts.parts if p.name == "communication")
    tot, hidden = _raw(kernels)
    note = next(n for n in comm.notes if "communication kernels per step" in n)
    got = [float(x) for x in re.findall(r"([\d.]+) ms", note)]
    assert got[0] == pytest.approx(tot / 1e3, rel=1e-3) and got[1] == pytest.approx(hidden / 1e3, rel=1e-3, abs=1e-6)
    assert got[2] == pytest.approx((tot - hidden) / 1e3, rel=1e-3, abs=1e-6)


def test_no_note_without_communication(tmp_path):
    ex = examine_trace(_trace(tmp_path, [(GEMM, 0, 300, 7), (GEMM, 310, 100, 7)]))
    assert not any("communication kernels per step" in n for p in ex.parts.parts for n in p.notes)
