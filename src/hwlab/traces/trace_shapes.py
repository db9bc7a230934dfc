"""Bytes and FLOPs of an aten op from the input shapes a profiler trace recorded, no torch.

A trace recorded with ``record_shapes=True`` carries each op's ``Input Dims``, ``Input type``,
``Input Strides`` and ``Concrete Inputs`` (scalar arguments), but not its outputs, its tensors'
identities or its index values. :func:`op_record` rebuilds, from those alone, the record the
live traffic model (:mod:`hwlab.examine.estimate`) keeps for an op, with the same formulas:

* **bytes**: each input tensor read once, by the span of memory its view covers
  (``(1 + sum((size - 1) * stride)) * itemsize``; contiguous where no strides were recorded),
  the output written once. The output is inferred per op family (:func:`out_shape`): matmul
  shapes, attention, reductions over the recorded dims, concatenation, gathers, in-place ops
  (their first input), else the broadcast of the inputs. View ops and allocations move
  nothing and get no record, as in the live model.
* **FLOPs**: the matmul family as ``torch.utils.flop_counter`` counts it (``2*M*N*K`` for
  mm/addmm/bmm/baddbmm/linear/matmul, ``2 * out * Cin/groups * kernel`` for convolutions (every
  ``aten`` convolution op; a backward counts twice that of its grad_output, for grad_input and
  grad_weight), the two products of attention); everything else 0. A convolution's stride and
  padding come from ``Concrete Inputs``; a trace without them (PyTorch before 2.0) takes stride 1
  and no padding, which over-counts a strided convolution's output: its floor is then high.
* **identity** (what fusion would save): a trace records no tensor identity, so an input is
  taken to be the output of the latest earlier op of the step with the same element count and
  dtype (a view keeps the count), else a tensor from outside the step. An estimate, said so
  wherever it is used.
* **gathers** read the rows they return (the output's size from the source, plus the index),
  not the whole source; no sector amplification is estimated (no index values in a trace).

A tensor list (``cat``, ``stack``) records dims but no dtype: each member takes the dtype of
the latest earlier output of its element count in the step (the identity estimate again); with
no such output, and for a tensor whose dtype or dims the trace did not record, the op's record
is ``shapes=False``:
its part is then walked only on what the trace measures.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hwlab.traces.kineto import DTYPE_BYTES
from hwlab.core.profiling import CONV_OPS, PART_ATTENTION_OPS, PART_GATHER_OPS, PART_GEMM_OPS, PART_LOW_PRECISION

#: ``Input type`` spellings -> torch dtype names (the live model's ``in_dtypes``)
DTYPE_NAMES = {"float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
               "int": "int32", "long int": "int64", "short int": "int16", "signed char": "int8",
               "unsigned char": "uint8", "bool": "bool", "c10::Float8_e4m3fn": "float8_e4m3fn",
               "c10::Float8_e5m2": "float8_e5m2", "c10::Float8_e4m3fnuz": "float8_e4m3fnuz",
               "c10::Float8_e5m2fnuz": "float8_e5m2fnuz"}
ITEM_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8, "int16": 2,
              "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1,
              "float8_e5m2fnuz": 1}
#: torch ScalarType codes, as ``Concrete Inputs`` records a dtype argument
SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
                7: "float64", 11: "bool", 15: "bfloat16", 23: "float8_e5m2", 24: "float8_e4m3fn",
                25: "float8_e5m2fnuz", 26: "float8_e4m3fnuz"}
#: ops that return a view or allocate without writing: no record (the live model skips them)
VIEW_OPS = frozenset(
    "aten::" + n for n in (
        "view", "reshape", "_reshape_alias", "t", "transpose", "permute", "expand", "as_strided", "unsqueeze",
        "squeeze", "slice", "select", "narrow", "detach", "alias", "unflatten", "view_as", "expand_as", "split",
        "chunk", "unbind", "resolve_conj", "resolve_neg", "_unsafe_view", "lift_fresh", "numpy_T", "flatten",
        "diagonal", "movedim", "swapaxes", "split_with_sizes", "empty", "empty_strided", "empty_like",
        "new_empty", "new_empty_strided", "set_", "resize_", "_local_scalar_dense", "item", "is_nonzero",
        "size", "stride"))
#: matmul-family ops (their input dtype picks the GEMM ceiling), as the live model's MATMUL_OPS
MATMUL_OPS = frozenset(PART_GEMM_OPS) | frozenset(PART_ATTENTION_OPS) | frozenset(CONV_OPS) | frozenset(
    ("aten::convolution_backward", "aten::cudnn_convolution_backward", "aten::miopen_convolution_backward"))
REDUCTION_OPS = frozenset("aten::" + n for n in (
    "sum", "mean", "amax", "amin", "max", "min", "prod", "norm", "linalg_vector_norm", "var", "std", "argmax",
    "argmin", "all", "any", "logsumexp", "count_nonzero", "var_mean", "std_mean"))
BOOL_OPS = frozenset("aten::" + n for n in ("eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "logical_and",
                                             "logical_or", "logical_not", "isfinite"))
GATHER_OPS = frozenset(PART_GATHER_OPS)


@dataclass
class TraceOpRecord:
    """The fields of :class:`hwlab.examine.estimate.OpRecord` the part split reads, from shapes."""
    name: str
    read_bytes: int
    written_bytes: int
    in_dtypes: list[str]
    out_dtypes: list[str]
    amplification: float | None = None
    flops: int = 0
    reads: list = field(default_factory=list)
    writes: list = field(default_factory=list)
    shapes: bool = True
    ext: Any = None

    @property
    def moved_bytes(self) -> float:
        return self.read_bytes + self.written_bytes

    @property
    def kind(self) -> str:
        """matmul / quant / dequant / gather / other, as the live record's ``kind``."""
        if self.name in MATMUL_OPS:
            return "matmul"
        if self.name in ("aten::_to_copy", "aten::copy_", "aten::to") and self.in_dtypes and self.out_dtypes:
            lo_in, lo_out = self.in_dtypes[-1] in PART_LOW_PRECISION, self.out_dtypes[0] in PART_LOW_PRECISION
            if lo_out and not lo_in:
                return "quant"
            if lo_in and not lo_out:
                return "dequant"
        if self.name in GATHER_OPS:
            return "gather"
        return "other"


