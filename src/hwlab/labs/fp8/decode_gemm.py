"""Lab 4's decode GEMM: a few static-scaled FP8 activation rows times an FP8 weight, in one
Triton kernel (``y = (x @ w.T) * x_scale * w_scale``, bf16 out).

Why the kit has its own next to cuBLAS's ``torch._scaled_mm``: at a decode step's 4-16 rows a
GEMM streams its weight once, so its time is a fixed part (launch, the first bytes' latency, the
last wave) plus bytes / rate; cuBLAS's FP8 GEMM pays several microseconds of the fixed part on
every call, a large share of a small weight's time. :class:`.model.QLinear` uses this kernel
only where :data:`USE_KIT_GEMM` says so, on the shapes where it measured faster in the decode step
(``docs/lab04-tuning.md``).

The kernel, one program per ``BN`` weight rows (output columns):

* the weight tile ``[BN, BK]`` and the activation tile ``[BM, BK]`` are loaded ``STAGES`` deep
  through shared memory (``tl.range(..., num_stages=STAGES)``: the loads of later steps are in
  flight while this step multiplies), the product on tensor cores in FP8 with a float32 sum;
* ``SWAP``: the weight tile is the MMA's first operand (``BN`` >= 64 rows, the smallest M of
  Hopper's warpgroup MMA) and the few activation rows the second, so no tensor-core row is
  spent on padding; otherwise the rows are first, padded to 16;
* ``SPLIT_K`` > 1: the K axis is shared by that many programs, which add their float32 sums into
  a workspace; the last to arrive (a counter) writes ``y`` and zeroes both for the next call. It
  gives a narrow output (few ``BN`` tiles) enough programs to fill the GPU. ``SERIAL_K`` (the
  lab's tiles): each slice stores its partial to a slab of its own, and the last to arrive sums the
  slabs in slice order: plain stores in place of one float32 atomic per element, the same sum on
  every call, where float32 atomics add in arrival order (and a tile summing with them was
  measured wrong now and then). The atomic reduction stays for that comparison;
* ``GELU_Q`` (``decode_mm``'s ``gelu_out_scale``): the epilogue applies exact GELU to the float32
  product and writes it in FP8 with the next layer's static scale, clamped to +-448, where
  :func:`.quant.quant_static` (``gelu=True``) would read the bf16 product back in a kernel of its
  own. Measured equal to that kernel in the decode step, so the lab leaves it off
  (:data:`.model.GELU_IN_GEMM`);
* ``PREFETCH_K`` > 0: before anything else the program asks L2 for the first ``PREFETCH_K``
  columns of its weight rows (``prefetch.global.L2``). With PDL (:func:`.quant.pdl_args`) that
  happens before the wait for the previous kernel: the weight is not that kernel's output, so
  its reads may start while that kernel drains, which is where a fixed part can hide.
"""
from __future__ import annotations

import torch

from hwlab.core import tritonenv  # interpreter on CPU; must precede triton
import triton
import triton.language as tl

from hwlab.labs.fp8 import workspace as W
from hwlab.labs.fp8.quant import FP8, fence_gpu, gelu, pdl_args, quant_static_ref, use_triton_for

#: whether :class:`.model.QLinear` runs this kernel for decode-shaped ``fp8_static`` calls (at most
#: :data:`MAX_ROWS` rows on a GPU) on the weight shapes :data:`CONFIGS` names (:func:`takes`),
#: instead of cuBLAS's FP8 GEMM: on, since an A/B of the decode step measured it faster with every
#: shape here
USE_KIT_GEMM = True
#: most activation rows a call takes here; a prefill's rows go to cuBLAS
MAX_ROWS = 16
#: the tile when the caller names none; :data:`CONFIGS` holds the measured choice per shape
DEFAULT_CONFIG = {"SWAP": True, "BN": 64, "BK": 256, "STAGES": 4, "SPLIT_K": 1, "PREFETCH_K": 0, "SERIAL_K": False,
                  "num_warps": 4}
