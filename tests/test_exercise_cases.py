"""Exercises 01-04 work on instances no notebook shows: for each, what the lab's notebook shows
(its kernel, its path, its printed figures) fails the exercise's checker, the committed solution
passes it, and a wrong answer's message names the evidence against it, never the right answer.

The solutions are read from ``solutions/exNN_*.py`` (the blocks between ``### BEGIN SOLUTION`` and
``### END SOLUTION``), so a solution that stops passing fails here, not only in the notebook run."""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hwlab.core import evidence, mapping, topology
from hwlab.course import exercise_checks as C

import triton  # noqa: E402  (hwlab, imported above, set the interpreter up first)
import triton.language as tl  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _blocks(n: str) -> list[str]:
    text = next((ROOT / "solutions").glob(f"ex{n}_*.py")).read_text()
    return re.findall(r"^### BEGIN SOLUTION\n(.*?)^### END SOLUTION", text, flags=re.S | re.M)


def _answers(n: str, i: int, **given) -> dict:
    ns = dict(given)
    exec(_blocks(n)[i], ns)  # noqa: S102  (the committed solution's own answer cell)
    return ns


def test_exercises_are_their_solutions_without_the_solution_blocks():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_exercises.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    for n in ("01", "02", "03", "04"):
        assert _blocks(n), f"solution {n} has no ### BEGIN SOLUTION block"
        ex = next((ROOT / "exercises").glob(f"ex{n}_*.py")).read_text()
        assert "BEGIN SOLUTION" not in ex


# ---------------------------------------------------------------- 01: the transposed chain
ROWS, COLS = 96, 160


