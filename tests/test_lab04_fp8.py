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
    cfg = L.TINY
    d, ff, V = cfg.d_model, cfg.d_ff, cfg.vocab
    layer = 4 * d * d + 2 * d * ff
    size = {"bf16": 2, "fp8_dequant": 1, "fp8_mm": 1, "fp8_static": 1}
    long_, short = L.KV_FP8_FROM_CTX, L.KV_FP8_FROM_CTX // 2
    mem, mem_short = L.memory_report(models, 2, long_), L.memory_report(models, 2, short)
    for p, m in models.items():
        pc = L.PATHS[p]
        want = 2 * V * d + size[pc["connector"]] * d * d + size[pc["head"]] * V * d
        want += sum(size[L.layer_mode(pc, cfg, i)] * layer for i in range(cfg.n_layers))
        assert mem[p]["weight_bytes"] == want, p
        kv8 = pc["kv_fp8_from_ctx"] is not None
        assert mem[p]["kv_bytes"] * (2 if kv8 else 1) == mem["bf16"]["kv_bytes"], p  # FP8 KV from its length on
        assert mem_short[p]["kv_bytes"] == mem_short["bf16"]["kv_bytes"], p  # bf16 below it
    assert mem["mixed"]["weight_bytes"] < mem["fixed"]["weight_bytes"] < mem["bf16"]["weight_bytes"]


@pytest.mark.slow
def test_every_path_agrees_with_bf16_within_its_bound(models):
    err = L.logit_error(models)
    assert err["bf16"] == 0.0
    for p, e in err.items():
        assert e <= L.LOGIT_ERROR_BOUND[p], (p, e)
    assert err["mixed"] > 0  # FP8 is not free: the error is real and measured


@pytest.mark.slow
def test_hit_rate_and_dequant_counting_from_the_profiler(models):
    r = {p: L.decode_profile(m) for p, m in models.items()}  # 2 rows: no FP8 kernel for mixed's out
    cfg = L.TINY
    n_gemm = cfg.n_layers * 4 + 2
    fp8_layers = [i for i in range(cfg.n_layers) if L.layer_mode(L.PATHS["mixed"], cfg, i) != "bf16"]
    assert fp8_layers and len(fp8_layers) < cfg.n_layers  # the kept edge blocks, and at least one FP8 block
    assert all(x["gemm_calls"] == n_gemm for x in r.values())
    assert r["bf16"]["fp8_hits"] == 0 and r["bf16"]["dequant_ranges"] == 0
    assert r["fp8_dequant"]["fp8_hits"] == 0 and r["fp8_dequant"]["dequant_ranges"] == n_gemm
    mixed_fb = {"connector", "head"} | {f"layers.{i}.out" for i in fp8_layers}
    assert set(r["mixed"]["fallback_modules"]) == mixed_fb and r["mixed"]["dequant_ranges"] == len(mixed_fb)
    assert r["mixed"]["fp8_hits"] == 3 * len(fp8_layers)  # qkv, up, down of each FP8 block
    for p in ("gemms_fixed", "fixed"):
        assert r[p]["fallback_gemms"] == 0 and r[p]["fallback_rate_pct"] == 0.0
        assert r[p]["fp8_hits"] == 4 * len(fp8_layers) + 1  # and the connector
        assert r[p]["high_precision_by_choice"] == 4 * (cfg.n_layers - len(fp8_layers)) + 1  # edges and the head


def test_an_out_projection_falls_back_only_where_its_fp8_kernel_has_no_shape():
    m = L.Decoder(L.TINY, "mixed", device="cpu")
    out = next(layer["out"] for layer in m.layers if layer["out"].mode == "fp8_static")
    x = torch.randn(16, L.TINY.d_model, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    y16 = out(x)
    assert not out.fell_back
    y4 = out(x[:4])
    assert out.fell_back
    rel = (torch.linalg.vector_norm(y4.float() - y16[:4].float()) / torch.linalg.vector_norm(y16[:4].float())).item()
    assert rel < 0.1  # the same product either way, within FP8 rounding
    assert L.decode_profile(m, batch=16)["fallback_modules"] == ["connector", "head"]


def test_bad_path():
    with pytest.raises(ValueError, match="path must be one of"):
        L.Decoder(L.TINY, "int3", device="cpu")
    with pytest.raises(ValueError, match="mode must be one of"):
        L.QLinear(torch.randn(4, 4), "fp4")


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
    from hwlab.core.measure import InsufficientMemoryError

    streams = L.default_streams("cuda")
    need = L.memory_needed_bytes(L.H200_SIZE, [(s.max_len, s.max_batch) for s in streams], L.SERVING_PATHS)
    assert 15e9 < need < 40e9  # four H200-size models (~13 GB at bf16 trunk) + the long bucket's KV cache
    with pytest.raises(InsufficientMemoryError, match="choose a smaller size"):
        L.run(cfg=L.TINY, streams=[L.StreamSpec(2**40, 64, 1)], device="cpu")


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
    """``gelu_to``: GELU of the product in FP8 with the next layer's static scale,
    whether the kit's GEMM's epilogue does it (a GPU) or one pass after (here, a CPU); the model's
    MLP then equals the unfused ``quant_static(gelu(up(h)))`` it replaced."""
    m = L.Decoder(L.TINY, STATIC, device="cpu")
    up, down = m.layers[0]["up"], m.layers[0]["down"]
    h = torch.randn(3, L.TINY.d_model, generator=torch.Generator().manual_seed(2))
    y = up(h, gelu_to=down.x_scale)
    ref = K.quant_static(up(h), down.x_scale, gelu=True)
    assert y.dtype == K.FP8 and torch.equal(y.float(), ref.float())
    assert not torch.equal(y.float(), K.quant_static(up(h), down.x_scale).float())  # the GELU is in it


def test_attention_comparison_checks_and_labels_on_a_cpu():
    """The lab's attention against SDPA on a CPU: each way checked against float32, eager labelled,
    bytes counted as stored (an FP8 cache half a bf16 one)."""
    from hwlab.labs.fp8.run import attention_vs_sdpa

    a = attention_vs_sdpa(L.TINY, 2, 40, "cpu")
    assert a["kv_bytes"] == 2 * a["kv_bytes_fp8"] and "eager" in a["timing"]
    assert a["rel_err_vs_float32"]["sdpa"] < 1e-2
    assert a["kit_fp8_gbps"] == pytest.approx(a["kv_bytes_fp8"] / a["kit_fp8_us"] / 1e3)
