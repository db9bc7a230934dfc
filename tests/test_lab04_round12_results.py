"""Round 12's H200 results (benchmarks/results/round12/), re-read on the CPU: every figure LAB04_NOTES.md
round 12 quotes is recomputed from the file (the read floor of the attention's cache beside SDPA and the
lab's FP8 attention), and each conclusion is derived, not copied."""
import json
from pathlib import Path

import pytest

from hwlab.labs.fp8.attention import FP8_CACHE_MATH_REL
from hwlab.labs.fp8.model import H200_SIZE

ROOT = Path(__file__).resolve().parents[1]
RES = ROOT / "benchmarks" / "results" / "round12"
NOTES = (ROOT / "benchmarks" / "LAB04_NOTES.md").read_text()
ROUND12 = " ".join(NOTES[NOTES.index("## Round 12"):NOTES.index("## Superseded notes")].split())  # one line
ROUND11 = json.loads((ROOT / "benchmarks" / "results" / "round11" / "lab04_round11b_h200.json").read_text())
TARGET = {512: 0.9, 4096: 1.0, 32768: 1.0}  # issue #19: FP8 attention GB/s over SDPA's (512: within 10%)


def _rows():
    return {r["ctx"]: r for r in json.loads((RES / "lab04_round12_h200.json").read_text())["attn_floor"]}


def _fastest(r, d, method="sustained"):
    us = r[f"{method}_us"]
    return us[r[f"{method}_fastest_read"][d]]


def _tag(ctx):
    return {512: "512 x16", 4096: "4k x16", 32768: "32k x4"}[ctx]


def test_every_timed_way_was_checked_and_its_rate_is_its_bytes_over_its_time():
    rows = _rows()
    assert set(rows) == set(TARGET)
    for ctx, r in rows.items():
        b8 = r["batch"] * H200_SIZE.n_heads * ctx * H200_SIZE.d_head * 2  # one layer's FP8 K and V
        assert r["fp8_bytes_per_layer"] == b8 and not r["failed"]
        assert r["rel_err_vs_float32"]["lab"] < FP8_CACHE_MATH_REL and r["rel_err_vs_float32"]["sdpa"] < 2e-2
        for method in ("sustained", "alternate"):
            for k, us in r[f"{method}_us"].items():
                m = r["ways"][k]
                want = 2 * b8 if k == "sdpa" or m.get("dtype") == "bf16" else b8
                assert m["bytes"] == want, k
                assert r[f"{method}_gbps"][k] == pytest.approx(want / us / 1e3)
        reads = [k for k, m in r["ways"].items() if m["kind"] == "read"]
        assert sum(r["ways"][k]["dtype"] == "fp8" for k in reads) >= 12 and any("kv pattern" in k for k in reads)


def test_the_needed_time_and_the_fastest_read_are_derived_from_the_same_run():
    for ctx, r in _rows().items():
        for method in ("sustained", "alternate"):
            us, g = r[f"{method}_us"], r[f"{method}_gbps"]
            assert r["target_over_sdpa"] == TARGET[ctx]
            assert r[f"{method}_needed_us"] == pytest.approx(r["fp8_bytes_per_layer"] / (TARGET[ctx] * g["sdpa"] * 1e3))
            for d in ("fp8", "bf16"):
                reads = [k for k in us if r["ways"][k]["kind"] == "read" and r["ways"][k]["dtype"] == d]
                assert r[f"{method}_fastest_read"][d] == min(reads, key=us.get)


def test_the_notes_table_is_the_files_figures():
    for ctx, r in _rows().items():
        us = r["sustained_us"]
        row = (f"| {_tag(ctx)} | {us['sdpa']:.1f} | {_fastest(r, 'bf16'):.1f} | {r['sustained_needed_us']:.1f} | "
               f"{_fastest(r, 'fp8'):.1f} | {us['lab']:.1f} |")
        assert row in ROUND12, row