@pytest.fixture(scope="module")
def sol01(tmp_path_factory):
    """The solution's kernel block as a module of its own (Triton reads a kernel's source file)."""
    p = tmp_path_factory.mktemp("sol01") / "sol01_kernel.py"
    p.write_text("import torch\nimport hwlab  # noqa: F401\nimport triton\nimport triton.language as tl\n"
                 "from hwlab.labs.bandwidth import transposed\n\n" + _blocks("01")[1])
    spec = importlib.util.spec_from_file_location("sol01_kernel", p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# notebook 01's fused kernel, verbatim (hwlab.labs.bandwidth._fused_chain_kernel), as a learner copies it
@triton.jit
def _nb01_kernel(x_ptr, b_ptr, r_ptr, y_ptr, n, n_cols, scale, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs % n_cols, mask=mask).to(tl.float32)
    r = tl.load(r_ptr + offs, mask=mask).to(tl.float32)
    t = x + b
    g = t * tl.sigmoid(2.0 * 0.7978845608028654 * (t + 0.044715 * t * t * t))
    tl.store(y_ptr + offs, ((g + r) * scale).to(y_ptr.dtype.element_ty), mask=mask)


def _nb01_launch(x, bias, scale, shift):
    y = torch.empty_like(x)
    r = torch.full_like(x, shift / scale)  # (g + shift/scale) * scale = g * scale + shift
    _nb01_kernel[(triton.cdiv(x.numel(), 2048),)](x, bias, r, y, x.numel(), x.shape[-1], scale, BLOCK=2048)
    return y


def nb01_as_shown(x, bias, scale=0.5, shift=0.125):
    return _nb01_launch(x, bias, scale, shift)


def nb01_then_transpose(x, bias, scale=0.5, shift=0.125):
    return _nb01_launch(x, bias, scale, shift).t().contiguous()


@triton.jit
def _strided_kernel(x_ptr, b_ptr, y_ptr, n_rows, n_cols, scale, shift, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # y's elements in order: its stores are contiguous
    m = o < n_rows * n_cols
    c = o // n_rows
    r = o % n_rows
    t = tl.load(x_ptr + r * n_cols + c, mask=m).to(tl.float32) + tl.load(b_ptr + c, mask=m).to(tl.float32)
    g = t * tl.sigmoid(2.0 * 0.7978845608028654 * (t + 0.044715 * t * t * t)) * scale + shift
    tl.store(y_ptr + o, g.to(y_ptr.dtype.element_ty), mask=m)


def strided_chain(x, bias, scale=0.5, shift=0.125):
    y = torch.empty(x.shape[1], x.shape[0], dtype=x.dtype, device=x.device)
    _strided_kernel[(triton.cdiv(x.numel(), 1024),)](x, bias, y, x.shape[0], x.shape[1], scale, shift, BLOCK=1024)
    return y


def _check01(fn, kernels):
    return C.check_transposed_kernel(fn, kernels, ROWS, COLS, torch.float16)


def test_01_the_notebooks_kernel_fails_the_solution_passes(sol01):
    from hwlab.labs import bandwidth as lab
    from hwlab.labs.bandwidth import transposed

    assert (transposed.SCALE, transposed.SHIFT) == (0.5, 0.125)  # the copies above use the instance's constants
    ok = _check01(sol01.my_transposed_chain, [sol01.my_transposed_kernel])
    assert ok.passed and "1.00x" in ok.message, ok
    as_is = _check01(nb01_as_shown, [_nb01_kernel])  # notebook 01's kernel: y in x's layout
    assert as_is.status == "wrong" and "shape" in as_is.message
    moved = _check01(nb01_then_transpose, [_nb01_kernel])  # right values, but three passes over DRAM
    assert moved.status == "wrong" and "too many bytes" in moved.message and "aten::clone" in moved.message
    kit = _check01(lambda x, b: lab.fused_chain(x, b, torch.zeros_like(x)).t().contiguous(), [_nb01_kernel])
    assert kit.status == "wrong" and "_fused_chain_kernel" in kit.message  # the kit's own kernel is refused


def test_01_a_strided_kernel_is_told_its_sector_use_not_the_fix():
    r = _check01(strided_chain, [_strided_kernel])
    assert r.status == "wrong" and "sectors" in r.message
    use = re.search(r"loads use (\d+)%", r.message)
    assert use and int(use.group(1)) < 25  # lanes a row apart: one sector per 2-byte element
    assert re.search(r"stores (\d+)%", r.message).group(1) == "100"
    for fix in ("tile", "tl.trans", "2-D", "2D"):
        assert fix not in r.message


def test_01_the_bytes_prediction_is_graded_against_the_meter_and_notebook_figures_fail():
    from hwlab.labs import bandwidth as lab

    rec = lab.result_from_evidence(evidence.recorded("lab01_bandwidth"))
    m = rec.measurements
    shown = [m["unfused"].params.get("bytes_moved", m["unfused"].n_bytes) / m["fused"].n_bytes,  # "predicted ~3x"
             rec.speedup("unfused", "fused"), rec.speedup("strided", "coalesced")]
    for fig in shown:  # what notebook 01 prints for its own chain
        r = C.check_bytes_prediction(round(fig, 2), ROWS, COLS)
        assert r.status == "wrong", (fig, r)
        assert "aten::" in r.message and f"{r.answer:.2f}x" in r.message
    right = C.check_bytes_prediction(_answers("01", 0)["MY_BYTES_RATIO"], ROWS, COLS)
    assert right.passed
    assert f"{right.expected:.2f}" not in C.check_bytes_prediction(2.0, ROWS, COLS).message
    assert C.check_bytes_prediction(None, ROWS, COLS).status == "not done yet"


def test_access_meter_counts_bytes_and_sectors_from_addresses():
    """The meter's two figures on kernels whose traffic is known by construction."""
    from hwlab.core import access_meter

    x = torch.randn(64, 128, dtype=torch.float16)
    y, tr = access_meter.meter(strided_chain, (x, torch.zeros(128, dtype=torch.float16)))
    assert tr.interpreted and len(tr.launches) == 1
    # one pass: x, y and bias once each, whole sectors (rows of 256 B)
    assert tr.dram_bytes == (2 * x.numel() + 128) * 2
    lu = tr.launches[0].side_use("load")
    # x read down columns: a warp's 32 two-byte loads hit 32 sectors; bias's loads hit one or two
    assert lu < 0.2 and tr.launches[0].side_use("store") == 1.0
    _, eager = access_meter.meter(lambda a: (a * 2).t().contiguous(), (x,))
    assert [o.name for o in eager.torch_ops] == ["mul", "clone"] and eager.dram_bytes == 4 * x.numel() * 2


# ---------------------------------------------------------------- 02: the row softmax's occupancy
@pytest.mark.slow
def test_02_notebook_02s_rows_fail_the_solution_passes_and_messages_hide_the_answer():
    from hwlab.labs.registers import TileConfig
    from hwlab.labs.registers.occupancy import HOPPER, occupancy

    rep = C.softmax_report(256, 1)
    a = _answers("02", 0, rep=rep, HOPPER=HOPPER)
    ok = C.check_occupancy_prediction(256, 1, a["MY_BLOCKS_PER_SM"], a["MY_LIMITER"])
    assert ok.passed, ok
    right_n = occupancy(rep.n_regs, rep.shared_bytes, 1, HOPPER).blocks_per_sm
    rec = evidence.recorded("lab02_registers")
    shown = set()
    for row in rec.extra["configs"]:  # notebook 02's sweep: each tile's blocks per SM and its limiter
        r = row["report"]
        if r.get("n_regs") is None or r["n_regs"] > HOPPER.max_regs_per_thread:
            continue
        o = occupancy(r["n_regs"], r["shared_bytes"], row["config"]["warps"], HOPPER)
        shown |= {(o.blocks_per_sm, k) for k in o.binding}
    assert shown
    for n, k in shown:
        assert C.check_occupancy_prediction(256, 1, n, k).status == "wrong", (n, k)
    wrong_limit = C.check_occupancy_prediction(256, 1, right_n, "registers")
    wrong_count = C.check_occupancy_prediction(256, 1, right_n + 53, "registers")
    for w in (wrong_limit, wrong_count):
        assert w.status == "wrong" and "block slot" not in w.message
        assert not re.search(rf"(?<!\d){right_n}(?!\d)", w.message), w.message
    assert "would allow" in wrong_limit.message
    # part 2: notebook 02's answers are tile configs; the kernel's knob is its warps
    sweep_cfg = C.check_warps_choice(4096, TileConfig(128, 256, 64, 8, 3))
    assert sweep_cfg.status == "wrong" and "warps count" in sweep_cfg.message
    best = _answers("02", 1)["MY_WARPS"]
    assert C.check_warps_choice(4096, best).passed
    low = C.check_warps_choice(4096, 4)
    assert low.status == "wrong" and "best occupancy" in low.message and f"{best} warp" not in low.message
    # brute force reads nothing off a wrong try: no occupancy, blocks or registers of the count tried
    for w in C.SOFTMAX_WARPS:
        r = C.check_warps_choice(4096, w)
        if r.status == "wrong":
            assert not re.search(r"\d+%|per SM|active warps|registers/thread|spill slots", r.message), (w, r.message)
    # a wrong count is not told which way (a whole number would fall to a few tries)
    assert not re.search(r"fewer than|more than|each allows more", wrong_count.message)


# ---------------------------------------------------------------- 03: a job's rank map
DGX1 = "dgx1_v100_hybrid_cube_mesh.txt"


def _topo(name=DGX1):
    return topology.parse_topo_matrix((evidence.RECORDED_DIR / "topology" / name).read_text())


def test_03_notebook_03s_mappings_fail_the_solution_passes():
    topo, devices = _topo(), [0, 5, 1, 4, 2, 3]
    sol = _answers("03", 0)
    assert C.check_crossing(topo, devices, 2, sol["CROSSING"], sol["EVIDENCE"], sol["LEAF"]).passed
    assert C.check_job_mapping(topo, devices, _answers("03", 1)["MY_GROUPS"], 2).passed
    # notebook 03 prints, for this capture at TP 2, the unaware (consecutive) and the chosen groups
    for shown in (mapping.naive_groups(topo, 2), mapping.choose_tp_groups(topo, 2)):
        assert C.check_job_mapping(topo, devices, shown, 2).status == "wrong", shown
    # the old exercise's answer (the PCIe server's) and the job's own consecutive device pairs
    assert C.check_job_mapping(topo, devices, [[0, 1], [2, 3]], 2).status == "wrong"
    assert C.check_job_mapping(topo, devices, [[0, 1], [2, 3], [4, 5]], 2).status == "wrong"


def test_03_answers_follow_the_capture_and_wrong_ones_do_not_name_the_right():
    topo, devices = _topo(), [0, 5, 1, 4, 2, 3]
    sol = _answers("03", 0)
    missed = C.check_crossing(topo, devices, 2, [[0, 1]], {(0, 5): "SYS"}, "L")
    assert missed.status == "wrong" and "[2, 3]" not in missed.message and "GPU1-GPU4" not in missed.message
    extra = C.check_crossing(topo, devices, 2, [[0, 1], [4, 5]], {(0, 5): "SYS"}, "L")
    assert extra.status == "wrong" and "GPU2-GPU3 NV2" in extra.message and "ranks [2, 3]" not in extra.message
    cell = C.check_crossing(topo, devices, 2, sol["CROSSING"], {(0, 5): "NV1", (1, 4): "SYS"}, "L")
    assert cell.status == "wrong" and "GPU0-GPU5" in cell.message and "SYS" not in cell.message
    for leaf in ("G", "M", "J"):
        w = C.check_crossing(topo, devices, 2, sol["CROSSING"], sol["EVIDENCE"], leaf)
        assert w.status == "wrong" and "leaf L" not in w.message and "rank mapping" not in w.message
    # another device list, another answer: the solution's groups are graded against the capture
    other = [0, 3, 1, 2, 4, 5]
    assert C.check_crossing(topo, other, 2, sol["CROSSING"], sol["EVIDENCE"], "L").status == "wrong"


# ---------------------------------------------------------------- 04: another layer falls back
@pytest.mark.slow
def test_04_notebook_04s_answers_fail_the_solution_passes():
    from hwlab.labs import fp8

    buckets = C.case_buckets()
    sol = _answers("04", 0)
    ok = C.check_case_fallback(sol["MY_BUCKET"], sol["MY_MODULE"], sol["MY_DEQUANTS"], sol["MY_SHAPE"], buckets)
    assert ok.passed, ok
    part2 = _answers("04", 1)["MY_BATCHES"][sol["MY_BUCKET"]]  # Part 1's pass does not state Part 2's answer
    assert not re.search(rf"(?<![\w.]){part2}(?![\d.])", ok.message), ok.message
    assert C.check_case_batches(_answers("04", 1)["MY_BATCHES"]).passed
    # notebook 04: `out` falls back, in its recorded long bucket, and PATHS["fixed"] is the fix
    rows, _ = C.fallback_buckets()
    nb_low = min(rows, key=lambda r: r["fp8_hit_pct"])
    args = (sol["MY_DEQUANTS"], sol["MY_SHAPE"], buckets)
    assert C.check_case_fallback(nb_low["ctx"], "out", *args).status == "wrong"
    out = C.check_case_fallback(sol["MY_BUCKET"], "out", *args)
    assert out.status == "wrong" and sol["MY_MODULE"] not in out.message
    assert C.check_case_batches(fp8.PATHS["fixed"]).status == "wrong"
    quiet = C.check_case_fallback(64, sol["MY_MODULE"], *args)
    assert quiet.status == "wrong" and str(sol["MY_BUCKET"]) not in quiet.message
    assert C.check_case_fallback(sol["MY_BUCKET"], sol["MY_MODULE"], 4, sol["MY_SHAPE"], buckets).status == "wrong"
    assert C.check_case_fallback(sol["MY_BUCKET"], sol["MY_MODULE"], sol["MY_DEQUANTS"], (6, 64, 256),
                                 buckets).status == "wrong"


@pytest.mark.slow
def test_04_the_batch_fix_is_reprofiled():
    fix = _answers("04", 1)["MY_BATCHES"]
    ctx = _answers("04", 0)["MY_BUCKET"]
    still = C.check_case_batches({**fix, ctx: 7})
    assert still.status == "wrong" and "dequant" in still.message
    padded = C.check_case_batches({**fix, ctx: 12})
    assert padded.status == "wrong" and "padding" in padded.message
    assert not re.search(r"\d+ padding", padded.message)  # no count: the answer would be one subtraction away
    assert C.check_case_batches({**fix, ctx: 4}).status == "wrong"  # fewer rows than the bucket serves


def test_04_a_rows_multiple_on_down_falls_back_and_counts_as_dequantized_bytes():
    """The model knob the instance uses: ``fp8_rows_multiple`` makes ``down`` fall back at other
    row counts, in the decoder and in the byte model alike."""
    from hwlab.labs import fp8
    from hwlab.labs.fp8 import bucket_case as case

    m = case.case_model("cpu")
    downs = [l["down"] for l in m.layers if l["down"].mode == "fp8_static"]
    assert downs and all(d.falls_back(6) and not d.falls_back(8) for d in downs)
    assert not any(l["out"].falls_back(6) for l in m.layers)
    cfg, p = case.CASE_CONFIG, case.CASE_PATH
    extra = fp8.step_bytes(cfg, p, 6, 0, False) - fp8.step_bytes(cfg, {**p, "fp8_rows_multiple": None}, 6, 0, False)
    per_weight = fp8.step_bytes(cfg, {**p, "main": "fp8_dequant", "fp8_rows_multiple": None}, 6, 0, False) \
        - fp8.step_bytes(cfg, {**p, "fp8_rows_multiple": None}, 6, 0, False)
    assert 0 < extra < per_weight  # two down layers dequantized, fewer bytes than every trunk layer
