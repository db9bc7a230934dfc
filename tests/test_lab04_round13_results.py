"""Round 13's H200 results (benchmarks/results/round13/), re-read on the CPU: every figure LAB04_NOTES.md
round 13 quotes is recomputed from the files (the fixed step with `out` / `down` on cuBLAS, the 512 steps
with one split per row, the element-by-element comparison), and each conclusion is derived, not copied."""
import json
from pathlib import Path

from hwlab.labs.fp8 import decode_gemm
from hwlab.labs.fp8.attention import MIN_PROGRAMS
from hwlab.labs.fp8.model import H200_SIZE

ROOT = Path(__file__).resolve().parents[1]
RES = ROOT / "benchmarks" / "results" / "round13"
NOTES = (ROOT / "benchmarks" / "LAB04_NOTES.md").read_text()
ROUND13 = " ".join(NOTES[NOTES.index("## Round 13"):NOTES.index("## Superseded notes")].split())  # one line
CALL1 = json.loads((RES / "lab04_round13_h200.json").read_text())
BITS = json.loads((RES / "lab04_round13b_h200.json").read_text())["bits"]
RECORD = json.loads((ROOT / "src" / "hwlab" / "recorded" / "h200" / "lab04_fp8.json").read_text())["extra"]["run"]


def _pct(us: dict, k: str) -> float:
    return 100 * (us[k] / us["lab"] - 1)


def _ms(v_us: float) -> str:
    return f"{v_us / 1e3:.4f}"


def test_every_choice_ran_in_every_bucket_and_the_lab_step_is_the_reference():
    g = CALL1["gemm"]
    assert [(r["ctx"], r["batch"]) for r in g] == [(512, 16), (4096, 16), (32768, 4)]
    for r in g + CALL1["final512"]:
        for m in ("sustained", "alternate"):
            assert "lab" in r[f"{m}_us"] and len(r[f"{m}_us"]) == 4
        assert len(r["blocks"]) == 2 * 4  # each choice twice, opposite orders
        assert r["logits_rel_diff_vs_lab"]["lab"] == 0.0
    assert [(r["path"], r["ctx"]) for r in CALL1["final512"]] == [("fixed", 512), ("bf16", 512)]
    # the shapes sent to cuBLAS are the lab's own out and down tiles (those it would leave)
    assert {tuple(s) for v in CALL1["gemm_choices"].values() for s in v} == {(4096, 4096), (4096, 14336)}
    assert all(tuple(s) in decode_gemm.CONFIGS for v in CALL1["gemm_choices"].values() for s in v)


def test_cublas_for_out_and_down_is_slower_in_the_step_as_the_notes_quote():
    rows = {r["ctx"]: r for r in CALL1["gemm"]}
    names = ("out on cuBLAS", "down on cuBLAS", "out and down on cuBLAS")
    for ctx, r in rows.items():
        us = r["sustained_us"]
        assert all(us[k] > us["lab"] for k in names), ctx  # sustained: slower everywhere
    us = rows[512]["sustained_us"]
    assert (f"512 {_ms(us['lab'])} -> {_ms(us[names[0]])} ms (+{_pct(us, names[0]):.1f}%) with `out`, "
            f"{_ms(us[names[1]])} (+{_pct(us, names[1]):.1f}%) with `down`, {_ms(us[names[2]])} "
            f"(+{_pct(us, names[2]):.1f}%) with both") in ROUND13
    for ctx, tag in ((4096, "4k"), (32768, "32k")):
        us = rows[ctx]["sustained_us"]
        assert (f"{tag} {_ms(us['lab'])} -> " + " / ".join(_ms(us[k]) for k in names) + " (+"
                + " / +".join(f"{_pct(us, k):.1f}" for k in names) + "%)") in ROUND13
    alt = {ctx: [_pct(r["alternate_us"], k) for k in names] for ctx, r in rows.items()}
    lo, hi = min(alt[512] + alt[4096]), max(alt[512] + alt[4096])
    assert lo > 0 and f"(+{lo:.1f} to +{hi:.1f}%)" in ROUND13
    assert f"at 32k {min(alt[32768]):.1f} to +{max(alt[32768]):.1f}%" in ROUND13
    # the alone figures quoted are the committed record's (kit's FP8 GEMM against cuBLAS's, 16 rows)
    g = {(x["layer"], x["rows"]): x for x in RECORD["gemms_vs_bf16"]}
    for layer in ("out", "down"):
        x = g[(layer, 16)]
        assert x["fp8_cublas_us"] < x["fp8_us"]
        assert f"{x['fp8_cublas_us']:.2f} against {x['fp8_us']:.2f}" in ROUND13