def test_at_4k_and_32k_the_target_sits_within_two_percent_of_a_bare_read_and_sdpa_at_its_own():
    rows = _rows()
    margin = {c: {m: rows[c][f"{m}_needed_us"] / _fastest(rows[c], "fp8", m) - 1 for m in ("sustained", "alternate")}
              for c in (4096, 32768)}
    sdpa_over = {c: rows[c]["sustained_us"]["sdpa"] / _fastest(rows[c], "bf16") - 1 for c in (4096, 32768)}
    lab_over = {c: rows[c]["sustained_us"]["lab"] / _fastest(rows[c], "fp8") - 1 for c in (4096, 32768)}
    for c in (4096, 32768):
        assert all(0 < v < 0.02 for v in margin[c].values()), margin
        assert 0 < sdpa_over[c] < 0.02 and lab_over[c] > 0.1
        assert "kv pattern" in rows[c]["sustained_fastest_read"]["fp8"]
    assert (f"only {100 * margin[4096]['sustained']:.1f} / {100 * margin[32768]['sustained']:.1f}% under the FP8 "
            f"target's time (alternating: {100 * margin[4096]['alternate']:.1f} / "
            f"{100 * margin[32768]['alternate']:.1f}%)") in ROUND12
    assert f"only {100 * sdpa_over[4096]:.1f} / {100 * sdpa_over[32768]:.1f}% over the fastest bare read" in ROUND12
    assert f"{100 * lab_over[4096]:.1f} / {100 * lab_over[32768]:.1f}% over that read" in ROUND12
    gb = [round(rows[c]["sustained_gbps"]["sdpa"]) for c in (4096, 32768)]
    assert f"({gb[0]} / {gb[1]} GB/s)" in ROUND12


def test_flat_reads_and_torch_are_slower_than_the_attention_shaped_read():
    rows = _rows()
    flat, tsum = {}, {}
    for c in (4096, 32768):
        us = rows[c]["sustained_us"]
        f = min((k for k in us if k.startswith("read fp8:") and "torch" not in k), key=us.get)
        flat[c] = us[f] / _fastest(rows[c], "fp8") - 1
        tsum[c] = us["read fp8: torch sum of int32 words"] / _fastest(rows[c], "fp8") - 1
        assert flat[c] > 0 and tsum[c] > flat[c]
    assert f"{100 * flat[4096]:.1f} / {100 * flat[32768]:.1f}% slower, torch's sum {100 * tsum[4096]:.1f} / " \
           f"{100 * tsum[32768]:.1f}% slower" in ROUND12


def test_at_512_the_floor_leaves_room():
    r = _rows()[512]
    m = {k: r[f"{k}_needed_us"] / _fastest(r, "fp8", k) - 1 for k in ("sustained", "alternate")}
    assert m["sustained"] > 0.1 and m["alternate"] > 0.1
    assert (f"{_fastest(r, 'fp8'):.1f} us against {r['sustained_needed_us']:.1f} needed, {100 * m['sustained']:.1f}% "
            f"under (alternating {100 * m['alternate']:.1f}%)") in ROUND12
    lab_over = r["sustained_us"]["lab"] / _fastest(r, "fp8") - 1
    assert f"runs {100 * lab_over:.0f}% over it" in ROUND12 and lab_over > 0.3


def test_the_labs_sustained_blocks_ran_slower_and_cooler_than_alternating():
    rows = _rows()
    for c in (4096, 32768):
        r = rows[c]
        s, a = r["sustained_us"], r["alternate_us"]
        assert s["lab"] / a["lab"] - 1 > 0.05
        assert abs(s["sdpa"] / a["sdpa"] - 1) < 0.01 and abs(_fastest(r, "fp8") / _fastest(r, "fp8", "alternate") - 1) < 0.01
        lab_mhz = max(b["sm_mhz_after"] for b in r["blocks"] if b["way"] == "lab")
        read_mhz = min(b["sm_mhz_after"] for b in r["blocks"] if b["way"] == r["sustained_fastest_read"]["fp8"])
        assert lab_mhz < read_mhz
    spread = [100 * (rows[c]["sustained_us"]["lab"] / rows[c]["alternate_us"]["lab"] - 1) for c in (4096, 32768)]
    assert f"{spread[0]:.1f} / {spread[1]:.1f}% slower in its sustained blocks" in ROUND12
    pct = [100 * rows[c]["alternate_over_sdpa"]["lab"] for c in (4096, 32768)]
    assert f"{pct[0]:.1f} / {pct[1]:.1f}% of SDPA" in ROUND12