def prod(xs) -> int:
    return math.prod(int(x) for x in xs)


def span_bytes(dims: list[int], strides: list[int] | None, item: int) -> int:
    """Bytes the view covers (the live model's ``span``, storage offset left out)."""
    if any(d == 0 for d in dims):
        return 0
    if not strides or len(strides) != len(dims):
        return prod(dims) * item
    return (1 + sum((d - 1) * abs(s) for d, s in zip(dims, strides) if d > 1)) * item


def broadcast(shapes: list[list[int]]) -> list[int]:
    n = max((len(s) for s in shapes), default=0)
    out = [1] * n
    for s in shapes:
        for i, d in enumerate(s[::-1]):
            j = n - 1 - i
            out[j] = d if out[j] == 1 else out[j]
    return out


def _concrete_ints(v: Any) -> list[int] | None:
    """``'[0, 1]'`` / ``'1'`` / ``'-1'`` -> [0, 1] / [1] / [-1]; None where it is not one."""
    if not isinstance(v, str) or not v.strip():
        return None
    t = v.strip().strip("[]")
    try:
        return [int(x) for x in t.split(",") if x.strip()] if t else []
    except ValueError:
        return None


def tensors(args: dict[str, Any]) -> tuple[list[tuple[int, list[int], list[int] | None, str]], bool]:
    """(position, dims, strides, dtype) of each tensor input, and whether every tensor-like
    input had a known dtype and dims (False: a tensor list or an unknown type)."""
    dims, types = args.get("Input Dims") or [], args.get("Input type") or []
    strides = args.get("Input Strides") or []
    out, complete = [], True
    for i, (d, t) in enumerate(zip(dims, types)):
        st = strides[i] if i < len(strides) and isinstance(strides[i], list) else None
        if t in ("Scalar", "ScalarList", "", None, "GenericList", "Device", "Layout", "ScalarType",
                 "MemoryFormat", "Generator", "str", "bool_list"):
            continue
        if t == "TensorList" or (isinstance(d, list) and d and isinstance(d[0], list)):
            # a list of tensors: dims per tensor, no dtype (the shape model looks for the producer)
            if isinstance(d, list) and all(isinstance(x, list) and all(isinstance(y, int) for y in x) for x in d):
                sts = st if isinstance(st, list) and len(st) == len(d) else [None] * len(d)
                out.extend((i, x, sx if isinstance(sx, list) and sx and isinstance(sx[0], int) else None, None)
                           for x, sx in zip(d, sts))
            else:
                complete = False
            continue
        dt = DTYPE_NAMES.get(t) or (t if t in ITEM_BYTES else None)
        if dt is None and t in DTYPE_BYTES:
            dt = {1: "uint8", 2: "float16", 4: "float32", 8: "float64"}[DTYPE_BYTES[t]]
        if dt is None or not isinstance(d, list) or not all(isinstance(x, int) for x in d):
            complete = False
            continue
        out.append((i, d, st if st and all(isinstance(x, int) for x in st) else None, dt))
    return out, complete


