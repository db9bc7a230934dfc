"""Lab 4 (CPU side): the FP8 paths of the real decoder, profiled on CPU (aten ops)."""
import pytest
import torch

from hwlab.labs import fp8 as L
from hwlab.labs.fp8 import kernels as K


@pytest.fixture(scope="module")
def models():
    return L.make_models(L.TINY, device="cpu")


def test_quantization_round_trip_error_is_fp8_sized():
    for _ in range(3):
        t = torch.randn(4096) * 3
        q, s = L.quantize_fp8(t)
        back = L.dequantize_fp8(q, s, torch.float32)
        rel = (torch.linalg.vector_norm(back - t) / torch.linalg.vector_norm(t)).item()
        assert 1e-3 < rel < 0.05  # e4m3: 3 mantissa bits -> a few percent, never exact


def test_kv_cache_fp8_round_trip():
    cache = L.KVCache(L.TINY, batch=2, max_ctx=8, fp8=True, device="cpu")
    k = torch.randn(2, L.TINY.n_heads, 8, L.TINY.d_head).to(torch.bfloat16)
    v = torch.randn_like(k)
    cache.write(0, k, v, 0)
    kk, vv = cache.read(0, 8)
    for a, b in ((kk, k), (vv, v)):
        rel = (torch.linalg.vector_norm(a.float() - b.float()) / torch.linalg.vector_norm(b.float())).item()
        assert rel < 0.06
    bf = L.KVCache(L.TINY, batch=2, max_ctx=8, fp8=False, device="cpu")
    assert cache.n_bytes * 2 == bf.n_bytes


def test_memory_accounting(models):
    mem = L.memory_report(models, batch=2, ctx=4096)
    cfg = L.TINY
    d, ff, V = cfg.d_model, cfg.d_ff, cfg.vocab
    linear = cfg.n_layers * (3 * d * d + d * d + 2 * d * ff) + d * d + V * d
    emb = V * d
    assert mem["bf16"]["weight_bytes"] == 2 * (linear + emb)
    assert mem["fp8_dequant"]["weight_bytes"] == linear + 2 * emb  # FP8 weights, bf16 embedding
    assert mem["fixed"]["weight_bytes"] == linear - V * d + 2 * V * d + 2 * emb  # head kept bf16
    assert mem["fixed"]["kv_bytes"] * 2 == mem["bf16"]["kv_bytes"]  # FP8 KV from 4k context
    short = L.memory_report(models, 2, 512)
    assert short["fixed"]["kv_bytes"] == short["bf16"]["kv_bytes"]  # bf16 KV below 4k context


@pytest.mark.slow
def test_every_path_agrees_with_bf16_within_its_bound(models):
    err = L.logit_error(models)
    assert err["bf16"] == 0.0
    for p, e in err.items():
        assert e <= L.LOGIT_ERROR_BOUND[p], (p, e)
    assert err["mixed"] > 0  # FP8 is not free: the error is real and measured


@pytest.mark.slow
def test_hit_rate_and_dequant_counting_from_the_profiler(models):
    r = {p: L.decode_profile(m) for p, m in models.items()}
    n_gemm = L.TINY.n_layers * 4 + 2
    assert all(x["gemm_calls"] == n_gemm for x in r.values())
    assert r["bf16"]["fp8_hits"] == 0 and r["bf16"]["dequant_ranges"] == 0
    assert r["fp8_dequant"]["fp8_hits"] == 0 and r["fp8_dequant"]["dequant_ranges"] == n_gemm
    assert r["mixed"]["fp8_hits"] == n_gemm - 2 and r["mixed"]["dequant_ranges"] == 2  # connector + head
    assert r["mixed"]["fallback_gemms"] == r["mixed"]["dequant_ranges"]
    assert r["fixed"]["fp8_hits"] == n_gemm - 1 and r["fixed"]["fallback_rate_pct"] == 0.0
    assert r["fixed"]["high_precision_by_choice"] == 1  # the head, on purpose
    assert r["mixed"]["quant_ranges"] == n_gemm - 2  # one activation requant per FP8 GEMM


