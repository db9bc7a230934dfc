"""Lab 4's research kernels (:mod:`hwlab.labs.fp8.research`: no lab path runs them; the tuning
scripts under benchmarks/ do) in the interpreter against their torch references, so a finding
in benchmarks/LAB04_NOTES.md can be re-measured with code that is still correct."""
import functools

import pytest
import torch

import hwlab  # noqa: F401  (interpreter before triton)
from hwlab.labs import fp8 as L
from hwlab.labs.fp8 import kernels as K
from hwlab.labs.fp8 import research as R


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_research_self_check_on_fresh_data():
    c = R.self_check("cpu", torch.float16, seed=0)
    assert c["quant_rows_scale"] == 0.0 and 0.01 < c["quant_rows_roundtrip"] < 0.10  # one e4m3 step (truncating)
    assert c["fp8w_linear"] < 1e-2 and c["fp8w_linear_splitk"] < 1e-2
    for k in ("decode_attention_16bit", "decode_attention_fp8"):
        assert c[k + "_prefetch"] < 1e-3  # the elementwise math: float32 throughout
        assert c[k + "_dot"] < 5e-3 and c[k + "_dot_prefetch"] < 5e-3  # fp16 operands on the tensor cores


def test_fp8_weight_gemm_matches_dequantized_reference():
    g = torch.Generator().manual_seed(4)
    w = torch.randn(80, 200, generator=g)  # N, K not multiples of the tile: masks are exercised
    wq, s = K.quant_tensor_ref(w)
    x = torch.randn(5, 200, generator=g).half()
    y = R.fp8w_linear(x, wq, s, use_triton=True)
    ref = (x.float() @ (wq.float() * s).t())
    assert y.shape == (5, 80) and y.dtype == torch.float16
    assert _rel(y, ref) < 5e-3


@pytest.mark.parametrize("swap,split_k,prefetch", [(False, 1, False), (True, 1, True), (False, 3, True), (True, 2, False)])
def test_fp8_weight_gemm_variants_and_split_k_workspace_left_clean(swap, split_k, prefetch):
    g = torch.Generator().manual_seed(5 + split_k)
    cfg = {"BN": 32 if swap else 16, "BK": 64, "num_warps": 4, "num_stages": 1, "SWAP": swap,
           "SPLIT_K": split_k, "PREFETCH": prefetch}
    for N, Kd, M in ((80, 200, 5), (48, 300, 17)):  # ragged N, K; M over one 16-row tile
        wq, s = K.quant_tensor_ref(torch.randn(N, Kd, generator=g))
        for _ in range(2):  # a second call must find the split-K workspace zeroed again
            x = torch.randn(M, Kd, generator=g).half()
            ref = x.float() @ (wq.float() * s).t()
            assert _rel(R.fp8w_linear(x, wq, s, use_triton=True, config=cfg), ref) < 5e-3
    if split_k > 1:
        from hwlab.labs.fp8 import workspace as W
        ws, cnt = W.buffer("cpu", "research_splitk_ws"), W.buffer("cpu", "research_splitk_cnt")
        assert ws.abs().max() == 0 and cnt.abs().max() == 0


@pytest.mark.parametrize("use_dot,prefetch", [(False, True), (True, False), (True, True)])
def test_decode_attention_variants_and_strided_query(use_dot, prefetch):
    g = torch.Generator().manual_seed(6)
    B, H, T, D = 2, 3, 600, 32
    qkv = torch.randn(B, 1, 3 * H * D, generator=g).half()
    q = qkv[..., : H * D].reshape(B, 1, H, D).transpose(1, 2)  # a strided view, as in the decoder
    assert not q.is_contiguous()
    for dt, sc in ((torch.float16, 1.0), (K.FP8, 0.01)):
        k = (torch.randn(B, H, T, D, generator=g) / sc).to(dt)
        v = (torch.randn(B, H, T, D, generator=g) / sc).to(dt)
        k[:, :, 520:] = float("nan")  # past n_ctx: a prefetch must not pull it in
        v[:, :, 520:] = float("nan")
        scale = torch.tensor(sc)
        for n in (1, 64, 65, 257, 520):
            out = R.decode_attention_variant(q, k, v, scale, n, use_triton=True, use_dot=use_dot,
                                             prefetch=prefetch, tile=K.AttnTile(256, 64))
            assert torch.isfinite(out).all()
            # tensor-core variant: fp16 operands (the FP8 values are exact in fp16; q and p round)
            assert _rel(out, K.decode_attention_ref(q, k, v, scale, n)) < (2e-3 if use_dot else 1e-4), (dt, n)


