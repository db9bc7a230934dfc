"""Lab 4's teaching kernels in the interpreter (fp16 activations; bf16 is wrong there) against
their torch references, on fresh random data each time."""
import dataclasses

import pytest
import torch

import hwlab  # noqa: F401  (interpreter before triton)
from hwlab.labs.fp8 import kernels as K


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_self_check_on_fresh_data(seed):
    c = K.self_check("cpu", torch.float16, seed=seed)
    assert c["quant_tensor_scale"] == 0.0  # amax is exact
    # the interpreter truncates when casting to e4m3 (the GPU rounds to nearest: ~2.6%), so
    # the round trip is bounded by one e4m3 step (2^-3 relative) rather than half of one
    assert 0.01 < c["quant_tensor_roundtrip"] < 0.10
    assert 0.01 < c["quant_static_gelu_roundtrip"] < 0.10 and 0.01 < c["rmsnorm_fp8_roundtrip"] < 0.10
    assert c["dequant_rows"] < 1e-3 and c["rmsnorm"] < 1e-3  # fp16 output rounding only
    assert c["add_rmsnorm_sum"] == 0.0 and c["add_rmsnorm"] < 1e-3
    assert c["decode_attention_16bit"] < 1e-3 and c["decode_attention_fp8"] < K.FP8_CACHE_MATH_REL
    assert c["kv_store_16bit"] == 0.0 and c["kv_store_fp8"] < 0.10


