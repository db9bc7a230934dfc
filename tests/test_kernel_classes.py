"""The kit's one kernel classification (core/kernel_classes.py), and every reader using it.

Names are the ones vendors' libraries write (copied from public profiler traces and library
sources); each case says what an engineer reading only the name would call it. The readers are
checked on built traces whose kernels have no launch record (a GPU-only trace, graph replay):
a kernel's class must not depend on the aten op that launched it."""
import gzip
import json
from pathlib import Path

import pytest

from hwlab.core.kernel_classes import classify_kernel, collective_of, unrecognised_table
from hwlab.core.profiling import kernel_class, part_class

CASES = [
    # cuBLAS / cuBLASLt / CUTLASS (NVIDIA)
    ("volta_sgemm_128x64_nt", "gemm", False, "fp32"),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn", "gemm", True, "bf16"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
     "_kernel__5x_cublas", "gemm", True, "bf16"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "gemm", True, None),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1>(cutlass_80_tensorop_s1688gemm"
     "_256x64_16x4_tn_align1::Params)", "gemm", True, "tf32"),
    ("volta_h884gemm_64x64_ldg8_nn", "gemm", True, "fp16"),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false>", "gemm", False, None),
    # hipBLASLt / Tensile / CK (AMD): MFMA from the _MI tile or xdl
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x256x64_MI16x16x1_SN_LDSB1", "gemm", True, "bf16"),
    ("Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0_AFC1", "gemm", True, "fp32"),
    ("Cijk_Ailk_Bljk_SB_MT64x64x8_SN_1LDSB0_APM1", "gemm", False, "fp32"),
    ("_ZN2ck16tensor_operation6device37kernel_batched_gemm_xdlops_bwd_weightINS_47GridwiseGemm", "gemm", True, None),
    # convolutions (GEMM-class): cuDNN, MIOpen
    ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int)", "conv", False, "fp32"),
    ("volta_scudnn_128x64_relu_interior_nn_v1", "conv", False, "fp32"),
    ("void implicit_convolve_sgemm<float, float, 1024, 6, 7, 3, 3, 5, 1, false, true, true>", "conv", False, "fp32"),
    ("miopenSp3AsmConv_v21_1_3_gfx9_fp32_stride1", "conv", False, "fp32"),
    # norms before convolution (cuDNN / MIOpen batch-norm carry the library's name)
    ("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>", "norm/reduction", None, None),
    ("MIOpenBatchNormFwdTrainSpatial", "norm/reduction", None, None),
    ("batched_transpose_32x32_half", "copy/concat", None, None),
    ("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true>", "copy/concat", None, None),
    # attention before GEMM (CUTLASS and CK attention carry GEMM-ish names)
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>",
     "attention", None, "bf16"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)", "attention", None, "bf16"),
    ("_ZN7ck_tile6kentryINS_13FmhaFwdKernel", "attention", None, None),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", "attention", None, "fp16"),
    # communication, NCCL or not
    ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "communication", None, None),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", "communication", None, None),
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*)", "communication", None, None),
    ("void deep_ep::internode::combine<false, 4, 8>(int4*, float*)", "communication", None, None),
    ("void c10d::symmetric_memory::multimem_all_reduce_kernel<c10::BFloat16, 16, 8>", "communication", None, None),
    ("void vllm::cross_device_reduce_1stage<c10::BFloat16, 8>(vllm::RankData*)", "communication", None, None),
    ("void nvshmemi_transfer_rma_kernel", "communication", None, None),
    # DeepEP's handshakes are communication too, whatever namespace wraps the library
    ("void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int, int const*, int*)", "communication",
     None, None),
    ("void dpsk::ep::internode::cached_notify<false>(int, int, int, int, int*, int)", "communication", None, None),
    ("void dpsk::ep::internode::notify_dispatch<false, 8>(int const*, long*, int)", "communication", None, None),
    ("void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*, float*)", "communication",
     None, None),
    ("void deep_ep::internode_ll::clean_low_latency_buffer<32>(int*, int, int*, int)", "communication", None, None),
    # Inductor's Triton kernels: templates of a matmul are GEMMs, the rest compiled
    ("triton_poi_fused_add_mul_0", "triton/compiled", None, None),
    ("triton_red_fused__softmax_1", "triton/compiled", None, None),
    ("triton_tem_fused_mm_4", "gemm", None, None),
    ("triton__0d1d2d3d4d5d6d7d8d9d10d11d12d13d14", "triton/compiled", None, None),
    ("triton_per_fused_native_layer_norm_0", "triton/compiled", None, None),
    # a hand-written Triton kernel names what it computes; only an unnamed one is compiled work
    ("triton_gemm_kernel_0d1d2d", "gemm", None, None),
    ("triton_layernorm_fwd_kernel", "norm/reduction", None, None),
    ("triton_mystery_kernel", "triton/compiled", None, None),
    # PyTorch's own kernels and friends
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "elementwise",
     None, None),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::threshold_kernel_impl<float>(at::"
     "TensorIteratorBase&, float, float)::{lambda(float, float)#1}>", "elementwise", None, None),
    ("void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
     "at::native::sum_functor<float, float, float>::operator()::{lambda(float, float)#1}>>>",
     "norm/reduction", None, None),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 2, 128, 1>",
     "copy/concat", None, None),
    ("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>, float>", "optimizer", None, None),
    ("void at::native::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>", "gather/scatter",
     None, None),
    ("void split_embedding_codegen_forward_unweighted_kernel<float, float, float, long, 2ul>", "gather/scatter",
     None, None),
    ("void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>", "norm/reduction",
     None, None),
    ("Memcpy DtoD (Device -> Device)", "memcpy", None, None),
    ("__amd_rocclr_fillBufferAligned", "memset", None, None),
    # met in the param DLRM traces: FBGEMM's embedding index check is index work
    ("void bounds_check_indices_kernel<long>(at::GenericPackedTensorAccessor<long, 1ul, at::RestrictPtrTraits, int>)",
     "gather/scatter", None, None),
    # FBGEMM's namespace is no GEMM
    ("void fbgemm_gpu::permute_2D_data_kernel<false, int, int, decltype(nullptr)>(int, int, int)", "copy/concat",
     None, None),
    # precision: a bf16 x MXFP4 GEMM is not an FP8 GEMM
    ("_matmul_ogs_NNT_bf16xbf16xmxfp4_128x256x128x1_swiglu", "gemm", True, "fp4"),
    ("nvjet_qqtst_128x128_128x6_2x1_v_bz_TNN", "gemm", True, "fp8"),
    # cuBLAS xmma kernels name their MMA instruction shape (met in astra-sim's Megatron ranks)
    ("sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x32_stage5_warpsize2x2x1_tensor16x8x16_kernel",
     "gemm", True, None),
]