def test_the_where_it_stands_ratios_are_the_files():
    rows = _rows()
    att = [rows[c][f"{m}_us"]["lab"] / _fastest(rows[c], "fp8", m) for c in (4096, 32768) for m in ("sustained", "alternate")]
    assert f"{min(att):.2f}-{max(att):.2f}x of its floor at 4k and 32k" in ROUND12
    assert f"{rows[512]['sustained_us']['lab'] / _fastest(rows[512], 'fp8'):.2f}x at 512" in ROUND12
    gem = []
    for r in ROUND11["floor"]:
        us = r["sustained_us"]
        gem.append(us["kit fp8 x16"] / us[r["sustained_fastest_read"]["fp8"]])  # the lab's tile
    assert f"FP8 GEMMs {min(gem):.2f}-{max(gem):.2f}x of theirs (round 11)" in ROUND12


def _call3():
    return json.loads((RES / "lab04_fp8_call3.json").read_text())


def test_call3_is_the_committed_record_or_its_predecessor():
    rec = json.loads((ROOT / "src" / "hwlab" / "recorded" / "h200" / "lab04_fp8.json").read_text())
    c3 = _call3()
    assert c3["kind"] == "lab04_fp8" and c3["recorded_at"] <= rec["recorded_at"]


def test_the_notes_shares_of_the_floor_are_call3s():
    from hwlab.labs import fp8 as L
    from hwlab.labs.fp8.targets import READ_CEILING_SHARE

    ev = _call3()
    run = ev["extra"]["run"]
    rows = L.byte_floor_targets(run, ev["ceilings"]["copy_gbps"], ev["extra"]["flowchart_leaves"])
    att = {a["ctx"]: a for a in run["attention_vs_sdpa"]}
    asks = {r["target"]: r["asks_of_floor"] for r in rows if "asks_of_floor" in r}
    a_asks = {c: next(v for t, v in asks.items() if t.startswith(f"FP8 attention at ctx {c} ")) for c in att}
    assert f"asks {100 * a_asks[4096]:.1f} / {100 * a_asks[32768]:.1f}% of a bare read of the FP8 bytes" in ROUND12
    assert f"and {100 * a_asks[512]:.1f}% at 512" in ROUND12
    sdpa = [100 * att[c]["sdpa_gbps"] / att[c]["bf16_read_floor"]["gbps"] for c in (512, 4096, 32768)]
    kit = [100 * att[c]["kit_fp8_gbps"] / att[c]["fp8_read_floor"]["gbps"] for c in (512, 4096, 32768)]
    assert f"SDPA runs at {sdpa[1]:.1f} / {sdpa[2]:.1f}% of a bare read of its own bf16 bytes" in ROUND12
    assert f"{kit[0]:.1f} / {kit[1]:.1f} / {kit[2]:.1f}% of the bare read's GB/s" in ROUND12
    assert f"SDPA at {sdpa[0]:.1f} / {sdpa[1]:.1f} / {sdpa[2]:.1f}% of its" in ROUND12
    g_asks = {(g["layer"], g["rows"]): g["bf16_gbps"] / g["fp8_read_floor"]["gbps"] for g in run["gemms_vs_bf16"]}
    assert f"the GEMM targets ask {100 * min(g_asks.values()):.1f}-{100 * max(g_asks.values()):.1f}%" in ROUND12
    at = sorted(k for k, v in g_asks.items() if v >= READ_CEILING_SHARE)
    assert at == [("down", 4), ("down", 16), ("up", 4)]  # what the notes name as at the ceiling
    assert (f"`qkv` {100 * g_asks[('qkv', 16)]:.1f} / {100 * g_asks[('qkv', 4)]:.1f}% (16 / 4 rows), `up` at 16 rows "
            f"{100 * g_asks[('up', 16)]:.1f}%, `out` {100 * g_asks[('out', 16)]:.1f} / {100 * g_asks[('out', 4)]:.1f}%") in ROUND12
    kg = [g["fp8_gbps"] / g["fp8_read_floor"]["gbps"] for g in run["gemms_vs_bf16"]]
    bg = [g["bf16_gbps"] / g["bf16_read_floor"]["gbps"] for g in run["gemms_vs_bf16"]]
    assert f"FP8 GEMMs at {100 * min(kg):.1f}-{100 * max(kg):.1f}%" in ROUND12
    assert f"bf16 GEMMs at {100 * min(bg):.1f}-{100 * max(bg):.1f}% of theirs" in ROUND12
    met = sum(r["met"] for r in rows)
    ceiling = sum(not r["met"] and r.get("asks_of_floor", 0) >= READ_CEILING_SHARE for r in rows)
    assert f"Targets: {met} of {len(rows)} met, {ceiling} of the rest at the read ceiling" in ROUND12