def test_attention_tile_is_a_frozen_checked_value():
    t = K.AttnTile(chunk=64, block_t=16, num_warps=2, num_stages=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.chunk = 128
    assert dataclasses.asdict(K.DEFAULT_TILE) == {"chunk": 256, "block_t": 16, "num_warps": 1, "num_stages": 2}
    for bad in ({"block_t": 24}, {"chunk": 48, "block_t": 32}, {"num_warps": 3}, {"num_stages": 0}):
        with pytest.raises(ValueError, match="power of two"):
            K.AttnTile(**{**dataclasses.asdict(K.DEFAULT_TILE), **bad})


def test_decoder_passes_its_tile_to_the_kernel(monkeypatch):
    """The tile set on a decoder is the one its attention launches with (no module state)."""
    from hwlab.labs import fp8 as L
    from hwlab.labs.fp8 import model

    seen = []
    real = model.K.decode_attention

    def spy(*a, tile=K.DEFAULT_TILE, **kw):
        seen.append(tile)
        return real(*a, tile=tile, **kw)

    monkeypatch.setattr(model.K, "decode_attention", spy)
    tile = K.AttnTile(64, 16, 2, 1)
    path = {**L.PATHS["fixed"], "bf16_edge_layers": 0, "kv_fp8_from_ctx": 16}  # an FP8 cache: it goes to the kit's kernel
    m = L.Decoder(L.TINY, path, device="cpu", attn_tile=tile)
    toks = torch.randint(0, L.TINY.vocab, (2, 17))
    cache = m.new_cache(2, 17)
    m(toks[:, :16], cache)
    m(toks[:, 16:], cache)
    assert cache.fp8 and seen == [tile] * L.TINY.n_layers
    m.attn_tile = K.DEFAULT_TILE  # settable by the caller between runs
    seen.clear()
    cache.len = 16
    m(toks[:, 16:], cache)
    assert seen == [K.DEFAULT_TILE] * L.TINY.n_layers


@pytest.mark.slow
def test_decode_attention_split_boundaries_and_poisoned_tail():
    g = torch.Generator().manual_seed(3)
    B, H, T, D = 1, 2, 600, 32
    q = torch.randn(B, H, 1, D, generator=g).half()
    k = torch.randn(B, H, T, D, generator=g).half()
    v = torch.randn(B, H, T, D, generator=g).half()
    k[:, :, 520:] = float("nan")  # positions past n_ctx must never be read into the result
    v[:, :, 520:] = float("nan")
    one = torch.ones(())
    for n in (1, K.DEFAULT_TILE.chunk, K.DEFAULT_TILE.chunk + 1, 520):
        out = K.decode_attention(q, k, v, one, n, use_triton=True)
        ref = K.decode_attention_ref(q, k, v, one, n)
        assert torch.isfinite(out).all()
        assert torch.allclose(out.float(), ref.float(), atol=2e-3, rtol=2e-3), n


def test_split_count_folds_only_a_short_remainder_into_the_last_split(monkeypatch):
    from hwlab.labs.fp8 import attention as A

    frac = A.MERGE_TAIL_FRACTION
    assert 0 < frac < 1
    chunk = 256
    short = int(frac * chunk)  # the longest remainder that joins the split before it
    assert A.split_count(16 * chunk, chunk) == 16
    assert A.split_count(16 * chunk + 1, chunk) == 16  # the decode step at 4k: 4097 positions
    assert A.split_count(16 * chunk + short, chunk) == 16
    assert A.split_count(16 * chunk + short + 1, chunk) == 17
    assert A.split_count(1, chunk) == A.split_count(chunk + 1, chunk) == 1
    monkeypatch.setattr(A, "MERGE_TAIL_FRACTION", 0.0)
    assert A.split_count(16 * chunk + 1, chunk) == 17


@pytest.mark.parametrize("frac", [0.0, 0.25])
def test_merged_last_split_reads_to_the_end_and_no_further(monkeypatch, frac):
    """The last program covers chunk + remainder positions when the remainder is merged: same
    result as a split of its own, and positions past n_ctx (NaN here) are never read."""
    from hwlab.labs.fp8 import attention as A

    monkeypatch.setattr(A, "MERGE_TAIL_FRACTION", frac)
    monkeypatch.setattr(A, "MIN_PROGRAMS", 1)  # keep the tile's chunk: 64
    g = torch.Generator().manual_seed(4)
    B, H, T, D = 1, 2, 300, 32
    q = torch.randn(B, H, 1, D, generator=g).half()
    k = torch.randn(B, H, T, D, generator=g).half()
    v = torch.randn(B, H, T, D, generator=g).half()
    n = 4 * 64 + 5
    k[:, :, n:] = float("nan")
    v[:, :, n:] = float("nan")
    one = torch.ones(())
    assert A.split_count(n, 64) == (4 if frac else 5)
    out = K.decode_attention(q, k, v, one, n, use_triton=True, tile=K.AttnTile(64, 16))
    ref = K.decode_attention_ref(q, k, v, one, n)
    assert torch.isfinite(out).all()
    assert torch.allclose(out.float(), ref.float(), atol=2e-3, rtol=2e-3)


def test_bad_inputs_say_what_to_do():
    one = torch.ones(())
    with pytest.raises(ValueError, match="n_ctx"):
        K.decode_attention(torch.randn(1, 1, 1, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8), one, 5)
    with pytest.raises(ValueError, match=r"q \(B, H, 1, D\)"):
        K.decode_attention(torch.randn(1, 1, 2, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8), one, 2)
    with pytest.raises(ValueError, match="2-D"):
        K.quant_tensor(torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match="bf16"):
        K.quant_tensor(torch.randn(2, 8).bfloat16(), use_triton=True)
    with pytest.raises(ValueError, match="one per row or one"):
        K.dequant_rows(torch.zeros(4, 8).to(K.FP8), torch.ones(3, 1), use_triton=True)


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.slow
def test_decode_attention_strided_query_small_tile_and_poisoned_tail():
    g = torch.Generator().manual_seed(6)
    B, H, T, D = 2, 3, 600, 32
    qkv = torch.randn(B, 1, 3 * H * D, generator=g).half()
    q = qkv[..., : H * D].reshape(B, 1, H, D).transpose(1, 2)  # a strided view, as in the decoder
    assert not q.is_contiguous()
    for dt, sc in ((torch.float16, 1.0), (K.FP8, 0.01)):
        k = (torch.randn(B, H, T, D, generator=g) / sc).to(dt)
        v = (torch.randn(B, H, T, D, generator=g) / sc).to(dt)
        k[:, :, 520:] = float("nan")  # past n_ctx: never read
        v[:, :, 520:] = float("nan")
        scale = torch.tensor(sc)
        for n in (1, 64, 65, 257, 520):
            out = K.decode_attention(q, k, v, scale, n, use_triton=True, tile=K.AttnTile(64, 16, 2, 1))
            assert torch.isfinite(out).all()
            assert _rel(out, K.decode_attention_ref(q, k, v, scale, n)) < (1e-4 if dt == torch.float16 else K.FP8_CACHE_MATH_REL), (dt, n)


def test_add_rmsnorm_kernel_is_the_add_then_the_norm():
    """The fused residual add + RMSNorm returns torch's rounded sum exactly and the norm of that
    sum (in FP8 with a scale); a kernel that normalized the unrounded sum, or the wrong row,
    or forgot the add, fails."""
    g = torch.Generator().manual_seed(8)
    x = (torch.randn(5, 300, generator=g) * 4).half()
    r = (torch.randn(5, 300, generator=g) * 4).half()
    tot, y = K.add_rmsnorm(x, r, use_triton=True)
    assert torch.equal(tot, x + r)
    assert _rel(y, K.rmsnorm_ref((x + r).float())) < 1e-3
    s = torch.tensor(0.01)
    tot8, y8 = K.add_rmsnorm(x, r, use_triton=True, out_scale=s)
    assert torch.equal(tot8, x + r) and y8.dtype == K.FP8
    assert _rel(y8.float() * s, K.rmsnorm_ref((x + r).float())) < 0.10  # one e4m3 step (the interpreter truncates)
    assert _rel(y, K.rmsnorm_ref(x.float())) > 0.1  # the add matters at this size
    with pytest.raises(ValueError, match="one shape"):
        K.add_rmsnorm(x, r[:, :10], use_triton=True)


def test_rmsnorm_and_static_quant_kernels():
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(9, 300, generator=g) * 4).half()
    ref = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    assert _rel(K.rmsnorm(x, use_triton=True), ref) < 1e-3
    s = torch.tensor(0.01)
    q = K.rmsnorm(x, use_triton=True, out_scale=s)
    assert q.dtype == K.FP8
    assert _rel(q.float() * s, ref) < 0.10  # one e4m3 step (the interpreter truncates)
    s_x = x.float().abs().max() / 448  # x's own amax: nothing saturates
    qs = K.quant_static(x, s_x, use_triton=True)
    assert qs.dtype == K.FP8 and qs.shape == x.shape
    assert _rel(qs.float() * s_x, x) < 0.10
    gq = K.quant_static(x, s_x, use_triton=True, gelu=True)  # GELU fused into the requant
    assert _rel(gq.float() * s_x, torch.nn.functional.gelu(x.float())) < 0.10
    assert _rel(gq.float(), K.quant_static(x, s_x, gelu=True).float()) < 0.10  # the torch path agrees
    big = K.quant_static(x, s_x / 10, use_triton=True)  # past the scale: saturates at +-448
    assert big.float().abs().max() == 448.0


