"""Lab 4's decoder: FP8 quantization marks, the precision-switchable linear layer, the KV
cache and the decoder whose every linear layer picks a path (:data:`PATHS`)."""
from __future__ import annotations

import contextlib

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from hwlab.labs.fp8 import decode_gemm
from hwlab.labs.fp8 import kernels as K
from hwlab.labs.fp8.kernels import DEFAULT_TILE, AttnTile

FP8 = K.FP8
FP8_MAX = K.FP8_MAX
QUANT_MARK, DEQUANT_MARK = "hwlab::quant_fp8", "hwlab::dequant_fp8"


def quantize_fp8(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor e4m3 quantization (:func:`.quant.quant_tensor_ref`): (t / scale) in FP8
    with scale = amax / 448. Marked ``hwlab::quant_fp8`` in profiles, so requant counts come
    from the profiler."""
    with torch.profiler.record_function(QUANT_MARK):
        return K.quant_tensor_ref(t)


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    """Back to ``dtype`` (scale broadcasts); marked ``hwlab::dequant_fp8`` in profiles."""
    with torch.profiler.record_function(DEQUANT_MARK):
        return K.dequant_rows_ref(q, scale, dtype)


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor) -> torch.Tensor:
    """``torch._scaled_mm`` of two FP8 operands with one scale each (its tensor-wise mode), bf16 out.
    On a CPU the same product is asked with each scale repeated per row of ``a`` and per column of
    ``b`` (PyTorch's row-wise mode): the same scales, the same op in the profile, but PyTorch's CPU
    kernel for the tensor-wise mode is far slower on a prefill's many rows, enough to stretch a
    tiny decoder's profile (exercise 04) past a minute of CPU time. On a GPU the call is unchanged:
    cuBLAS's tensor-wise mode is the path the lab measures. A PyTorch whose CPU kernel takes only
    tensor-wise scales (it refuses the row-wise call) gets the tensor-wise call, remembered."""
    global _CPU_ROWWISE
    if not a.is_cuda and scale_a.dim() == 0 and scale_b.dim() == 0 and _CPU_ROWWISE is not False:
        ra = scale_a.reshape(1, 1).expand(a.shape[0], 1).contiguous()
        rb = scale_b.reshape(1, 1).expand(1, b.shape[1]).contiguous()
        try:
            y = torch._scaled_mm(a, b, scale_a=ra, scale_b=rb, out_dtype=torch.bfloat16)
            _CPU_ROWWISE = True
            return y
        except RuntimeError:
            if _CPU_ROWWISE:  # it worked before: this failure is not the mode's
                raise
            _CPU_ROWWISE = False
    return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)


#: whether this PyTorch's CPU ``_scaled_mm`` takes row-wise scales (None: not tried yet)
_CPU_ROWWISE: bool | None = None


class QLinear(torch.nn.Module):
    """A bias-free linear layer holding its weight for one precision path.

    FP8 weights carry one scale per tensor; ``fp8_mm`` quantizes the activation per tensor
    (dynamic scaling, two small kernels) and calls ``torch._scaled_mm`` in its tensor-wise
    mode, the FP8 GEMM path of Hopper-class GPUs. (Row-wise scales are more accurate, but
    cuBLASLt ran them with large tiles that read a decode-shaped weight well below tensor-wise
    scaling's rate.) ``fp8_dequant`` runs the
    one-pass dequant kernel of :mod:`.quant` (1 B read + 2 B written per weight) and
    then a bf16 GEMM that reads the copy again. ``fp8_static`` is ``fp8_mm`` with the
    activation scale fixed by calibration: no amax pass, and an activation that arrives already
    in FP8 (a norm that quantized with this layer's scale) is used as is. ``rows_multiple``: an
    FP8 layer whose FP8 kernel exists only for batches of a multiple of that many rows; any other
    batch falls back to the dequant path (the seed's "partial fallback", by shape).

    ``swap_ab`` (``fp8_static`` only): at decode sizes (a multiple of 16 rows, up to
    :data:`SWAP_AB_MAX_ROWS`) the weight goes in as the GEMM's first operand and the activation
    rows as its second, and the (N, rows) result is returned as a transposed view. cuBLAS then
    tiles the weight's N side instead of the few rows; the decoder sets it where that measured
    faster (the wide-K ``down`` projection). The multiple of
    16 is cuBLAS's FP8 shape rule for that operand; a prefill's many rows keep the plain order.
    """

    MODES = ("bf16", "fp8_dequant", "fp8_mm", "fp8_static")

    def __init__(self, weight: torch.Tensor, mode: str = "bf16"):
        super().__init__()
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {self.MODES}, not {mode!r}")
        self.mode = mode
        self.out_features, self.in_features = weight.shape
        if mode == "bf16":
            self.register_buffer("w", weight.to(torch.bfloat16))
        else:
            q, s = quantize_fp8(weight)  # (N, K) FP8, one float32 scale
            self.register_buffer("w", q)
            self.register_buffer("w_scale", s)
        if mode == "fp8_static":  # the activation's scale, set by Decoder.calibrate
            self.register_buffer("x_scale", torch.full((), float("nan"), device=weight.device))
        self.calibrating = self.calibrated = False
        self.swap_ab = False
        #: an FP8 layer whose FP8 kernel exists only for row counts that are a multiple of this: any
        #: other batch falls back (dequant + bf16 GEMM); None: every row count has one
        self.rows_multiple: int | None = None
        #: whether the last call fell back to a dequantized weight (the profile counts it)
        self.fell_back = False

    @property
    def weight_bytes(self) -> int:
        return self.w.numel() * self.w.element_size()

    def runs_swap_ab(self, rows: int) -> bool:
        """Whether a call with ``rows`` activation rows runs swap-AB (see the class docstring)."""
        return self.swap_ab and self.mode == "fp8_static" and rows % 16 == 0 and rows <= SWAP_AB_MAX_ROWS

    def runs_kit_gemm(self, xq: torch.Tensor) -> bool:
        """Whether a call on the quantized rows ``xq`` runs the kit's decode GEMM
        (:mod:`.decode_gemm`, for the weight shapes it :func:`~.decode_gemm.takes`): an
        ``fp8_static`` layer, on a GPU, at most ``decode_gemm.MAX_ROWS`` rows; otherwise cuBLAS's
        FP8 GEMM."""
        return (self.mode == "fp8_static" and xq.is_cuda and xq.shape[0] <= decode_gemm.MAX_ROWS
                and decode_gemm.takes(self.out_features, self.in_features))

    @property
    def takes_fp8_input(self) -> bool:
        """A calibrated ``fp8_static`` layer with an FP8 kernel at every row count: its producer
        (norm, GELU, the attention's combine) may quantize for it."""
        return self.mode == "fp8_static" and self.calibrated and self.rows_multiple is None

    def falls_back(self, rows: int) -> bool:
        """Whether a call with ``rows`` activation rows has no FP8 kernel here (``rows_multiple``)."""
        return (self.mode in ("fp8_mm", "fp8_static") and self.rows_multiple is not None
                and rows % self.rows_multiple != 0)

    def mm_float32(self, x: torch.Tensor) -> torch.Tensor:
        """A bf16 layer's product written as float32 by the GEMM itself (cuBLAS sums in float32
        anyway), where ``forward(x).float()`` rounds to bf16 and launches a cast kernel after."""
        if self.mode != "bf16":
            raise ValueError(f"mm_float32 is a bf16 layer's; this one is {self.mode}")
        x2 = x.reshape(-1, x.shape[-1])
        if x2.is_cuda:
            y = torch.mm(x2, self.w.t(), out_dtype=torch.float32)
        else:  # a CPU has no bf16 -> float32 mm: the same sum in float32
            y = x2.float() @ self.w.float().t()
        return y.reshape(*x.shape[:-1], self.out_features)

    def forward(self, x: torch.Tensor, gelu_to: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ w.T`` in this layer's mode. ``gelu_to`` (a static FP8 scale: the next layer's
        input scale): return GELU of the product quantized to FP8 with it, inside the kit's GEMM
        where it runs and :data:`GELU_IN_GEMM` is on, else by :func:`.quant.quant_static` after."""
        if gelu_to is not None:
            y = self._forward(x, gelu_to if GELU_IN_GEMM else None)
            if y.dtype == FP8:  # the GEMM's epilogue did both
                return y
            with torch.profiler.record_function(QUANT_MARK):  # GELU and the requant in one pass
                return K.quant_static(y, gelu_to, gelu=True)
        return self._forward(x)

    def _forward(self, x: torch.Tensor, gelu_to: torch.Tensor | None = None) -> torch.Tensor:
        self.fell_back = self.mode == "fp8_dequant" or self.falls_back(x.reshape(-1, x.shape[-1]).shape[0])
        if self.mode == "bf16":
            return F.linear(x, self.w)
        if self.fell_back:  # the fallback: a bf16 copy of the weight, every step
            with torch.profiler.record_function(DEQUANT_MARK):
                w = K.dequant_rows(self.w, self.w_scale)
            return F.linear(x, w)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.mode == "fp8_static" and not self.calibrating:
            if not self.calibrated:
                raise RuntimeError("an fp8_static layer has no activation scale yet: build it through Decoder "
                                   "(which calibrates) or call Decoder.calibrate() first")
            xs = self.x_scale
            if x2.dtype == FP8:  # quantized by the producer (a norm that wrote FP8 with our scale)
                xq = x2
            else:
                with torch.profiler.record_function(QUANT_MARK):  # requant, static scale: one pass
                    xq = K.quant_static(x2, xs)
        else:
            if self.calibrating:  # record the largest activation seen; compute as fp8_mm meanwhile
                self.x_scale = torch.maximum(torch.nan_to_num(self.x_scale, nan=0.0),
                                             x2.detach().abs().amax().float() / FP8_MAX)
            with torch.profiler.record_function(QUANT_MARK):  # requant of the activation
                xq, xs = K.quant_tensor(x2)
        if self.runs_kit_gemm(xq):
            y = decode_gemm.decode_mm(xq, self.w, xs, self.w_scale, gelu_out_scale=gelu_to)
        elif self.runs_swap_ab(xq.shape[0]):
            xq = xq if xq.is_contiguous() else xq.contiguous()  # its transpose is the K-major operand cuBLAS wants
            y = scaled_mm(self.w, xq.t(), self.w_scale, xs).t()
        else:
            y = scaled_mm(xq, self.w.t(), xs, self.w_scale)
        return y.reshape(*shape[:-1], self.out_features)


#: whether an ``fp8_static`` up projection that runs the kit's decode GEMM applies GELU and the down
#: projection's FP8 requant in its epilogue (:class:`QLinear`'s ``gelu_to``), one kernel per layer
#: fewer than :func:`.quant.quant_static` after it: off. The decode step measured the two equal
#: within 0.1% (with PDL a small kernel between two GEMMs starts while the first drains), so the lab
#: keeps the separate pass, which a learner can read and profile on its own
GELU_IN_GEMM = False
#: most activation rows a swap-AB GEMM takes (:class:`QLinear`): a decode step's batch; a
#: prefill's thousands of rows fill cuBLAS's tiles in the plain order
SWAP_AB_MAX_ROWS = 64
#: the layers whose FP8 GEMM runs swap-AB in the fixed path: ``down`` (K = d_ff, 3.5x its N),
#: where it read the weight faster at 4 and 16 rows; the others measured equal
SWAP_AB_LAYERS = ("down",)


@dataclass(frozen=True)
class ModelConfig:
    vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


TINY = ModelConfig(vocab=512, d_model=64, n_layers=3, n_heads=4, d_ff=128)
#: sized so decode on an H200 is memory-bound (~1.5 B parameters in the layers), with a 64k-vocab
#: head: large enough that dequantizing it every step spends most of what the FP8 trunk saves
#: (the seed's symptom), small enough that the trunk still saves a little
H200_SIZE = ModelConfig(vocab=65536, d_model=4096, n_layers=8, n_heads=32, d_ff=14336)

MAIN = ("qkv", "out", "up", "down")
#: a path: the mode of the trunk's linear layers (``main``), of the ``connector`` and of the ``head``;
#: ``kv_fp8_from_ctx``: the shortest cache length stored in FP8 (None: bf16 always);
#: ``bf16_edge_layers``: how many layers at each end of the trunk keep bf16 weights whatever ``main``
#: says (FP8 recipes keep the first and last blocks in high precision); ``out_rows_multiple``: the
#: ``out`` projection's FP8 kernel exists only for row counts that are a multiple of this (None: every
#: row count), any other batch falls back to dequant + bf16 GEMM (:class:`QLinear`'s ``rows_multiple``)
PATH_DEFAULTS: dict[str, Any] = {"main": "bf16", "connector": "bf16", "head": "bf16", "kv_fp8_from_ctx": None,
                                 "bf16_edge_layers": 0, "out_rows_multiple": None}
#: keys a custom path may add: ``fp8_rows_multiple``, ``out_rows_multiple`` per trunk layer kind
#: (``{"down": 4}``): that kind's FP8 kernel exists only for row counts that are a multiple of it
OPTIONAL_PATH_KEYS = frozenset({"fp8_rows_multiple"})


def rows_multiples(path: dict[str, Any]) -> dict[str, int]:
    """Per trunk layer kind, the row multiple its FP8 kernel needs (kinds without one left out)."""
    out = {"out": path.get("out_rows_multiple")}
    out.update(path.get("fp8_rows_multiple") or {})
    return {k: v for k, v in out.items() if v is not None}
#: the context length from which the fixed path stores the KV cache in FP8: the long bucket only
KV_FP8_FROM_CTX = 8192
PATHS: dict[str, dict[str, Any]] = {
    "bf16": dict(PATH_DEFAULTS),
    "fp8_dequant": {**PATH_DEFAULTS, "main": "fp8_dequant", "connector": "fp8_dequant", "head": "fp8_dequant"},
    # the seed's deployment: trunk on FP8 GEMMs except where a shape has no FP8 kernel, connector and
    # head dequantized back to bf16 every step, KV cache bf16
    "mixed": {**PATH_DEFAULTS, "main": "fp8_static", "connector": "fp8_dequant", "head": "fp8_dequant",
              "bf16_edge_layers": 1, "out_rows_multiple": 16},
    # the seed's fixes 1-2: the head kept in bf16 on purpose, the connector and every trunk shape on FP8
    "gemms_fixed": {**PATH_DEFAULTS, "main": "fp8_static", "connector": "fp8_static", "head": "bf16",
                    "bf16_edge_layers": 1},
    # and fix 3: an FP8 KV cache for the long-context bucket
    "fixed": {**PATH_DEFAULTS, "main": "fp8_static", "connector": "fp8_static", "head": "bf16",
              "bf16_edge_layers": 1, "kv_fp8_from_ctx": KV_FP8_FROM_CTX},
}


def layer_mode(path: dict[str, Any], cfg: "ModelConfig", i: int) -> str:
    """The mode of trunk layer ``i``'s linears on ``path`` (bf16 at the kept edges)."""
    e = path.get("bf16_edge_layers", 0)
    return "bf16" if i < e or i >= cfg.n_layers - e else path["main"]


#: the decoder's bf16 head on a GPU writes float32 logits itself (:meth:`QLinear.mm_float32`):
#: one kernel fewer per step than a bf16 product and a cast (measured faster in both paths)
HEAD_FP32 = True
#: a bf16 cache read over fewer positions than this (one length for all rows) goes to the kit's
#: kernel, which also writes the step's K and V and the out projection's FP8 input, so two
#: launches per layer fewer; from this length on, to SDPA, which streams a long bf16 cache faster
#: (the kit's way measured faster at 512 in both paths, slower at 4k)
KIT_BF16_BELOW_CTX = 4096


class KVCache:
    """Per-layer K/V of shape (B, H, T, Dh), in bf16 or FP8 with one static scale per layer
    (fixed from the prefill's K and V, as serving stacks do for a static FP8 KV cache).

    Decode attention reads the cache in its stored dtype through
    :func:`.attention.decode_attention` (``fused_read=True``); ``fused_read=False`` is the
    path without an FP8-aware attention kernel: dequantize the whole cache to bf16 every step,
    then attend (the FP8 cache then saves memory, not time).

    Continuous batching (:mod:`.stream`): each batch row is one request's slot, ``row_len``
    (int32, on the device) holds each row's length, a decode step writes every row at its own
    position and attends over its own length (the kit's kernel for bf16 caches too: SDPA takes
    per-row lengths only as a mask over the padded cache, which would read every slot to the
    end), and :meth:`rows` / :meth:`slot` are views that share the storage. ``scale_frozen``
    keeps the per-layer FP8 scale of the first prefill for every later request.
    """

    def __init__(self, cfg: ModelConfig, batch: int, max_ctx: int, fp8: bool, device, fused_read: bool = True):
        dt = FP8 if fp8 else torch.bfloat16
        shape = (batch, cfg.n_heads, max_ctx, cfg.d_head)
        self.fp8, self.fused_read = fp8, fused_read
        self.k = [torch.empty(shape, dtype=dt, device=device) for _ in range(cfg.n_layers)]
        self.v = [torch.empty(shape, dtype=dt, device=device) for _ in range(cfg.n_layers)]
        self.scale = [torch.ones((), device=device) for _ in range(cfg.n_layers)]
        self.len = 0
        self.row_len: torch.Tensor | None = None
        self.scale_frozen = False
        self._attend_len: torch.Tensor | None = None

    def _view(self, rows: slice, per_row: bool) -> "KVCache":
        v = object.__new__(KVCache)
        v.fp8, v.fused_read, v.len, v.scale_frozen = self.fp8, self.fused_read, 0, self.scale_frozen
        v.k, v.v = [t[rows] for t in self.k], [t[rows] for t in self.v]
        v.scale = self.scale  # the same list: a scale set through a view is the cache's
        v.row_len = self.row_len[rows] if per_row else None
        v._attend_len = None
        return v

    def rows(self, n: int) -> "KVCache":
        """The first ``n`` slots, for one decode step of ``n`` live requests (per-row lengths)."""
        if self.row_len is None:
            raise ValueError("rows() serves a continuous batch: set cache.row_len (int32, one length per slot) first")
        return self._view(slice(0, n), per_row=True)

    def slot(self, i: int) -> "KVCache":
        """Slot ``i`` alone, empty, for one request's prefill."""
        return self._view(slice(i, i + 1), per_row=False)

    @property
    def n_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def write(self, layer: int, k, v, pos: int):
        t = k.shape[2]
        if pos + t > self.k[layer].shape[2]:
            raise ValueError(f"the cache holds {self.k[layer].shape[2]} positions; writing {t} at {pos} "
                             "overflows it: make the cache with max_ctx >= prompt + decode steps")
        if t == 1 and self.row_len is not None:  # continuous batching: each row at its own length
            return K.kv_store(k, v, self.k[layer], self.v[layer], self.scale[layer], self.row_len)
        if t == 1 and pos > 0:  # a decode step: one kernel (quantizing for an FP8 cache)
            return K.kv_store(k, v, self.k[layer], self.v[layer], self.scale[layer], pos)
        if self.fp8:
            if pos == 0 and not self.scale_frozen:  # one scale per layer, fixed at prefill (static KV quantization)
                self.scale[layer].copy_((torch.maximum(k.abs().amax(), v.abs().amax()).float() / FP8_MAX).clamp(min=1e-12))
            s = self.scale[layer]
            self.k[layer][:, :, pos:pos + t] = K.quant_static_ref(k, s)
            self.v[layer][:, :, pos:pos + t] = K.quant_static_ref(v, s)
        else:
            self.k[layer][:, :, pos:pos + t] = k
            self.v[layer][:, :, pos:pos + t] = v

    def read(self, layer: int, upto: int):
        """K and V up to ``upto`` as bf16 (an FP8 cache is dequantized: a marked copy)."""
        k, v = self.k[layer][:, :, :upto], self.v[layer][:, :, :upto]
        if self.fp8:
            s = self.scale[layer]
            return dequantize_fp8(k, s), dequantize_fp8(v, s)
        return k, v

    def attend(self, layer: int, q: torch.Tensor, n_ctx: int, tile: AttnTile = DEFAULT_TILE,
               out_scale: torch.Tensor | None = None) -> torch.Tensor:
        """One decode query (B, H, 1, Dh) against the first ``n_ctx`` cached positions.

        A bf16 cache of :data:`KIT_BF16_BELOW_CTX` positions or more goes to torch's SDPA (faster
        than the kit's kernel on a long bf16 cache, so the baseline is not handicapped), a shorter
        one to the kit's kernel (fewer launches in the step); an FP8 cache to the kit's
        kernel, which reads FP8 directly, or, with ``fused_read=False``, is dequantized to bf16
        first. With per-row lengths (``row_len``), every cache goes to the kit's kernel over each
        row's length.
        ``tile``: the kit's kernel's launch shape (the decoder passes its ``attn_tile``).
        ``out_scale``: the next GEMM's static FP8 input scale; where the kit's kernel runs on a
        GPU its combine writes FP8 with it (the requant fused, marked as one), elsewhere the
        result stays in q's dtype and the GEMM quantizes it."""
        kit = self._attend_len is not None or (self.fused_read and (self.fp8 or n_ctx < KIT_BF16_BELOW_CTX))
        if not kit:
            kk, vv = self.read(layer, n_ctx)
            return F.scaled_dot_product_attention(q, kk, vv)
        n = self._attend_len if self._attend_len is not None else n_ctx
        if out_scale is None or not K.use_triton_for(q, None):
            return K.decode_attention(q, self.k[layer], self.v[layer], self.scale[layer], n, tile=tile)
        with torch.profiler.record_function(QUANT_MARK):  # the out projection's requant, in the combine
            return K.decode_attention(q, self.k[layer], self.v[layer], self.scale[layer], n, tile=tile,
                                      out_scale=out_scale)

    def step(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: int,
             tile: AttnTile = DEFAULT_TILE, out_scale: torch.Tensor | None = None) -> torch.Tensor:
        """One decode step: this step's ``k``, ``v`` (B, H, 1, Dh) written at ``pos``, then ``q``
        attended over ``pos + 1`` positions, as :meth:`write` then :meth:`attend`. Where the kit's
        kernel reads the cache at one length for all rows on a GPU, the write happens inside it
        (one kernel fewer per layer, :func:`.attention.decode_attention`'s ``new_kv``)."""
        kit = self.fp8 or pos + 1 < KIT_BF16_BELOW_CTX  # the cache :meth:`attend` gives the kit's kernel
        fuse = (self.row_len is None and self.fused_read and kit and pos > 0 and k.shape[2] == 1
                and K.use_triton_for(q, None))
        if not fuse:
            self.write(layer, k, v, pos)
            return self.attend(layer, q, pos + 1, tile, out_scale)
        if pos + 1 > self.k[layer].shape[2]:
            raise ValueError(f"the cache holds {self.k[layer].shape[2]} positions; writing 1 at {pos} "
                             "overflows it: make the cache with max_ctx >= prompt + decode steps")
        with torch.profiler.record_function(QUANT_MARK) if out_scale is not None else contextlib.nullcontext():
            return K.decode_attention(q, self.k[layer], self.v[layer], self.scale[layer], pos + 1, tile=tile,
                                      out_scale=out_scale, new_kv=(k, v))


class Decoder(torch.nn.Module):
    """The lab's decoder on one precision ``path`` (a name in :data:`PATHS` or a dict of the
    same keys). ``attn_tile``: the launch shape of the kit's decode attention
    (:class:`.attention.AttnTile`); an attribute the caller may set between runs."""

    def __init__(self, cfg: ModelConfig, path: str | dict = "bf16", seed: int = 0, device=None,
                 attn_tile: AttnTile = DEFAULT_TILE):
        super().__init__()
        self.attn_tile = attn_tile
        if isinstance(path, dict):
            p = {**PATH_DEFAULTS, **path}
            bad = {k: p[k] for k in ("main", "connector", "head") if p[k] not in QLinear.MODES}
            if bad or set(p) - OPTIONAL_PATH_KEYS != set(PATH_DEFAULTS):
                raise ValueError(f"a custom path maps main/connector/head to one of {QLinear.MODES} "
                                 f"and kv_fp8_from_ctx to a context length or None; got {path!r}")
            self.path_cfg, self.path = p, "custom"
        elif path in PATHS:
            self.path_cfg, self.path = PATHS[path], path
        else:
            raise ValueError(f"path must be one of {list(PATHS)} or a dict, not {path!r}")
        self.cfg = cfg
        p = self.path_cfg
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        g = torch.Generator(device=dev).manual_seed(seed)  # weights drawn where they live (GB-sized on a GPU)

        def w(o, i):
            return torch.randn(o, i, generator=g, device=dev) / math.sqrt(i)

        d = cfg.d_model
        self.embed = (torch.randn(cfg.vocab, d, generator=g, device=dev) * 0.5).to(torch.bfloat16)
        self.connector = QLinear(w(d, d), p["connector"])
        self.layers = torch.nn.ModuleList()
        for i in range(cfg.n_layers):
            mode = layer_mode(p, cfg, i)
            layer = torch.nn.ModuleDict({
                "qkv": QLinear(w(3 * d, d), mode), "out": QLinear(w(d, d), mode),
                "up": QLinear(w(cfg.d_ff, d), mode), "down": QLinear(w(d, cfg.d_ff), mode)})
            for name in SWAP_AB_LAYERS:
                layer[name].swap_ab = layer[name].mode == "fp8_static"
            for name, mult in rows_multiples(p).items():
                layer[name].rows_multiple = mult
            self.layers.append(layer)
        self.head = QLinear(w(cfg.vocab, d), p["head"])
        self.device = dev
        self.calibrate()

    def calibrate(self, batch: int = 2, prompt: int = 64, seed: int = 3) -> dict[str, float]:
        """Static activation scales for ``fp8_static`` layers: one prefill of ``batch`` x
        ``prompt`` seeded random tokens records each such layer's largest input |x|; its scale
        is that / 448 (what FP8 checkpoints ship as an input scale). Decode then quantizes
        with it in one pass, or inside the norm that feeds the layer; a larger activation
        later saturates at +-448 (the logit-error bound checks the cost). Returns the scales."""
        mods = {n: m for n, m in self.named_modules() if isinstance(m, QLinear) and m.mode == "fp8_static"}
        if not mods:
            return {}
        for m in mods.values():
            m.calibrating, m.calibrated = True, False
            m.x_scale = torch.full((), float("nan"), device=self.device)
        g = torch.Generator().manual_seed(seed)
        toks = torch.randint(0, self.cfg.vocab, (batch, prompt), generator=g).to(self.device)
        try:
            with torch.no_grad():
                self(toks, KVCache(self.cfg, batch, prompt, fp8=False, device=self.device))
        finally:
            for m in mods.values():
                m.calibrating = False
        for m in mods.values():
            m.calibrated = True
        return {n: float(m.x_scale) for n, m in mods.items()}

    def _add_norm_for(self, x: torch.Tensor, r: torch.Tensor | None,
                      consumer: QLinear) -> tuple[torch.Tensor, torch.Tensor]:
        """``x + r`` (the residual stream with a GEMM's output added; ``r`` None: nothing to add)
        and its RMSNorm for ``consumer``, in one kernel: written straight to FP8 (the requant
        fused in too) when the consumer takes static-scaled FP8 input."""
        scale = consumer.x_scale if consumer.takes_fp8_input else None
        with torch.profiler.record_function(QUANT_MARK) if scale is not None else contextlib.nullcontext():
            if r is None:
                return x, K.rmsnorm(x, out_scale=scale)  # one kernel on a GPU, the torch reference on a CPU
            return K.add_rmsnorm(x, r, out_scale=scale)

    @property
    def weight_bytes(self) -> int:
        return self.embed.numel() * 2 + sum(m.weight_bytes for m in self.modules() if isinstance(m, QLinear))

    def new_cache(self, batch: int, max_ctx: int, fused_read: bool = True) -> KVCache:
        f = self.path_cfg["kv_fp8_from_ctx"]
        return KVCache(self.cfg, batch, max_ctx, fp8=f is not None and max_ctx >= f, device=self.device,
                       fused_read=fused_read)

    def forward(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Next-token logits (B, 1, vocab) after ``tokens`` (B, T) appended at ``cache.len``.

        Prefill (T > 1, empty cache): causal attention over the prompt's own K/V, which are
        then written to the cache; only the last position goes through the head (what
        serving needs for the first token). Decode (T = 1): attention over the cache.
        """
        cfg = self.cfg
        B, T = tokens.shape
        pos = cache.len
        if T > 1 and pos:
            raise ValueError("prefill (more than one token) starts from an empty cache; decode one token at a time")
        per_row = T == 1 and cache.row_len is not None
        if per_row:  # each row attends over its own length, this step's position included
            cache._attend_len = cache.row_len + 1
        x = self.connector(self.embed[tokens])
        r = None  # a GEMM's output not yet added into the residual stream x (added with the next norm)
        for li, L in enumerate(self.layers):
            x, h = self._add_norm_for(x, r, L["qkv"])
            q, k, v = L["qkv"](h).split(cfg.d_model, dim=-1)
            q, k, v = (t.reshape(B, T, cfg.n_heads, cfg.d_head).transpose(1, 2) for t in (q, k, v))
            if T > 1:
                cache.write(li, k, v, pos)
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                a = cache.step(li, q, k, v, pos, self.attn_tile,
                               L["out"].x_scale if L["out"].takes_fp8_input else None)
            r = L["out"](a.transpose(1, 2).reshape(B, T, cfg.d_model))
            x, h = self._add_norm_for(x, r, L["up"])
            if L["down"].takes_fp8_input:  # GELU and down's requant: in up's GEMM, or one pass after
                u = L["up"](h, gelu_to=L["down"].x_scale)
            else:
                u = F.gelu(L["up"](h))
            r = L["down"](u)
        cache.len = pos + T
        if per_row:
            cache.row_len.add_(1)  # in place: a view's rows are the whole cache's
            cache._attend_len = None
        _, h = K.add_rmsnorm(x[:, -1:], r[:, -1:])
        if HEAD_FP32 and self.head.mode == "bf16" and h.is_cuda:
            return self.head.mm_float32(h)
        return self.head(h).float()


def make_models(cfg: ModelConfig = TINY, paths=tuple(PATHS), device=None,
                attn_tile: AttnTile = DEFAULT_TILE) -> dict[str, Decoder]:
    """One model per path, all from the same random weights (same seed) and attention tile."""
    return {p: Decoder(cfg, p, device=device, attn_tile=attn_tile) for p in paths}


def logit_error(models: dict[str, Decoder], batch: int = 2, prompt: int = 16, steps: int = 4) -> dict[str, float]:
    """max over prefill and ``steps`` greedy-free decode steps of ||logits - bf16|| / ||bf16||."""
    g = torch.Generator().manual_seed(1)
    ref_model = models["bf16"]
    toks = torch.randint(0, ref_model.cfg.vocab, (batch, prompt + steps), generator=g).to(ref_model.device)
    out: dict[str, float] = {}
    ref_logits = _run(ref_model, toks, prompt, steps)
    for p, m in models.items():
        lg = _run(m, toks, prompt, steps)
        out[p] = max(float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))
                     for a, b in zip(lg, ref_logits))
    return out


def _run(m: Decoder, toks, prompt: int, steps: int) -> list[torch.Tensor]:
    cache = m.new_cache(toks.shape[0], prompt + steps)
    logits = [m(toks[:, :prompt], cache)[:, -1]]
    for i in range(steps):
        logits.append(m(toks[:, prompt + i:prompt + i + 1], cache)[:, -1])
    return logits


#: logit-error bound per path against bf16: FP8 e4m3 has a 3-bit mantissa (~6% per-element
#: rounding); over a few layers the relative logit error stays near 10%
LOGIT_ERROR_BOUND = {"bf16": 0.0, "fp8_dequant": 0.15, "mixed": 0.15, "gemms_fixed": 0.15, "fixed": 0.15}
