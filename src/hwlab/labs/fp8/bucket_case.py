"""Lab 4's second instance (exercise 04): another deployment where another layer falls back.

A smaller decoder (:data:`CASE_CONFIG`) served on an FP8 path whose trunk runs the lab's
calibrated FP8 GEMM, head in bf16 on purpose, the first and last blocks in bf16; its FP8 GEMM
library has a kernel for the ``down`` projection only at row counts that are a multiple of
:data:`CASE_DOWN_ROWS_MULTIPLE` (``fp8_rows_multiple``: the seed's partial fallback, by shape, on a
layer other than notebook 04's ``out``). The bucket mix (:data:`CASE_BUCKETS`) has one bucket whose
batch has no such kernel, so every FP8 ``down`` there reads a dequantized bf16 copy each step.

:func:`bucket_profile_table` profiles one decode step of a bucket with ``torch.profiler``
(input shapes recorded) and returns the GEMM and quant/dequant rows of its table, as a learner
reads them, beside the step's own count of fallbacks (:func:`hwlab.labs.fp8.profile.decode_profile`'s,
from the layers that dequantized in that step); exercise 04 prints the first and grades with the second.
"""
from __future__ import annotations

from typing import Any

from hwlab.labs.fp8.model import DEQUANT_MARK, QUANT_MARK, Decoder, ModelConfig, QLinear
from hwlab.labs.fp8.profile import _hits, _profile_decode_step

CASE_CONFIG = ModelConfig(vocab=512, d_model=64, n_layers=4, n_heads=4, d_ff=256)
CASE_DOWN_ROWS_MULTIPLE = 4
CASE_PATH: dict[str, Any] = {"main": "fp8_static", "connector": "fp8_static", "head": "bf16",
                             "bf16_edge_layers": 1, "fp8_rows_multiple": {"down": CASE_DOWN_ROWS_MULTIPLE}}
#: (context, batch) per bucket of the service
CASE_BUCKETS = ((64, 8), (128, 6), (256, 4))
#: profiler rows a learner reads for GEMMs and the quant/dequant ranges
TABLE_OPS = ("aten::linear", "aten::_scaled_mm", DEQUANT_MARK, QUANT_MARK)


_MODELS: dict[str, Decoder] = {}


def case_model(device="cpu") -> Decoder:
    """The instance's decoder on ``device``, built (and calibrated) once per process: profiling a
    step leaves its weights as they were."""
    key = str(device)
    if key not in _MODELS:
        _MODELS[key] = Decoder(CASE_CONFIG, CASE_PATH, device=device)
    return _MODELS[key]


def layer_shapes(m: Decoder | None = None) -> dict[str, tuple[int, int]]:
    """Weight shape (out_features, in_features) per layer kind (trunk kinds without the index)."""
    out: dict[str, tuple[int, int]] = {}
    for name, mod in (m or case_model()).named_modules():
        if isinstance(mod, QLinear):
            out.setdefault(name.split(".")[-1], (mod.out_features, mod.in_features))
    return out


def bucket_profile_table(m: Decoder, batch: int, ctx: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One decode step at ``ctx`` with ``batch`` rows, profiled: the table's rows for
    :data:`TABLE_OPS` grouped by input shapes (name, shapes, calls), and the step's counts
    (:func:`~hwlab.labs.fp8.profile._hits`: hit rate, the layers that fell back)."""
    prof = _profile_decode_step(m, batch, ctx, record_shapes=True)
    rows = []
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key in TABLE_OPS:
            # an FP8 GEMM's two operands; its scales (0-d, or repeated per row on a CPU: model.scaled_mm) are
            # not what a learner reads the table for
            shapes = [list(s) for s in (e.input_shapes or [])[:2 if e.key == "aten::_scaled_mm" else None] if s]
            rows.append({"op": e.key, "input_shapes": shapes, "calls": int(e.count)})
    rows.sort(key=lambda r: (TABLE_OPS.index(r["op"]), str(r["input_shapes"])))
    return rows, _hits(m, prof, batch)