def test_bad_path():
    with pytest.raises(ValueError, match="path must be one of"):
        L.Decoder(L.TINY, "int3", device="cpu")
    with pytest.raises(ValueError, match="mode must be one of"):
        L.QLinear(torch.randn(4, 4), "fp4")


@pytest.mark.slow
def test_run_reports_every_path_and_bucket_on_cpu():
    r = L.run(buckets=[(16, 2)], n_rep=2, device="cpu", stream=False)  # the stream: test_lab04_stream.py
    assert set(r["paths"]) == set(L.PATHS)
    for p, v in r["paths"].items():
        b = v["buckets"][0]
        assert b["ttft_ms"] > 0 and b["tpot_ms"] > 0 and b["timer"] == "cpu-perf-counter"
    assert r["paths"]["mixed"]["weight_mem_change_pct"] < -30  # FP8 weights: memory falls


@pytest.mark.slow
def test_grader():
    assert L.grade_path(None).status == "not done yet"
    assert L.grade_path(dict(L.PATHS["mixed"])).status == "wrong"
    assert L.grade_path({"main": "fp8_mm", "connector": "fp8_mm", "head": "bf16", "kv_fp8_from_ctx": None}).passed
    assert L.grade_path({"main": "bf16"}).status == "wrong"  # no FP8 hits
    assert "custom path" in L.grade_path({"main": "int4"}).message


@pytest.mark.slow
def test_decode_breakdown_accounts_for_every_gemm(models):
    n_gemm = L.TINY.n_layers * 4 + 2
    for p, m in models.items():
        b = L.decode_breakdown(m, batch=2, ctx=24)
        prof = L.decode_profile(m)
        assert b["count"]["gemm fp8"] == prof["fp8_hits"], p
        assert b["count"]["gemm fp8"] + b["count"]["gemm"] == n_gemm, p
        assert b["total_us"] == pytest.approx(sum(b["us"].values()))
        assert sum(b["share_pct"].values()) == pytest.approx(100.0)
        assert (b["count"]["quant/dequant"] > 0) == (p != "bf16"), p  # bf16 never (de)quantizes


def test_byte_model_from_config_matches_the_model(models):
    for p, m in models.items():
        for ctx in (31, 4095, 5000):
            assert L.decode_bytes_for(L.TINY, L.PATHS[p], 2, ctx) == L.decode_bytes(m, 2, ctx)
    # a dequantized weight moves 5 bytes per element: mixed moves more than its FP8 promise
    assert L.decode_bytes_for(L.TINY, L.PATHS["mixed"], 2, 31) > L.decode_bytes_for(L.TINY, L.PATHS["mixed"], 2, 31, promised=True)


def test_run_refuses_a_size_that_does_not_fit_before_allocating():
    from hwlab.measure import InsufficientMemoryError

    need = L.memory_needed_bytes(L.H200_SIZE, L.default_buckets("cuda"))
    assert 25e9 < need < 100e9  # four H200-size models (~15 GB) + the 32k bucket's 17 GB KV cache
    with pytest.raises(InsufficientMemoryError, match="choose a smaller size"):
        L.run(cfg=L.TINY, buckets=[(2**40, 64)], device="cpu")


STATIC = {"main": "fp8_static", "connector": "fp8_static", "head": "bf16", "kv_fp8_from_ctx": 64}


def test_static_activation_scales_are_calibrated_and_reproducible():
    a, b = L.Decoder(L.TINY, STATIC, device="cpu"), L.Decoder(L.TINY, STATIC, device="cpu")
    sa = a.calibrate()
    assert len(sa) == L.TINY.n_layers * 4 + 1  # every FP8 layer but the bf16 head
    assert all(0 < v < 1 for v in sa.values())
    assert sa == b.calibrate()  # seeded calibration: the same model gets the same scales
    # a scale is the largest input seen / 448: the connector sees embedding rows
    emb_amax = a.embed.float().abs().max().item()
    assert sa["connector"] <= emb_amax / 448 * (1 + 1e-6)
    q = L.QLinear(torch.randn(8, 8), "fp8_static")
    with pytest.raises(RuntimeError, match="calibrate"):
        q(torch.randn(2, 8))


