"""Lab 4's FP8 (e4m3) conversion kernels: quantize an activation, dequantize a weight (the
fallback), and the decode step's RMSNorm and GELU with the next GEMM's requant fused in.

Each op has a Triton kernel (used on a GPU) and a torch reference of the same arithmetic (used
on a CPU, where the Triton interpreter computes bf16 wrongly, and by the tests, which run the
kernels in the interpreter in fp16/fp32 against the references).

Bytes per element, the lesson of Lab 4 (decode is memory-bound):

* :func:`dequant_rows` reads 1 B (FP8) and writes 2 B (bf16); the GEMM that follows reads the
  2 B again: 5 B per weight per step, against 2 B for a bf16 weight and 1 B for a weight an
  FP8 GEMM reads directly.
* :func:`quant_tensor` one activation pass for the amax, one to scale and cast: the requant a
  dynamically scaled FP8 GEMM needs in front of it. :func:`quant_static` (a calibrated scale)
  needs only the second pass, and :func:`rmsnorm` / ``quant_static(gelu=True)`` fold it into
  the pass that produces the activation.

Kernel names avoid the words the profiler classifier uses for GEMMs ("gemm", "fp8", "e4m3",
...), so the hit-rate count sees only real GEMM kernels; :mod:`.profile` counts these as
"quant/dequant" by the ``_quant_``, ``_row_amax`` and ``_dequant_rows`` in their names.
"""
from __future__ import annotations

import torch

from hwlab.core import tritonenv  # interpreter on CPU; must precede triton
import triton
import triton.language as tl

FP8 = torch.float8_e4m3fn
#: the largest finite e4m3 value: a scale maps amax to it, anything beyond saturates
FP8_MAX = 448.0
#: elements per program of the row kernels (a row wider than this loops)
BLOCK = 1024
#: warps per program of the decode step's norm kernels (one program per row, a 4096-wide row
#: read at once): twice Triton's default, so each thread waits on half the loads; 8 measured faster
#: than 4 and 16
ROW_WARPS = 8


#: programmatic dependent launch (PDL, Hopper and later) for the decode step's own kernels: one
#: launched with it may be scheduled while the kernel before it drains, and waits
#: (``griddepcontrol.wait``) for that kernel's writes before it reads anything, so the gap
#: between two kernels shrinks while the order of their memory effects stays the stream's. On
#: (:func:`set_pdl` switches it): with the kit's own GEMM (which asks for the next launch as it
#: starts) the step measured faster in every bucket, the attention's kernels left out
#: (:data:`.attention.PDL_ATTENTION`); with cuBLAS's GEMMs between the kit's kernels it was slower.
_PDL = {"on": True}


def set_pdl(on: bool) -> bool:
    """Launch the decode-step kernels with PDL (where the GPU has it); returns the old setting."""
    old, _PDL["on"] = _PDL["on"], bool(on)
    return old


def pdl_enabled() -> bool:
    """Whether :func:`set_pdl` has PDL on (where a GPU has it, :func:`pdl_args` then uses it)."""
    return _PDL["on"]


def pdl_args(t: torch.Tensor) -> dict:
    """Keyword arguments for a kernel launch next to ``t``: ``PDL`` (the kernel's constexpr: wait
    for the previous kernel, then let the next one launch) and Triton's ``launch_pdl``; PDL off on
    a CPU, before sm_90, and unless :func:`set_pdl` turned it on."""
    on = _PDL["on"] and t.device.type == "cuda" and torch.cuda.get_device_capability(t.device) >= (9, 0)
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """A PDL kernel's first step: wait for the previous kernel's writes, then let the next kernel
    start launching (it will wait for ours in turn, so memory order is the stream's)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def fence_gpu(t):
    """``fence.acq_rel.gpu`` in every thread holding an element of ``t``: its earlier writes and
    atomics are performed for the whole GPU before its later ones (the fence of CUDA's
    threadfence-reduction pattern, before a counter tells the last program that all are in). A
    compiled kernel only: the interpreter runs one program at a time and has no inline PTX."""
    tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.u32 $0, 0;", "=r,r", [t], dtype=tl.int32, is_pure=False,
                              pack=1)


def use_triton_for(t: torch.Tensor, use_triton: bool | None) -> bool:
    """Triton on a GPU; on a CPU only when asked (the interpreter: fp16/fp32, never bf16)."""
    if use_triton is None:
        return t.device.type == "cuda"
    if use_triton and t.device.type == "cpu":
        tritonenv.check_dtype(t.dtype)
    return use_triton


# ---------------------------------------------------------------- references
def quant_static_ref(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(x / scale) clamped to +-448, in e4m3: quantization with a fixed (calibrated) scale."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def quant_tensor_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor e4m3: (x / s) in FP8, s = amax(x) / 448 as a 0-d float32 tensor."""
    s = x.detach().abs().amax().float().clamp(min=1e-12) / FP8_MAX
    return quant_static_ref(x, s), s