@pytest.mark.parametrize("dt", [torch.float16, K.FP8])
def test_per_row_attention_variant_matches_each_row_alone(dt):
    g = torch.Generator().manual_seed(5)
    B, H, T, D = 3, 2, 200, 16
    kc, vc = torch.randn(B, H, T, D, generator=g).to(dt), torch.randn(B, H, T, D, generator=g).to(dt)
    lens = torch.tensor([1, 200, 70], dtype=torch.int32)
    for b, n in enumerate(lens.tolist()):  # past each row's length: huge values, wrong if read
        kc[b, :, n:] = torch.full((H, T - n, D), 300.0).to(dt)
        vc[b, :, n:] = torch.full((H, T - n, D), 300.0).to(dt)
    q = torch.randn(B, H, 1, D, generator=g).half()
    s = torch.tensor(0.5)
    out = R.decode_attention_variant(q, kc, vc, s, lens, use_triton=True, tile=K.AttnTile(64, 16), use_dot=True)
    for b, n in enumerate(lens.tolist()):
        alone = K.decode_attention_ref(q[b:b + 1], kc[b:b + 1], vc[b:b + 1], s, n).float()
        assert (out[b:b + 1].float() - alone).abs().max() < 2e-3, (b, n)


def test_quant_rows_scales_each_row():
    g = torch.Generator().manual_seed(9)
    x = (torch.randn(6, 300, generator=g) * torch.logspace(-2, 2, 6)[:, None]).half()
    q, s = R.quant_rows(x, use_triton=True)
    _, sr = R.quant_rows_ref(x)
    assert s.shape == (6, 1) and torch.equal(s, sr)
    for i in range(6):  # each row within one e4m3 step of itself, whatever its magnitude
        assert _rel(q[i].float() * s[i], x[i]) < 0.10
    with pytest.raises(ValueError, match="bf16"):
        R.quant_rows(torch.randn(2, 8).bfloat16(), use_triton=True)


def test_w8a16_decoder_is_fp8_mm_on_the_cpu_with_the_same_weights():
    """Its layers are W8Linear (decode-shaped GPU calls take the W8A16 kernel); on a CPU they run
    as fp8_mm, so its logits equal a plain decoder's on the same path, and so do its bytes."""
    m = R.w8a16_decoder(L.TINY, device="cpu", config=R.W8_CONFIG_CPU)
    ref = L.Decoder(L.TINY, R.W8A16_PATH, device="cpu")
    w8 = [mod for mod in m.modules() if isinstance(mod, R.W8Linear)]
    assert len(w8) == 4 * L.TINY.n_layers + 1 and all(mod.config == R.W8_CONFIG_CPU for mod in w8)
    assert not any(isinstance(mod, R.W8Linear) for mod in ref.modules())
    toks = torch.randint(0, L.TINY.vocab, (2, 9), generator=torch.Generator().manual_seed(0))
    outs = []
    for d in (m, ref):
        cache = d.new_cache(2, 9)
        outs.append([d(toks[:, :8], cache), d(toks[:, 8:], cache)])
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    assert L.decode_bytes(m, 2, 8) == L.decode_bytes(ref, 2, 8)


def test_refresh_refuses_a_tuned_research_variant_for_the_lab(tmp_path, monkeypatch):
    """HWLAB_LAB04_TUNED feeds a sweep's best tile to the lab; a tensor-core or prefetch winner
    is a kernel the lab does not run, so the refresh stops before measuring and says why."""
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "refresh_gpu_evidence", Path(__file__).parents[1] / "benchmarks" / "refresh_gpu_evidence.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tuned = tmp_path / "tuned.json"
    tuned.write_text(json.dumps({"best_attn": {"chunk": 256, "block_t": 32, "num_warps": 2, "num_stages": 2,
                                               "use_dot": True, "prefetch": False}}))
    monkeypatch.setenv("HWLAB_LAB04_TUNED", str(tuned))
    with pytest.raises(SystemExit, match="research variant"):
        mod.part_lab04(tmp_path, [])
    tuned.write_text("{}")
    with pytest.raises(SystemExit, match="not a finished"):
        mod.part_lab04(tmp_path, [])
    assert not (tmp_path / "lab04_fp8.json").exists()


