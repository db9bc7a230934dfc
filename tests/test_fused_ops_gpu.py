"""Fused native ops on a GPU (examine/fused_ops): the kernels under the encoder fast path are classed
by name and counted from the shapes recorded for the op that launched them, once per op."""
from hwlab.core.profiling import trace_calls
from hwlab.examine.fused_ops import COUNTED, FusedSplit, fused_matmul_flops, fused_owner

M, K, N = 8192, 768, 2304


def _trace():
    """One call: the fast path's layer op over an addmm that launches a GEMM kernel and a split-K
    reduction kernel, and a softmax-free efficient-attention op with its own kernel."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": "hwlab-call", "ts": 0, "dur": 1000, "pid": 1, "tid": 1}]
    ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::_transformer_encoder_layer_fwd", "ts": 10, "dur": 900,
               "pid": 1, "tid": 1, "args": {"External id": 1}})
    ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": 20, "dur": 100, "pid": 1, "tid": 1,
               "args": {"External id": 2, "Input Dims": [[N], [M, K], [K, N], [], []],
                        "Input type": ["float", "float", "float", "Scalar", "Scalar"]}})
    ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::_efficient_attention_forward", "ts": 200, "dur": 100,
               "pid": 1, "tid": 1, "args": {"External id": 3, "Input Dims": [[16, 512, 12, 64]] * 3,
                                           "Input type": ["float", "float", "float"]}})
    for corr, ts in ((11, 30), (12, 40), (13, 210)):
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 5, "pid": 1,
                   "tid": 1, "args": {"correlation": corr}})
    ev.append({"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32",
               "ts": 50, "dur": 300, "pid": 0, "tid": 7, "args": {"correlation": 11}})
    ev.append({"ph": "X", "cat": "kernel", "name": "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_splitK_reduce>",
               "ts": 360, "dur": 20, "pid": 0, "tid": 7, "args": {"correlation": 12}})
    ev.append({"ph": "X", "cat": "kernel", "name": "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention)",
               "ts": 400, "dur": 200, "pid": 0, "tid": 7, "args": {"correlation": 13}})
    return {"traceEvents": ev}


def test_kernels_under_a_fused_op_are_counted_from_their_launching_ops_shapes_once():
    (items,) = trace_calls(_trace(), "hwlab-call")
    assert len(items) == 3 and all(fused_owner(it) for it in items)
    split = FusedSplit()
    split.new_call()
    got = [split.classify(it) for it in items]
    (c1, r1), (c2, r2), (c3, r3) = got
    assert c1.startswith("gemm") and r1 is not COUNTED and r1.flops == 2 * M * N * K
    assert r2 is COUNTED  # the same addmm's second kernel: counted once, with the first
    assert c3 == "attention" and r3 is not None and r3 is not COUNTED and r3.flops > 0
    split.new_call()  # a new call counts its ops again
    assert split.classify(items[0])[1] is not COUNTED


def test_the_whole_calls_flops_add_the_fused_ops_gemm_and_attention_once():
    calls = trace_calls(_trace(), "hwlab-call")
    split = FusedSplit()
    split.new_call()
    recs = [split.classify(it)[1] for it in calls[0]]
    assert fused_matmul_flops(calls) == 2 * M * N * K + recs[2].flops
    assert fused_matmul_flops([[]]) == 0