def dequant_rows_ref(q: torch.Tensor, s: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    return (q.float() * s).to(dtype)


def rmsnorm_ref(x: torch.Tensor, eps: float = 1e-6, out_scale: torch.Tensor | None = None) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dimension, computed in float32; with
    ``out_scale``, quantized to FP8 with that (static) scale."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y.to(x.dtype) if out_scale is None else quant_static_ref(y, out_scale)


# ---------------------------------------------------------------- kernels
@triton.jit
def _row_amax_kernel(x_ptr, amax_ptr, n_cols, stride_x, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for c in range(0, n_cols, BLOCK):
        o = c + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + o, mask=o < n_cols, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    tl.store(amax_ptr + row, tl.max(amax, 0))


@triton.jit
def _quant_tensor_kernel(x_ptr, amax_ptr, q_ptr, s_ptr, n_amax, n_cols, stride_x, stride_q,
                         BLOCK: tl.constexpr, AMAX_BLOCK: tl.constexpr):
    """Scale = max of all rows' maxima / 448 (program 0 stores it), then this row's x / scale."""
    row = tl.program_id(0)
    a = tl.load(amax_ptr + tl.arange(0, AMAX_BLOCK), mask=tl.arange(0, AMAX_BLOCK) < n_amax, other=0.0)
    scale = tl.maximum(tl.max(a, 0), 1e-12) / 448.0
    if row == 0:
        tl.store(s_ptr, scale)
    for c in range(0, n_cols, BLOCK):
        o = c + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + o, mask=o < n_cols, other=0.0).to(tl.float32)
        y = tl.minimum(tl.maximum(x / scale, -448.0), 448.0)
        tl.store(q_ptr + row * stride_q + o, y.to(q_ptr.dtype.element_ty), mask=o < n_cols)


@triton.jit
def _dequant_rows_kernel(q_ptr, s_ptr, out_ptr, n_cols, s_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    o = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = o < n_cols
    s = tl.load(s_ptr + row * s_stride)
    x = tl.load(q_ptr + row * n_cols + o, mask=m).to(tl.float32) * s
    tl.store(out_ptr + row * n_cols + o, x.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _rmsnorm_kernel(x_ptr, y_ptr, s_ptr, n_cols, stride_x, stride_y, eps, BLOCK: tl.constexpr, QUANT: tl.constexpr,
                    PDL: tl.constexpr = False):
    pdl_enter(PDL)
    row = tl.program_id(0)
    o = tl.arange(0, BLOCK)
    m = o < n_cols
    x = tl.load(x_ptr + row * stride_x + o, mask=m, other=0.0).to(tl.float32)
    y = x * (1.0 / tl.sqrt(tl.sum(x * x, 0) / n_cols + eps))
    if QUANT:  # the consumer's static FP8 scale: the next GEMM reads 1 B per activation
        y = tl.minimum(tl.maximum(y / tl.load(s_ptr), -448.0), 448.0)
    tl.store(y_ptr + row * stride_y + o, y.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _add_rmsnorm_kernel(x_ptr, r_ptr, sum_ptr, y_ptr, s_ptr, n_cols, stride_x, stride_r, stride_rc, stride_y, eps,
                        BLOCK: tl.constexpr, QUANT: tl.constexpr, PDL: tl.constexpr = False):
    """sum = x + r (rounded to x's dtype, as torch's add), then RMSNorm of that sum: the
    residual add and the next norm in one pass over the row. ``r`` may be a transposed view
    (``stride_rc`` > 1: a swap-AB GEMM's (N, rows) output read as (rows, N)). That read is
    strided: each 32-byte sector it touches holds one element of the row, so it costs more than
    its few KiB suggest, though the step still measured faster with swap-AB than without)."""
    pdl_enter(PDL)
    row = tl.program_id(0)
    o = tl.arange(0, BLOCK)
    m = o < n_cols
    x = tl.load(x_ptr + row * stride_x + o, mask=m, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * stride_r + o * stride_rc, mask=m, other=0.0).to(tl.float32)
    s = (x + r).to(sum_ptr.dtype.element_ty)
    tl.store(sum_ptr + row * n_cols + o, s, mask=m)
    s = s.to(tl.float32)
    y = s * (1.0 / tl.sqrt(tl.sum(s * s, 0) / n_cols + eps))
    if QUANT:
        y = tl.minimum(tl.maximum(y / tl.load(s_ptr), -448.0), 448.0)
    tl.store(y_ptr + row * stride_y + o, y.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def gelu(x):
    """Exact (erf) GELU, as ``F.gelu``."""
    return 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))


@triton.jit
def _quant_static_kernel(x_ptr, s_ptr, q_ptr, n, BLOCK: tl.constexpr, GELU: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    x = tl.load(x_ptr + o, mask=m, other=0.0).to(tl.float32)
    if GELU:  # exact (erf) GELU first, as F.gelu: the MLP's activation and the requant in one pass
        x = gelu(x)
    q = tl.minimum(tl.maximum(x / tl.load(s_ptr), -448.0), 448.0)
    tl.store(q_ptr + o, q.to(q_ptr.dtype.element_ty), mask=m)


# ---------------------------------------------------------------- the ops
def quant_tensor(x: torch.Tensor, use_triton: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor dynamic FP8 quantization of a 2-D activation: a row-amax kernel, then one
    kernel that reduces the row maxima and quantizes (2 launches, no host sync, so a decode step
    can be graph-captured). The scale feeds ``torch._scaled_mm``'s tensor-wise mode; why
    tensor-wise and not row-wise scales: cuBLAS ran row-wise scales with large tiles that read a
    decode-shaped weight well below tensor-wise scaling's rate (``docs/lab04-tuning.md``)."""
    if x.dim() != 2:
        raise ValueError(f"FP8 quantization wants a 2-D (rows, cols) tensor, got shape {tuple(x.shape)}")
    if not use_triton_for(x, use_triton):
        return quant_tensor_ref(x)
    x = x if x.stride(-1) == 1 else x.contiguous()
    rows, cols = x.shape
    amax = torch.empty((rows,), dtype=torch.float32, device=x.device)
    _row_amax_kernel[(rows,)](x, amax, cols, x.stride(0), BLOCK=BLOCK)
    if rows > 1024:  # prefill: reduce the row maxima first, so each program reads one value
        amax = amax.amax().reshape(1)
    q = torch.empty((rows, cols), dtype=FP8, device=x.device)
    s = torch.empty((), dtype=torch.float32, device=x.device)
    _quant_tensor_kernel[(rows,)](x, amax, q, s, amax.numel(), cols, x.stride(0), q.stride(0), BLOCK=BLOCK,
                                  AMAX_BLOCK=max(16, triton.next_power_of_2(amax.numel())))
    return q, s


def quant_static(x: torch.Tensor, scale: torch.Tensor, use_triton: bool | None = None,
                 gelu: bool = False) -> torch.Tensor:
    """FP8 quantization with a static scale: one elementwise pass (no amax, so no reduction
    and no second kernel, unlike :func:`quant_tensor`). ``gelu``: apply exact GELU first (the
    MLP's activation fused into the requant of the down projection's input)."""
    if not use_triton_for(x, use_triton):
        return quant_static_ref(torch.nn.functional.gelu(x.float()) if gelu else x, scale)
    xc = x.contiguous()
    q = torch.empty(xc.shape, dtype=FP8, device=x.device)
    n = xc.numel()
    _quant_static_kernel[(triton.cdiv(n, 2048),)](xc, scale.reshape(1).float(), q, n, BLOCK=2048, GELU=gelu,
                                                  **pdl_args(x))
    return q


def dequant_rows(q: torch.Tensor, s: torch.Tensor, dtype=torch.bfloat16, use_triton: bool | None = None) -> torch.Tensor:
    """``q * s`` to ``dtype`` (s: one float32 per row, (rows, 1), or one for the tensor), one
    read of q and one write: the fallback's copy of an FP8 weight, made every step."""
    if not use_triton_for(q, use_triton):
        return dequant_rows_ref(q, s, dtype)
    rows, cols = q.shape
    out = torch.empty((rows, cols), dtype=dtype, device=q.device)
    s = s.float().contiguous()
    if s.numel() not in (1, rows):
        raise ValueError(f"dequant_rows: {s.numel()} scales for {rows} rows; give one per row or one")
    _dequant_rows_kernel[(rows, triton.cdiv(cols, BLOCK))](q.contiguous(), s, out, cols,
                                                          0 if s.numel() == 1 else 1, BLOCK=BLOCK)
    return out


def rmsnorm(x: torch.Tensor, eps: float = 1e-6, use_triton: bool | None = None,
            out_scale: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm (no weight) in one kernel: one program per row (rows up to 16k wide; wider rows
    take the torch reference). In torch it is ~6 small kernels; a decode step runs it
    2 x layers + 1 times, so each launch counts. ``out_scale``: write FP8 (x / scale) for a
    GEMM that takes static-scaled FP8 input."""
    if not use_triton_for(x, use_triton) or x.shape[-1] > 16384:
        return rmsnorm_ref(x, eps, out_scale)
    x2 = x.reshape(-1, x.shape[-1])
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    y = torch.empty(x2.shape, dtype=x.dtype if out_scale is None else FP8, device=x.device)
    s = y if out_scale is None else out_scale.reshape(1).float()
    _rmsnorm_kernel[(x2.shape[0],)](x2, y, s, x2.shape[1], x2.stride(0), y.stride(0), eps,
                                    BLOCK=triton.next_power_of_2(x2.shape[1]), QUANT=out_scale is not None,
                                    num_warps=ROW_WARPS, **pdl_args(x))
    return y.reshape(x.shape)


def add_rmsnorm_ref(x: torch.Tensor, r: torch.Tensor, eps: float = 1e-6,
                    out_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x + r, rmsnorm_ref(x + r))``: the residual add, then the norm of its rounded sum."""
    s = x + r
    return s, rmsnorm_ref(s, eps, out_scale)


def add_rmsnorm(x: torch.Tensor, r: torch.Tensor, eps: float = 1e-6, use_triton: bool | None = None,
                out_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the next RMSNorm in one kernel: returns ``(x + r, norm(x + r))``,
    the norm in FP8 with ``out_scale`` as :func:`rmsnorm`. A decode step adds a GEMM's output
    into the residual stream twice per layer and normalizes right after each time; fused, each
    pair is one launch instead of two, and the sum is read back from registers, not memory.
    ``r`` may be a transposed view (a swap-AB GEMM's output, :class:`.model.QLinear`)."""
    if x.shape != r.shape:
        raise ValueError(f"add_rmsnorm adds tensors of one shape; got {tuple(x.shape)} and {tuple(r.shape)}")
    if not use_triton_for(x, use_triton) or x.shape[-1] > 16384:
        return add_rmsnorm_ref(x, r, eps, out_scale)
    x2, r2 = (t.reshape(-1, t.shape[-1]) for t in (x, r))  # r's reshape may keep a column stride
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    total = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    y = torch.empty(x2.shape, dtype=x.dtype if out_scale is None else FP8, device=x.device)
    s = y if out_scale is None else out_scale.reshape(1).float()
    _add_rmsnorm_kernel[(x2.shape[0],)](x2, r2, total, y, s, x2.shape[1], x2.stride(0), r2.stride(0), r2.stride(1),
                                        y.stride(0), eps, BLOCK=triton.next_power_of_2(x2.shape[1]), QUANT=out_scale is not None,
                                        num_warps=ROW_WARPS, **pdl_args(x))
    return total.reshape(x.shape), y.reshape(x.shape)