def test_one_split_per_row_at_512_is_slower_in_both_steps():
    for r in CALL1["final512"]:
        tiles = [k for k in r["sustained_us"] if k != "lab"]
        assert len(tiles) == 3
        for m in ("sustained", "alternate"):
            assert all(r[f"{m}_us"][k] > r[f"{m}_us"]["lab"] for k in tiles)
        us = r["sustained_us"]
        quoted = (f"{_ms(us['lab'])} " + ("ms with the lab's kernel against " if r["path"] == "fixed" else "against ")
                  + " / ".join(_ms(us[k]) for k in tiles) + " (+" + " / +".join(f"{_pct(us, k):.1f}" for k in tiles)
                  + "%)")
        assert quoted in ROUND13, quoted
        gap = max(abs(_pct(r["alternate_us"], k) - _pct(us, k)) for k in tiles)
        assert gap <= 0.3  # "alternating within 0.3 points of those"
    # "512 programs reading 256 KB each" against the lab's 2048: the step's bf16 cache at 512 x16
    rows_heads = 16 * H200_SIZE.n_heads
    assert rows_heads == 512 and 512 * H200_SIZE.d_head * 2 * 2 == 256 * 1024
    assert rows_heads * 4 == MIN_PROGRAMS and "(2048 programs" in ROUND13


def test_the_bit_identical_logits_are_explained_by_the_kernels_outputs():
    fixed = [r for r in CALL1["gemm"] + CALL1["final512"] if r["path"] == "fixed"]
    assert all(v == 0.0 for r in fixed for v in r["logits_rel_diff_vs_lab"].values())
    assert all(x["differ"] == 0 and x["elements"] == 16 * 4096 for x in BITS["gemm"])
    assert "0 of 65,536 elements differ" in ROUND13
    d = [x["differ"] for x in BITS["attention"]]
    assert len(d) == 3 and f"{min(d)}-{max(d)} of 65,536 FP8 values differ" in ROUND13
    bf = [v for r in CALL1["final512"] if r["path"] == "bf16" for k, v in r["logits_rel_diff_vs_lab"].items() if k != "lab"]
    assert all(v > 0 for v in bf)
    assert f"moved its logits by {100 * min(bf):.2f}-{100 * max(bf):.2f}%" in ROUND13


def test_notebook_04_quotes_round_13_from_the_files():
    nb = " ".join((ROOT / "notebooks" / "04_fp8_dequant_fallback.py").read_text().replace("#", " ").split())
    g = [_pct(r["sustained_us"], k) for r in CALL1["gemm"] for k in r["sustained_us"] if k != "lab"]
    f = [_pct(r["sustained_us"], k) for r in CALL1["final512"] for k in r["sustained_us"] if k != "lab"]
    assert f"fixed step {min(g):.1f}-{max(g):.1f}% slower in every bucket" in nb
    assert f"+{min(f):.0f} to +{max(f):.0f}%" in nb


def _outputs(text: str) -> dict:
    """Notebook 04's printed attention and GEMM lines and targets summary, parsed: GB/s by kernel."""
    import re
    num = lambda s: float(s.replace(",", ""))  # noqa: E731
    att = {int(m[1]): {"kit": num(m[2]), "sdpa": num(m[3]), "fp8_read": num(m[4])} for m in re.finditer(
        r"attention ctx +(\d+) x\d+ +: kit on FP8 +([\d,]+) GB/s, SDPA on bf16 +([\d,]+),.*?bare read of the FP8 bytes +([\d,]+)",
        text)}
    gemm = {(m[1], int(m[2])): {"fp8": num(m[3]), "bf16": num(m[4]), "fp8_read": num(m[5])} for m in re.finditer(
        r"GEMM +(\w+) x(\d+) +: FP8 +([\d,]+) GB/s = \d+% of bf16's +([\d,]+); a bare read of the FP8 weight +([\d,]+)",
        text)}
    summary = re.search(r"(\d+) of 17 targets met; (\d+) of the rest at the read ceiling", text)
    vendor = re.search(r"(\d+) of (\d+) targets ask the kit's kernel to sit nearer its floor", text)
    copy = {int(m[1]): int(m[2]) for m in re.finditer(r"fixed ctx +(\d+) x\d+ +TTFT.*?(\d+)% of copy", text)}
    return {"att": att, "gemm": gemm, "met": int(summary[1]), "ceiling": int(summary[2]),
            "beyond": (int(vendor[1]), int(vendor[2])), "copy": copy}


