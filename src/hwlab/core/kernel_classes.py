"""What a device kernel is, from the kernel itself: one classification for every reader.

``hwlab examine --trace``, ``hwlab ranks --traces`` and the live profile (``hwlab examine fn``)
all ask this module, so a kernel is never a GEMM for one report and elementwise (or compiled, or
not communication) for the next. The class comes from the kernel's **name** (and its trace
category, for memcpy / memset), across vendors and libraries; the aten op that launched it is
used by the callers only where the name says nothing, and is never required: a GPU-only trace,
CUDA / HIP graph replay and kernels whose launch record is missing classify the same as a fully
linked trace.

Rules, first match wins (each rule's fragments are the lower-cased names the libraries write):

1. **memcpy / memset**: the ``gpu_memcpy`` / ``gpu_memset`` categories, ``Memcpy ...`` /
   ``Memset ...`` names, HIP's ``__amd_rocclr_copyBuffer`` / ``fillBuffer`` blits.
2. **communication** (:data:`COMM_MARKS`): NCCL / RCCL / MSCCL kernels, NVSHMEM, expert-parallel
   all-to-all libraries (DeepEP, pplx; DeepEP's ``intranode`` / ``internode`` / ``internode_ll``
   namespaces whole, under any outer namespace, so its notify and cached-notify handshakes count
   with its dispatch and combine), multimem and one-/two-shot all-reduce (symmetric memory),
   custom all-reduce (vLLM ``cross_device_reduce``, quick-reduce), Transformer Engine userbuffers.
3. **Inductor's Triton kernels** (``triton_poi`` / ``triton_red`` / ``triton_per`` / ``triton_tem``
   / ``triton_for`` ..., the older ``triton_fused_`` / ``triton__``): templates of a matmul are GEMMs,
   of an attention are attention, the rest are ``triton/compiled`` (what they compute is fused and
   not named). A hand-written Triton kernel (``triton_gemm_kernel``, ``triton_layernorm_fwd``)
   names what it computes, so it goes through the rules below like any other kernel, and only a
   name none of them recognises is ``triton/compiled``.
4. **attention** (:data:`ATTENTION_MARKS`): FlashAttention 2/3, FlashInfer, FlashMLA, CK-tile
   and aiter FMHA, cuDNN SDPA, xFormers / mem-efficient, PyTorch's ``pytorch_flash``, paged attention.
5. **norm / reduction** before convolution (MIOpen and cuDNN batch-norm kernels carry the
   library's name), **copy / transpose** before convolution (cuDNN layout kernels).
6. **conv** (:data:`CONV_MARKS`): cuDNN engines, MIOpen, implicit-GEMM / Winograd / FFT kernels.
7. **gemm** (:data:`GEMM_MARKS`): cuBLAS / cuBLASLt (``nvjet``, ``*gemm*``, ``xmma_gemm``),
   CUTLASS, hipBLASLt / Tensile (``Cijk_``), rocBLAS, Composable Kernel GEMMs, DeepGEMM, Triton
   matmul kernels, ROCm skinny GEMMs (``wvSplitK``). cuBLAS split-K reductions are reductions.
8. **quant/dequant**, **gather/scatter** (index, embedding, sort, top-k), **optimizer**
   (``multi_tensor_apply``, fused Adam), **elementwise** (functors, activations, MIOpen tensor
   ops, and any other ``at::native::`` kernel: PyTorch's own kernels that no rule above took are
   elementwise or pointwise-reduction work).

Anything else is :data:`UNRECOGNISED`: reported with its name and time, never put in a class.

**Tensor cores / MFMA** (``tensor_core``, GEMM-class kernels only): True where the name carries an
MMA instruction or tile (NVIDIA ``tensorop``, ``hmma``, ``wgmma``, ``884`` / ``1688`` / ``16816``
tiles, xmma's ``tensor16x8x16`` instruction shape, ``nvjet``, ``tcgen05``; AMD Tensile's ``_MI<m>x<n>`` tile, CK's ``xdl`` / ``wmma`` /
``mfma``); False where it names a SIMT path (``sgemm`` / ``dgemm`` / ``gemv`` without an MMA
mark, ``scudnn``, a Tensile tile without ``_MI``); True for a GEMM-class kernel in bf16, tf32,
fp8 or fp4 (the libraries run those types on the MMA units only); False for one in fp32 without an
MMA mark; None where the name says neither.

**Precision** from the name: fp4 (``mxfp4``, ``nvfp4``, ``e2m1``) is checked before fp8
(``e4m3``, ``e5m2``, ``f8f8``, cuBLASLt ``qqtst``, ``fp8``), so a bf16 x MXFP4 kernel is not an
FP8 GEMM; Tensile's data-type code (``_BBS_``, ``_HHS_``, ``_SB_``, ``_F8..``); then bf16 /
fp16 / tf32 (``s1688`` / ``s16816`` tensorop = fp32 data on the TF32 path) / fp32.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

UNRECOGNISED = "unrecognised"
#: the kernel classes (plus :data:`UNRECOGNISED`)
KERNEL_CLASSES = ("communication", "attention", "gemm", "conv", "quant/dequant", "gather/scatter",
                  "copy/concat", "memcpy", "memset", "norm/reduction", "optimizer", "elementwise",
                  "triton/compiled")
#: kernel class -> the part of a step it belongs to (:data:`hwlab.core.profiling.PART_CLASSES`):
#: convolutions are GEMM-class work (implicit GEMM, Winograd: the same MMA / FMA units)
PART_OF = {"communication": "communication", "attention": "attention", "gemm": "gemm", "conv": "gemm",
           "quant/dequant": "quant/dequant", "gather/scatter": "gather/scatter", "copy/concat": "copy/concat",
           "memcpy": "copy/concat", "memset": "copy/concat", "norm/reduction": "elementwise/reduction",
           "optimizer": "elementwise/reduction", "elementwise": "elementwise/reduction",
           "triton/compiled": "triton/compiled", UNRECOGNISED: UNRECOGNISED}
#: kernel precision -> the dtype name a GEMM part carries (``gemm bfloat16``); tf32 is fp32 data
PRECISION_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "tf32": "float32", "fp32": "float32",
                   "fp8": "float8_e4m3fn", "fp64": "float64", "int8": "int8", "fp4": "fp4"}

COMM_MARKS = ("nccl", "rccl", "msccl", "nvshmem", "deep_ep", "deepep", "pplx", "all2all", "alltoall",
              "all_to_all", "allreduce", "all_reduce", "allgather", "all_gather", "reducescatter",
              "reduce_scatter", "multimem", "one_shot_", "two_shot_", "cross_device_reduce", "custom_ar",
              "quickreduce", "quick_all_reduce", "userbuffers", "onerank", "intranode::", "internode::",
              "internode_ll::", "ep_dispatch", "ep_combine", "moe_dispatch", "moe_combine", "c10d::")
ATTENTION_MARKS = ("flash_fwd", "flash_bwd", "flash::", "flash_attn", "flashattn", "flashinfer", "flashmla",
                   "fmha", "attention", "attn", "sdpa", "mha_fwd", "mha_bwd", "_mha", "xformers",
                   "pytorch_flash", "mem_eff", "paged_attention", "flash_decod", "mla_decode", "sage_fwd",
                   "sageattn")
NORM_MARKS = ("batchnorm", "batch_norm", "bn_fw", "bn_bw", "layernorm", "layer_norm", "rmsnorm", "rms_norm",
              "groupnorm", "group_norm", "instancenorm", "instance_norm", "softmax", "cuapplylayernorm",
              "cucomputegradinput", "cucomputepartgradgammabeta", "welford", "lrn", "splitkreduce",
              "reduce_kernel", "reduce", "cross_entropy", "nll_loss", "log_softmax", "sum_kernel", "mean_kernel",
              "norm_kernel", "argmax", "argmin", "cumsum", "scan", "nllcriterion")
COPY_MARKS = ("nchwtonhwc", "nhwctonchw", "transpose", "permute", "copy", "catarraybatchedcopy", "cat_",
              "concat", "contiguous", "im2col", "col2im", "kvcache", "kv_cache", "reshape_and_cache", "fillfunctor", "fill_kernel", "fillbuffer",
              "__amd_rocclr", "pad_kernel", "reflection_pad", "replication_pad", "upsample")
CONV_MARKS = re.compile(r"conv(?!ert)|[sh]cudnn|winograd|wgrad|dgrad|fprop|igemm|miopen|implicit_convolve|"
                        r"sp3asmconv|gridwise_convolution|naive_conv|fft[123]d_|flip_filter", re.I)
GEMM_MARKS = ("gemm", "gemv", "nvjet", "cutlass", "xmma", "cijk_", "rocblas", "hipblaslt", "matmul", "wvsplitk",
              "deep_gemm", "_mm_kernel", "bmm_kernel", "cublas", "tcgen05", "wgmma")
QUANT_MARKS = ("dequant", "quantize", "_quant", "quant_", "cast_fp8", "to_fp8", "fp8_cast", "cast_transpose",
               "_amax", "amax_", "scaled_fp8")
GATHER_MARKS = ("index", "indices", "gather", "scatter", "embedding", "embbag", "radixsort", "sort", "topk", "unique",
                "moe_align", "masked_select", "nonzero", "histogram", "take_kernel", "routing", "bitmatrix")
#: optimizer kernels: a regex, so ``lamb`` does not match the ``lambda`` in a functor's name
OPTIMIZER_MARKS = re.compile(r"multi_tensor_apply|adam|(?<![a-z])lamb(?!da)|(?<![a-z])sgd|adagrad|momentum")
ELEMENTWISE_MARKS = ("elementwise", "vectorized", "functor", "activation", "gelu", "silu", "swiglu", "relu",
                     "act_and_mul", "rotary", "rope_", "_rope", "dropout", "bias", "threshold", "pointwise", "subtensorop", "optensor",
                     "sigmoid", "tanh", "exp_kernel", "where_kernel", "clamp", "at::native::", "at_native",
                     "binary_", "unary_", "mul_kernel", "add_kernel", "fused_add", "scale_kernel", "scalepackedtensor")

#: MMA / MFMA marks (tensor cores); SIMT GEMM marks (no MMA)
TC_MARKS = ("tensorop", "hmma", "imma", "wgmma", "gmma", "884", "1688", "16816", "16832", "nvjet", "tcgen05",
            "umma", "xdl", "wmma", "mfma", "qqtst")
_TENSILE_MI = re.compile(r"_mi\d+x\d+")
#: cuBLAS xmma kernels name their MMA instruction shape (``..._tensor16x8x16_...``)
_MMA_SHAPE = re.compile(r"tensor\d+x\d+x\d+")
_TENSILE_TYPE = re.compile(r"cijk_[a-z]+_[a-z]+_([a-z0-9]+?)_")
SIMT_MARKS = ("sgemm", "dgemm", "gemv", "scudnn", "gemmsn", "gemmk1", "implicit_convolve")
#: Inductor's kernel names: ``triton_`` + the first three letters of its kind (pointwise, reduction,
#: persistent reduction, template, foreach, split scan, cooperative, unknown), or the older
#: ``triton_fused_...`` / ``triton__0d1d...``; any other ``triton_...`` is a hand-written kernel
_INDUCTOR = re.compile(r"triton_(poi|red|per|tem|for|spl|coo|unk|fused)_|triton__")


@dataclass(frozen=True)
class KernelKind:
    """One kernel's class (:data:`KERNEL_CLASSES` or :data:`UNRECOGNISED`), the rule that matched
    (its fragment, so a reader can check it), tensor-core use and precision (module doc)."""
    cls: str
    rule: str
    tensor_core: bool | None = None
    precision: str | None = None

    @property
    def part(self) -> str:
        return PART_OF[self.cls]

    @property
    def gemm_class(self) -> bool:
        return self.cls in ("gemm", "conv")

    @property
    def recognised(self) -> bool:
        return self.cls != UNRECOGNISED


def _first(n: str, marks) -> str | None:
    return next((m for m in marks if m in n), None)


def precision_of(n: str) -> str | None:
    """The data precision a kernel name carries (module doc), lower-cased name in."""
    if any(m in n for m in ("mxfp4", "nvfp4", "e2m1", "fp4")):
        return "fp4"
    if any(m in n for m in ("e4m3", "e5m2", "f8f8", "qqtst", "fp8", "float8")):
        return "fp8"
    m = _TENSILE_TYPE.search(n)
    if m:
        code = m.group(1)
        for pre, p in (("f8", "fp8"), ("b", "bf16"), ("h", "fp16"), ("s", "fp32"), ("d", "fp64"),
                       ("i8", "int8"), ("4xi8", "int8")):
            if code.startswith(pre):
                return "tf32" if p == "fp32" and "xf32" in n else p
    if "bf16" in n or "bfloat16" in n:
        return "bf16"
    if any(m in n for m in ("f16", "fp16", "half", "h884", "h1688", "h16816", "hgemm", "hcudnn")):
        return "fp16"
    if "tf32" in n or ("tensorop" in n and re.search(r"s1688|s16816", n)):
        return "tf32"
    if any(m in n for m in ("sgemm", "scudnn", "float", "f32", "fp32")):
        return "fp32"
    if "dgemm" in n or "double" in n:
        return "fp64"
    if "i8816" in n or "int8" in n or "imma" in n:
        return "int8"
    return None


def tensor_core_of(n: str) -> bool | None:
    """MMA / MFMA use of a GEMM-class kernel from its lower-cased name (module doc)."""
    if _first(n, TC_MARKS) or _TENSILE_MI.search(n) or _MMA_SHAPE.search(n):
        return True
    if n.startswith("cijk_"):  # a Tensile tile without _MI runs on the vector ALUs
        return False
    if _first(n, SIMT_MARKS):
        return False
    p = precision_of(n)
    if p in ("bf16", "tf32", "fp8", "fp4"):
        return True  # the libraries run these types on the MMA units only
    if p == "fp32":
        return False  # fp32 data without a tf32 / MMA mark: the CUDA cores (cuDNN's <float> engines)
    return None


@functools.lru_cache(maxsize=1 << 16)  # traces repeat a few hundred names thousands of times
def classify_kernel(name: str, cat: str | None = None) -> KernelKind:
    """The class of one device kernel from its name and trace category (module doc)."""
    n = (name or "").lower().replace("fbgemm", "fbg_")  # FBGEMM's namespace names no GEMM
    c = (cat or "").lower()
    if c in ("gpu_memcpy", "memcpy") or n.startswith("memcpy"):
        return KernelKind("memcpy", "memcpy")
    if c in ("gpu_memset", "memset") or n.startswith("memset"):
        return KernelKind("memset", "memset")
    if n.startswith("__amd_rocclr_copy"):
        return KernelKind("memcpy", "__amd_rocclr_copy")
    if n.startswith("__amd_rocclr_fill"):
        return KernelKind("memset", "__amd_rocclr_fill")
    m = _first(n, COMM_MARKS)
    if m:
        return KernelKind("communication", m)
    if _INDUCTOR.match(n):  # Inductor's generated kernels
        if n.startswith("triton_tem") and re.search(r"_(mm|bmm|addmm|baddbmm|convolution|conv)(_|\d|$)", n):
            return KernelKind("gemm", "triton_tem (matmul template)", None, precision_of(n))
        if n.startswith("triton_tem") and ("attention" in n or "flex" in n):
            return KernelKind("attention", "triton_tem (attention template)")
        return KernelKind("triton/compiled", "triton_ (Inductor)")
    m = _first(n, ATTENTION_MARKS)
    if m:
        return KernelKind("attention", m, tensor_core_of(n), precision_of(n))
    if "cast_transpose" not in n and not _first(n, ("gemm", "cijk_", "nvjet")):
        for cls, marks in (("norm/reduction", NORM_MARKS[:16]), ("copy/concat", COPY_MARKS[:4])):
            m = _first(n, marks)  # batch-norm and layout kernels of cuDNN / MIOpen, before conv
            if m:
                return KernelKind(cls, m)
    cm = CONV_MARKS.search(n)
    if cm:
        return KernelKind("conv", cm.group(0), tensor_core_of(n), precision_of(n))
    m = _first(n, GEMM_MARKS) or ("bmm_" if n.startswith("bmm_") else None)  # TensorRT-LLM's batched GEMMs
    if m and not _first(n, ("splitkreduce", "reduce_kernel")):
        return KernelKind("gemm", m, tensor_core_of(n), precision_of(n))
    if "reduce_kernel" in n:  # PyTorch's reduction template, whatever its functor's name holds
        return KernelKind("norm/reduction", "reduce_kernel")
    om = OPTIMIZER_MARKS.search(n)
    for cls, marks in (("quant/dequant", QUANT_MARKS), ("gather/scatter", GATHER_MARKS),
                       ("optimizer", (om.group(0),) if om else ()), ("copy/concat", COPY_MARKS),
                       ("norm/reduction", NORM_MARKS), ("elementwise", ELEMENTWISE_MARKS)):
        m = _first(n, marks)
        if m:
            return KernelKind(cls, m)
    if n.startswith("triton"):  # a pre-Inductor-naming Triton kernel (``triton__0d1d2d``)
        return KernelKind("triton/compiled", "triton")
    return KernelKind(UNRECOGNISED, "")


def is_communication(name: str) -> bool:
    """A communication kernel by name (rule 2), NCCL or not."""
    return classify_kernel(name).cls == "communication"


#: communication kernel name fragments -> the collective they run (first match wins)
COLLECTIVE_OF = (("alltoall", "alltoall"), ("all_to_all", "alltoall"), ("all2all", "alltoall"),
                 ("dispatch", "alltoall"), ("combine", "alltoall"), ("sendrecv", "sendrecv"),
                 ("reduce_scatter", "reducescatter"), ("reducescatter", "reducescatter"),
                 ("allgather", "allgather"), ("all_gather", "allgather"), ("allreduce", "allreduce"),
                 ("all_reduce", "allreduce"), ("cross_device_reduce", "allreduce"), ("broadcast", "broadcast"))


def collective_of(name: str) -> str:
    """The collective a non-NCCL communication kernel runs, by name, else ``comm``."""
    n = name.lower()
    return next((c for m, c in COLLECTIVE_OF if m in n), "comm")


def unrecognised_table(items, top_n: int = 10) -> list[dict]:
    """The unrecognised kernels among ``(name, us)`` pairs: name (cut to 160 characters), total µs
    and count, the longest first, at most ``top_n``."""
    per: dict[str, list] = {}
    for name, us in items:
        if name and not classify_kernel(name).recognised:
            row = per.setdefault(name[:160], [0.0, 0])
            row[0] += us
            row[1] += 1
    return [{"name": k, "us": v[0], "count": v[1]}
            for k, v in sorted(per.items(), key=lambda kv: -kv[1][0])[:top_n]]