@pytest.mark.parametrize("name,cls,tc,precision", CASES)
def test_each_kernel_is_classed_by_its_own_name(name, cls, tc, precision):
    k = classify_kernel(name)
    assert (k.cls, k.tensor_core if k.gemm_class else None, k.precision if precision else None) == \
        (cls, tc, precision), k


def test_a_kernel_nothing_recognises_is_unrecognised_and_reported_by_name_and_time():
    assert classify_kernel("void cask_cudnn_infer::computeOffsetsKernel<false, false>(x)").cls == "unrecognised"
    assert kernel_class("my_custom_kernel_v2")[0] == "unrecognised"
    assert part_class(None, "my_custom_kernel_v2") == "unrecognised"
    rows = unrecognised_table([("my_custom_kernel_v2", 5.0), ("volta_sgemm_128x64_nt", 100.0),
                               ("my_custom_kernel_v2", 7.0), ("other_thing", 1.0)])
    assert rows == [{"name": "my_custom_kernel_v2", "us": 12.0, "count": 2},
                    {"name": "other_thing", "us": 1.0, "count": 1}]


def test_the_aten_op_decides_only_where_the_name_says_nothing():
    # no launch linked (graph replay, GPU-only trace): the name decides; never "triton/compiled"
    assert part_class(None, "Cijk_Alik_Bljk_BBS_BH_MT256x256x64_MI16x16x1_SN") == "gemm bfloat16"
    assert part_class(None, "flash_fwd_kernel") == "attention"
    # a cuBLAS GEMM called from a compiled region is still a GEMM
    assert part_class(None, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn", compiled=True) == "gemm bfloat16"
    # a bias add launched under aten::linear is elementwise, not GEMM time
    assert part_class("aten::linear", "void at::native::vectorized_elementwise_kernel<4, "
                      "at::native::CUDAFunctor_add<float>>") == "elementwise/reduction"
    # the op's dtype wins over the name's precision where the op is linked
    assert part_class("aten::mm", "volta_sgemm_128x64_nt", ("float32",)) == "gemm float32"
    # an unrecognised kernel under a recorded op takes the op's class
    assert part_class("aten::mm", "my_custom_gemmish_kernel", ("bfloat16",)) == "gemm bfloat16"


@pytest.mark.parametrize("name,coll", [
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*)", "alltoall"),
    ("void c10d::symmetric_memory::multimem_all_reduce_kernel<c10::BFloat16, 16, 8>", "allreduce"),
    ("void vllm::cross_device_reduce_2stage<half, 8>", "allreduce"),
    ("nvshmem_put_kernel", "comm"),
])
def test_non_nccl_communication_names_its_collective(name, coll):
    assert collective_of(name) == coll