def test_kv_store_writes_one_position_and_quantizes():
    g = torch.Generator().manual_seed(8)
    B, H, T, D = 2, 3, 10, 32
    qkv = torch.randn(B, 1, 3 * H * D, generator=g).half()
    k = qkv[..., H * D: 2 * H * D].reshape(B, 1, H, D).transpose(1, 2)
    v = qkv[..., 2 * H * D:].reshape(B, 1, H, D).transpose(1, 2)
    for dt in (torch.float16, K.FP8):
        kc = torch.zeros(B, H, T, D).to(dt)
        vc = torch.zeros(B, H, T, D).to(dt)
        s = torch.tensor(0.01 if dt == K.FP8 else 1.0)
        K.kv_store(k, v, kc, vc, s, 4, use_triton=True)
        for c, src in ((kc, k), (vc, v)):
            assert _rel(c[:, :, 4:5].float() * s, src) < (0.10 if dt == K.FP8 else 1e-6)
            others = torch.cat([c[:, :, :4], c[:, :, 5:]], 2).float()
            assert others.abs().max() == 0  # no other position touched
    with pytest.raises(ValueError, match="outside the cache"):
        K.kv_store(k, v, kc, vc, s, T, use_triton=True)


def test_combine_writes_fp8_with_the_next_gemms_scale():
    """The out projection's requant fused into the combine (interpreter): FP8 out, within one
    e4m3 step of the float32 attention quantized with the same scale; q's dtype without it."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 3, 1, 32, generator=g).to(torch.float16)
    k = torch.randn(2, 3, 300, 32, generator=g).to(torch.float16)
    v = (torch.randn(2, 3, 300, 32, generator=g) * 3).to(torch.float16)
    one, s = torch.tensor(1.0), torch.tensor(0.01)
    ref = K.decode_attention_ref(q, k, v, one, 290).float()
    plain = K.decode_attention(q, k, v, one, 290, use_triton=True, tile=K.AttnTile(64, 16, 1, 1))
    fused = K.decode_attention(q, k, v, one, 290, use_triton=True, tile=K.AttnTile(64, 16, 1, 1), out_scale=s)
    assert plain.dtype == torch.float16 and fused.dtype == K.FP8 and fused.shape == plain.shape
    assert _rel(fused.float() * s, ref) < 1 / 8
    assert _rel(fused.float(), K.quant_static_ref(ref, s).float()) < 1 / 8  # the scale divides, not multiplies
    assert K.decode_attention(q, k, v, one, 290, out_scale=s).dtype == K.FP8  # the torch path quantizes too


def test_add_rmsnorm_reads_a_transposed_gemm_output():
    """A swap-AB GEMM returns (rows, N) as a transposed view; the fused add + norm reads it
    through its column stride (interpreter) and matches the reference on the contiguous copy."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(16, 96, generator=g).to(torch.float16)
    r_t = torch.randn(96, 16, generator=g).to(torch.float16).t()  # (16, 96), strides (1, 16)
    assert r_t.stride() == (1, 16)
    tot, y = K.add_rmsnorm(x, r_t, use_triton=True)
    tot_ref, y_ref = K.add_rmsnorm_ref(x, r_t.contiguous())
    assert _rel(tot, tot_ref) < 1e-3 and _rel(y, y_ref) < 1e-2


