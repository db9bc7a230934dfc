"""Lab 2 on a CPU: occupancy by hand, static sm_90 compile reports, interpreter correctness,
the compile-time guard, and the recorded H200 acceptance figures."""
import json

import pytest
import torch

from hwlab.core.evidence import recorded
from hwlab.diagnosis.flowchart import diagnose
from hwlab.labs import registers as R
from hwlab.labs.registers import fusion
from hwlab.labs.registers.occupancy import HOPPER, SMLimits, occupancy
from hwlab.core.measure import bench, rel_error


# ---- occupancy, worked by hand
def test_occupancy_gemm_tile_two_limits_tie():
    # 207 regs -> 208/thread -> 6656/warp -> floor(65536/6656)=9 warps -> 2 blocks of 4 warps;
    # smem 98304+1024 reserved=99328 -> floor(233472/99328)=2 blocks; warps 64/4=16; blocks 32
    o = occupancy(207, 98304, 4)
    assert o.blocks_by_limit == {"registers": 2, "shared_mem": 2, "warps": 16, "blocks": 32}
    assert o.binding == ["registers", "shared_mem"] and o.occupancy_pct == 12.5


def test_occupancy_small_kernel_bound_by_registers_and_warps():
    # 32 regs -> 1024/warp -> 64 warps -> 16 blocks of 4 warps; warps limit also 16
    o = occupancy(32, 0, 4)
    assert o.blocks_per_sm == 16 and o.binding == ["registers", "warps"] and o.occupancy_pct == 100.0


def test_occupancy_shared_memory_binds():
    # 40 regs -> 1280/warp -> 51 warps -> 6 blocks of 8 warps; smem 50000->50048+1024=51072 -> 4
    o = occupancy(40, 50000, 8)
    assert o.blocks_by_limit["registers"] == 6 and o.blocks_by_limit["shared_mem"] == 4
    assert o.binding == ["shared_mem"] and o.active_warps == 32


def test_occupancy_block_limit_and_custom_machine():
    assert occupancy(16, 0, 1).binding == ["blocks"]  # 32 blocks of 1 warp before 64 warps
    small = SMLimits(regs_per_sm=32768, max_warps_per_sm=48, max_blocks_per_sm=16)
    assert occupancy(64, 0, 4, small).blocks_by_limit["registers"] == 4


def test_occupancy_bad_input():
    with pytest.raises(ValueError, match="exceeds the hardware maximum"):
        occupancy(300, 0, 4)
    with pytest.raises(ValueError, match="launch would fail"):
        occupancy(64, 300_000, 4)


def test_tile_config_parse():
    assert R.TileConfig.parse("128,256,64,8,3") == R.WIDE
    assert R.SPILL.acc_regs_per_thread == 256
    with pytest.raises(ValueError, match="BM,BN,BK,WARPS,STAGES"):
        R.TileConfig.parse("128,128")


# ---- static compile for sm_90 without a GPU
@pytest.fixture(scope="module")
def reports():
    # both at once, the spilling one first: each report comes back in its job's place
    spill, sane = R.compile_guarded_many([("matmul", R.SPILL), ("matmul", R.SANE)], timeout_s=300)
    return {R.SPILL: spill, R.SANE: sane}


@pytest.mark.slow
def test_a_static_report_is_compiled_once_per_process(reports, monkeypatch):
    def no_child(*a, **k):
        raise AssertionError("compiled again")
    monkeypatch.setattr(R.compile_guard.subprocess, "run", no_child)
    again = R.compile_guarded("matmul", R.SANE, timeout_s=300)
    assert again == reports[R.SANE] and again is not reports[R.SANE]
    again.n_regs = -1  # a caller's change does not reach the next caller
    assert R.compile_guarded("matmul", R.SANE, timeout_s=300).n_regs == reports[R.SANE].n_regs
    with pytest.raises(AssertionError, match="compiled again"):  # another dtype is another compile
        R.compile_guarded("matmul", R.SANE, dtype="fp16", timeout_s=300)


@pytest.mark.slow
def test_static_report_sane_tile_does_not_spill(reports):
    r = reports[R.SANE]
    assert r.skipped is None, r.skipped
    assert r.n_spills == 0 and r.spill_store_bytes == 0
    assert 128 < r.n_regs <= 255 and r.shared_bytes == 3 * (128 * 64 + 64 * 128) * 2


@pytest.mark.slow
def test_static_report_oversized_tile_spills(reports):
    r = reports[R.SPILL]
    assert r.n_regs == 255 and r.n_spills > 0 and r.spill_store_bytes > 0
    assert r.occupancy(R.SPILL.warps).blocks_per_sm == 1


