import re
import torch

from hwlab.course import exercise as X


def ref(x):
    return x * 2


def make():
    return (torch.randn(100),)


def test_not_done_yet_is_not_an_error():
    def todo(x):
        raise NotImplementedError
    r = X.check_kernel("double", todo, ref, make, tol=1e-6, n_bytes=800)
    assert r.status == "not done yet" and not r.passed
    assert X.check_kernel("double", lambda x: None, ref, make, tol=1e-6, n_bytes=800).status == "not done yet"


def test_wrong_answer_is_caught_on_fresh_data():
    calls = []

    def sometimes_wrong(x):
        calls.append(1)
        return x * 2 if len(calls) < 2 else x * 2 + 1  # right once, wrong on the next input
    r = X.check_kernel("double", sometimes_wrong, ref, make, tol=1e-6, n_bytes=800)
    assert r.status == "wrong" and "relative error" in r.message


def test_correct_on_cpu_is_graded_for_correctness_only():
    r = X.check_kernel("double", lambda x: x + x, ref, make, tol=1e-6, n_bytes=800,
                       ceiling_gbps=1000.0, device="cpu")
    assert r.passed and r.status == "passed (correctness only)" and "GPU" in r.message


def test_check_value():
    assert X.check_value("leaf", None, "G", "").status == "not done yet"
    assert X.check_value("leaf", "G", "G", "why").passed
    w = X.check_value("leaf", "J", "G", "DRAM is saturated")
    assert w.status == "wrong" and "'J'" in w.message


# ---------------------------------------------------------------- graded on what matters
import pytest  # noqa: E402
import triton  # noqa: E402  (hwlab, imported above, set the interpreter up first)
import triton.language as tl  # noqa: E402

from hwlab.course import exercise_checks as C  # noqa: E402
from hwlab.course import toolchain_check as T  # noqa: E402
from hwlab.labs import bandwidth as lab  # noqa: E402
from hwlab.labs.registers import TileConfig  # noqa: E402
from hwlab.core.measure import TOL_BY_DTYPE  # noqa: E402


@triton.jit
def _learners_kernel(x_ptr, b_ptr, r_ptr, y_ptr, n, n_cols, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs % n_cols, mask=mask).to(tl.float32)
    r = tl.load(r_ptr + offs, mask=mask).to(tl.float32)
    t = x + b
    g = t * tl.sigmoid(2.0 * 0.7978845608028654 * (t + 0.044715 * t * t * t))
    tl.store(y_ptr + offs, ((g + r) * scale).to(y_ptr.dtype.element_ty), mask=mask)


def _learners_chain(x, bias, residual, scale=0.5):
    y = torch.empty_like(x)
    _learners_kernel[(triton.cdiv(x.numel(), 1024),)](x, bias, residual, y, x.numel(), x.shape[-1], scale,
                                                      BLOCK=1024)
    return y


def _check01(fn):
    return C.check_own_kernel("fused chain", fn, [_learners_kernel], lab.reference_chain,
                              lambda: lab.make_chain_inputs(16, 96, torch.float16), tol=TOL_BY_DTYPE["float16"],
                              n_bytes=lab.chain_traffic(16, 96, 2)["bytes_required"], device="cpu")


