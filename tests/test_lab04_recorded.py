"""Lab 4's recorded H200 run (benchmarks/refresh_gpu_evidence.py --only lab04), re-derived.

The issue's targets: the mixed path shows the seed's signature (weights -30% or more, decode
TPOT improving by 10% or less); the fixed path improves TPOT by >= 25% in the memory-bound
buckets (met at 4k and 32k context, where bf16 decode runs at >= 90% of the copy ceiling; at
512 context the fixed path gains 22% against a byte promise of 29%: see
test_fixed_path_meets_the_target_where_bytes_dominate and benchmarks/LAB04_NOTES.md); hit rate
and dequant counts for every path; logit error in bound.
"""
import pytest

from hwlab.core import specs
from hwlab.core.evidence import recorded
from hwlab.labs.fp8.attention import FP8_CACHE_MATH_REL
from hwlab.labs import fp8 as L


@pytest.fixture(scope="module")
def run():
    ev = recorded("lab04_fp8")
    assert ev.device == "NVIDIA H200" and ev.is_gpu
    return ev.extra["run"]


def _tpot_change(run, path):
    base = {(b["ctx"], b["batch"]): b["tpot_ms"] for b in run["paths"]["bf16"]["buckets"]}
    return {(b["ctx"], b["batch"]): 100 * (b["tpot_ms"] / base[(b["ctx"], b["batch"])] - 1)
            for b in run["paths"][path]["buckets"]}


def test_memory_accounting_matches_the_config(run):
    cfg = L.ModelConfig(**run["config"])
    d, ff, V = cfg.d_model, cfg.d_ff, cfg.vocab
    linear = cfg.n_layers * (3 * d * d + d * d + 2 * d * ff) + d * d + V * d
    w = {p: v["weight_bytes"] for p, v in run["paths"].items()}
    assert w["bf16"] == 2 * (linear + V * d)
    assert w["mixed"] == linear + 2 * V * d
    assert w["fixed"] == linear + V * d + 2 * V * d  # head kept in bf16
    for b16, bfx in zip(run["paths"]["bf16"]["buckets"], run["paths"]["fixed"]["buckets"]):
        assert bfx["kv_bytes"] * (2 if bfx["ctx"] + 1 >= 4096 else 1) == b16["kv_bytes"]


def test_mixed_path_reproduces_the_seed_signature(run):
    w = run["paths"]["mixed"]["weight_bytes"] / run["paths"]["bf16"]["weight_bytes"] - 1
    assert w <= -0.30
    for bucket, change in _tpot_change(run, "mixed").items():
        assert change >= -10.0, (bucket, change)  # TPOT improves by 10% or less (here: it worsens)


def test_fixed_path_meets_the_target_where_bytes_dominate(run):
    change = _tpot_change(run, "fixed")
    copy = recorded("lab04_fp8").ceilings["copy_gbps"]
    bf16 = {(b["ctx"], b["batch"]): b for b in run["paths"]["bf16"]["buckets"]}
    memory_bound = {k for k, b in bf16.items() if b["decode_gbps"] >= 0.9 * copy}
    assert memory_bound == {(4096, 16), (32768, 4)}  # bf16 decode at >= 90% of the copy ceiling
    for k in memory_bound:
        assert change[k] <= -25.0, (k, change[k])  # the target
    # 512 context: head and KV stay bf16 by design, so the bytes promise only -29%; the run
    # gains less than that and the lab reports it as measured, not as met
    cfg = L.ModelConfig(**run["config"])
    promise = L.decode_bytes_for(cfg, L.PATHS["fixed"], 16, 512) / L.decode_bytes_for(cfg, L.PATHS["bf16"], 16, 512) - 1
    assert -0.30 < promise < -0.28
    assert 100 * promise < change[(512, 16)] < 0
    assert change[(32768, 4)] < change[(4096, 16)] < change[(512, 16)]  # more where FP8 KV halves more


def test_recorded_tiles_are_the_kits_defaults(run):
    import dataclasses

    from hwlab.labs.fp8 import kernels as K

    rec = recorded("lab04_fp8").extra["kernel_config"]
    if "attn" in rec:  # recorded before the tile became an AttnTile: {"w8": research tile, "attn": {...}}
        rec = dict(rec["attn"])
        assert not rec.pop("use_dot") and not rec.pop("prefetch")  # the lab's elementwise kernel ran
    # recorded in rounds 8-9, while AttnTile carried round 8's two switches (off; research since)
    rec = dict(rec)
    if "programs_per_sm" in rec:
        assert rec.pop("programs_per_sm") == 0 and rec.pop("fused_combine") is False
    assert rec == dataclasses.asdict(K.DEFAULT_TILE)  # the code in the repo produced this run