def _call4_text() -> str:
    return (RES / "notebook04_call4_outputs.txt").read_text()


def _copy_text() -> str:
    nb = json.loads((ROOT / "docs" / "executed-h200" / "notebooks__04_fp8_dequant_fallback.ipynb").read_text())
    return "\n".join("".join(o.get("text", "")) for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", []))


def test_notebook_04s_two_h200_runs_as_the_notes_quote():
    c3 = _outputs((RES / "notebook04_call3_outputs.txt").read_text())
    c4 = _outputs(_call4_text())
    rec = {(g["layer"], g["rows"]): g for g in RECORD["gemms_vs_bf16"]}
    recatt = {a["ctx"]: a for a in RECORD["attention_vs_sdpa"]}
    up3, up_rec = c3["gemm"][("up", 4)], rec[("up", 4)]
    assert c3["met"] == 6 and up3["fp8"] >= up3["bf16"]  # the sixth: up at 4 rows
    assert (f"met live, the sixth `up` at 4 rows, met because cuBLAS's bf16 GEMM read only {up3['bf16']:,.0f} GB/s "
            f"there ({up_rec['bf16_gbps']:,.0f} in the record) while the kit's FP8 GEMM read {up3['fp8']:,.0f} "
            f"({up_rec['fp8_gbps']:,.0f} in the record)") in ROUND13
    a3 = c3["att"][4096]
    assert a3["fp8_read"] < a3["sdpa"]  # the FP8 read under SDPA's rate on twice the bytes
    assert (f"read at {a3['fp8_read']:,.0f} GB/s ({recatt[4096]['fp8_read_floor']['gbps']:,.0f} in the record), under "
            f"the {a3['sdpa']:,.0f} SDPA read") in ROUND13
    asks = 100 * a3["sdpa"] / a3["fp8_read"]
    assert abs(asks - 105.6) < 0.06 and "the target asked 105.6% of that read" in ROUND13  # printed figures rounded
    o4, o3, o_rec = c4["gemm"][("out", 16)], c3["gemm"][("out", 16)], rec[("out", 16)]
    assert (f"the 4k read {c4['att'][4096]['fp8_read']:,.0f} GB/s, but `out`'s weight read {o4['fp8_read']:,.0f} "
            f"({o_rec['fp8_read_floor']['gbps']:,.0f} in the record, {o3['fp8_read']:,.0f} in call 3)") in ROUND13
    assert (f"{c4['copy'][4096]} / {c4['copy'][32768]}% of copy at 4k / 32k against "
            f"{c3['copy'][4096]} / {c3['copy'][32768]}% in call 3") in " ".join(ROUND13.split())
    assert (c4["met"], c4["ceiling"]) == (5, 7) and f"{c4['met']} of 17 met, {c4['ceiling']} of the rest" in ROUND13
    assert c3["beyond"] == c4["beyond"] == (10, 11)


def test_the_sixteenth_run_is_call_5_as_the_notes_and_docs_quote():
    c5 = _outputs(_copy_text())
    text = _copy_text()
    docs = " ".join((ROOT / "docs" / "executed-h200" / "README.md").read_text().split())
    assert "measured live on NVIDIA H200" in text and "within the run's p10-p90 spread" not in text
    assert (c5["met"], c5["ceiling"], c5["beyond"]) == (5, 6, (10, 11))
    cp = "/".join(str(c5["copy"][c]) for c in (512, 4096, 32768))
    assert f"{cp}% of copy; the fixed walk OK" in docs and f"{c5['met']} of 17 #19 targets met live, {c5['ceiling']} of" in docs
    assert (f"`out`'s read back at {c5['gemm'][('out', 16)]['fp8_read']:,.0f} GB/s, the fixed step at "
            f"{cp.replace('/', ' / ')}% of copy, {c5['met']} of 17 met and {c5['ceiling']} of the rest") in ROUND13