def test_swap_ab_runs_where_the_decoder_sets_it():
    """The fixed path's ``down`` runs swap-AB at 16 rows (a transposed result, equal to the plain
    order's), the plain order at 4 rows and in other paths; a prefill's rows never swap."""
    from hwlab.labs import fp8 as L
    from hwlab.labs.fp8.model import SWAP_AB_LAYERS, SWAP_AB_MAX_ROWS

    fixed = L.Decoder(L.TINY, {**L.PATHS["fixed"], "bf16_edge_layers": 0}, device="cpu")
    other = L.Decoder(L.TINY, "fp8_dequant", device="cpu")
    for layer in fixed.layers:
        assert {n for n, m in layer.items() if m.swap_ab} == set(SWAP_AB_LAYERS)
    assert not any(m.swap_ab for layer in other.layers for m in layer.values())
    down = fixed.layers[0]["down"]
    g = torch.Generator().manual_seed(9)
    for rows, swapped in ((16, True), (4, False), (SWAP_AB_MAX_ROWS + 16, False)):
        x = torch.randn(rows, L.TINY.d_ff, generator=g)
        y = down(x)
        down.swap_ab = False
        y_plain = down(x)
        down.swap_ab = True
        assert (y.stride(-1) != 1) == swapped, rows
        assert _rel(y, y_plain) < 1e-2, rows


def test_decoder_fuses_the_out_projections_requant_into_attention(monkeypatch):
    """Where the kit's kernel runs on a GPU, the fixed path hands attention the out projection's
    static scale and the out GEMM takes the FP8 result as it is (spied here on a CPU, where the
    kernel's torch path quantizes with the same scale)."""
    from hwlab.labs import fp8 as L
    from hwlab.labs.fp8 import model

    seen = []
    real = model.K.decode_attention

    def spy(*a, out_scale=None, **kw):
        seen.append(out_scale)
        return real(*a, out_scale=out_scale, **kw)

    monkeypatch.setattr(model.K, "decode_attention", spy)
    monkeypatch.setattr(model.K, "use_triton_for", lambda t, u: True)
    m = L.Decoder(L.TINY, {**L.PATHS["fixed"], "bf16_edge_layers": 0, "kv_fp8_from_ctx": 16}, device="cpu")
    toks = torch.randint(0, L.TINY.vocab, (2, 17))
    cache = m.new_cache(2, 17)
    m(toks[:, :16], cache)
    with torch.profiler.profile() as prof:
        m(toks[:, 16:], cache)
    assert [float(s) for s in seen] == [float(layer["out"].x_scale) for layer in m.layers]
    names = [e.name for e in prof.events()]
    # one requant range per layer for the out projection, inside attention; none in the GEMM
    # the connector's input once, then per layer: two norms that quantize, the GELU requant and
    # attention (the out projection's requant); a second requant in the out GEMM would add one
    assert names.count(model.QUANT_MARK) == 1 + 4 * L.TINY.n_layers