def test_01_own_kernel_passes_and_kit_or_torch_answers_fail():
    assert _check01(_learners_chain).passed
    kit = _check01(lab.fused_chain)  # correct output, but the kit's kernel
    assert kit.status == "wrong" and "hwlab.labs.bandwidth._fused_chain_kernel" in kit.message
    # notebook 01's own kernel, named as the learner's (assigned to their name, or its function re-jitted)
    listed = C.check_own_kernel("fused chain", lab.fused_chain, [lab._fused_chain_kernel], lab.reference_chain,
                                lambda: lab.make_chain_inputs(16, 96, torch.float16), tol=TOL_BY_DTYPE["float16"],
                                n_bytes=lab.chain_traffic(16, 96, 2)["bytes_required"], device="cpu")
    assert listed.status == "wrong" and "_fused_chain_kernel" in listed.message and "not yours" in listed.message
    rejit = triton.jit(lab._fused_chain_kernel.fn)

    def rejit_chain(x, bias, residual, scale=0.5):
        y = torch.empty_like(x)
        rejit[(triton.cdiv(x.numel(), 1024),)](x, bias, residual, y, x.numel(), x.shape[-1], scale, BLOCK=1024)
        return y
    r = C.check_own_kernel("fused chain", rejit_chain, [rejit], lab.reference_chain,
                           lambda: lab.make_chain_inputs(16, 96, torch.float16), tol=TOL_BY_DTYPE["float16"],
                           n_bytes=lab.chain_traffic(16, 96, 2)["bytes_required"], device="cpu")
    assert r.status == "wrong" and "not yours" in r.message, r.message
    eager = _check01(lab.unfused_chain)  # torch's own chain
    assert eager.status == "wrong" and "aten::gelu" in eager.message and "never ran" in eager.message
    half = _check01(lambda x, b, r, scale=0.5: _learners_chain(x, b, r, 1.0) * scale)
    assert half.status == "wrong" and "aten::mul" in half.message


@pytest.mark.slow
def test_02_wrong_limiter_fails_right_one_passes():
    cfg = TileConfig(64, 64, 32, 4, 2)  # 59 registers, 16 KiB shared: registers bind (8 blocks/SM)
    w = C.check_limiter(cfg, "shared memory", "small tile")
    assert w.status == "wrong" and "another limit allows fewer" in w.message and "bind" not in w.message
    s = C.check_limiter(cfg, "spills", "small tile")
    assert s.status == "wrong" and "nothing spills" in s.message
    from hwlab.labs import registers
    rep = registers.compile_guarded("matmul", cfg, static=True)
    # the reason is graded on its content: the resource that binds and its figure from the report
    vague = C.check_limiter(cfg, "registers", "64x64 on 4 warps is 32 accumulator registers per thread")
    assert vague.status == "wrong" and "figure from the compile report" in vague.message
    assert str(rep.n_regs) not in vague.message  # the feedback does not hand over the figure
    unnamed = C.check_limiter(cfg, "registers", f"it uses {rep.n_regs} per thread")
    assert unnamed.status == "wrong" and "does not name the resource" in unnamed.message
    listing = C.check_limiter(cfg, "registers", "registers " + " ".join(str(i) for i in range(256)))
    assert listing.status == "wrong" and "numbers" in listing.message  # a list of every figure does not pass
    ok = C.check_limiter(cfg, "registers", f"{rep.n_regs} registers per thread bind it; 32 accumulators, no spill")
    assert ok.passed and "static sm_90a compile" in ok.message
    assert C.check_limiter(cfg, None, "x").status == "not done yet"


@pytest.mark.slow
def test_04_fp8_head_fails_with_the_seeds_reason_and_kv_is_graded_per_bucket():
    fix = {"main": "fp8_mm", "connector": "fp8_mm", "head": "bf16", "kv_fp8_from_ctx": 4096}
    h = C.check_fp8_path(dict(fix, head="fp8_mm"))
    assert h.status == "wrong" and "先保留敏感头高精" in h.message
    kv = C.check_fp8_path(dict(fix, kv_fp8_from_ctx=512))  # FP8 KV where its bytes do not pay
    rows, label = C.kv_buckets()
    # a miss says how many buckets go against the rule, neither which way nor any bucket's share
    assert kv.status == "wrong" and "goes against the rule" in kv.message and "pays" not in kv.message
    none = C.check_fp8_path(dict(fix, kv_fp8_from_ctx=None))  # bf16 KV where FP8 would pay
    assert none.status == "wrong" and "goes against the rule" in none.message
    for w in (kv, none):
        assert not any(re.search(rf"(?<!\d){r['kv_share_pct']:.0f}%", w.message) for r in rows), w.message
    assert label.startswith("recorded on NVIDIA H200")
    for r in rows:  # the share is recomputed from the recorded bytes
        assert r["kv_share_pct"] == pytest.approx(100.0 * r["kv_bytes"] / r["decode_bytes"])
    assert C.check_fp8_path(fix).passed


