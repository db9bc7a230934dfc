"""Fused native ops split into the parts their work is (:func:`hwlab.examine.parts.build_parts`).

Some aten ops are whole layers run natively: PyTorch's encoder fast path
(``aten::_transformer_encoder_layer_fwd``), native multi-head attention, the fused optimizers
(SDPA and its variants are attention whole, by the kit's table, and are not split). The
traffic model (a dispatch mode, :mod:`hwlab.examine.estimate`) sees each as one op with no matmul
FLOPs, so joined to it, a layer's GEMMs, attention and elementwise work would all be read as one
elementwise part. Instead an item under a fused native op (:data:`FUSED_NATIVE_OPS`) is classed by
what it is:

* on a GPU, by its kernel's name (the kit's one table, :func:`hwlab.core.profiling.part_class`),
  its bytes and FLOPs counted from the shapes the profiler recorded for the op that launched it,
  once per op however many kernels it launched;
* on a CPU (no kernels), by the innermost aten op over it: ``mm`` / ``addmm`` are GEMMs, ``bmm`` and
  softmax inside an attention op (:data:`ATTENTION_PARENTS`) are attention, the rest elementwise
  by the same table; its bytes and FLOPs are counted from the shapes the profiler recorded for that
  op (:class:`hwlab.traces.trace_shapes.ShapeModel`), each op on its own (no fusion credit, since
  the native op already ran its steps one after another).

The fused op's own traffic record is joined to none of the parts: its bytes would otherwise be
counted once in every part it feeds.
"""
from __future__ import annotations

from typing import Any

from hwlab.core.profiling import PART_ATTENTION_OPS, part_class

#: aten ops that run a layer (or an optimizer step) natively: their items are split by what they are
FUSED_NATIVE_OPS = frozenset((
    "aten::_transformer_encoder_layer_fwd", "aten::_native_multi_head_attention",
    "aten::_transformer_decoder_only_layer_fwd", "aten::_native_decoder_only_multi_head_attention",
    "aten::_fused_adam_", "aten::_fused_adamw_", "aten::_fused_sgd_", "aten::_fused_adagrad_"))
#: ops whose batched matmuls and softmax are attention (the rest of their work is projections)
ATTENTION_PARENTS = frozenset(("aten::_native_multi_head_attention",
                               "aten::_native_decoder_only_multi_head_attention"))
#: the ops of attention's core inside an attention parent
ATTENTION_CORE = frozenset(("aten::bmm", "aten::baddbmm", "aten::_softmax", "aten::softmax",
                            "aten::_masked_softmax", "aten::matmul"))


def fused_owner(it: dict[str, Any]) -> str | None:
    """The fused native op over an item (:data:`FUSED_NATIVE_OPS`), or None."""
    return next((n for n in reversed(it.get("inner_stack") or it["stack"]) if n in FUSED_NATIVE_OPS), None)


#: what :meth:`FusedSplit.classify` returns for a GPU kernel whose launching op an earlier kernel of
#: the same call already counted (one op, several kernels: its FLOPs and bytes once)
COUNTED = object()


class FusedSplit:
    """Classes and counts items under fused native ops, one shape model per profiled call."""

    def __init__(self) -> None:
        from hwlab.traces.trace_shapes import ShapeModel

        self._model_type = ShapeModel
        self._model = ShapeModel()
        self._seen: set = set()
        self.used = False

    def new_call(self) -> None:
        self._model = self._model_type()
        self._seen = set()

    def _kernel_record(self, it: dict[str, Any], inner: str) -> Any:
        """A GPU kernel's launching op, counted from its recorded shapes once per op (:data:`COUNTED`
        for its later kernels), or None without shapes."""
        oid = (it.get("inner_op_ids") or it.get("op_ids") or [None])[0]
        if oid is not None and oid in self._seen:
            return COUNTED
        self._seen.add(oid)
        rec = self._model.record(inner, it["op_args"])
        return None if rec is None or rec.shapes is False else rec

    def classify(self, it: dict[str, Any]) -> tuple[str, Any]:
        """(part class, op record from its recorded shapes or None) of an item under a fused op."""
        self.used = True
        stack = it.get("inner_stack") or it["stack"]  # a trace's item names its outermost op in "stack"
        inner = stack[0] if stack else None
        rec = None
        if it["kernel"] is None and inner is not None and it.get("args"):
            rec = self._model.record(inner, it["args"])
            if rec is not None and rec.shapes is False:
                rec = None
        elif it["kernel"] is not None and inner is not None and it.get("op_args"):
            rec = self._kernel_record(it, inner)
        dtypes = tuple(rec.in_dtypes) if rec is not None and rec is not COUNTED else ()
        if any(n in PART_ATTENTION_OPS for n in stack):  # SDPA in a layer: all of it attention, as elsewhere
            cls = "attention"
        elif it["kernel"] is not None:  # a GPU kernel: its name decides
            cls = part_class(inner, it["kernel"], dtypes, it["compiled"])
        elif inner in ATTENTION_CORE and any(n in ATTENTION_PARENTS for n in stack[1:]):
            cls = "attention"
        elif inner in FUSED_NATIVE_OPS:  # the fused op's own self time: its glue between steps
            cls = "elementwise/reduction"
        else:
            cls = part_class(inner, None, dtypes, False)
        if cls == "gemm" and dtypes:
            cls = f"gemm {dtypes[0]}"
        return cls, rec


def fused_matmul(calls: list) -> tuple[int, str | None]:
    """Matmul-family FLOPs per call of the work inside fused native ops (the GEMM and attention
    items, counted from their recorded shapes as the parts count them; median over the profiled
    calls), which ``torch.utils.flop_counter`` cannot see: it counts the fused op as one op with
    none; and the input dtype of their first GEMM. ``(0, None)`` where no fused op ran."""
    import statistics
    per_call, dtype = [], None
    split = FusedSplit()
    for items in calls:
        split.new_call()
        tot = 0
        for it in items:
            if fused_owner(it) is None:
                continue
            cls, rec = split.classify(it)
            if rec is not None and rec is not COUNTED and (cls.startswith("gemm") or cls == "attention"):
                tot += int(rec.flops)
                if dtype is None and cls.startswith("gemm") and rec.in_dtypes:
                    dtype = rec.in_dtypes[0]
        per_call.append(tot)
    return (int(statistics.median(per_call)) if per_call else 0), dtype


def fused_matmul_flops(calls: list) -> int:
    """The FLOPs of :func:`fused_matmul`."""
    return fused_matmul(calls)[0]