def test_static_path_hits_fp8_with_one_requant_per_gemm_and_stays_accurate():
    m = L.Decoder(L.TINY, STATIC, device="cpu")
    ms = {"bf16": L.Decoder(L.TINY, "bf16", device="cpu"), "static": m}
    assert 0 < L.logit_error(ms)["static"] <= L.LOGIT_ERROR_BOUND["fixed"]
    r = L.decode_profile(m)
    n_gemm = L.TINY.n_layers * 4 + 2
    assert r["fp8_hits"] == n_gemm - 1 and r["fallback_gemms"] == 0 and r["dequant_ranges"] == 0
    # each FP8 GEMM's input is quantized once: in the norm (qkv, up) or by one static pass
    assert r["quant_ranges"] == n_gemm - 1


def test_qlinear_gelu_to_returns_gelu_in_fp8_with_the_given_scale():
    """``gelu_to`` (round 9): GELU of the product in FP8 with the next layer's static scale,
    whether the kit's GEMM's epilogue does it (a GPU) or one pass after (here, a CPU); the model's
    MLP then equals the unfused ``quant_static(gelu(up(h)))`` it replaced."""
    m = L.Decoder(L.TINY, STATIC, device="cpu")
    up, down = m.layers[0]["up"], m.layers[0]["down"]
    h = torch.randn(3, L.TINY.d_model, generator=torch.Generator().manual_seed(2))
    y = up(h, gelu_to=down.x_scale)
    ref = K.quant_static(up(h), down.x_scale, gelu=True)
    assert y.dtype == K.FP8 and torch.equal(y.float(), ref.float())
    assert not torch.equal(y.float(), K.quant_static(up(h), down.x_scale).float())  # the GELU is in it