def _gpu_only_trace(path: Path, kernels: list[tuple[str, float]], *, gap_us: float = 2.0) -> Path:
    """A trace with device kernels only (no host ops, no launches): what a GPU-only capture or a
    graph replay gives; kernels back to back with ``gap_us`` between them."""
    ev, t = [], 1000.0
    for i, (name, dur) in enumerate(kernels):
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": t, "dur": dur,
                   "args": {"device": 0, "stream": 7, "correlation": 100 + i}})
        t += dur + gap_us
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": ev}
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return path


def test_examine_trace_classes_a_gpu_only_trace_by_kernel_names(tmp_path):
    from hwlab.examine.from_trace import examine_trace
    kernels = ([("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 400.0),
                ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>",
                 200.0),
                ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", 100.0),
                ("my_custom_kernel_v2", 50.0)] * 5)
    ex = examine_trace(_gpu_only_trace(tmp_path / "gpu_only.json.gz", kernels))
    parts = {p.name: p for p in ex.parts.parts}
    assert "triton/compiled" not in parts
    busy = sum(p.t_ms for n, p in parts.items() if n != "gpu idle")
    share = {n: p.t_ms / busy for n, p in parts.items() if n != "gpu idle"}
    assert share["gemm bfloat16"] == pytest.approx(400 / 750, abs=0.02)
    assert share["attention"] == pytest.approx(200 / 750, abs=0.02)
    assert share["elementwise/reduction"] == pytest.approx(100 / 750, abs=0.02)
    assert share["unrecognised"] == pytest.approx(50 / 750, abs=0.02)
    note = next(n for n in ex.notes if n.startswith("unrecognised kernels"))
    assert "my_custom_kernel_v2" in note and "0.25 ms/step" in note


def test_ranks_and_examine_count_the_same_non_nccl_communication(tmp_path):
    from hwlab.traces.kineto import read_trace
    comm = [("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*)", 300.0),
            ("void c10d::symmetric_memory::multimem_all_reduce_kernel<c10::BFloat16, 16, 8>", 100.0)]
    kernels = comm + [("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 500.0)]
    path = _gpu_only_trace(tmp_path / "ep.json.gz", kernels)
    rt = read_trace(path)
    assert sorted((c.name, c.dur_us) for c in rt.collectives) == [("allreduce", 100.0), ("alltoall", 300.0)]
    from hwlab.examine.from_trace import examine_trace
    parts = {p.name: p for p in examine_trace(path).parts.parts}
    assert parts["communication"].t_ms == pytest.approx(0.4, abs=1e-6)


def test_an_expert_parallel_step_counts_every_deepep_kernel_as_communication(tmp_path):
    """DeepEP's notify / cached-notify handshakes sit beside its dispatch and combine on the
    communication stream: a GPU-only step of them and a GEMM reads as communication in examine
    (nothing unrecognised) and as the same collectives' time in the ranks reader."""
    from hwlab.examine.from_trace import examine_trace
    from hwlab.traces.kineto import read_trace
    ep = [("void dpsk::ep::internode::notify_dispatch<false, 8>(int const*, long*, int)", 90.0),
          ("void dpsk::ep::internode::dispatch<false, 8, false, 8>(int4*, float*, long*)", 300.0),
          ("void dpsk::ep::internode::cached_notify<false>(int, int, int, int, int*, int)", 60.0),
          ("void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*, float*)", 250.0)]
    gemm = [("void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_ptp128c::GemmKernel>(x::Params)", 300.0)]
    path = _gpu_only_trace(tmp_path / "ep_step.json.gz", ep + gemm)
    parts = {p.name: p for p in examine_trace(path).parts.parts}
    assert "unrecognised" not in parts
    assert parts["communication"].t_ms == pytest.approx(0.7, abs=1e-6)
    assert sum(c.dur_us for c in read_trace(path).collectives) == pytest.approx(700.0)


def test_a_hand_written_triton_gemm_is_gemm_time_beside_inductor_kernels(tmp_path):
    """A Triton GEMM outside Inductor's naming (tritonbench's ``triton_gemm_kernel``) is GEMM-class
    time; Inductor's fused pointwise kernel beside it stays ``triton/compiled``."""
    from hwlab.examine.from_trace import examine_trace
    kernels = [("triton_gemm_kernel_0d1d2d", 400.0), ("triton_poi_fused_add_mul_0", 100.0),
               ("sm90_xmma_gemm_f16f16_f32", 100.0)] * 3
    parts = {p.name: p for p in examine_trace(_gpu_only_trace(tmp_path / "tgemm.json.gz", kernels)).parts.parts}
    gemm_ms = sum(p.t_ms for n, p in parts.items() if n.startswith("gemm"))
    assert gemm_ms == pytest.approx(1.5, abs=1e-6)
    assert parts["triton/compiled"].t_ms == pytest.approx(0.3, abs=1e-6)