def test_every_path_reports_hits_and_dequant_counts(run):
    prof = {p: v["profile"] for p, v in run["paths"].items()}
    n = run["config"]["n_layers"] * 4 + 2
    for p, r in prof.items():
        assert r["gemm_calls"] == n, (p, r["gemm_names"])  # one GEMM per linear, nothing else
        assert r["source"] == "torch.profiler kernel names"
    assert prof["bf16"]["fp8_hits"] == 0 and prof["fp8_dequant"]["fallback_gemms"] == n
    assert prof["mixed"]["fallback_gemms"] == 2 and prof["mixed"]["fp8_hits"] == n - 2
    assert prof["fixed"]["fallback_gemms"] == 0 and prof["fixed"]["high_precision_by_choice"] == 1
    # each marked range counted once, on the host timeline (evidence.migrate_v1_to_v2 halves the
    # counts of a version-1 GPU record, which also counted their mirrors on the GPU timeline)
    assert all(r["ranges_counted_on"] == "host timeline" for r in prof.values())
    assert prof["fixed"]["dequant_ranges"] == 0 and prof["mixed"]["dequant_ranges"] == 2
    assert prof["fp8_dequant"]["dequant_ranges"] == n
    assert prof["mixed"]["quant_ranges"] == n - 2  # one requant per FP8 GEMM call
    # static scales: one requant per FP8 GEMM, fused into the norm or GELU that feeds it where
    # there is one (qkv, up, down) or one elementwise pass (connector, out)
    assert prof["fixed"]["quant_ranges"] == n - 1
    assert set(prof["fixed"]["gemm_names"]) - {n for n in prof["bf16"]["gemm_names"]} and \
        all(("qqtst" in k) or ("fp8_decode_gemm" in k) for k in prof["fixed"]["gemm_names"]
            if k not in prof["bf16"]["gemm_names"])  # cuBLAS FP8 or, since round 7, the kit's decode GEMM


def test_logit_error_within_bound_and_kernels_checked(run):
    ev = recorded("lab04_fp8")
    for p, e in run["logit_error"].items():
        assert e <= L.LOGIT_ERROR_BOUND[p], (p, e)
    assert run["logit_error"]["fixed"] > 0
    checks = ev.extra["kernel_checks"]
    # the lab's kernels (research kernels' checks, recorded here before they moved out, are not judged)
    assert checks["decode_attention_fp8"] < FP8_CACHE_MATH_REL and checks["decode_attention_16bit"] < 1e-2
    assert checks["rmsnorm"] < 1e-2 and checks["dequant_rows"] < 1e-2
    assert checks["kv_store_fp8"] == 0.0 and checks["kv_store_16bit"] == 0.0
    assert checks["quant_tensor_roundtrip"] < 0.05  # e4m3 with round-to-nearest on the GPU


def test_fp8_kv_without_a_fused_kernel_saves_memory_not_time(run):
    for b in run["paths"]["fixed"]["buckets"]:
        if b["kv_fp8"]:
            assert b["tpot_kv_dequant_ms"] > 2 * b["tpot_ms"]


def test_bytes_and_bandwidth_are_consistent(run):
    ev = recorded("lab04_fp8")
    copy = ev.ceilings["copy_gbps"]
    peak = specs.lookup(ev.machine["device"]).hbm_gbps
    for p, v in run["paths"].items():
        for b in v["buckets"]:
            assert b["decode_gbps"] == pytest.approx(b["decode_bytes"] / b["tpot_ms"] / 1e6)
            # a decode step mostly reads: it may pass the copy ceiling (read + write) by a few %,
            # as SDPA's reads do, but never the datasheet's peak, and never by much
            assert b["decode_gbps"] < min(peak, 1.10 * copy)
            assert b["tpot_p10_ms"] <= b["tpot_ms"] <= b["tpot_p90_ms"]


def test_byte_model_reproduces_the_recorded_bytes(run):
    cfg = L.ModelConfig(**run["config"])
    for p, v in run["paths"].items():
        for b in v["buckets"]:
            assert L.decode_bytes_for(cfg, L.PATHS[p], b["batch"], b["ctx"]) == b["decode_bytes"], (p, b["ctx"])
            promised = L.decode_bytes_for(cfg, L.PATHS[p], b["batch"], b["ctx"], promised=True)
            assert (promised < b["decode_bytes"]) == (p in ("fp8_dequant", "mixed")), p  # only fallbacks break the promise