def test_byte_floor_targets_decide_each_row_from_its_figure():
    """Each target row is met exactly when its figure clears what it is compared with, and a
    row appears only where the run measured its figure (a CPU run: the logit error alone)."""
    from hwlab.labs.fp8.targets import PCT_OF_COPY_TARGET, byte_floor_targets

    def bucket(ctx, batch, gbps):
        return {"ctx": ctx, "batch": batch, "decode_gbps": gbps}

    copy = 4000.0
    run = {"paths": {"fixed": {"buckets": [bucket(512, 16, 2800.0), bucket(4096, 16, 3400.0), bucket(32768, 4, 3600.0)]},
                     "bf16": {"buckets": [bucket(512, 16, 3000.0), bucket(4096, 16, 3700.0), bucket(32768, 4, 3900.0)]}},
           "attention_vs_sdpa": [{"ctx": 512, "batch": 16, "kit_fp8_gbps": 2800.0, "sdpa_gbps": 3000.0, "launch_share_pct": 80.0},
                                 {"ctx": 4096, "batch": 16, "kit_fp8_gbps": 4100.0, "sdpa_gbps": 4400.0, "launch_share_pct": 4.0},
                                 {"ctx": 32768, "batch": 4, "kit_gbps": 1.0, "sdpa_gbps": 2.0}],  # an old record's row
           "gemms_vs_bf16": [{"layer": "down", "rows": 16, "swap_ab": True, "fp8_gbps": 3400.0, "bf16_gbps": 3500.0},
                             {"layer": "up", "rows": 16, "swap_ab": False, "fp8_gbps": 3600.0, "bf16_gbps": 3500.0}],
           "logit_error": {"fixed": 0.1}, "logit_error_bound": {"fixed": 0.15}}
    rows = {r["target"].split(":")[0]: r for r in byte_floor_targets(run, copy, {"fixed ctx 4096 x16": "OK",
                                                                             "fixed ctx 32768 x4": "M"})}
    assert rows["fixed decode at ctx 4096 x16"]["measured"] == 85.0 and not rows["fixed decode at ctx 4096 x16"]["met"]
    assert rows["fixed decode at ctx 32768 x4"]["measured"] == 90.0 and rows["fixed decode at ctx 32768 x4"]["met"]
    assert rows["fixed decode at ctx 32768 x4"]["against"] == PCT_OF_COPY_TARGET
    short = rows["fixed decode at ctx 512 x16"]
    assert (short["measured"], short["against"], short["met"]) == (70.0, 75.0, False)
    a512, a4k = rows["FP8 attention at ctx 512 x16"], rows["FP8 attention at ctx 4096 x16"]
    assert a512["met"] and a512["against"] == pytest.approx(2700.0)  # within 10% at 512: launches dominate
    assert not a4k["met"] and a4k["against"] == 4400.0
    assert not any("32768 x4: GB/s" in k for k in rows)  # no FP8 figure in that row: left out, not guessed
    assert not rows["FP8 GEMM down at 16 rows"]["met"] and rows["FP8 GEMM up at 16 rows"]["met"]
    assert rows["fixed path's walk at ctx 4096 x16 lands on OK"]["met"]
    assert not rows["fixed path's walk at ctx 32768 x4 lands on OK"]["met"]
    assert rows["fixed path's logit error within its bound"]["met"]
    cpu = byte_floor_targets({"paths": {"fixed": {"buckets": [bucket(32, 2, 1.0)]}, "bf16": {"buckets": [bucket(32, 2, 1.0)]}},
                              "logit_error": {"fixed": 0.2}, "logit_error_bound": {"fixed": 0.15}}, copy)
    assert [r["met"] for r in cpu] == [False] and "logit" in cpu[0]["target"]


@pytest.mark.slow
def test_gemm_and_attention_comparisons_check_and_label_on_a_cpu():
    """The lab's GEMM comparison on a CPU: every layer and batch size, each way checked against
    the float32 product of its operands, swap-AB's plain order timed beside it, eager labelled."""
    from hwlab.labs.fp8.model import SWAP_AB_LAYERS
    from hwlab.labs.fp8.run import attention_vs_sdpa, gemms_vs_bf16

    b16, fx = L.Decoder(L.TINY, "bf16", device="cpu"), L.Decoder(L.TINY, "fixed", device="cpu")
    rows = gemms_vs_bf16(b16, fx, [16, 4], "cpu")
    assert [(r["layer"], r["rows"]) for r in rows] == [(n, m) for n in L.MAIN for m in (16, 4)]
    for r in rows:
        assert r["weight_bytes"]["bf16"] == 2 * r["weight_bytes"]["fp8"] and not r["graphed"]
        assert max(r["rel_err_vs_float32"].values()) < 1e-2
        # swap-AB runs where the fixed path sets it and the rows are a multiple of 16; only there
        # is the plain order timed beside it
        assert r["swap_ab"] == (r["layer"] in SWAP_AB_LAYERS and r["rows"] == 16) == ("fp8_plain_order_us" in r)
        assert r["fp8_over_bf16_gbps"] == pytest.approx(r["fp8_gbps"] / r["bf16_gbps"])
        for way in ("fp8", "bf16"):  # each way's spread over its replays, around its median
            lo, hi = r[f"{way}_us_p10_p90"]
            assert lo <= r[f"{way}_us"] <= hi
    a = attention_vs_sdpa(L.TINY, 2, 40, "cpu")
    assert a["kv_bytes"] == 2 * a["kv_bytes_fp8"] and "eager" in a["timing"]
    assert a["rel_err_vs_float32"]["sdpa"] < 1e-2
    assert a["kit_fp8_gbps"] == pytest.approx(a["kv_bytes_fp8"] / a["kit_fp8_us"] / 1e3)