def _bench(name):
    import importlib.util
    import sys
    from pathlib import Path

    bench = Path(__file__).parents[1] / "benchmarks"
    sys.path.insert(0, str(bench))  # the round-5 scripts import lab04_round3 / lab04_round5 beside them
    try:
        spec = importlib.util.spec_from_file_location(name, bench / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(bench))
    return mod


def test_round5_attention_variants_match_the_reference_and_the_lab(monkeypatch):
    """Round 5's research kernels (interpreter): the TMA and prefetch/grid-order variants against
    the float32 reference, and the grid-order A/B's 'before' launch bit for bit the lab's kernel
    (same math, other grid order), fused requant included: the A/B then times order alone. The
    lab's kernel with a split for every remainder, as in round 5 (round 6 merges a short one)."""
    from hwlab.labs.fp8 import attention as A

    monkeypatch.setattr(A, "MERGE_TAIL_FRACTION", 0.0)
    r5, ab = _bench("lab04_round5"), _bench("lab04_grid_order_ab")
    g = torch.Generator().manual_seed(11)
    q = torch.randn(2, 3, 1, 64, generator=g).to(torch.float16)
    k = (torch.randn(2, 3, 300, 64, generator=g) * 20).to(K.FP8)
    v = (torch.randn(2, 3, 300, 64, generator=g) * 20).to(K.FP8)
    v.view(torch.uint8)[:, :, 290:] = 0x7F  # NaN bytes past the length: never read into the result
    s, o = torch.tensor(0.05), torch.tensor(0.01)
    ref = K.decode_attention_ref(q, k, v, s, 290)
    for c in r5.v2_candidates(64):
        assert _rel(r5.attention_v2(q, k, v, s, 290, **c), ref) < K.FP8_CACHE_MATH_REL, c
    assert _rel(r5.attention_tma(q, k, v, s, 290, chunk=64, block_t=16, num_warps=1, stages=2), ref) < K.FP8_CACHE_MATH_REL
    tile = K.AttnTile(64, 16, 1, 1)
    for out_scale in (None, o):
        before = ab.bh_major(q, k, v, s, 290, tile=tile, out_scale=out_scale)
        lab = K.decode_attention(q, k, v, s, 290, use_triton=True, tile=tile, out_scale=out_scale)
        assert before.dtype == lab.dtype and torch.equal(before.float(), lab.float())


