"""Counting the work of an arbitrary function: required bytes, FLOPs, and a traffic model.

Three figures, each labelled with where it came from (``hwlab examine`` shows the label):

* **required bytes** — every input tensor read once and every output tensor written once,
  each *storage* counted once (two views of one buffer are one read), each tensor counted
  by the span of memory its view covers (a broadcast stride-0 view covers one row). This is
  the minimum DRAM traffic, the floor of :mod:`hwlab.core.measure`.
* **FLOPs** — :class:`torch.utils.flop_counter.FlopCounterMode` over one call. It counts the
  matmul family (mm, addmm, bmm, convolution, attention) as ``2*M*N*K`` and nothing else:
  elementwise work is not counted (it never sets a floor next to its bytes), and neither is
  anything inside a Triton kernel or a ``torch.compile``d graph (pass ``n_flops`` then).
* **moved bytes (traffic model)** — a :class:`TrafficCounter` dispatch mode sees every aten
  op the function runs with its real tensors: each op's inputs read and outputs written
  (view ops move nothing). We use a dispatch mode rather than the profiler's recorded shapes
  because the profiler records input shapes only, not outputs, strides or index values.
  Reads are scaled by an **estimated sector amplification**: GPU memory moves 32-byte sectors,
  so a warp whose 32 lanes read 4-byte items at a stride of >= 8 items drags 32 sectors where
  4 would do (8x). For elementwise/copy ops the stride of each input along the output's
  contiguous dimension gives it; for gather ops (index, index_select, gather, embedding,
  take) the op is replayed on a tensor of storage offsets, so the distinct sectors each group
  of 32 consecutive outputs touches are counted from the real index values. Matmuls,
  reductions and convolutions read in their own tiled order: no estimate (1x assumed, said).
  Ops inside a Triton kernel or a compiled graph are invisible to the dispatch mode; the
  profiler says when that happened and the moved bytes are then labelled as not attributable.

Thresholds live in the flowchart; this module only counts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode, flop_registry

#: GPU memory transaction granularity (bytes) and a warp's width
SECTOR_BYTES = 32
WARP = 32
#: gather ops whose first argument is the source tensor, replayed on offsets to count sectors
GATHER_OPS = ("aten::index", "aten::index_select", "aten::gather", "aten::embedding", "aten::take")
#: ops that allocate without writing (no traffic)
NO_TRAFFIC_OPS = ("aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
                  "aten::new_empty_strided", "aten::lift_fresh", "aten::detach", "aten::alias",
                  "aten::_local_scalar_dense", "aten::set_", "aten::resize_")
#: matmul-family ops (their FLOPs decide the GEMM ceiling's dtype)
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm",
              "aten::convolution", "aten::_convolution", "aten::_scaled_dot_product_flash_attention",
              "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
              "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::linear", "aten::matmul")
#: replaying a gather on offsets costs a tensor the size of its source: skip beyond this
MAX_GATHER_SOURCE = 1 << 28
#: outputs of a gather sampled to count sectors (a multiple of WARP)
GATHER_SAMPLE = 1 << 20
LOW_PRECISION = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "int8", "uint8",
                 "int4", "uint4")


def op_name(func: Any) -> str:
    """``aten.mm.default`` -> ``aten::mm`` (the profiler's spelling)."""
    s = str(func)
    parts = s.split(".")
    return f"{parts[0]}::{parts[1]}" if len(parts) >= 2 else s


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def tensors_of(obj: Any) -> list[torch.Tensor]:
    """Every tensor in a nested structure of tuples, lists and dicts."""
    leaves, _ = tree_flatten(obj)
    return [x for x in leaves if isinstance(x, torch.Tensor)]


def storage_key(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def span(t: torch.Tensor) -> tuple[int, int]:
    """[start, end) in bytes of the memory the view ``t`` covers within its storage."""
    es = t.element_size()
    lo = hi = t.storage_offset()
    for size, st in zip(t.shape, t.stride()):
        if size > 1:
            if st >= 0:
                hi += (size - 1) * st
            else:
                lo += (size - 1) * st
    return lo * es, (hi + 1) * es


def span_bytes(tensors: list[torch.Tensor], skip: set | None = None) -> int:
    """Bytes covered by ``tensors``, each storage once (overlapping views merged)."""
    by_storage: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for t in tensors:
        if t.numel() == 0:
            continue
        k = storage_key(t)
        if skip and k in skip:
            continue
        by_storage.setdefault(k, []).append(span(t))
    return sum(union_len(spans) for spans in by_storage.values())


def union_len(spans: list[tuple[int, int]]) -> int:
    """Total length of the union of [start, end) intervals."""
    total, end = 0, None
    for lo, hi in sorted(spans):
        if end is None or lo > end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total


def required_bytes(inputs: Any, outputs: Any) -> tuple[int, int]:
    """(bytes read, bytes written): input tensors once each, outputs that are not views of an
    input once each."""
    ins = tensors_of(inputs)
    read = span_bytes(ins)
    written = span_bytes(tensors_of(outputs), skip={storage_key(t) for t in ins})
    return read, written


def count_flops(fn: Callable[..., Any], args: tuple, kwargs: dict) -> int:
    """FLOPs of one call as FlopCounterMode counts them (matmul family only, see above)."""
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        fn(*args, **kwargs)
    return int(fc.get_total_flops())


def _contiguous_dim(t: torch.Tensor) -> int | None:
    """The dimension a kernel walks fastest when writing ``t`` (smallest non-zero stride)."""
    dims = [(abs(st), d) for d, (s, st) in enumerate(zip(t.shape, t.stride())) if s > 1 and st != 0]
    return min(dims)[1] if dims else None


def strided_amplification(src: torch.Tensor, out: torch.Tensor) -> float | None:
    """Sectors per ideal for reading ``src`` while writing ``out`` elementwise (same or
    broadcast shape): stride of ``src`` along ``out``'s contiguous dimension, in items, capped
    at a sector per item. None when the shapes do not broadcast (not elementwise)."""
    try:
        b = src.expand(out.shape)
    except RuntimeError:
        return None
    d = _contiguous_dim(out)
    if d is None:
        return 1.0
    st = abs(b.stride()[d])
    if st <= 1:  # contiguous, or broadcast (stride 0) and served from cache
        return 1.0
    per_sector = max(1, SECTOR_BYTES // src.element_size())
    return float(min(st, per_sector))


def gather_replay(func: Any, args: tuple, kwargs: dict) -> tuple[float | None, int | None]:
    """(amplification, distinct source bytes read) of a gather op, from the real index values:
    the op is replayed on a tensor of storage offsets. Amplification: distinct 32-byte source
    sectors per group of 32 consecutive outputs, over the ideal. (None, None) where the replay
    does not fit the op."""
    src = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if src is None or src.numel() == 0 or src.numel() > MAX_GATHER_SOURCE:
        return None, None
    try:
        n_storage = src.storage_offset() + sum((s - 1) * st for s, st in zip(src.shape, src.stride())) + 1
        base = torch.arange(n_storage, device=src.device, dtype=torch.int64)
        offs = torch.as_strided(base, src.shape, src.stride(), src.storage_offset())
        out_offs = func(offs, *args[1:], **kwargs)
    except Exception:  # an op the replay does not fit (odd signature): no estimate, said
        return None, None
    es = src.element_size()
    touched = int(torch.unique(out_offs.reshape(-1)).numel()) * es
    flat = out_offs.reshape(-1)[:GATHER_SAMPLE]
    n = (flat.numel() // WARP) * WARP
    if n == 0:
        return None, touched
    sectors = (flat[:n] * es // SECTOR_BYTES).view(-1, WARP).sort(dim=1).values
    distinct = 1 + (sectors[:, 1:] != sectors[:, :-1]).sum(dim=1)
    ideal = max(1, math.ceil(WARP * es / SECTOR_BYTES))
    return float(distinct.double().mean().item()) / ideal, touched


def gather_amplification(func: Any, args: tuple, kwargs: dict) -> float | None:
    """The amplification part of :func:`gather_replay`."""
    return gather_replay(func, args, kwargs)[0]


@dataclass
class OpRecord:
    """One aten op a call ran: its traffic and dtypes."""

    name: str
    read_bytes: int
    written_bytes: int
    in_dtypes: list[str]
    out_dtypes: list[str]
    amplification: float | None  # estimated sectors over ideal for its reads; None: no estimate
    reads_dequantized: bool = False  # a GEMM reading an output of a dequant op in this call
    flops: int = 0  # torch.utils.flop_counter's formula for this op (matmul family), else 0
    #: (storage key, bytes) read / written: lets a group of ops be floored as if fused
    #: (:func:`hwlab.examine.parts.fused_floor_bytes`); a gather's source counts what it touched
    reads: list = field(default_factory=list)
    writes: list = field(default_factory=list)

    @property
    def moved_bytes(self) -> float:
        return self.read_bytes * (self.amplification or 1.0) + self.written_bytes

    @property
    def kind(self) -> str:
        """matmul / quant / dequant / gather / copy-or-elementwise."""
        if self.name in MATMUL_OPS:
            return "matmul"
        if self.name in ("aten::_to_copy", "aten::copy_", "aten::to") and self.in_dtypes and self.out_dtypes:
            if self.out_dtypes[0] in LOW_PRECISION and self.in_dtypes[0] not in LOW_PRECISION:
                return "quant"
            if self.in_dtypes[0] in LOW_PRECISION and self.out_dtypes[0] not in LOW_PRECISION:
                return "dequant"
        if self.name in GATHER_OPS:
            return "gather"
        return "other"


class TrafficCounter(TorchDispatchMode):
    """Records an :class:`OpRecord` for every aten op run under it (see the module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[OpRecord] = []
        self._dequantized: set = set()
        self.produced: set = set()  # storages written by an op of this call
        self.external: dict[tuple[str, int], list[tuple[int, int]]] = {}  # read, not produced here
        self.gathered: dict[tuple[str, int], int] = {}  # gather source -> distinct bytes it read
        self.read_whole: set = set()  # storages some op reads other than as a gather's source
        #: allocation generation per storage address: the caching allocator hands a freed
        #: buffer's address to the next tensor, so reads/writes are keyed (device, address, gen)
        self._gen: dict = {}

    def vkey(self, t: torch.Tensor) -> tuple:
        """The storage of ``t`` as it is now: (device, address, allocation generation)."""
        k = storage_key(t)
        return (*k, self._gen.get(k, 0))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = op_name(func)
        ins = tensors_of((args, kwargs))
        outs = tensors_of(out)
        if getattr(func, "is_view", False):
            return out
        for t in ins:  # tensors that existed before the call: its inputs, and captured weights
            k = storage_key(t)
            if k not in self.produced and t.numel():
                self.external.setdefault(k, []).append(span(t))
        self.produced.update(storage_key(t) for t in outs)
        in_vkeys = [self.vkey(t) for t in ins]
        raw_in = {storage_key(t) for t in ins}
        for t in outs:  # a new allocation at a freed buffer's address is a new tensor: next generation
            k = storage_key(t)
            if k not in raw_in:
                self._gen[k] = self._gen.get(k, 0) + 1
        if name in NO_TRAFFIC_OPS:
            return out
        src_key = storage_key(args[0]) if name in GATHER_OPS and args and isinstance(args[0], torch.Tensor) \
            else None
        self.read_whole.update(storage_key(t) for t in ins if storage_key(t) != src_key)
        read = span_bytes(ins)
        written = span_bytes(outs)
        amp: float | None = None
        touched = None
        with torch.no_grad():
            if name in GATHER_OPS:
                g, touched = gather_replay(func, args, kwargs)
                if touched is not None and src_key is not None:
                    self.gathered[src_key] = self.gathered.get(src_key, 0) + touched
                elif src_key is not None:
                    self.read_whole.add(src_key)
                if touched is not None:  # a gather reads the elements it touches, not its whole source
                    rest = read - span_bytes([args[0]])
                    read = touched + rest
                    if g is not None and read:
                        # the source read is amplified; the index and other inputs are read once
                        amp = (touched * g + rest) / read
            elif name not in MATMUL_OPS and len(outs) == 1 and ins:
                amps = [(span_bytes([t]), strided_amplification(t, outs[0])) for t in ins
                        if t.dim() and t.dim() <= outs[0].dim()]
                if amps and all(a is not None for _, a in amps):
                    tot = sum(b for b, _ in amps)
                    amp = sum(b * a for b, a in amps) / tot if tot else None
        reads = [(vk, span_bytes([t])) for t, vk in zip(ins, in_vkeys) if t.numel()]
        if name in GATHER_OPS and src_key is not None and touched is not None:
            reads = [(k, touched if k[:2] == src_key else b) for k, b in reads]
        packet = getattr(func, "overloadpacket", None)
        flops = 0
        if packet in flop_registry:
            try:
                flops = int(flop_registry[packet](*args, **kwargs, out_val=out))
            except Exception:  # a formula that does not fit this call: no FLOPs, as FlopCounterMode
                flops = 0
        rec = OpRecord(name, read, written, [dtype_name(t.dtype) for t in ins],
                       [dtype_name(t.dtype) for t in outs], amp, flops=flops, reads=reads,
                       writes=[(self.vkey(t), span_bytes([t])) for t in outs if t.numel()])
        if rec.kind == "dequant":
            self._dequantized.update(storage_key(t) for t in outs)
        elif rec.kind == "matmul":
            rec.reads_dequantized = any(storage_key(t) in self._dequantized for t in ins)
        self.ops.append(rec)
        return out


@dataclass
class Traffic:
    """The traffic model of one call (see the module doc), summed over its ops."""

    ops: list[OpRecord] = field(default_factory=list)
    external: dict = field(default_factory=dict)  # storage -> spans read that the call did not write
    gathered: dict = field(default_factory=dict)  # gather source storage -> distinct bytes read
    read_whole: set = field(default_factory=set)  # storages read other than as a gather source
    out_keys: set = field(default_factory=set)  # storages of what the call returned

    def _needed(self, key, span_len: int) -> int:
        """A storage only ever read through gathers needs only the elements they touched."""
        if key in self.gathered and key not in self.read_whole:
            return min(span_len, self.gathered[key])
        return span_len

    def input_read_bytes(self, inputs: Any) -> int:
        """Required reads of the inputs: each storage's span, or the distinct elements gathers
        touched where a storage is only read through gathers (a lookup in a large table)."""
        by: dict = {}
        for t in tensors_of(inputs):
            if t.numel():
                by.setdefault(storage_key(t), []).append(span(t))
        return sum(self._needed(k, union_len(v)) for k, v in by.items())

    def captured_read_bytes(self, inputs: Any) -> int:
        """Bytes of tensors the call read that were neither its inputs nor made by it: weights of
        an ``nn.Module``, tensors a closure or a global holds. They are required reads too."""
        skip = {storage_key(t) for t in tensors_of(inputs)}
        return sum(self._needed(k, union_len(v)) for k, v in self.external.items() if k not in skip)

    @property
    def moved_bytes(self) -> int:
        return int(sum(o.moved_bytes for o in self.ops))

    @property
    def unamplified_bytes(self) -> int:
        return int(sum(o.read_bytes + o.written_bytes for o in self.ops))

    @property
    def sector_amplification(self) -> float | None:
        """Read-bytes-weighted estimated amplification over the ops that have an estimate."""
        est = [o for o in self.ops if o.amplification is not None and o.read_bytes]
        tot = sum(o.read_bytes for o in est)
        return sum(o.read_bytes * o.amplification for o in est) / tot if tot else None

    def matmul_dtype(self) -> str | None:
        """The input dtype of the matmul ops that read the most bytes (None: no matmul)."""
        by: dict[str, int] = {}
        for o in self.ops:
            if o.kind == "matmul" and o.in_dtypes:
                by[o.in_dtypes[0]] = by.get(o.in_dtypes[0], 0) + o.read_bytes
        return max(by, key=by.get) if by else None

    def counts(self) -> dict[str, int]:
        c = {"ops": len(self.ops), "matmul": 0, "quant": 0, "dequant": 0, "gather": 0,
             "fp8_matmul": 0, "matmul_on_dequantized": 0}
        for o in self.ops:
            if o.kind in c:
                c[o.kind] += 1
            if o.name == "aten::_scaled_mm":
                c["fp8_matmul"] += 1
            if o.reads_dequantized:
                c["matmul_on_dequantized"] += 1
        return c

    def by_op(self) -> dict[str, dict[str, Any]]:
        agg: dict[str, dict[str, Any]] = {}
        for o in self.ops:
            a = agg.setdefault(o.name, {"count": 0, "moved_bytes": 0, "dtypes": set()})
            a["count"] += 1
            a["moved_bytes"] += int(o.moved_bytes)
            a["dtypes"].update(o.in_dtypes + o.out_dtypes)
        return {k: {**v, "dtypes": sorted(v["dtypes"])} for k, v in agg.items()}


def count_traffic(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Traffic:
    """Run ``fn`` once under :class:`TrafficCounter`. A ``torch.compile``d function runs its
    ops eagerly under a dispatch mode; the caller checks the profile to know (see module doc)."""
    tc = TrafficCounter()
    with torch.no_grad(), tc:
        out = fn(*args, **kwargs)
    return Traffic(tc.ops, tc.external, tc.gathered, tc.read_whole,
                   out_keys={tc.vkey(t) for t in tensors_of(out)})