def test_the_live_count_quoted_is_the_fourteenth_runs_notebook():
    # the fourteenth run's printed outputs, kept as text when the sixteenth run replaced its copy
    out = (RES / "notebook04_fourteenth_run_outputs.txt").read_text()
    line = next(x for x in out.splitlines() if "targets met" in x)
    assert line.startswith("5 of 17 targets met; 6 of the rest at the read ceiling") and "measured live on NVIDIA H200" in line
    assert "(6 in notebook 04's live run minutes later)" in ROUND12


def _attn512(name, part):
    r = json.loads((RES / name).read_text())[part]
    assert len(r) == 1 and (r[0]["ctx"], r[0]["batch"], r[0]["T"]) == (512, 16, 512)
    return r[0]


def test_the_512_attention_without_its_combine_as_the_notes_quote():
    b = _attn512("lab04_round12b_h200.json", "attn512")
    c = _attn512("lab04_round12c_h200.json", "attn512b")
    for r in (b, c):  # every way checked against float32 before it was timed
        assert all(e < (2e-2 if k == "sdpa" else FP8_CACHE_MATH_REL) for k, e in r["rel_err_vs_float32"].items())
        assert set(r["sustained_us"]) == set(r["rel_err_vs_float32"])
    us, o = b["sustained_us"], b["sustained_over_sdpa"]
    best = "final rows, 2 warps, 32 per step, chunk 512, 3 loop stages"
    combined = "rows, 2 warps, 32 per step, chunk 512, 3 loop stages"
    assert max((k for k in o if k != "sdpa"), key=o.get) == best
    assert max((k for k in c["sustained_over_sdpa"] if k != "sdpa"), key=c["sustained_over_sdpa"].get) == best
    assert f"the lab's kernel {us['lab']:.1f} ({100 * o['lab']:.1f}%)" in ROUND12
    t = "rows, lab tile, 3 loop stages"
    assert f"splits and the combine) {us[t]:.1f} ({100 * o[t]:.1f}%)" in ROUND12
    assert (f"with the combine {us[combined]:.1f} ({100 * o[combined]:.1f}%), writing the output itself "
            f"**{us[best]:.1f} ({100 * o[best]:.1f}%; call 6 again: {100 * c['sustained_over_sdpa'][best]:.1f}%)**") in ROUND12
    lean = "final lean, 2 warps, 32 per step, chunk 512, 3 loop stages"
    assert f"the lean loop at the same tile {us[lean]:.1f} ({100 * o[lean]:.1f}%)" in ROUND12
    assert f"saves {us[combined] - us[best]:.1f} us of a layer's {us[combined]:.1f} at 512" in ROUND12
    gap = 100 * (0.9 - max(o[best], c["sustained_over_sdpa"][best]))
    assert 0 < gap and f"within {gap:.1f} points of its target" in ROUND12
    assert all(v < 0.9 for r in (b, c) for m in ("sustained", "alternate")
               for k, v in r[f"{m}_over_sdpa"].items() if k != "sdpa")  # "no tile tried crossed it"
    cu = c["sustained_us"]
    st = {n: cu[f"final rows, 2 warps, 32 per step, chunk 512, {n} loop stages"] for n in (2, 4)}
    assert f"2 stages {st[2]:.1f} ({100 * c['sustained_over_sdpa']['final rows, 2 warps, 32 per step, chunk 512, 2 loop stages']:.1f}%), 4 stages {st[4]:.1f}" in ROUND12
    others = [v for k, v in us.items() if k.startswith("final rows") and "2 warps, 32" not in k]
    assert f"1, 4 or 8 warps at 16, 64 or 128 per step {min(others):.1f}-{max(others):.1f}" in ROUND12