def test_pdl_is_on_for_the_lab_but_never_on_a_cpu_nor_for_the_attention():
    """PDL: on for the decode step's kernels where the GPU has it, never for a CPU
    tensor (the interpreter has no griddepcontrol), and off for the attention's kernels unless
    its own switch is on; the kernels still launch with it set."""
    from hwlab.labs.fp8 import attention as A
    from hwlab.labs.fp8 import quant as Q

    x = torch.zeros(2)
    assert Q._PDL["on"] is True and A.PDL_ATTENTION is False
    assert Q.pdl_args(x) == {"PDL": False} and A._pdl_args(x) == {"PDL": False}
    out = K.rmsnorm(torch.randn(3, 64, dtype=torch.float16), use_triton=True)  # still launches
    assert torch.isfinite(out).all()
    old = Q.set_pdl(False)
    try:
        assert old is True and Q._PDL["on"] is False
    finally:
        Q.set_pdl(old)
    assert Q._PDL["on"] is True


@pytest.mark.parametrize("dt", [torch.float16, K.FP8])
def test_attention_that_writes_the_new_position_matches_kv_store_then_attention(dt):
    """``new_kv``: the last split's program stores this step's K and V, then reads them with the
    rest. The cache afterwards and the output equal kv_store followed by the attention, and the
    fused call with a stale value at the new position (NaN) proves the kernel wrote it before
    reading it."""
    g = torch.Generator().manual_seed(8)
    B, H, T, D = 2, 2, 160, 32
    scale = torch.tensor(0.02 if dt == K.FP8 else 1.0)
    kc = (torch.randn(B, H, T, D, generator=g) * (2.0 if dt == K.FP8 else 1.0)).to(dt)
    vc = (torch.randn(B, H, T, D, generator=g) * (2.0 if dt == K.FP8 else 1.0)).to(dt)
    qkv = torch.randn(B, H, 1, 3 * D, generator=g).half()
    q, k, v = qkv.split(D, dim=-1)  # strided views, as the QKV projection's output gives them
    n = 131  # position 130 is this step's; the last split (chunk 64) holds 128..130
    kc[:, :, n - 1] = float("nan")  # a stale value: read before the write, it would poison the result
    ref_k, ref_v = kc.clone(), vc.clone()
    K.kv_store(k, v, ref_k, ref_v, scale, n - 1, use_triton=True)
    ref = K.decode_attention(q, ref_k, ref_v, scale, n, use_triton=True, tile=K.AttnTile(64, 16))
    fused_k, fused_v = kc.clone(), vc.clone()
    out = K.decode_attention(q, fused_k, fused_v, scale, n, use_triton=True, tile=K.AttnTile(64, 16),
                             new_kv=(k, v))
    assert torch.equal(fused_k.view(torch.uint8), ref_k.view(torch.uint8))
    assert torch.equal(fused_v.view(torch.uint8), ref_v.view(torch.uint8))
    assert torch.isfinite(out).all()
    assert torch.equal(out, ref)
    with pytest.raises(ValueError, match="new_kv"):
        K.decode_attention(q, fused_k, fused_v, scale, torch.full((B,), n, dtype=torch.int32), use_triton=True,
                           new_kv=(k, v))


def test_a_short_bf16_cache_goes_to_the_kit_kernel_and_a_long_one_to_sdpa(monkeypatch):
    from hwlab.labs import fp8 as L
    from hwlab.labs.fp8 import model

    calls = []
    real = model.K.decode_attention
    monkeypatch.setattr(model.K, "decode_attention", lambda *a, **kw: calls.append(a[4]) or real(*a, **kw))
    monkeypatch.setattr(model, "KIT_BF16_BELOW_CTX", 12)
    m = L.Decoder(L.TINY, "bf16", device="cpu")
    toks = torch.randint(0, L.TINY.vocab, (2, 20))
    cache = m.new_cache(2, 20)
    assert not cache.fp8
    m(toks[:, :10], cache)
    m(toks[:, 10:11], cache)  # reads 11 positions: the kit's kernel, every layer
    assert calls == [11] * L.TINY.n_layers
    calls.clear()
    m(toks[:, 11:12], cache)  # 12: SDPA
    assert calls == []