def test_byte_floor_per_bucket_from_the_fixed_bucket_run(run):
    """The fixed-bucket run's TPOT against its byte floor (the figure #19 works on); the
    flowchart walk itself is measured on the serving stream (tests/test_lab04_stream.py)."""
    copy = recorded("lab04_fp8").ceilings["copy_gbps"]
    rows = {(r["path"], r["ctx"]): r for r in L.bucket_table(run, copy)}
    for (p, ctx), r in rows.items():
        # the floor is the bytes at the copy ceiling (read + write); a decode step mostly reads,
        # and reads alone stream a few % faster (SDPA's do), so a step may pass it, never by much
        assert r["floor_ms"] < 1.10 * r["tpot_ms"]
        assert r["pct_of_copy"] == pytest.approx(100 * r["floor_ms"] / r["tpot_ms"])
    # where bytes dominate bf16 runs near its floor; the fixed path is faster yet further from its own
    for ctx in (4096, 32768):
        assert rows[("bf16", ctx)]["pct_of_copy"] >= 90
        assert rows[("fixed", ctx)]["tpot_ms"] < rows[("bf16", ctx)]["tpot_ms"]


def test_attention_comparison_rederived_from_the_record(run):
    """The FP8 attention against SDPA (issue #19): every GB/s from its bytes and time, the bytes
    from the config, the launch share from the graph and eager times, each way checked first."""
    cfg = L.ModelConfig(**run["config"])
    rows = run["attention_vs_sdpa"]
    assert [(a["ctx"], a["batch"]) for a in rows] == [tuple(b) for b in run["buckets"]]
    for a in rows:
        assert a["kit_fp8_graphed"] and a["sdpa_graphed"] and "CUDA graph" in a["timing"]
        assert a["kv_bytes"] == 2 * a["batch"] * cfg.n_heads * a["ctx"] * cfg.d_head * 2 == 2 * a["kv_bytes_fp8"]
        for way, nbytes in (("kit_fp8", a["kv_bytes_fp8"]), ("sdpa", a["kv_bytes"]), ("kit_bf16", a["kv_bytes"])):
            assert a[f"{way}_gbps"] == pytest.approx(nbytes / a[f"{way}_us"] / 1e3)
            lo, hi = a[f"{way}_us_p10_p90"]
            assert lo <= a[f"{way}_us"] <= hi
        assert a["launch_share_pct"] == pytest.approx(100 * (1 - a["kit_fp8_us"] / a["kit_fp8_eager_us"]))
        assert a["kit_fp8_over_sdpa_gbps"] == pytest.approx(a["kit_fp8_gbps"] / a["sdpa_gbps"])
        err = a["rel_err_vs_float32"]
        assert err["kit_fp8"] < FP8_CACHE_MATH_REL and err["kit_bf16"] < 1e-3 and err["sdpa"] < 1e-2
    # the short bucket is launch-bound when run eagerly; the long ones are not
    share = {a["ctx"]: a["launch_share_pct"] for a in rows}
    assert share[512] > 50 and share[4096] < 10 and share[32768] < 10


def test_gemm_comparison_rederived_and_the_swap_ab_choice_measured(run):
    """Each decode GEMM's FP8 weight read against bf16's (issue #19): bytes from the config, GB/s
    from bytes and time, outputs checked, and swap-AB where the fixed path runs it measured
    faster than the plain order in the same run (the reason it runs)."""
    from hwlab.labs.fp8.model import SWAP_AB_LAYERS

    cfg = L.ModelConfig(**run["config"])
    d, ff = cfg.d_model, cfg.d_ff
    shapes = {"qkv": (3 * d, d), "out": (d, d), "up": (ff, d), "down": (d, ff)}
    rows = run["gemms_vs_bf16"]
    assert {(g["layer"], g["rows"]) for g in rows} == {(n, b) for n in L.MAIN for b in {b for _, b in run["buckets"]}}
    for g in rows:
        n, k = shapes[g["layer"]]
        assert g["weight_bytes"] == {"bf16": 2 * n * k, "fp8": n * k} and g["n_layers"] == cfg.n_layers
        kit = g.get("kit_gemm", False)  # the kit's decode GEMM ran (round 7 on): cuBLAS timed beside it
        for way, key in ((("bf16", "bf16"), ("fp8", "fp8")) + ((("fp8_plain_order", "fp8"),) if g["swap_ab"] else ())
                         + ((("fp8_cublas", "fp8"),) if kit else ())
                         + ((("fp8_pdl_back_to_back", "fp8"),) if "fp8_pdl_back_to_back_us" in g else ())):
            assert g[f"{way}_gbps"] == pytest.approx(g["weight_bytes"][key] / g[f"{way}_us"] / 1e3)
        assert max(g["rel_err_vs_float32"].values()) < 1e-2
        assert g["swap_ab"] == (g["layer"] in SWAP_AB_LAYERS and g["rows"] % 16 == 0 and not kit)
        if g["swap_ab"]:
            assert g["fp8_us"] < g["fp8_plain_order_us"], g