@pytest.mark.parametrize("problem", ["missing", "version", "ptxas"])
def test_toolchain_problem_is_an_environment_problem_not_a_wrong_answer(problem, monkeypatch, tmp_path):
    if problem == "missing":
        monkeypatch.setattr(T, "_triton_version", lambda: None)
    elif problem == "version":
        monkeypatch.setattr(T, "_triton_version", lambda: (3, 2))
    else:
        monkeypatch.setattr(T, "_ptxas", lambda: tmp_path / "no-ptxas")
    results = [C.check_limiter(TileConfig(64, 64, 32, 4, 2), "registers", "why")]
    if problem != "ptxas":  # 01 and 04 need ptxas only on a GPU (the static sm_90a report of 02 always)
        results.append(_check01(_learners_chain))
        results.append(C.check_fp8_path({"main": "fp8_mm", "connector": "fp8_mm", "head": "bf16",
                                         "kv_fp8_from_ctx": 4096}))
    for r in results:
        assert r.status == "environment problem" and not r.passed, r
        assert "not your answer" in r.message and "scripts/setup.sh" in r.message
        assert str(r).startswith("[!]")


def test_toolchain_failure_inside_the_compile_is_an_environment_problem(monkeypatch):
    from hwlab.labs import registers

    monkeypatch.setattr(registers, "compile_guarded", lambda *a, **k: registers.CompileReport(
        "matmul", "64x64x32 w4 s2", source="skipped", skipped="compile failed: ['FileNotFoundError: "
        "triton 3.8.0 ships no ptxas at /x']"))
    r = C.check_limiter(TileConfig(64, 64, 32, 4, 2), "registers", "why")
    assert r.status == "environment problem" and "ships no ptxas" in r.message
    assert C.toolchain_problem(static_compile=True) is None  # this machine's own toolchain is fine


def test_04_part2_bucket_is_graded_from_the_recorded_profiles_not_a_label(monkeypatch):
    """Exercise 04, part 2: the bucket with the lowest recorded FP8 hit rate and the layer kind
    that falls back only there, recomputed from the record's profiles: the right pair passes, a
    kind that falls back everywhere or another bucket is wrong, and a record whose buckets swap
    their profiles swaps the answer."""
    import copy

    from hwlab.core import evidence

    rows, label = C.fallback_buckets()
    assert label.startswith("recorded on NVIDIA H200") and len(rows) == 2
    low = min(rows, key=lambda r: r["fp8_hit_pct"])
    high = max(rows, key=lambda r: r["fp8_hit_pct"])
    assert low["fp8_hit_pct"] < high["fp8_hit_pct"]
    assert set(low["fell_back"]) - set(high["fell_back"]) == {"out"}
    assert C.check_fallback_bucket(low["ctx"], "out").passed
    assert C.check_fallback_bucket(low["ctx"], "head").status == "wrong"  # falls back in every bucket
    assert C.check_fallback_bucket(high["ctx"], "out").status == "wrong"
    assert C.check_fallback_bucket(None, "out").status == "not done yet"
    assert "pick one of" in C.check_fallback_bucket(7, "out").message
    ev = copy.deepcopy(evidence.recorded("lab04_fp8"))
    a, b = ev.extra["run"]["stream"]["paths"]["mixed"]["buckets"]
    a["profile"], b["profile"] = ({**b["profile"], "ctx": a["profile"]["ctx"], "batch": a["profile"]["batch"]},
                                  {**a["profile"], "ctx": b["profile"]["ctx"], "batch": b["profile"]["batch"]})
    monkeypatch.setattr(evidence, "recorded", lambda kind, device="h200": ev)
    assert C.check_fallback_bucket(high["ctx"], "out").passed and not C.check_fallback_bucket(low["ctx"], "out").passed