@pytest.mark.parametrize("rows,k,n", [(8, 64, 256), (512, 256, 64), (3, 64, 512)])
def test_fp8_gemm_is_the_tensor_wise_scaled_product_on_this_device(rows, k, n):
    """``model.scaled_mm`` (the FP8 layers' GEMM; on a CPU asked with each scale repeated per row
    and column) is the product of the two FP8 operands times both scales, rounded once to bf16."""
    from hwlab.labs.fp8 import model

    g = torch.Generator().manual_seed(rows)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    a = (3 * torch.randn(rows, k, generator=g)).to(torch.float8_e4m3fn).to(dev)
    w = (2 * torch.randn(n, k, generator=g)).to(torch.float8_e4m3fn).to(dev)
    sa, sw = torch.tensor(0.37, device=dev), torch.tensor(0.011, device=dev)
    y = model.scaled_mm(a, w.t(), sa, sw)
    ref = a.double() @ w.double().t() * 0.37 * 0.011
    assert y.dtype == torch.bfloat16 and y.shape == (rows, n)
    # fp32 accumulation, one bf16 rounding: within bf16's half-ulp of the float64 product (plus fp32 sums)
    assert torch.allclose(y.double(), ref, rtol=2 ** -8, atol=1e-6 * ref.abs().max().item())
    swapped = model.scaled_mm(w, a.t(), sw, sa).t()  # the swap-AB order: the same product
    assert torch.allclose(swapped.double(), ref, rtol=2 ** -8, atol=1e-6 * ref.abs().max().item())



def test_fp8_gemm_on_a_pytorch_whose_cpu_kernel_refuses_row_wise_scales(monkeypatch):
    """Some PyTorch builds' CPU ``_scaled_mm`` takes only tensor-wise scales (an internal assert
    refuses the row-wise call): the layer then asks tensor-wise, the same product, and remembers."""
    from hwlab.labs.fp8 import model

    real, calls = torch._scaled_mm, []

    def tensor_wise_only(a, b, *, scale_a, scale_b, **kw):
        calls.append(scale_a.numel())
        if not a.is_cuda and (scale_a.numel() != 1 or scale_b.numel() != 1):
            raise RuntimeError("Now _scaled_mm only supports per-tensor scaling for CPU backend.")
        return real(a, b, scale_a=scale_a, scale_b=scale_b, **kw)

    monkeypatch.setattr(torch, "_scaled_mm", tensor_wise_only)
    monkeypatch.setattr(model, "_CPU_ROWWISE", None)
    g = torch.Generator().manual_seed(0)
    a = (3 * torch.randn(16, 64, generator=g)).to(torch.float8_e4m3fn)
    w = (2 * torch.randn(32, 64, generator=g)).to(torch.float8_e4m3fn)
    ref = a.double() @ w.double().t() * 0.5 * 0.25
    for _ in range(2):
        y = model.scaled_mm(a, w.t(), torch.tensor(0.5), torch.tensor(0.25))
        assert torch.allclose(y.double(), ref, rtol=2 ** -8, atol=1e-6 * ref.abs().max().item())
    assert calls == [16, 1, 1] and model._CPU_ROWWISE is False  # refused once, then asked tensor-wise only


@pytest.mark.slow
def test_the_bucket_table_lists_an_fp8_gemms_two_operands():
    """Exercise 04's profiler table: per ``aten::_scaled_mm`` row the activation (rows, in) and the
    transposed weight (in, out) a learner reads shapes from, never the scales."""
    from hwlab.labs.fp8 import bucket_case as case

    m = case.case_model("cpu")
    rows, _ = case.bucket_profile_table(m, 8, 16)
    mm = [r for r in rows if r["op"] == "aten::_scaled_mm"]
    shapes = case.layer_shapes(m)
    assert mm and all(len(r["input_shapes"]) == 2 and r["input_shapes"][0][0] == 8 for r in mm)
    assert {tuple(r["input_shapes"][1][::-1]) for r in mm} <= set(shapes.values())