def out_shape(name: str, ts: list[tuple[int, list[int], Any, str]], concrete: list) -> tuple[list[int], str] | None:
    """The inferred output (dims, dtype) of an op (module doc); None where it cannot be told."""
    if not ts:
        return None
    shapes = [d for _, d, _, _ in ts]
    dt0 = ts[0][3]
    c = lambda i: concrete[i] if i < len(concrete) else None  # noqa: E731
    base = name[len("aten::"):]
    if name in ("aten::mm", "aten::_scaled_mm") and len(shapes) >= 2 and len(shapes[0]) == 2:
        return [shapes[0][0], shapes[1][-1]], ("bfloat16" if name == "aten::_scaled_mm" else dt0)
    if name in ("aten::addmm", "aten::_addmm_activation", "aten::baddbmm") and len(shapes) >= 3:
        a, b = shapes[1], shapes[2]
        return a[:-1] + [b[-1]], ts[1][3]
    if name == "aten::bmm" and len(shapes) >= 2:
        return shapes[0][:-1] + [shapes[1][-1]], dt0
    if name == "aten::linear" and len(shapes) >= 2:
        return shapes[0][:-1] + [shapes[1][0]], dt0
    if name == "aten::matmul" and len(shapes) >= 2:
        a, b = shapes[0], shapes[1]
        if len(a) == 1 and len(b) == 1:
            return [], dt0
        if len(b) == 1:
            return a[:-1], dt0
        if len(a) == 1:
            return b[:-2] + [b[-1]], dt0
        return broadcast([a[:-2], b[:-2]]) + [a[-2], b[-1]], dt0
    if name in ("aten::mv", "aten::addmv") and len(shapes) >= 2:
        return [shapes[-2][0]], dt0
    if name in PART_ATTENTION_OPS and len(shapes) >= 3:
        q, v = shapes[0], shapes[2]
        return q[:-1] + [v[-1]], dt0
    if name in CONV_BACKWARD_OPS and len(shapes) >= 3:  # grad_input: the forward input's shape (module doc)
        i_x = CONV_BACKWARD_OPS[name][0]
        return shapes[i_x], ts[i_x][3]
    if name in CONV_OPS and "transpose" not in name and len(shapes) >= 2:
        x, w = shapes[0], shapes[1]
        nsp = len(x) - 2
        i_st, i_pad, i_dil = CONV_ARG_POS.get(name, (3, 4, 5))
        stride = _concrete_ints(c(i_st)) or [1]
        pad = _concrete_ints(c(i_pad)) or [0]
        dil = _concrete_ints(c(i_dil)) or [1]
        sp = []
        for k in range(nsp):
            s_, p_, d_ = (v[k] if k < len(v) else v[-1] for v in (stride, pad, dil))
            sp.append((x[2 + k] + 2 * p_ - d_ * (w[2 + k] - 1) - 1) // s_ + 1)
        return [x[0], w[0]] + sp, dt0
    if name in REDUCTION_OPS:
        dims = _concrete_ints(c(1))
        keep = c(2) == "True"
        x = shapes[0]
        if dims is None or dims == []:
            return ([1] * len(x) if keep else []), ("int64" if base.startswith("arg") else dt0)
        red = {d % len(x) for d in dims} if x else set()
        return [1 if i in red else s for i, s in enumerate(x) if keep or i not in red], \
            ("int64" if base.startswith("arg") else dt0)
    if name in ("aten::cat", "aten::concat", "aten::stack") and all(dt for *_, dt in ts):
        d = (_concrete_ints(c(1)) or [0])[0]
        if name == "aten::stack":
            d %= len(shapes[0]) + 1
            return shapes[0][:d] + [len(shapes)] + shapes[0][d:], dt0
        live = [x for x in shapes if x != [0]]  # cat skips empty 1-d inputs
        d %= max(1, len(live[0]))
        return live[0][:d] + [sum(x[d] for x in live)] + live[0][d + 1:], dt0
    if name in ("aten::embedding",) and len(shapes) >= 2:
        return shapes[1] + shapes[0][1:], dt0
    if name == "aten::index_select" and len(shapes) >= 2:
        d = (_concrete_ints(c(1)) or [0])[0] % max(1, len(shapes[0]))
        return shapes[0][:d] + [prod(shapes[1])] + shapes[0][d + 1:], dt0
    if name in ("aten::gather", "aten::take") and len(shapes) >= 2:
        return shapes[1], dt0
    if name in ("aten::_to_copy", "aten::to"):
        code = _concrete_ints(c(1))
        return shapes[0], SCALAR_TYPES.get(code[0], dt0) if code else dt0
    if name.endswith("_") and not name.endswith("__"):  # in place: writes its first input
        return shapes[0], dt0
    out_dt = "bool" if name in BOOL_OPS else next((t for _, _, _, t in ts if t.startswith(("float", "bfloat"))), dt0)
    return broadcast(shapes), out_dt


#: convolution backward ops -> (input, grad_output, weight) argument positions: the record's output is
#: grad_input (the input's shape; grad_weight's bytes are left out, so the floor stays a lower bound) and
#: its FLOPs are two forwards' (grad_input and grad_weight), as torch.utils.flop_counter counts them
CONV_BACKWARD_OPS = {"aten::convolution_backward": (1, 0, 2), "aten::cudnn_convolution_backward": (0, 1, 2),
                     "aten::miopen_convolution_backward": (0, 1, 2)}
#: (stride, padding, dilation) argument positions of the convolutions whose signature differs from
#: ``aten::convolution``'s (input, weight, bias, stride, padding, dilation, ...)
CONV_ARG_POS = {"aten::cudnn_convolution": (3, 2, 4), "aten::miopen_convolution": (4, 3, 5),
                "aten::mkldnn_convolution": (4, 3, 5)}


def flops_of(name: str, ts: list[tuple[int, list[int], Any, str]], out: list[int] | None) -> int:
    """``torch.utils.flop_counter``'s count for the matmul family from shapes, else 0."""
    s = [d for _, d, _, _ in ts]
    try:
        if name in ("aten::mm", "aten::_scaled_mm") and len(s) >= 2:
            return 2 * s[0][0] * s[0][1] * s[1][1]
        if name in ("aten::addmm", "aten::_addmm_activation") and len(s) >= 3:
            return 2 * s[1][0] * s[1][1] * s[2][1]
        if name == "aten::bmm" and len(s) >= 2:
            return 2 * s[0][0] * s[0][1] * s[0][2] * s[1][2]
        if name == "aten::baddbmm" and len(s) >= 3:
            return 2 * s[1][0] * s[1][1] * s[1][2] * s[2][2]
        if name in ("aten::linear", "aten::matmul") and out is not None and len(s) >= 2:
            k = s[0][-1]
            return 2 * prod(out) * k
        if name in ("aten::mv", "aten::addmv") and len(s) >= 2:
            return 2 * prod(s[-2])
        if name in CONV_BACKWARD_OPS and len(s) >= 3:  # grad_input and grad_weight: each a forward's FLOPs
            _, i_go, i_w = CONV_BACKWARD_OPS[name]
            return 2 * 2 * prod(s[i_go]) * prod(s[i_w][1:])
        if name in CONV_OPS and "transpose" not in name and out and len(s) >= 2:
            w = s[1]
            return 2 * prod(out) * prod(w[1:])
        if name in PART_ATTENTION_OPS and len(s) >= 3:
            q, k, v = s[0], s[1], s[2]
            bh = prod(q[:-2])
            return 2 * bh * q[-2] * k[-2] * q[-1] + 2 * bh * q[-2] * k[-2] * v[-1]
    except (IndexError, TypeError):
        return 0
    return 0


class ShapeModel:
    """Records for one step's outermost ops in order, with the identity estimate (module doc)."""

    def __init__(self) -> None:
        self.n = 0
        self.latest: dict[tuple[int, str], tuple] = {}  # (numel, dtype) -> key of the latest output
        self.dtype_of: dict[int, str] = {}  # numel -> dtype of the latest output of that size

    def _new(self) -> tuple:
        self.n += 1
        return ("trace", self.n)

    def record(self, name: str, args: dict[str, Any], ext: Any = None) -> TraceOpRecord | None:
        """The record of one op, or None for a view / allocation (no traffic)."""
        if name in VIEW_OPS:
            return None
        ts, complete = tensors(args)
        if any(dt is None for *_, dt in ts):  # tensor-list members: the dtype of their producer in this step
            found = [(i, d, st, self.dtype_of.get(prod(d))) for i, d, st, dt in ts]
            complete = complete and all(dt for *_, dt in found)
            ts = found
        concrete = args.get("Concrete Inputs") or []
        out = out_shape(name, ts, concrete) if complete else None
        if not complete or out is None or not ts:
            return TraceOpRecord(name, 0, 0, [t for _, _, _, t in ts if t], [], shapes=False, ext=ext)
        reads = []
        in_keys = []
        for _, d, st, dt in ts:
            n_b = span_bytes(d, st, ITEM_BYTES[dt])
            k = self.latest.get((prod(d), dt)) or self._new()
            in_keys.append(k)
            if n_b:
                reads.append((k, n_b))
        odims, odt = out
        o_b = prod(odims) * ITEM_BYTES.get(odt, 4) if odims is not None else 0
        if name in GATHER_OPS and reads:  # the rows it returns, not the whole source
            src_k, src_b = reads[0]
            reads[0] = (src_k, min(src_b, o_b))
        inplace = name.endswith("_") and not name.endswith("__")
        if name == "aten::copy_" and len(ts) >= 2:
            okey = in_keys[0]
            reads = reads[1:]  # copy_ reads its source, writes its destination
        elif inplace:
            okey = in_keys[0]
        else:
            okey = self._new()
        merged: dict = {}
        for k, b in reads:  # one storage read twice (cat([z, z])) is read once, as the live model's span
            merged[k] = max(merged.get(k, 0), b)
        reads = list(merged.items())
        writes = [(okey, o_b)] if o_b else []
        self.latest[(prod(odims), odt)] = okey
        self.dtype_of[prod(odims)] = odt
        return TraceOpRecord(name, sum(b for _, b in reads), o_b, [t for _, _, _, t in ts], [odt],
                             flops=flops_of(name, ts, odims), reads=reads, writes=writes, ext=ext)