#: (N, K) -> tile, for each weight shape where this kernel measured faster than cuBLAS in the
#: decode step (tiles swept in CUDA graphs over 8 layers' weights, larger
#: than L2, as a step streams them); a shape not here stays on cuBLAS
CONFIGS: dict[tuple[int, int], dict] = {
    (3 * 4096, 4096): {"SWAP": True, "BN": 64, "BK": 128, "STAGES": 6, "SPLIT_K": 1},  # qkv
    (4096, 4096): {"SWAP": True, "BN": 64, "BK": 128, "STAGES": 6, "SPLIT_K": 4, "SERIAL_K": True},  # out, connector
    (14336, 4096): {"SWAP": True, "BN": 64, "BK": 128, "STAGES": 6, "SPLIT_K": 1},  # up
    (4096, 14336): {"SWAP": True, "BN": 64, "BK": 128, "STAGES": 6, "SPLIT_K": 4, "SERIAL_K": True},  # down
}
#: FP8 tensor-core products are added into the float32 sum at least every this many K columns:
#: Hopper's FP8 MMA keeps its own running sum at reduced precision, and Triton's default on sm_90
#: lets it run the whole K (cuBLAS promotes too);
#: every 128 columns is DeepGEMM's choice, and costs nothing a memory-bound GEMM can see
ACC_K = 128
#: the interpreter runs any tile; a small one keeps CPU tests quick
CPU_CONFIG = {"SWAP": False, "BN": 16, "BK": 32, "STAGES": 1, "SPLIT_K": 1, "PREFETCH_K": 0, "SERIAL_K": False,
              "num_warps": 4}


