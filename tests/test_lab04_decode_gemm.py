"""Lab 4's decode GEMM (:mod:`hwlab.labs.fp8.decode_gemm`) in the Triton interpreter, against
its float32 reference: both operand orders, split-K (its workspace left zeroed for the next
call), ragged N and K, and rows over one 16-row tile. FP8 weights are stored as fp16 here (the
interpreter's dot takes fp16; every e4m3 value is exact in fp16), the kernel's code unchanged."""
import pytest
import torch

import hwlab  # noqa: F401  (interpreter before triton)
from hwlab.labs.fp8 import decode_gemm as G
from hwlab.labs.fp8 import kernels as K
from hwlab.labs.fp8 import workspace as W


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.slow
@pytest.mark.parametrize("swap,split_k,serial", [(False, 1, False), (True, 1, False), (False, 3, False),
                                                (True, 2, False), (False, 3, True), (True, 4, True)])
def test_decode_mm_matches_reference_and_leaves_split_k_workspace_clean(swap, split_k, serial):
    """``serial``: the serial reduction (a slab of partials per K slice, summed by the last slice);
    its counters must be zero again after every call, as the atomic sums' workspace must."""
    g = torch.Generator().manual_seed(11 + split_k)
    cfg = {**G.CPU_CONFIG, "SWAP": swap, "SPLIT_K": split_k, "BN": 32 if swap else 16, "SERIAL_K": serial}
    for N, Kd, M in ((80, 200, 5), (48, 300, 17)):  # ragged N and K; M over one 16-row tile
        wq, ws = K.quant_tensor_ref(torch.randn(N, Kd, generator=g))
        w = wq.half()
        for _ in range(2):  # a second call must find the split-K workspace zeroed again
            xq, xs = K.quant_tensor_ref(torch.randn(M, Kd, generator=g))
            x = xq.half()
            y = G.decode_mm(x, w, xs, ws, config=cfg, out_dtype=torch.float32, use_triton=True)
            ref = G.decode_mm_ref(x, w, xs, ws, torch.float32)
            assert y.shape == (M, N) and _rel(y, ref) < 1e-3
    if split_k > 1:
        cnt = W.buffer("cpu", "splitk_cnt")
        assert cnt.abs().max() == 0
        if serial:  # the slabs hold this call's partials; the atomic workspace stays zero
            assert W.buffer("cpu", "splitk_slabs").abs().max() > 0
        assert W.buffer("cpu", "splitk_part") is None or W.buffer("cpu", "splitk_part").abs().max() == 0


def test_the_labs_split_k_tiles_reduce_serially():
    """The lab's tiles: every tile that splits K sums the slices by the serial
    reduction, never by float32 atomics (the atomic sums were now and then wrong at one tile)."""
    split = {nk: c for nk, c in G.CONFIGS.items() if c.get("SPLIT_K", 1) > 1}
    assert split and all(c.get("SERIAL_K") for c in split.values())


def test_decode_mm_reference_is_the_dequantized_product():
    g = torch.Generator().manual_seed(3)
    wq, ws = K.quant_tensor_ref(torch.randn(24, 64, generator=g))
    xq, xs = K.quant_tensor_ref(torch.randn(4, 64, generator=g))
    y = G.decode_mm(xq, wq, xs, ws)  # CPU, not asked for Triton: the reference
    ref = (xq.float() * xs) @ (wq.float() * ws).t()
    assert y.dtype == torch.bfloat16 and _rel(y, ref) < 1e-2


def test_decode_mm_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="x \\(M, K\\) and w \\(N, K\\)"):
        G.decode_mm(torch.zeros(2, 8), torch.zeros(4, 9), torch.ones(()), torch.ones(()))


@pytest.mark.parametrize("split_k,serial", [(1, False), (3, True)])
def test_decode_mm_gelu_epilogue_is_gelu_then_the_static_requant(split_k, serial):
    """Round 9: the up projection's GEMM writes GELU of its product in FP8 with the down
    projection's static scale. Against the float32 product's GELU, quantized by the reference
    requant: a kernel that skipped the GELU, quantized before it, or left the scale out fails."""
    g = torch.Generator().manual_seed(21 + split_k)
    cfg = {**G.CPU_CONFIG, "SPLIT_K": split_k, "SERIAL_K": serial}
    N, Kd, M = 80, 200, 5
    wq, ws = K.quant_tensor_ref(torch.randn(N, Kd, generator=g))
    xq, xs = K.quant_tensor_ref(torch.randn(M, Kd, generator=g) * 3)
    x, w = xq.half(), wq.half()
    prod = G.decode_mm_ref(x, w, xs, ws, torch.float32)
    s = torch.nn.functional.gelu(prod).abs().max() / 448 * 1.5  # nothing saturates
    y = G.decode_mm(x, w, xs, ws, config=cfg, use_triton=True, gelu_out_scale=s)
    ref = G.decode_mm_ref(x, w, xs, ws, gelu_out_scale=s)
    assert y.dtype == K.FP8 and ref.dtype == K.FP8 and y.shape == (M, N)
    want = torch.nn.functional.gelu(prod)
    assert _rel(ref.float() * s, want) < 0.10  # the reference itself: one e4m3 step
    assert _rel(y.float() * s, want) < 0.10  # one e4m3 step (the interpreter truncates)
    assert _rel(y.float(), ref.float()) < 0.10
    assert _rel(y.float() * s, prod) > 0.3  # GELU matters at this size: a kernel without it fails
    s_small = s / 8  # a smaller scale saturates more of the output at +-448: the kernel clamps as quant_static
    y8 = G.decode_mm(x, w, xs, ws, config=cfg, use_triton=True, gelu_out_scale=s_small)
    assert float(y8.float().abs().max()) == 448.0
    if split_k > 1:
        assert W.buffer("cpu", "splitk_cnt").abs().max() == 0