@pytest.mark.slow
def test_overfusion_measured_fused_spills_split_does_not():
    """The over-fusion measurement the notebook calls live (and the refresh records): both paths
    checked against float64 before timing (interpreter, small size), each with the compile
    report of the kernel it times (static sm_90a here): the fused 64x512 tile spills, the split
    GEMM's sane tile does not."""
    of = R.overfusion(n_rep=3)
    assert of.skipped is None
    assert of.fused_report.config == R.FUSED.label and of.fused_report.n_spills > 0
    assert of.split_report.config == R.SANE.label and of.split_report.n_spills == 0
    for m, rep in ((of.fused, of.fused_report), (of.split, of.split_report)):
        assert m.rel_err is not None and m.rel_err <= m.tol == fusion.TOL
        assert m.params["report"] == rep.to_dict()
        m_, k_ = fusion.CPU_MK
        assert m.n_flops == 2 * m_ * k_ * R.FUSED.bn
    assert (of.fused.name, of.split.name) == (fusion.FUSED_NAME, fusion.SPLIT_NAME)
    assert of.reports() == {"fused": of.fused_report.to_dict(), "split": of.split_report.to_dict()}
    assert of.split_speedup == pytest.approx(of.fused.t_ms / of.split.t_ms)


def test_overfusion_reports_a_compile_past_its_limit(monkeypatch):
    monkeypatch.setattr(R.compile_guard, "_STATIC_REPORTS", {})  # none made yet in this process
    of = R.overfusion(timeout_s=0.01, n_rep=1)
    assert of.fused is None and of.split is None and "compile exceeded" in of.skipped


@pytest.mark.slow
def test_ncu_without_a_gpu_is_unavailable_and_records_nothing(reports):
    why = R.ncu_unavailable()
    assert why and why.startswith("ncu unavailable")
    rows = R.ncu_occupancy(R.SANE)
    assert rows.rows == [] and rows.unavailable == why and rows.record() is None
    results = [R.ConfigResult(R.SANE, reports[R.SANE])]
    assert R.collect_ncu(results) == why and results[0].ncu is None
    assert R.NcuRows(error="ncu failed (1)").record() == {"error": "ncu failed (1)"}
    row = {"kernel": "matmul_kernel", "launch__occupancy_limit_registers": 1.0}
    assert R.NcuRows([row, {"kernel": "other"}]).record() == row  # the profiled launch's row


def test_the_child_ncu_profiles_accepts_its_arguments():
    """ncu runs ``python -m hwlab.labs.registers`` with :func:`ncu_args`: the entry point must
    read them back as the same config, in GPU mode, with the NVTX launch."""
    from hwlab.labs.registers.__main__ import build_parser

    args = R.counters.ncu_args(R.SPILL)
    assert args[:2] == ["-m", "hwlab.labs.registers"]
    a = build_parser().parse_args(args[2:])
    assert (a.compile, a.mode, a.ncu_launch, R.TileConfig.parse(a.config)) == ("matmul", "gpu", True, R.SPILL)


@pytest.mark.slow
def test_compile_guard_skips_a_config_that_takes_too_long():
    r = R.compile_guarded("wide_block", block=32768, warps=1, timeout_s=3)
    assert r.skipped == "compile exceeded 3 s" and r.n_regs is None
    ok = R.compile_guarded("wide_block", block=1024, warps=4, timeout_s=120)
    assert ok.skipped is None and ok.n_spills == 0


# ---- the kernels in the interpreter, fresh random data
@pytest.mark.parametrize("shape", [(64, 64, 64), (96, 160, 32), (32, 128, 96)])
def test_matmul_kernel_matches_float64(shape):
    M, N, K = shape
    for _ in range(2):
        a = torch.randn(M, K, dtype=torch.float16)
        b = torch.randn(K, N, dtype=torch.float16)
        c, _k = R.matmul(a, b, R.TileConfig(32, 32, 32, 4, 1))
        assert rel_error(c, R.reference_matmul(a, b)) <= 2e-3


def test_fused_and_split_softmax_agree_with_reference():
    a = torch.randn(64, 64, dtype=torch.float16) * 0.3
    b = torch.randn(64, 128, dtype=torch.float16) * 0.3
    ref = R.reference_matmul_softmax(a, b)
    assert rel_error(R.matmul_softmax_fused(a, b, bm=32, bk=32)[0], ref) <= 5e-3
    assert rel_error(R.matmul_softmax_split(a, b, R.TileConfig(32, 32, 32, 4, 1))[0], ref) <= 5e-3


def test_matmul_bad_shapes():
    with pytest.raises(R.InputError, match="multiple of BK"):
        R.matmul(torch.randn(32, 48), torch.randn(48, 32), R.TileConfig(32, 32, 32, 4, 1))
    with pytest.raises(R.InputError, match="do not multiply"):
        R.matmul(torch.randn(32, 32), torch.randn(64, 32))


