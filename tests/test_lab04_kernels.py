"""Lab 4's Triton kernels in the interpreter (fp16 activations; bf16 is wrong there) against
their torch references, on fresh random data each time."""
import pytest
import torch

import hwlab  # noqa: F401  (interpreter before triton)
from hwlab.labs import fp8_kernels as K


@pytest.mark.parametrize("seed", [0, 1])
def test_self_check_on_fresh_data(seed):
    c = K.self_check("cpu", torch.float16, seed=seed)
    assert c["quant_rows_scale"] == 0.0 and c["quant_tensor_scale"] == 0.0  # amax is exact
    # the interpreter truncates when casting to e4m3 (the GPU rounds to nearest: ~2.6%), so
    # the round trip is bounded by one e4m3 step (2^-3 relative) rather than half of one
    assert 0.01 < c["quant_rows_roundtrip"] < 0.10 and 0.01 < c["quant_tensor_roundtrip"] < 0.10
    assert c["dequant_rows"] < 1e-3  # fp16 output rounding only
    assert c["decode_attention_16bit"] < 1e-3 and c["decode_attention_fp8"] < 1e-3
    assert c["fp8w_linear"] < 1e-2


def test_decode_attention_split_boundaries_and_poisoned_tail():
    g = torch.Generator().manual_seed(3)
    B, H, T, D = 1, 2, 600, 32
    q = torch.randn(B, H, 1, D, generator=g).half()
    k = torch.randn(B, H, T, D, generator=g).half()
    v = torch.randn(B, H, T, D, generator=g).half()
    k[:, :, 520:] = float("nan")  # positions past n_ctx must never be read into the result
    v[:, :, 520:] = float("nan")
    one = torch.ones(())
    for n in (1, K.CHUNK_T, K.CHUNK_T + 1, 520):
        out = K.decode_attention(q, k, v, one, n, use_triton=True)
        ref = K.decode_attention_ref(q, k, v, one, n)
        assert torch.isfinite(out).all()
        assert torch.allclose(out.float(), ref.float(), atol=2e-3, rtol=2e-3), n


def test_fp8_weight_gemm_matches_dequantized_reference():
    g = torch.Generator().manual_seed(4)
    w = torch.randn(80, 200, generator=g)  # N, K not multiples of the tile: masks are exercised
    wq, s = K.quant_tensor_ref(w)
    x = torch.randn(5, 200, generator=g).half()
    y = K.fp8w_linear(x, wq, s, use_triton=True)
    ref = (x.float() @ (wq.float() * s).t())
    assert y.shape == (5, 80) and y.dtype == torch.float16
    assert (y.float() - ref).norm() / ref.norm() < 5e-3


def test_bad_inputs_say_what_to_do():
    one = torch.ones(())
    with pytest.raises(ValueError, match="n_ctx"):
        K.decode_attention(torch.randn(1, 1, 1, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8), one, 5)
    with pytest.raises(ValueError, match=r"q \(B, H, 1, D\)"):
        K.decode_attention(torch.randn(1, 1, 2, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8), one, 2)
    with pytest.raises(ValueError, match="2-D"):
        K.quant_tensor(torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match="bf16"):
        K.quant_rows(torch.randn(2, 8).bfloat16(), use_triton=True)
    with pytest.raises(ValueError, match="one per row or one"):
        K.dequant_rows(torch.zeros(4, 8).to(K.FP8), torch.ones(3, 1), use_triton=True)