@triton.jit
def _prefetch_l2(ptrs):
    """Ask L2 for the 128-byte lines at ``ptrs`` (one address per line); nothing is returned."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _epilogue(v, scale, os_ptr, GELU_Q: tl.constexpr):
    """The float32 sum ``v`` scaled; ``GELU_Q``: then exact GELU (as ``F.gelu``) and the static
    FP8 requant with the scale at ``os_ptr`` (as :func:`.quant.quant_static`)."""
    v = v * scale
    if GELU_Q:
        v = gelu(v)
        v = tl.minimum(tl.maximum(v / tl.load(os_ptr), -448.0), 448.0)
    return v


@triton.jit
def _fp8_decode_gemm_kernel(x_ptr, w_ptr, xs_ptr, ws_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K,
                      stride_xm, stride_wn, stride_ym,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr,
                      SWAP: tl.constexpr, SPLIT_K: tl.constexpr, PREFETCH_K: tl.constexpr, EVEN_K: tl.constexpr,
                      ACC_K: tl.constexpr, FENCE: tl.constexpr, PDL: tl.constexpr, SERIAL_K: tl.constexpr = False,
                      os_ptr=None, GELU_Q: tl.constexpr = False):
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rn = pid_n * BN + tl.arange(0, BN)
    rm = pid_m * BM + tl.arange(0, BM)
    rk = tl.arange(0, BK)
    k_len = tl.cdiv(tl.cdiv(K, SPLIT_K), BK) * BK  # this program's K slice, whole BK steps
    k_lo = pid_k * k_len
    k_hi = tl.minimum(k_lo + k_len, K)
    if PREFETCH_K > 0:  # the weight is no earlier kernel's output: ask for it before waiting
        lines = tl.minimum(k_lo + tl.arange(0, PREFETCH_K // 128) * 128, k_hi - 1)  # inside the slice
        _prefetch_l2(w_ptr + tl.minimum(rn, N - 1)[:, None] * stride_wn + lines[None, :])
    if PDL:
        tl.extra.cuda.gdc_wait()  # the activation is the previous kernel's output
        tl.extra.cuda.gdc_launch_dependents()
    if SWAP:
        acc = tl.zeros((BN, BM), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=STAGES):
        kk = k0 + rk
        if EVEN_K:  # no mask along K: the loads stay 16-byte vectors, which the pipeline needs
            w = tl.load(w_ptr + rn[:, None] * stride_wn + kk[None, :], mask=rn[:, None] < N, other=0.0)
            x = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=rm[:, None] < M, other=0.0)
        else:
            w = tl.load(w_ptr + rn[:, None] * stride_wn + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < k_hi),
                        other=0.0)
            x = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < k_hi),
                        other=0.0)
        if SWAP:  # the FP8 products summed in float32 every ACC_K columns, as cuBLAS's (not fast) mode
            acc = tl.dot(w, tl.trans(x), acc, max_num_imprecise_acc=ACC_K)
        else:
            acc = tl.dot(x, tl.trans(w), acc, max_num_imprecise_acc=ACC_K)
    if SWAP:
        part = tl.trans(acc)
    else:
        part = acc
    out = (rm[:, None] < M) & (rn[None, :] < N)
    scale = tl.load(xs_ptr) * tl.load(ws_ptr)
    y_off = rm[:, None] * stride_ym + rn[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptr + y_off, _epilogue(part, scale, os_ptr, GELU_Q).to(y_ptr.dtype.element_ty), mask=out)
    else:  # the K slices meet in the workspace; the slice that counts in last writes y
        tile = pid_m * tl.num_programs(0) + pid_n
        p_off = rm[:, None] * N + rn[None, :]
        slab = tl.num_programs(1) * BM * N  # one K slice's partials (SERIAL_K)
        if SERIAL_K:  # a slab of its own per K slice: plain stores, summed in slice order below
            tl.store(part_ptr + pid_k * slab + p_off, part, mask=out)
        else:  # one float32 atomic per element into the zeroed workspace
            tl.atomic_add(part_ptr + p_off, part, mask=out)
        if FENCE:  # each thread's writes performed GPU-wide before the counter moves: the fence of
            fence_gpu(rm)  # CUDA's threadfence-reduction pattern
        tl.debug_barrier()  # every thread past its fence before the counter's release
        if tl.atomic_add(cnt_ptr + tile, 1) == SPLIT_K - 1:  # acq_rel: the other slices' writes are visible
            if SERIAL_K:
                total = tl.zeros((BM, BN), dtype=tl.float32)
                for s in tl.static_range(SPLIT_K):
                    total += tl.load(part_ptr + s * slab + p_off, mask=out, other=0.0, cache_modifier=".cg")
            else:
                total = tl.load(part_ptr + p_off, mask=out, other=0.0, cache_modifier=".cg")
                tl.store(part_ptr + p_off, tl.zeros((BM, BN), dtype=tl.float32), mask=out)  # zero for the next call
            tl.store(y_ptr + y_off, _epilogue(total, scale, os_ptr, GELU_Q).to(y_ptr.dtype.element_ty), mask=out)
            tl.store(cnt_ptr + tile, 0)


def decode_mm_ref(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                  out_dtype=torch.bfloat16, gelu_out_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The same product in float32: ``(x @ w.T) * x_scale * w_scale``, cast to ``out_dtype``;
    with ``gelu_out_scale``, GELU of it quantized to FP8 with that static scale instead."""
    y = (x.float() @ w.float().t()) * (x_scale.float() * w_scale.float())
    if gelu_out_scale is not None:
        return quant_static_ref(torch.nn.functional.gelu(y), gelu_out_scale)
    return y.to(out_dtype)


def takes(n: int, k: int) -> bool:
    """Whether a decode call on an (N, K) FP8 weight runs here: :data:`USE_KIT_GEMM` on and the
    shape measured (in :data:`CONFIGS`)."""
    return USE_KIT_GEMM and (n, k) in CONFIGS