def test_byte_floor_targets_rederived_from_the_record(run):
    """The targets table (lab.byte_floor_targets) against figures recomputed here from the raw
    fields: decode bytes over TPOT over the copy ceiling, and the comparisons' GB/s."""
    ev = recorded("lab04_fp8")
    copy = ev.ceilings["copy_gbps"]
    rows = {r["target"]: r for r in L.byte_floor_targets(run, copy, ev.extra["flowchart_leaves"])}

    def pct(path, ctx, batch):
        b = next(b for b in run["paths"][path]["buckets"] if (b["ctx"], b["batch"]) == (ctx, batch))
        return 100 * b["decode_bytes"] / b["tpot_ms"] / 1e6 / copy

    for ctx, batch in ((4096, 16), (32768, 4)):
        r = rows[f"fixed decode at ctx {ctx} x{batch}: % of copy"]
        assert r["measured"] == pytest.approx(pct("fixed", ctx, batch)) and r["met"] == (r["measured"] >= 87.0)
    r = rows["fixed decode at ctx 512 x16: % of copy, against bf16's"]
    assert (r["measured"], r["against"]) == (pytest.approx(pct("fixed", 512, 16)), pytest.approx(pct("bf16", 512, 16)))
    att = [r for t, r in rows.items() if t.startswith("FP8 attention")]
    gem = [r for t, r in rows.items() if t.startswith("FP8 GEMM")]
    assert len(att) == 3 and len(gem) == len(run["gemms_vs_bf16"])
    for r in att + gem:
        assert r["met"] == (r["measured"] >= r["against"])
    # what the lab claims for the fix: its walk on OK where KV bytes dominate, its logits in bound
    assert rows["fixed path's walk at ctx 4096 x16 lands on OK"]["met"]
    assert rows["fixed path's walk at ctx 32768 x4 lands on OK"]["met"]
    assert rows["fixed path's logit error within its bound"]["met"]


def test_read_floor_rederived_from_the_record(run):
    """The same bytes read by kernels that only read them (labs/fp8/floor.py), in the same run:
    every floor from its bytes and time, the fastest of the ways timed, faster than the kernels
    measured against it, and the targets table's share of it recomputed here."""
    from hwlab.labs.fp8.floor import KV_READS, MATRIX_READS
    from hwlab.labs.fp8.targets import READ_CEILING_SHARE, SHORT_CONTEXT_ATTN_SHARE

    for a in run["attention_vs_sdpa"]:
        for name, nbytes, kernel in (("fp8", a["kv_bytes_fp8"], "kit_fp8"), ("bf16", a["kv_bytes"], "sdpa")):
            f = a[f"{name}_read_floor"]
            assert f["graphed"] and set(f["us_by_way"]) <= set(KV_READS) and f["us"] == min(f["us_by_way"].values())
            assert f["gbps"] == pytest.approx(nbytes / f["us"] / 1e3)
            assert f["us"] < a[f"{kernel}_us"]  # nothing read these bytes faster than the bare read
    for g in run["gemms_vs_bf16"]:
        for name, kernel in (("fp8", "fp8"), ("bf16", "bf16")):
            f = g[f"{name}_read_floor"]
            assert set(f["us_by_way"]) <= set(MATRIX_READS) and f["us"] == min(f["us_by_way"].values())
            assert f["gbps"] == pytest.approx(g["weight_bytes"][name] / f["us"] / 1e3) and f["us"] < g[f"{kernel}_us"]
    ev = recorded("lab04_fp8")
    rows = L.byte_floor_targets(run, ev.ceilings["copy_gbps"], ev.extra["flowchart_leaves"])
    asks = {}
    for a in run["attention_vs_sdpa"]:
        share = SHORT_CONTEXT_ATTN_SHARE if (a["ctx"], a["batch"]) == (512, 16) else 1.0
        asks[f"attention {a['ctx']}"] = share * a["sdpa_gbps"] / a["fp8_read_floor"]["gbps"]
    for g in run["gemms_vs_bf16"]:
        asks[f"{g['layer']} {g['rows']}"] = g["bf16_gbps"] / g["fp8_read_floor"]["gbps"]
    assert sorted(r["asks_of_floor"] for r in rows if "asks_of_floor" in r) == pytest.approx(sorted(asks.values()))
    # what the notes and notebook 04 say of this machine: the attention targets at 4k and 32k ask the
    # read ceiling; at 512 the floor leaves room
    assert asks["attention 4096"] >= READ_CEILING_SHARE and asks["attention 32768"] >= READ_CEILING_SHARE
    assert asks["attention 512"] < 0.9
    text = L.format_targets(rows)
    ceiling = sum(not r["met"] and r.get("asks_of_floor", 0) >= READ_CEILING_SHARE for r in rows)
    assert text.count("(at the read ceiling)") == ceiling and f"; {ceiling} of the rest at the read ceiling" in text
