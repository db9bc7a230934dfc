"""Lab 1 kernels in the Triton interpreter (CPU) against float64 references, fresh data."""
import pytest
import torch

from hwlab.diagnosis import flowchart
from hwlab.labs import bandwidth as B
from hwlab.core.measure import TOL_BY_DTYPE, rel_error


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(3, 37), (16, 128), (5, 1000)])  # odd sizes test the mask
def test_fused_chain_matches_reference(dtype, shape):
    for _ in range(2):
        x, b, r = B.make_chain_inputs(*shape, dtype=dtype, device="cpu")
        y = torch.full_like(x, float("nan"))
        B.fused_chain(x, b, r, 0.5, out=y)
        assert rel_error(y, B.reference_chain(x, b, r, 0.5)) <= TOL_BY_DTYPE[str(dtype)[6:]]
        assert rel_error(B.unfused_chain(x, b, r, 0.5), B.reference_chain(x, b, r, 0.5)) <= 1e-2


@pytest.mark.parametrize("layout", ["coalesced", "strided"])
def test_scale_layouts_compute_the_same(layout):
    x = torch.randn(33, 70)
    y = torch.full_like(x, float("nan"))
    B.scale_layout(x, 0.25, layout, out=y)
    assert torch.equal(y, x * 0.25)


def test_bad_input():
    with pytest.raises(ValueError, match="layout must be"):
        B.scale_layout(torch.randn(4, 4), layout="diagonal")
    with pytest.raises(ValueError, match="bf16 gives wrong results"):
        B.make_chain_inputs(4, 4, dtype=torch.bfloat16, device="cpu")
    with pytest.raises(B.InputError, match="contiguous"):
        B.fused_chain(torch.randn(8, 8).t(), torch.randn(8), torch.randn(8, 8))


def test_traffic_accounting():
    t = B.chain_traffic(1024, 512, 2)
    n = 1024 * 512
    assert t["bytes_required"] == (3 * n + 512) * 2
    assert t["bytes_moved_unfused"] == (9 * n + 512) * 2
    assert t["n_flops"] == B.CHAIN_FLOPS_PER_ELEMENT * n
    assert t["bytes_moved_unfused"] / t["bytes_required"] == pytest.approx(3.0, rel=1e-3)
    assert B.sector_amplification("strided", 2, 8192) == 16
    assert B.sector_amplification("strided", 4, 8192) == 8
    assert B.sector_amplification("coalesced", 4, 8192) == 1
    assert B.sector_amplification("strided", 4, 4) == 1  # a row fits in one sector


def test_run_on_cpu_checks_everything_and_refuses_to_diagnose_interpreter_timings():
    r = B.run(16, 64, torch.float32, device="cpu", n_rep=3, ceiling_gbps=10.0)
    assert set(r.measurements) == {"unfused", "fused", "strided", "coalesced"}
    for m in r.measurements.values():
        assert m.rel_err is not None and m.rel_err <= m.tol
        assert m.device.startswith("CPU") and m.ceiling_gbps == 10.0
    assert r.params["interpreted"] is True and r.diagnoses == {}
    assert flowchart.walk_cases(r).diagnoses == {}  # the walk refuses interpreter timings too


def test_replay_recorded_h200_run():
    from hwlab.core.evidence import recorded
    r = B.result_from_evidence(recorded("lab01_bandwidth"))
    assert r.diagnoses == {}  # the lab returns evidence; the consumers' floor walks it
    assert flowchart.walk_cases(r) is r and r.diagnoses["unfused"].leaf_id == "G"
    assert r.table()[0]["leaf"] == r.diagnoses[r.table()[0]["case"]].leaf_id
    assert r.speedup("unfused", "fused") == pytest.approx(
        r.measurements["unfused"].t_ms / r.measurements["fused"].t_ms)


BY_HAND = ("single_gpu_slow", "multi_gpu_or_service_slow", "rank_tail")


def test_run_on_cpu_measures_d_and_k_for_every_case():
    """Each case's evidence carries D and K from its own one-process service step (the case's
    calls back to back, timed as one step, over its median x calls) and no by-hand answer. With
    a copy ceiling so low that every case sits within its floor, every walk reaches D and K, and
    every answer on it is measured (a by-hand D, as the lab once had, fails here)."""
    from hwlab.diagnosis.flowchart import diagnose

    r = B.run(16, 64, torch.float32, device="cpu", n_rep=3, ceiling_gbps=1e-6)
    assert set(r.service) == set(r.measurements)
    for k, ev in r.evidence.items():
        svc, m = r.service[k], r.measurements[k]
        assert not set(BY_HAND) & set(ev)
        assert svc["service_predicted_ms"] == pytest.approx(svc["service_calls"] * m.t_ms)
        assert ev["e2e_slowdown"] == pytest.approx(svc["service_step_ms"] / svc["service_predicted_ms"])
        assert ev["rank_tail_pct"] == 0.0 and ev["n_ranks"] == 1
        assert set(ev["metric_sources"]) == set(ev) - {"metric_sources", "n_ranks", "metric_spreads"}
        walk = diagnose(ev)
        assert walk.path[:2] == ["B", "D"] and walk.fully_measured, walk.explain()
        assert "every answer on this walk was measured" in walk.explain()