def test_launch_bound_on_cpu_is_honest():
    lb = R.launch_bound(n_layers=8, hidden=256, n_rep=5)
    assert lb.graph is None and "CUDA graphs need a GPU" in lb.note
    assert lb.eager.rel_err is not None and lb.n_kernels == 24
    # D and K from the eager step run back to back as one process serves it; no floor without a
    # CUDA graph, so B is not answered (the walk stops there), and nothing is answered by hand
    s = lb.service
    assert s["service_predicted_ms"] == pytest.approx(s["service_calls"] * lb.eager.t_ms)
    ev = R.launch_evidence(lb)
    assert ev["e2e_slowdown"] == pytest.approx(s["service_step_ms"] / s["service_predicted_ms"])
    assert ev["rank_tail_pct"] == 0.0 and ev["n_ranks"] == 1 and "slowdown_vs_floor" not in ev
    assert not set(BY_HAND) & set(ev) and set(ev["metric_sources"]) == {"e2e_slowdown", "rank_tail_pct"}
    walk = diagnose(ev)
    assert walk.undecided.id == "B" and not walk.by_hand
    assert lb.to_dict()["service"] == s


BY_HAND = ("single_gpu_slow", "multi_gpu_or_service_slow", "rank_tail")


@pytest.mark.slow
def test_config_evidence_measures_d_and_k(reports):
    """A GEMM config's evidence, built from a real (interpreted) timing, its sm_90a compile report
    and its service step (the kernel called back to back as one step): D and K are measured, and
    a walk that reaches D answers every question by measurement."""
    size, cfg = 128, R.SANE
    mk = lambda: (torch.randn(size, size, dtype=torch.float16), torch.randn(size, size, dtype=torch.float16))  # noqa: E731
    m = bench(f"triton {cfg.label}", lambda a, b: R.matmul(a, b, cfg)[0], mk, n_bytes=3 * size * size * 2,
                n_flops=2 * size**3, reference=lambda a, b: a.double() @ b.double(), tol=2e-3,
                device="cpu", n_rep=3)
    # a ceiling the interpreted kernel reaches, so B says "no" and the walk goes on to D and K
    m = m.with_ceilings(tflops=m.tflops, source="this interpreted run (test)")
    r = R.ConfigResult(cfg, reports[cfg], measurement=m, service=R.tile_service(cfg, size, m.t_ms, "cpu", n_rep=3))
    ev = R.config_evidence(r, copy_gbps=10.0)
    s = r.service
    assert s["service_predicted_ms"] == pytest.approx(s["service_calls"] * m.t_ms)
    assert ev["e2e_slowdown"] == pytest.approx(s["service_step_ms"] / s["service_predicted_ms"])
    assert ev["rank_tail_pct"] == 0.0 and ev["n_ranks"] == 1 and ev["n_spills"] == 0
    assert not set(BY_HAND) & set(ev)
    assert set(ev["metric_sources"]) == set(ev) - {"metric_sources", "n_ranks", "metric_spreads"}
    walk = diagnose(ev)
    assert walk.path[:2] == ["B", "D"] and walk.fully_measured, walk.explain()
    assert r.to_dict()["service"] == s
    # without a service step, D is left undecided, never answered by hand
    bare = R.config_evidence(R.ConfigResult(cfg, reports[cfg], measurement=m))
    assert "e2e_slowdown" not in bare and diagnose(bare).undecided.id == "D"


@pytest.mark.slow
def test_grader(tmp_path, monkeypatch):
    """The lab's grader builds the core's result type, and the class folder still gets it."""
    from hwlab.course import classroom
    from hwlab.core import grading

    monkeypatch.setenv(classroom.ENV_DIR, str(tmp_path))
    assert R.grade_config(None, "").status == "not done yet"
    r = R.grade_config(R.SPILL, "because")
    assert isinstance(r, grading.ExerciseResult) and r.status == "wrong" and "still spills" in r.message
    (rec,) = [json.loads(p.read_text()) for p in tmp_path.glob("exercise-*.json")]  # not-done is no attempt
    assert rec["item"] == "spill-free tile" and rec["status"] == "wrong"