def config_for(n: int, k: int) -> dict:
    """The tile for an (N, K) weight: the measured one (:data:`CONFIGS`) or :data:`DEFAULT_CONFIG`;
    in the interpreter, :data:`CPU_CONFIG`."""
    if tritonenv.INTERPRETED:
        return CPU_CONFIG
    return CONFIGS.get((n, k), DEFAULT_CONFIG)


def decode_mm(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
              config: dict | None = None, out_dtype=torch.bfloat16, use_triton: bool | None = None,
              gelu_out_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``(x @ w.T) * x_scale * w_scale`` for activation rows ``x`` (M, K) and a weight ``w`` (N, K),
    both FP8 on a GPU (the interpreter takes fp16/fp32, the same code), one float32 scale each.
    ``config``: the tile (keys of :data:`DEFAULT_CONFIG`; default :func:`config_for`).
    ``gelu_out_scale``: return GELU of the product in FP8 with this static scale (the next layer's
    input, ``GELU_Q`` in the module docstring); ``out_dtype`` is then FP8."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"decode_mm wants x (M, K) and w (N, K); got {tuple(x.shape)} and {tuple(w.shape)}")
    if not use_triton_for(x, use_triton):
        return decode_mm_ref(x, w, x_scale, w_scale, out_dtype, gelu_out_scale)
    gelu_q = gelu_out_scale is not None
    out_dtype = FP8 if gelu_q else out_dtype
    M, Kd = x.shape
    N = w.shape[0]
    c = {**DEFAULT_CONFIG, **(config or config_for(N, Kd))}
    x = x if x.stride(1) == 1 else x.contiguous()
    w = w if w.stride(1) == 1 else w.contiguous()
    y = torch.empty((M, N), dtype=out_dtype, device=x.device)
    BM = 16
    grid = (triton.cdiv(N, c["BN"]), triton.cdiv(M, BM), c["SPLIT_K"])
    serial = bool(c.get("SERIAL_K")) and c["SPLIT_K"] > 1
    part, cnt = (_workspace(x.device, grid[1] * BM * N * (c["SPLIT_K"] if serial else 1), grid[0] * grid[1], serial)
                 if c["SPLIT_K"] > 1 else (y, y))
    _fp8_decode_gemm_kernel[grid](x, w, x_scale.reshape(1).float(), w_scale.reshape(1).float(), y, part, cnt, M, N, Kd,
                            x.stride(0), w.stride(0), y.stride(0), BM=BM, BN=c["BN"], BK=c["BK"],
                            STAGES=c["STAGES"], SWAP=c["SWAP"], SPLIT_K=c["SPLIT_K"], PREFETCH_K=c["PREFETCH_K"],
                            EVEN_K=Kd % (c["BK"] * c["SPLIT_K"]) == 0, ACC_K=min(c["BK"], c.get("ACC_K", ACC_K)),
                            FENCE=c.get("FENCE", not tritonenv.INTERPRETED),  # the interpreter: one program at a time
                            SERIAL_K=serial, os_ptr=gelu_out_scale.reshape(1).float() if gelu_q else None,
                            GELU_Q=gelu_q, num_warps=c["num_warps"], **pdl_args(x))
    return y


def _workspace(device, n_floats: int, n_tiles: int, serial: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The split-K float32 sums and int32 tile counters (:func:`.workspace.zeroed`): the kernel
    leaves both zeroed, so calls and CUDA-graph replays reuse them. ``serial``: one slab of
    partials per K slice instead (each overwritten by every call; its own buffer, since the
    atomic sums need theirs zero)."""
    return (W.zeroed(device, "splitk_slabs" if serial else "splitk_part", n_floats, torch.float32),
            W.zeroed(device, "splitk_cnt", n_tiles, torch.int32))


__all__ = ["CONFIGS", "DEFAULT_CONFIG", "FP8", "MAX_ROWS", "USE_KIT_GEMM", "config_for", "decode_mm", "decode_mm_ref",
           "takes"]
