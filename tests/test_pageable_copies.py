"""``hwlab examine --trace`` names copies from pageable host memory (examine/pageable_copies), with
the figures re-derived from the built trace."""
import json
import re

import pytest

from hwlab.examine.from_trace import examine_trace
from hwlab.examine.pageable_copies import PIN_ACTION

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"


def _trace(tmp_path, kernels, steps=3):
    """Each step runs ``kernels`` (name, category, us) back to back, each launched 2 us before it."""
    ev, corr = [], 1
    for s in range(steps):
        t0 = 1000.0 + s * 5000.0
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 1}", "ts": t0, "dur": 4000.0,
                   "pid": 1, "tid": 1})
        t = t0 + 10
        for name, cat, us in kernels:
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync" if "emcpy" in name
                       else "cudaLaunchKernel", "ts": t - 2, "dur": 1, "pid": 1, "tid": 1,
                       "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": cat, "name": name, "ts": t, "dur": us, "pid": 0, "tid": 7,
                       "args": {"correlation": corr}})
            t, corr = t + us + 5, corr + 1
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H100 80GB HBM3"}]}))
    return f


@pytest.mark.parametrize("pageable_us,pinned_us", [(300.0, 100.0), (30.0, 270.0), (4.0, 296.0)])
def test_pageable_copies_are_named_with_their_time_and_pinning_leads_where_they_are_the_part(
        tmp_path, pageable_us, pinned_us):
    ex = examine_trace(_trace(tmp_path, [
        (GEMM, "kernel", 2000.0), ("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", pageable_us),
        ("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", pinned_us)]))
    copy = next(p for p in ex.parts.parts if p.name == "copy/concat")
    pct = 100.0 * pageable_us / (pageable_us + pinned_us)
    assert copy.t_ms == pytest.approx((pageable_us + pinned_us) / 1e3, rel=1e-6)
    lines = [n for n in copy.notes if "pageable host memory" in n]
    if pct < 5.0:
        assert not lines and PIN_ACTION not in copy.actions
        return
    got = re.match(r"([\d.]+) ms per step \((\d+)% of the copy part\)", lines[0])
    assert float(got.group(1)) == pytest.approx(pageable_us / 1e3, rel=1e-3) and int(got.group(2)) == round(pct)
    assert (copy.actions[:1] == [PIN_ACTION]) == (pct >= 50.0)
    assert any("pageable host memory" in n for n in ex.notes)