# ---- recorded H200 acceptance, re-derived from the stored timings
def test_recorded_lab02_acceptance():
    ev = recorded("lab02_registers")
    cfgs = ev.extra["configs"]
    timed = [c for c in cfgs if c["measurement"]]
    best = min(timed, key=lambda c: c["measurement"]["t_ms"])
    assert best["report"]["n_spills"] == 0
    cublas = ev.result("gemm[bf16]")
    assert best["measurement"]["t_ms"] <= cublas.t_ms / 0.8  # >= 80% of cuBLAS bf16, same run
    slow_spill = [c for c in timed if c["report"]["n_spills"] > 0
                  and c["measurement"]["t_ms"] >= 5 * best["measurement"]["t_ms"]]
    assert slow_spill, "a spilling config at least 5x slower than the best"
    for c in timed:  # occupancy limits agree with Nsight Compute
        ours = c["occupancy"]["blocks_by_limit"]
        assert {k: c["ncu"][f"launch__occupancy_limit_{k}"] for k in ours} == ours
    L = ev.extra["launch"]
    assert L["eager"]["t_ms"] / L["graph"]["t_ms"] >= 3.0


def test_recorded_lab02_walks_answer_every_question_by_measurement():
    """recorded/h200/lab02_registers.json: each timed config's and the launch-bound step's D and
    K come from their one-process service steps recorded in the same run (re-derived: the step
    over the kernel's or eager step's own median x calls; one rank), no walk holds a by-hand
    answer, and every walk reaching D is fully measured. Fails on a file recorded before Lab 2
    measured D/K: re-record with --only lab02."""
    ev = recorded("lab02_registers")
    fe = ev.extra["flowchart_evidence"]
    steps = {c["report"]["config"]: (c.get("service"), c["measurement"]["t_ms"])
             for c in ev.extra["configs"] if c["measurement"]}
    L = ev.extra["launch"]
    steps["launch-bound step"] = (L.get("service"), L["eager"]["t_ms"])
    assert set(fe) == set(steps)
    for k, e in fe.items():
        s, t_ms = steps[k]
        assert s, f"{k}: no service step recorded (re-record with --only lab02)"
        assert not set(BY_HAND) & set(e), k
        assert s["service_predicted_ms"] == pytest.approx(s["service_calls"] * t_ms)
        assert e["e2e_slowdown"] == pytest.approx(s["service_step_ms"] / s["service_predicted_ms"])
        assert e["n_ranks"] == 1 and e["rank_tail_pct"] == 0.0
        walk = diagnose(e)
        assert not walk.by_hand, walk.explain()
        if "D" in walk.path:
            assert walk.fully_measured, walk.explain()
    assert "D" in diagnose(fe["128x256x64 w8 s3"]).path


def test_recorded_lab02_overfusion():
    """The recorded over-fusion run: the fused tile spilled on the H200 and the split GEMM did
    not; both timings were checked against float64 and the split path was the faster one."""
    ev = recorded("lab02_registers")
    rep = ev.extra["overfusion"]
    assert rep["fused"]["config"] == R.FUSED.label and rep["fused"]["n_spills"] > 0
    assert rep["split"]["config"] == R.SANE.label and rep["split"]["n_spills"] == 0
    fused, split = ev.result(fusion.FUSED_NAME), ev.result(fusion.SPLIT_NAME)
    for m in (fused, split):
        assert m.rel_err is not None and m.rel_err <= m.tol
    assert fused.t_ms > split.t_ms


def test_recorded_lab02_flowchart():
    fe = recorded("lab02_registers").extra["flowchart_evidence"]
    assert diagnose(fe["256x256x64 w4 s2"]).leaf_id == "J"
    assert diagnose(fe["256x256x64 w8 s3"]).leaf_id == "J"
    assert diagnose(fe["128x256x64 w8 s3"]).leaf_id == "OK"
    assert diagnose(fe["launch-bound step"]).leaf_id == "J"


def test_loop_instruction_mix_counts_the_longest_loop_body():
    """SASS as nvdisasm prints it: opcodes without modifiers or predicates, counted from a label to
    the backward branch to it; the longer of two loops wins; no backward branch, no loop."""
    from hwlab.labs.registers.compile_guard import loop_instruction_mix

    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/              @!P0 BRA `(.L_x_9) ;
        /*0030*/                   BRA `(.L_x_0) ;
.L_x_1:
        /*0040*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0050*/                   HFMA2 R6, R4, R5, R6 ;
        /*0060*/                   HFMA2.MMA R7, R4, R5, R7 ;
        /*0070*/                   SHFL.BFLY PT, R8, R6, 0x1, 0x1f ;
        /*0080*/               @P1 BRA `(.L_x_1) ;
.L_x_9:
        /*0090*/                   EXIT ;
"""
    assert loop_instruction_mix(sass) == {"HFMA2": 2, "LDG": 1, "SHFL": 1, "BRA": 1}
    assert loop_instruction_mix(sass.replace("`(.L_x_1)", "`(.L_x_9)").replace("`(.L_x_0)", "`(.L_x_9)")) == {}
