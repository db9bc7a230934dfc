"""Lab 4's read floor (``labs/fp8/floor.py``): the read kernels in Triton's interpreter byte for byte
against torch, the plans that fit a cache or a weight, the fastest read checked before it is timed,
and the lab's attention comparison and targets table carrying the floor."""
import json
from pathlib import Path

import pytest
import torch

import hwlab  # noqa: F401  (interpreter before triton)
from hwlab.labs import fp8 as L
from hwlab.labs.fp8 import floor as FL
from hwlab.labs.fp8 import kernels as K
from hwlab.labs.fp8 import research as R
from hwlab.labs.fp8.targets import byte_floor_targets, floor_shares

ROOT = Path(__file__).resolve().parents[1]


def _record() -> dict:
    """The committed H200 record of Lab 4 (what the notes, the README and #19's note quote)."""
    return json.loads((ROOT / "src/hwlab/recorded/h200/lab04_fp8.json").read_text())


def _flat(path: str) -> str:
    return " ".join((ROOT / path).read_text().split())


def test_stream_kv_reads_every_byte_of_its_chunks():
    """The cache read (``floor.stream_kv``, interpreter; round 10's load-only probe): per (batch x head, split) the
    XOR of exactly its chunk's K and V bytes, as torch computes it; a flipped byte in one chunk
    changes that chunk's result only."""
    g = torch.Generator().manual_seed(11)
    k = torch.randint(0, 255, (2, 3, 128, 64), generator=g, dtype=torch.uint8).view(K.FP8)
    v = torch.randint(0, 255, (2, 3, 128, 64), generator=g, dtype=torch.uint8).view(K.FP8)
    for chunk, bt, st in ((64, 16, 0), (128, 32, 3)):
        got = FL.stream_kv(k, v, chunk, bt, loop_stages=st, use_triton=True)
        assert got.shape == (6, 128 // chunk) and torch.equal(got, FL.stream_kv(k, v, chunk, bt, use_triton=False))
    base = FL.stream_kv(k, v, 64, 16, use_triton=True)
    k2 = k.view(torch.uint8).clone()
    k2[1, 2, 70, 5] ^= 0x10  # (batch 1, head 2) = row 5, position 70 = split 1
    diff = FL.stream_kv(k2.view(K.FP8), v, 64, 16, use_triton=True) != base
    assert diff.nonzero().tolist() == [[5, 1]]
    with pytest.raises(ValueError, match="chunk dividing T"):
        FL.stream_kv(k, v, 48, 16)


def test_stream_matrix_reads_every_byte_of_its_tiles():
    """The weight read (``floor.stream_matrix``, interpreter; round 11's probe): per (row block, K
    slice) the XOR of the weight's bytes as int32 words, as torch computes it, for FP8 and bf16
    weights, with and without Triton's pipelined loop; one flipped byte changes exactly its tile."""
    g = torch.Generator().manual_seed(11)
    w8 = torch.randint(-100, 100, (32, 256), generator=g).to(torch.int8).view(K.FP8)
    w16 = torch.randn(32, 128, generator=g).to(torch.bfloat16)
    for w in (w8, w16):
        for bn, bk, split, st in ((16, 64, 1, 0), (8, 16, 4, 0), (32, 32, 2, 2)):
            got = FL.stream_matrix(w, bn, bk, split, num_warps=1, loop_stages=st, use_triton=True)
            want = FL.stream_matrix(w, bn, bk, split, use_triton=False)
            assert got.shape == (32 // bn, split) and torch.equal(got, want)
            assert int(got.abs().sum()) > 0
    base = FL.stream_matrix(w8, 8, 16, 4, num_warps=1, use_triton=True)
    w2 = w8.view(torch.int8).clone()
    w2[13, 200] ^= 1  # row block 1, K slice 3 of 4 (64 bytes each)
    diff = FL.stream_matrix(w2.view(K.FP8), 8, 16, 4, num_warps=1, use_triton=True) != base
    assert diff.nonzero().tolist() == [[1, 3]]
    with pytest.raises(ValueError, match="divide"):
        FL.stream_matrix(w8, 12, 16)
    with pytest.raises(ValueError, match="multiple of 16"):
        FL.stream_matrix(w8, 8, 24)


def test_research_re_exports_the_same_read_kernels():
    assert R.stream_kv is FL.stream_kv and R.stream_matrix is FL.stream_matrix


def test_plans_fit_the_bytes_they_read():
    k = torch.zeros(1, 2, 512, 16, dtype=torch.uint8).view(K.FP8)
    assert list(FL.kv_read_plans([k], [k])) == ["1 warp, 16 per step, chunk 256, 3 stages"]  # 1024 and 2048 do not divide 512
    k4 = torch.zeros(1, 1, 4096, 16, dtype=torch.bfloat16)  # a 16-bit cache is read as its bytes
    plans = FL.kv_read_plans([k4], [k4])
    assert list(plans) == list(FL.KV_READS) and plans[next(iter(plans))][1].shape == (1, 4096 // 256)
    assert FL.kv_read_plans([k[:, :, :40]], [k[:, :, :40]]) == {}
    w = torch.zeros(64, 1024, dtype=torch.uint8).view(K.FP8)  # 1024 bytes a row: K split 4 of 256 B, not 8
    assert sorted(FL.matrix_read_plans([w])) == sorted(n for n, p in FL.MATRIX_READS.items() if p[4] == 4)
    assert FL.matrix_read_plans([w.t()]) == {}  # a transposed view is not read as if it were its transpose
    assert FL.matrix_read_plans([w[:40]]) == {}  # 40 rows: no tile of 16 or 64 divides them


def test_fastest_read_checks_each_read_and_keeps_the_fastest():
    g = torch.Generator().manual_seed(3)
    ws = [torch.randint(0, 255, (64, 2048), generator=g, dtype=torch.uint8).view(K.FP8) for _ in range(2)]
    plans = FL.matrix_read_plans(ws)
    best = FL.fastest_read(plans, ws[0].numel(), 2, torch.device("cpu"), n_rep=3)
    assert set(best["us_by_way"]) == set(plans) and best["us"] == min(best["us_by_way"].values())
    # each plan timed twice (the second pass in reverse order), its faster pass kept
    assert all(len(p) == 2 and best["us_by_way"][k] == min(p) for k, p in best["us_by_pass"].items())
    assert best["way"] == min(best["us_by_way"], key=best["us_by_way"].get) and not best["graphed"]
    assert best["gbps"] == pytest.approx(ws[0].numel() / best["us"] / 1e3)
    name, (call, want) = next(iter(plans.items()))
    with pytest.raises(RuntimeError, match="did not read"):  # a read of other bytes is a bug, not a floor
        FL.fastest_read({name: (call, want ^ 1)}, ws[0].numel(), 2, torch.device("cpu"), n_rep=3)
    assert FL.fastest_read({}, 1, 1, torch.device("cpu")) is None


@pytest.mark.slow
def test_the_labs_attention_comparison_reads_its_own_bytes_for_the_floor():
    from hwlab.labs.fp8.run import attention_vs_sdpa
    a = attention_vs_sdpa(L.TINY, 2, 256, "cpu")
    for name, nbytes in (("fp8", a["kv_bytes_fp8"]), ("bf16", a["kv_bytes"])):
        f = a[f"{name}_read_floor"]
        assert f["way"] in FL.KV_READS and f["gbps"] == pytest.approx(nbytes / f["us"] / 1e3) and not f["graphed"]
    assert "fp8_read_floor" not in attention_vs_sdpa(L.TINY, 2, 40, "cpu")  # no read shape fits 40 positions


def test_targets_carry_the_floor_and_mark_the_read_ceiling():
    from hwlab.labs.fp8.targets import READ_CEILING_SHARE, byte_floor_targets, format_targets

    def attn(ctx, kit, sdpa, floor):
        return {"ctx": ctx, "batch": 16, "kit_fp8_gbps": kit, "sdpa_gbps": sdpa, "launch_share_pct": 70.0,
                **({"fp8_read_floor": {"gbps": floor}} if floor else {})}
    run = {"paths": {"fixed": {"buckets": []}, "bf16": {"buckets": []}}, "logit_error": {"fixed": 0.1},
           "logit_error_bound": {"fixed": 0.15},
           "attention_vs_sdpa": [attn(4096, 4000, 4400, 4450), attn(512, 3000, 3700, 3850), attn(32768, 4000, 4400, None)]}
    rows = byte_floor_targets(run, 4300.0)
    a4k, a512, a32k = rows[:3]
    assert a4k["asks_of_floor"] == pytest.approx(4400 / 4450) and a4k["floor"] == 4450
    assert a512["asks_of_floor"] == pytest.approx(0.9 * 3700 / 3850) and a512["asks_of_floor"] < READ_CEILING_SHARE
    assert "floor" not in a32k  # a record from before the floor was measured
    text = format_targets(rows).splitlines()
    assert text[0].endswith("the target asks 98.9% of it (at the read ceiling)")
    assert "a bare read 3,850 GB/s, the target asks 86.5% of it" in text[1] and "ceiling" not in text[1]
    assert "bare read" not in text[2]
    assert text[-1] == "1 of 4 targets met; 1 of the rest at the read ceiling"
    met = byte_floor_targets({**run, "attention_vs_sdpa": [attn(4096, 4420, 4400, 4450)]}, 4300.0)
    assert "ceiling" not in format_targets(met)  # a met target is not marked, however near the ceiling
    past = format_targets(byte_floor_targets({**run, "attention_vs_sdpa": [attn(4096, 4000, 4400, 4300)]}, 4300.0))
    assert "asks 102.3% of it (past the read ceiling" in past and past.endswith("1 of the rest at the read ceiling")


@pytest.mark.slow
def test_a_failing_read_is_recorded_beside_the_run_not_raised(monkeypatch):
    """A read that fails to build or reads wrong bytes costs the run its floor, not its measurements."""
    from hwlab.labs.fp8.run import attention_vs_sdpa

    def broken(*a, **k):
        raise RuntimeError("read floor: x did not read the bytes it was given")
    monkeypatch.setattr(FL, "fastest_read", broken)
    a = attention_vs_sdpa(L.TINY, 2, 256, "cpu")
    assert "fp8_read_floor" not in a and "did not read" in a["fp8_read_floor_error"]
    assert a["kit_fp8_gbps"] > 0 and a["sdpa_gbps"] > 0


def test_floor_shares_set_each_kernel_against_its_own_read():
    """Each share is the kernel's GB/s over the read of its own bytes; the target's ask is the
    targets table's; a row is marked beyond the vendor exactly when the target asks a larger share
    of the FP8 read than the vendor's kernel reaches of its bf16 read; rows without both floors
    are left out."""
    from hwlab.labs.fp8.targets import byte_floor_targets, floor_shares, format_floor_shares

    def fl(g):
        return {"gbps": g}
    run = {"paths": {"fixed": {"buckets": []}, "bf16": {"buckets": []}}, "logit_error": {"fixed": 0.1},
           "logit_error_bound": {"fixed": 0.15},
           "attention_vs_sdpa": [
               {"ctx": 512, "batch": 16, "kit_fp8_gbps": 3000.0, "sdpa_gbps": 3600.0, "launch_share_pct": 70.0,
                "fp8_read_floor": fl(3900.0), "bf16_read_floor": fl(4200.0)},
               {"ctx": 4096, "batch": 16, "kit_fp8_gbps": 4100.0, "sdpa_gbps": 4500.0, "launch_share_pct": 2.0,
                "fp8_read_floor": fl(4550.0), "bf16_read_floor": fl(4600.0)},
               {"ctx": 32768, "batch": 4, "kit_fp8_gbps": 4100.0, "sdpa_gbps": 4500.0, "launch_share_pct": 2.0,
                "fp8_read_floor": fl(4550.0)}],  # no bf16 read: left out
           "gemms_vs_bf16": [{"layer": "up", "rows": 16, "swap_ab": False, "fp8_gbps": 3700.0, "bf16_gbps": 3600.0,
                              "fp8_read_floor": fl(3900.0), "bf16_read_floor": fl(4200.0)}]}
    rows = floor_shares(run)
    assert [r["kernel"] for r in rows] == ["attention ctx 512 x16", "attention ctx 4096 x16", "GEMM up at 16 rows"]
    a512, a4k, up = rows
    assert a512["kit"] == pytest.approx(3000 / 3900) and a512["vendor_share"] == pytest.approx(3600 / 4200)
    assert a512["asks"] == pytest.approx(0.9 * 3600 / 3900) and not a512["beyond_vendor"]  # 0.831 < 0.857
    assert a4k["asks"] == pytest.approx(4500 / 4550) and a4k["beyond_vendor"] and not a4k["met"]
    assert up["met"] and up["beyond_vendor"]  # met, though it asked more than cuBLAS's share of its own read
    asks = {r["target"]: r.get("asks_of_floor") for r in byte_floor_targets(run, 4300.0)}
    assert [a for a in asks.values() if a is not None][:2] == pytest.approx([a512["asks"], a4k["asks"]])
    text = format_floor_shares(rows, "x").splitlines()
    assert "the target asks  83.1%" in text[0] and "(met)" in text[2] and "(met)" not in text[1]
    assert text[-1].startswith("2 of 3 targets ask the kit's kernel to sit nearer its floor") and text[-1].endswith("[x]")
    assert floor_shares({"attention_vs_sdpa": [], "gemms_vs_bf16": []}) == []
    assert format_floor_shares([], "cpu").startswith("no bare reads")


def test_on_the_record_every_target_but_the_512_attention_asks_beyond_the_vendors_own_share():
    """The committed H200 record: the sentence LAB04_NOTES.md round 13 and #19's note rest on."""
    run = _record()["extra"]["run"]
    rows = floor_shares(run)
    assert len(rows) == 11 and [r["kernel"] for r in rows if not r["beyond_vendor"]] == ["attention ctx 512 x16"]
    notes = _flat("benchmarks/LAB04_NOTES.md")
    near = [r for r in rows if r["kit"] >= r["vendor_share"]]
    assert f"{sum(r['beyond_vendor'] for r in rows)} of {len(rows)} targets ask" in notes
    assert ", ".join(r["kernel"].replace("GEMM ", "") for r in near) in notes
    readme = _flat("README.md")
    assert f"{sum(r['beyond_vendor'] for r in rows)} of {len(rows)} attention and GEMM targets ask" in readme


def test_the_notes_floor_share_figures_are_the_records():
    run = _record()["extra"]["run"]
    notes = _flat("benchmarks/LAB04_NOTES.md")
    rows = {r["kernel"]: r for r in floor_shares(run)}
    att = [rows[f"attention ctx {c}"] for c in ("512 x16", "4096 x16", "32768 x4")]
    gem = [r for k, r in rows.items() if k.startswith("GEMM")]
    assert "SDPA reads at " + " / ".join(f"{100 * r['vendor_share']:.1f}" for r in att) in notes
    assert "the kit's FP8 attention at " + " / ".join(f"{100 * r['kit']:.1f}" for r in att) in notes
    for key in ("vendor_share", "kit", "asks"):
        lo, hi = (100 * f(r[key] for r in gem) for f in (min, max))
        assert f"{lo:.1f}-{hi:.1f}%" in notes, key
    ratio = lambda m: m["fp8_read_floor"]["gbps"] / m["bf16_read_floor"]["gbps"]  # noqa: E731
    a = {x["ctx"]: ratio(x) for x in run["attention_vs_sdpa"]}
    w = [ratio(g) for g in run["gemms_vs_bf16"]]
    assert f"{min(a[4096], a[32768]):.2f}-{max(a[4096], a[32768]):.2f} of the bf16 reads' GB/s for the 4k and 32k" in notes
    assert f"{min(w):.2f}-{max(w):.2f} for the weights and {a[512]:.2f} for the 512 cache" in notes
    # a kit kernel at the vendor's share reaches the target exactly where that ratio (x 0.9 at 512) is >= 1
    for r, m in zip(att, run["attention_vs_sdpa"]):
        assert r["asks"] / r["vendor_share"] == pytest.approx((0.9 if m["ctx"] == 512 else 1.0) / ratio(m))
    k4, k32 = att[1], att[2]
    assert (f"{100 * k4['kit']:.1f} / {100 * k32['kit']:.1f}% of its read at 4k / 32k where SDPA reaches "
            f"{100 * k4['vendor_share']:.1f} / {100 * k32['vendor_share']:.1f}%") in notes
    d = [rows["GEMM down at 16 rows"], rows["GEMM down at 4 rows"]]
    assert all(r["kit"] < r["vendor_share"] for r in d)
    assert (f"`down` ({100 * d[0]['kit']:.1f}-{100 * d[1]['kit']:.1f}% against "
            f"{100 * d[0]['vendor_share']:.1f}-{100 * d[1]['vendor_share']:.1f}%)") in notes


def test_the_done_when_table_is_the_records():
    """LAB04_NOTES.md's table of #19's "Done when" after round 13: each figure and verdict from the
    committed record, through the lab's own targets and floor shares."""
    rec = _record()
    run = rec["extra"]["run"]
    notes = (ROOT / "benchmarks/LAB04_NOTES.md").read_text()
    table = notes[notes.index('## #19 against its "Done when"'):notes.index("## Superseded notes")]
    rows = {r["target"]: r for r in byte_floor_targets(run, rec["ceilings"]["copy_gbps"], rec["extra"]["flowchart_leaves"])}
    pct = [rows[f"fixed decode at ctx {c}: % of copy"] for c in ("4096 x16", "32768 x4")]
    assert all(r["met"] for r in pct) and f"| {pct[0]['measured']:.1f} / {pct[1]['measured']:.1f}% | yes |" in table
    short = rows["fixed decode at ctx 512 x16: % of copy, against bf16's"]
    assert not short["met"] and f"| {short['measured']:.1f} against {short['against']:.1f}% | no |" in table
    att = {a["ctx"]: a for a in run["attention_vs_sdpa"]}
    assert (f"| {100 * att[4096]['kit_fp8_over_sdpa_gbps']:.1f} / {100 * att[32768]['kit_fp8_over_sdpa_gbps']:.1f}% "
            "of it | no |") in table
    assert f"| {100 * att[512]['kit_fp8_over_sdpa_gbps']:.1f}% of it | no |" in table
    sh = {r["kernel"]: r for r in floor_shares(run)}
    a = [sh[f"attention ctx {k}"] for k in ("512 x16", "4096 x16", "32768 x4")]
    assert (f"{100 * a[1]['asks']:.1f} / {100 * a[2]['asks']:.1f}% of a bare read of the FP8 cache; SDPA reaches "
            f"{100 * a[1]['vendor_share']:.1f} / {100 * a[2]['vendor_share']:.1f}%") in table
    assert f"{100 * a[0]['asks']:.1f}% of a bare read; SDPA reaches {100 * a[0]['vendor_share']:.1f}% of its own" in table
    over = [g["fp8_over_bf16_gbps"] for g in run["gemms_vs_bf16"]]
    gs = [r for k, r in sh.items() if k.startswith("GEMM")]
    assert f"| {100 * min(over):.1f}-{100 * max(over):.1f}% of it | no |" in table and max(over) < 1
    assert (f"{100 * min(r['asks'] for r in gs):.1f}-{100 * max(r['asks'] for r in gs):.1f}% of a bare read of the FP8 "
            f"weight; cuBLAS's bf16 GEMMs reach {100 * min(r['vendor_share'] for r in gs):.1f}-"
            f"{100 * max(r['vendor_share'] for r in gs):.1f}%") in table
    err = rows["fixed path's logit error within its bound"]
    assert err["met"] and f"| {err['measured']:.3f} (bound {err['against']})" in table
    assert all(rows[f"fixed path's walk at ctx {c} lands on OK"]["met"] for c in ("4096 x16", "32768 x4"))
    near = [k.replace("GEMM ", "") for k, r in sh.items() if r["kit"] >= r["vendor_share"]]
    assert f"it holds for {len(near)} of the {len(sh)} kernels" in " ".join(table.split())
    assert " ".join(table.split()).count("(qkv at 4 and 16 rows, out at 4, up at 16)") == 1
    assert near == ["qkv at 4 rows", "qkv at 16 rows", "out at 4 rows", "up at 16 rows"]


def test_a_verdict_inside_the_runs_spread_is_marked():
    """The kit's GB/s range over its replays (p10-p90) against the target's: overlapping ranges mark
    the verdict as one a re-run may flip, met or not; apart, or without spreads, no mark."""
    from hwlab.labs.fp8.targets import byte_floor_targets, format_targets

    def gemm(fp8_us, fp8_spread, bf16_us, bf16_spread):
        return {"layer": "up", "rows": 4, "swap_ab": False, "fp8_us": fp8_us, "fp8_gbps": 58.72e6 / fp8_us / 1e3,
                "bf16_us": bf16_us, "bf16_gbps": 117.44e6 / bf16_us / 1e3,
                **({"fp8_us_p10_p90": fp8_spread, "bf16_us_p10_p90": bf16_spread} if fp8_spread else {})}
    base = {"paths": {"fixed": {"buckets": []}, "bf16": {"buckets": []}}, "logit_error": {"fixed": 0.1},
            "logit_error_bound": {"fixed": 0.15}}

    def row(g):
        return byte_floor_targets({**base, "gemms_vs_bf16": [g]}, 4300.0)[0]
    close = row(gemm(16.5, [16.3, 16.9], 32.6, [32.2, 33.4]))  # kit 3,559 GB/s vs 3,602: ranges overlap
    assert not close["met"] and close["within_spread"]
    assert "[within the run's p10-p90 spread: a re-run may flip it]" in format_targets([close])
    far = row(gemm(18.0, [17.9, 18.1], 30.0, [29.9, 30.1]))
    assert not far["met"] and far["within_spread"] is False and "spread" not in format_targets([far])
    met = row(gemm(14.9, [14.8, 15.2], 30.0, [29.6, 30.4]))  # met, the ranges touching: marked too
    assert met["met"] and met["within_spread"]
    assert "within_spread" not in row(gemm(16.5, None, 32.6, None))  # an old record: no spreads, no mark
    # the attention's target range is SDPA's times its share (0.9 at 512)
    a = {"ctx": 512, "batch": 16, "launch_share_pct": 80.0, "kit_fp8_us": 20.5, "kit_fp8_gbps": 67.1e6 / 20.5 / 1e3,
         "kit_fp8_us_p10_p90": [20.2, 20.8], "sdpa_us": 36.4, "sdpa_gbps": 134.2e6 / 36.4 / 1e3,
         "sdpa_us_p10_p90": [36.0, 36.8]}
    r = byte_floor_targets({**base, "attention_vs_sdpa": [a]}, 4300.0)[0]
    assert r["within_spread"] and not r["met"]  # 3,273 against 3,318 (x 0.9): inside each other's spread
    tight = {**a, "kit_fp8_us_p10_p90": [20.45, 20.55], "sdpa_us_p10_p90": [36.3, 36.5]}  # 3,265-3,281 vs 3,309-3,327
    assert byte_floor_targets({**base, "attention_vs_sdpa": [tight]}, 4300.0)[0]["within_spread"] is False