def test_round6_and_7_choices_set_the_lab_and_put_it_back():
    """Each A/B choice of lab04_round6.py and lab04_round7.py changes only what it names, on the
    lab it ran on (PRE7: the lab before round 7's changes), and the lab is as it was after it (a
    choice left set would make every later measurement in the process a different lab). Round
    7's choices switch the kit's decode GEMM with the tiles its GEMM part picked (prefetch depths
    a power of two within one K slice), and PDL per module."""
    from hwlab.labs import fp8 as L
    from hwlab.labs.fp8 import attention as A
    from hwlab.labs.fp8 import decode_gemm as G
    from hwlab.labs.fp8 import model
    from hwlab.labs.fp8 import quant as Q

    r6, r7 = _bench("lab04_round6"), _bench("lab04_round7")
    state = lambda: (model.K.decode_attention, A.MERGE_TAIL_FRACTION, A.MIN_PROGRAMS, Q._PDL["on"],  # noqa: E731
                     model.SWAP_AB_MAX_ROWS, model.KVCache.step, model.KIT_BF16_BELOW_CTX, Q.ROW_WARPS,
                     model.HEAD_FP32, A.PDL_ATTENTION, Q.pdl_args, G.USE_KIT_GEMM, dict(G.CONFIGS))
    before = state()
    best = {nk: r7.TILES["swap 64x256 s4 k4"] for nk in r7.SHAPES.values()}
    tables = {**{f"6 {k}": v for k, v in r6.CHOICES.items()}, **{f"6b {k}": v for k, v in r6.CHOICES_B.items()},
              **{f"7 {k}": v for k, v in r7.step_choices(best).items()},
              **{f"7b {k}": v for k, v in r7.step_choices_b(best, [(4096, 14336)]).items()}}
    for name, c in tables.items():
        assert all(c[k] == v for k, v in r6.PRE7.items() if k not in ("kit_gemm", "pdl", "row_warps", "head_fp32")) \
            and set(r6.PRE7) <= set(c), name  # every choice states the lab it ran on
        with r6.choice(c):
            assert (A.MERGE_TAIL_FRACTION == c.get("merge", before[1])
                    and Q._PDL["on"] == c["pdl"] and Q.ROW_WARPS == c["row_warps"] and model.HEAD_FP32 == c["head_fp32"]
                    and (model.KVCache.step is r6._step_separate) == (c.get("kv") == "separate")
                    and (model.K.decode_attention is r6.bh_major) == (c.get("order") == "bh")), name
            assert G.USE_KIT_GEMM == c["kit_gemm"] == (name.startswith("7") and " kit" in name), name
            assert A.PDL_ATTENTION == ("attention" not in c.get("pdl_off", ())), name
            assert (Q.pdl_args is before[10]) == ("quant" not in c.get("pdl_off", ())), name
            if c["kit_gemm"]:
                assert G.takes(4096, 4096) == ("out on cuBLAS" not in name), name
                assert G.takes(4096, 14336) == ("where faster" not in name), name
                for (n, k), cfg in G.CONFIGS.items():
                    pk = cfg["PREFETCH_K"]
                    assert pk == 0 or (pk & (pk - 1) == 0 and 128 <= pk <= k // cfg["SPLIT_K"]), (name, n, k, pk)
                if "prefetch 4096" in name:  # down's K slice (14336 / 4) holds 2048 of the 4096 asked
                    assert G.CONFIGS[(4096, 14336)]["PREFETCH_K"] == 2048
        assert state() == before, name
    with r6.choice({}):  # no knob named: the lab as it is
        assert state() == before
    assert r6.CHOICES["lab"] == r6.ROUND6_LAB  # round 6's "lab" is the lab as it was then
    m = L.Decoder(L.TINY, "bf16", device="cpu")
    x = torch.randn(2, L.TINY.d_model).to(torch.bfloat16)
    assert _rel(m.head.mm_float32(x), m.head(x).float()) < 1e-2  # the head's float32 product, as on a GPU
    with pytest.raises(ValueError, match="bf16 layer"):
        L.Decoder(L.TINY, "fixed", device="cpu").layers[0]["qkv"].mm_float32(x)


def test_round8_choices_set_the_attention_switches_and_the_serial_tiles_and_put_them_back():
    """lab04_round8.py's step choices: ``attn`` (round 8's switches, since round 9 in research)
    reaches every decoder attention call through ``research.decode_attention_round8`` (and nothing
    else changes), the 8b choice reduces only the split tiles serially, and the lab is as it was
    after each."""
    from hwlab.labs.fp8 import attention as A
    from hwlab.labs.fp8 import decode_gemm as G
    from hwlab.labs.fp8 import model

    r8 = _bench("lab04_round8")
    before = (model.K.decode_attention, dict(G.CONFIGS), A.PDL_ATTENTION)
    seen = []
    real = R.decode_attention_round8
    try:
        R.decode_attention_round8 = lambda *a, **kw: seen.append(kw)
        with r8.choice8(r8.STEP_CHOICES["fused + ppsm 28"]):
            model.K.decode_attention(None, tile=A.DEFAULT_TILE)
        with r8.choice8(r8.STEP_CHOICES["lab"]):
            assert model.K.decode_attention is before[0]
    finally:
        R.decode_attention_round8 = real
    assert seen == [{"tile": A.DEFAULT_TILE, **r8.TILES["fused + ppsm 28"]}]
    assert seen[0]["programs_per_sm"] == 28 and seen[0]["fused_combine"] is True
    ch = r8.step_choices_8b({})
    serial = ch["lab tiles, serial split-K"]["configs"]
    for nk, cfg in G.CONFIGS.items():
        assert serial[nk].get("SERIAL_K", False) == (cfg.get("SPLIT_K", 1) > 1)
    assert (model.K.decode_attention, dict(G.CONFIGS), A.PDL_ATTENTION) == before


def test_round9_choice_switches_the_gelu_fold_and_puts_it_back():
    from hwlab.labs.fp8 import model

    r9 = _bench("lab04_round9")
    before = model.GELU_IN_GEMM
    assert before is False  # measured equal in round 9: the lab keeps the separate pass
    with r9.choice9(r9.STEP_CHOICES["gelu after the GEMM"]):
        assert model.GELU_IN_GEMM is False
    with r9.choice9(r9.STEP_CHOICES["lab"]):
        assert model.GELU_IN_GEMM is True
    assert model.GELU_IN_GEMM is before
    assert all(ib == 0 or ib % t.block_t == 0 for ib, t in r9.LAYOUTS.values())  # each a valid A/B side


@pytest.mark.parametrize("dt,ib", [(torch.float16, 16), (K.FP8, 16), (K.FP8, 32)])
def test_interleaved_kv_attention_matches_the_reference_and_the_two_cache_loop(dt, ib):
    """Round 9's layout A/B: the same loop on K and V interleaved per ``ib`` positions and on two
    caches gives the reference's output at lengths inside one block, across blocks and over a
    ragged last split; a kernel reading V from K's rows (or the wrong block) fails."""
    g = torch.Generator().manual_seed(9 + ib)
    B, H, T, D = 2, 3, 8 * ib, 64
    sc = 0.01 if dt == K.FP8 else 1.0
    k = (torch.randn(B, H, T, D, generator=g) / sc).to(dt)
    v = (torch.randn(B, H, T, D, generator=g) / sc).to(dt)
    q = torch.randn(B, H, 1, D, generator=g).half()
    scale = torch.tensor(sc)
    kv = R.interleave_kv(k, v, ib)
    assert kv.shape == (B, H, T // ib, 2, ib, D)
    assert torch.equal(kv[:, :, 1, 1, 3].float(), v[:, :, ib + 3].float())  # block 1's V row 3
    tile = K.AttnTile(chunk=2 * ib, block_t=16)
    for n in (5, ib + 7, T - 3, T):
        ref = K.decode_attention_ref(q, k, v, scale, n)
        out = R.decode_attention_interleaved(q, kv, scale, n, tile=tile, use_triton=True)
        two = R.decode_attention_interleaved(q, k, scale, n, tile=tile, v_cache=v, use_triton=True)
        assert _rel(out, ref) < K.FP8_CACHE_MATH_REL and _rel(two, ref) < K.FP8_CACHE_MATH_REL, n
    wrong = R.decode_attention_interleaved(q, R.interleave_kv(k, k, ib), scale, T, tile=tile, use_triton=True)
    assert _rel(wrong, K.decode_attention_ref(q, k, v, scale, T)) > 0.1
    with pytest.raises(ValueError, match="multiple of the block"):
        R.interleave_kv(k[:, :, :T - 1], v[:, :, :T - 1], ib)
    # the loads' cache policy (round 9's part ``loads``) changes where lines live, never the result
    pol = R.decode_attention_interleaved(q, k, scale, T - 3, tile=tile, v_cache=v, use_triton=True,
                                         eviction_policy="", cache_modifier=".cg")
    assert _rel(pol, K.decode_attention_ref(q, k, v, scale, T - 3)) < K.FP8_CACHE_MATH_REL
    with pytest.raises(ValueError, match="cache_modifier"):
        R.decode_attention_interleaved(q, k, scale, T, v_cache=v, use_triton=True, cache_modifier=".cs")
    with pytest.raises(ValueError, match="takes no eviction_policy"):  # ptxas refused it on the H200
        R.decode_attention_interleaved(q, k, scale, T, v_cache=v, use_triton=True, cache_modifier=".cg")


@pytest.mark.parametrize("dt", [torch.float16, K.FP8])
# the deliberately broken call below combines partials never written (uninitialised memory), which
# may overflow in the interpreter's casts; the test asserts that result is wrong, not what it holds
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_fused_combine_equals_the_combine_kernel_and_leaves_its_counters_zero(dt):
    """Round 8's fused combine (``research.decode_attention_round8``, interpreter): the last program of each (batch, head)
    combines the splits itself. Its output equals the two-kernel attention's (same partials, sums
    in the same float32 arithmetic to within rounding) for one length, per-row lengths, this step's
    K and V written in, and the FP8 output of the out projection's requant; the per-row counters
    are zero after every call (a second call and a graph replay need them so), and a call whose
    counters were left non-zero would combine at the wrong program and differ."""
    from hwlab.labs.fp8 import attention as A
    from hwlab.labs.fp8 import workspace as W

    g = torch.Generator().manual_seed(21)
    B, H, T, D = 2, 3, 200, 32
    sc = torch.tensor(0.02 if dt == K.FP8 else 1.0)
    kc = (torch.randn(B, H, T, D, generator=g) * (2.0 if dt == K.FP8 else 1.0)).to(dt)
    vc = (torch.randn(B, H, T, D, generator=g) * (2.0 if dt == K.FP8 else 1.0)).to(dt)
    q = torch.randn(B, H, 1, D, generator=g).half()
    tile = K.AttnTile(32, 16)
    rows = torch.tensor([190, 7], dtype=torch.int32)
    o = torch.tensor(0.01)
    for n, out_scale in ((181, None), (rows, None), (181, o), (33, None)):
        for _ in range(2):
            ref = K.decode_attention(q, kc, vc, sc, n, use_triton=True, tile=tile, out_scale=out_scale)
            got = R.decode_attention_round8(q, kc, vc, sc, n, use_triton=True, tile=tile, out_scale=out_scale,
                                            fused_combine=True)
            assert got.dtype == ref.dtype and got.shape == ref.shape
            assert _rel(got.float(), ref.float()) < (0.07 if out_scale is not None else 1e-3), (n, out_scale)
            assert W.buffer("cpu", "attn_rows").abs().max() == 0
    # this step's K and V written by the fused kernel, then read with the rest
    k, v = torch.randn(B, H, 1, D, generator=g).half(), torch.randn(B, H, 1, D, generator=g).half()
    kp, vp, kf, vf = kc.clone(), vc.clone(), kc.clone(), vc.clone()
    ref = K.decode_attention(q, kp, vp, sc, 150, use_triton=True, tile=tile, new_kv=(k, v))
    got = R.decode_attention_round8(q, kf, vf, sc, 150, use_triton=True, tile=tile, new_kv=(k, v), fused_combine=True)
    assert torch.equal(kf.view(torch.uint8), kp.view(torch.uint8)) and _rel(got.float(), ref.float()) < 1e-3
    # counters left at 1 (a call that died mid-way): the first program to count then sees
    # n_splits - 1 too early and combines partials not yet written; the kernel cannot heal that
    W.buffer("cpu", "attn_rows")[: B * H] = 1
    bad = R.decode_attention_round8(q, kc, vc, sc, 181, use_triton=True, tile=tile, fused_combine=True)
    good = K.decode_attention(q, kc, vc, sc, 181, use_triton=True, tile=tile)
    W.buffer("cpu", "attn_rows").zero_()
    assert not _rel(bad.float(), good.float()) < 1e-3
    assert A.split_count(181, A.chunk_for(tile, B * H, 181)) > 1  # the cases above did split
    with pytest.raises(ValueError, match="programs_per_sm >= 0"):
        R.decode_attention_round8(q, kc, vc, sc, 181, use_triton=True, fused_combine=1)


def test_programs_per_sm_sizes_the_splits_from_the_gpu():
    """Round 8's ``programs_per_sm`` (``research.chunk_for_gpu``): about that many programs per SM
    over the whole grid, each split a whole number of ``block_t`` steps; 0 keeps the lab's chunk
    rule (MIN_PROGRAMS)."""
    from hwlab.labs.fp8 import attention as A

    t = K.DEFAULT_TILE
    for bh, n, sms in ((512, 4096, 132), (128, 32768, 132), (512, 512, 132), (6, 200, 4)):
        chunk = R.chunk_for_gpu(t, bh, n, 28, sms)
        splits = A.split_count(n, chunk)
        assert chunk % t.block_t == 0 and chunk >= t.block_t
        target = max(1, 28 * sms // bh)  # but no split shorter than one block_t step
        assert min(target, -(-n // t.block_t)) - 1 <= splits <= target, (bh, n, sms, chunk, splits)
    assert R.chunk_for_gpu(t, 512, 4096, 1, 132) >= 4096  # fewer slots than rows: 1 split
    assert R.chunk_for_gpu(t, 512, 4096, 0, 132) == A.chunk_for(t, 512, 4096) == t.chunk  # the lab's rule


@pytest.mark.parametrize("opts", [dict(), dict(prefetch=1), dict(prefetch=2), dict(loop_stages=3), dict(rows=True),
                                  dict(rows=True, loop_stages=2, tile=K.AttnTile(chunk=64, block_t=32, num_warps=2))])
def test_round10_lean_loops_match_the_reference_and_the_labs_writes(opts):
    """Round 10's loops (``research.decode_attention_lean``, interpreter): the output and sum kept per
    position row, with or without a prefetch, a pipelined loop or a running max per row, give the
    reference's output over whole steps, a ragged last step, one position and per-row lengths; the
    new K and V they write are the lab's bytes; a 16-bit cache takes the lab's loop."""
    g = torch.Generator().manual_seed(10)
    B, H, T, D = 2, 2, 300, 64
    k = (torch.randn(B, H, T, D, generator=g) * 30).to(K.FP8)
    v = (torch.randn(B, H, T, D, generator=g) * 30).to(K.FP8)
    q = torch.randn(B, H, 1, D, generator=g).half()
    scale = torch.tensor(0.03)
    for n in (1, 16, 17, 290):
        out = R.decode_attention_lean(q, k, v, scale, n, use_triton=True, **opts)
        assert _rel(out, K.decode_attention_ref(q, k, v, scale, n)) < K.FP8_CACHE_MATH_REL, n
    lens = torch.tensor([3, 280], dtype=torch.int32)
    assert _rel(R.decode_attention_lean(q, k, v, scale, lens, use_triton=True, **opts),
                K.decode_attention_ref(q, k, v, scale, lens)) < K.FP8_CACHE_MATH_REL
    kn, vn = torch.randn(B, H, 1, D, generator=g).half(), torch.randn(B, H, 1, D, generator=g).half()
    k1, v1, k2, v2 = k.clone(), v.clone(), k.clone(), v.clone()
    s_out = torch.tensor(0.02)
    lab = K.decode_attention(q, k1, v1, scale, 200, use_triton=True, new_kv=(kn, vn), out_scale=s_out)
    lean = R.decode_attention_lean(q, k2, v2, scale, 200, use_triton=True, new_kv=(kn, vn), out_scale=s_out, **opts)
    assert torch.equal(k1.view(torch.uint8), k2.view(torch.uint8)) and torch.equal(v1.view(torch.uint8), v2.view(torch.uint8))
    assert lean.dtype == K.FP8 and _rel(lean.float(), lab.float()) < 0.05  # FP8 outputs: a rounding apart at most
    k16, v16 = (torch.randn(B, H, T, D, generator=g).half() for _ in range(2))
    one = torch.tensor(1.0)
    assert torch.equal(R.decode_attention_lean(q, k16, v16, one, 250, use_triton=True, **opts),
                       K.decode_attention(q, k16, v16, one, 250, use_triton=True, tile=opts.get("tile", K.DEFAULT_TILE)))


def test_round10_switches_refuse_what_they_cannot_run(monkeypatch):
    """The lean loop's fp16 rows hold at most ``lean_steps_fit``'s steps; the switches take their
    documented values; the register cap is a compiled kernel's option, not the interpreter's."""
    assert R.lean_steps_fit(K.AttnTile(), 256) and not R.lean_steps_fit(K.AttnTile(chunk=4096, block_t=16), 4096)
    q = torch.zeros(1, 1, 1, 64, dtype=torch.float16)
    k = torch.zeros(1, 1, 8192, 64).to(K.FP8)
    assert R.decode_attention_lean(q, k, k, torch.tensor(1.0), 8192, use_triton=False, tile=K.AttnTile(chunk=4096)).shape
    monkeypatch.setattr(L.attention, "MIN_PROGRAMS", 0)  # else one (batch, head) halves the chunk to fit the GPU
    with pytest.raises(ValueError, match="overflow"):
        R.decode_attention_lean(q, k, k, torch.tensor(1.0), 8192, use_triton=True, tile=K.AttnTile(chunk=4096))
    with pytest.raises(ValueError, match="prefetch"):
        R.decode_attention_lean(q, k, k, torch.tensor(1.0), 10, use_triton=True, prefetch=3)
    with pytest.raises(ValueError, match="loop_stages"):
        R.decode_attention_lean(q, k, k, torch.tensor(1.0), 10, use_triton=True, prefetch=1, rows=True)
    with pytest.raises(ValueError, match="maxnreg"):
        R.launch_limits(8)
    assert R.launch_limits(64) == {} and R.launch_limits(None) == {}  # the interpreter takes no register cap


def test_round10_combine_with_pdl_gives_the_labs_output():
    """``research.decode_attention_round8(pdl_combine=True)`` launches the lab's combine kernel itself
    (with PDL where it runs): the same output as the lab's attention, FP8 requant included."""
    g = torch.Generator().manual_seed(12)
    k = (torch.randn(2, 2, 200, 64, generator=g) * 30).to(K.FP8)
    v = (torch.randn(2, 2, 200, 64, generator=g) * 30).to(K.FP8)
    q = torch.randn(2, 2, 1, 64, generator=g).half()
    scale = torch.tensor(0.03)
    for out_scale in (None, torch.tensor(0.02)):
        a = K.decode_attention(q, k, v, scale, 190, use_triton=True, out_scale=out_scale)
        b = R.decode_attention_round8(q, k, v, scale, 190, use_triton=True, out_scale=out_scale, pdl_combine=True)
        assert a.dtype == b.dtype and torch.equal(a.float(), b.float())


def test_round12_final_lean_loop_writes_the_output_without_a_combine():
    """``decode_attention_lean(final=True)`` (interpreter): one split per row, whose program writes
    the normalized output itself; the same output as the lab's split attention and as the same loop
    with its combine, and refused where a row has more than one split."""
    g = torch.Generator().manual_seed(14)
    k = (torch.randn(2, 2, 200, 64, generator=g) * 30).to(K.FP8)
    v = (torch.randn(2, 2, 200, 64, generator=g) * 30).to(K.FP8)
    q = torch.randn(2, 2, 1, 64, generator=g).half()
    scale = torch.tensor(0.03)
    tile = L.AttnTile(256, 32, 2, 3)
    ref = K.decode_attention_ref(q, k, v, scale, 190).float()
    for rows, st in ((True, 3), (False, 0)):
        fin = R.decode_attention_lean(q, k, v, scale, 190, use_triton=True, tile=tile, rows=rows, loop_stages=st, final=True)
        com = R.decode_attention_lean(q, k, v, scale, 190, use_triton=True, tile=tile, rows=rows, loop_stages=st)
        assert fin.shape == q.shape and fin.dtype == q.dtype
        assert K.rel_err(fin, ref) < K.FP8_CACHE_MATH_REL and torch.allclose(fin.float(), com.float(), rtol=2e-3, atol=2e-3)
    with pytest.raises(ValueError, match="one split per row"):
        R.decode_attention_lean(q, k, v, scale, 190, use_triton=True, tile=L.AttnTile(64, 16, 1, 2), final=True)
    # round 13: with the next GEMM's scale it writes FP8 as the lab's combine does (to one FP8 step)
    os_ = torch.tensor(0.01)
    fq = R.decode_attention_lean(q, k, v, scale, 190, use_triton=True, tile=tile, final=True, out_scale=os_)
    lq = K.decode_attention(q, k, v, scale, 190, use_triton=True, out_scale=os_)
    assert fq.dtype == lq.dtype == K.FP8
    assert (fq.float() - lq.float()).abs().max() <= 0.07 * lq.float().abs().max()


def test_round13_final_on_a_bf16_cache_writes_the_new_position_and_fp8_output():
    """The decode step's call at 512 (interpreter): a 16-bit cache (bf16 on the GPU), this step's K and V written by the
    kernel first (``new_kv``), FP8 output with the out projection's scale, one split per row: the
    same cache afterwards and the same FP8 output (to one FP8 step) as the lab's kernel."""
    g = torch.Generator().manual_seed(15)
    shape = (2, 2, 160, 64)
    kb, vb = torch.randn(shape, generator=g).half(), torch.randn(shape, generator=g).half()  # 16-bit (no bf16 here)
    q, kn, vn = (torch.randn(2, 2, 1, 64, generator=g).half() for _ in range(3))
    one, os_ = torch.tensor(1.0), torch.tensor(0.004)
    caches = {}
    for name, fn in (("lab", K.decode_attention),
                     ("final", functools.partial(R.decode_attention_lean, final=True, tile=L.AttnTile(256, 32, 2, 3)))):
        k, v = kb.clone(), vb.clone()
        caches[name] = (fn(q, k, v, one, 150, use_triton=True, out_scale=os_, new_kv=(kn, vn)), k, v)
    (lab, kl, vl), (fin, kf, vf) = caches["lab"], caches["final"]
    assert torch.equal(kl, kf) and torch.equal(vl, vf) and torch.equal(kf[:, :, 149:150], kn)
    assert fin.dtype == K.FP8 and (fin.float() - lab.float()).abs().max() <= 0.07 * lab.float().abs().max()
