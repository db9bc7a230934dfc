"""The bandwidth lab's second instance (exercise 01): bias, tanh-GELU, a scale and a shift, stored
transposed: ``y = (gelu_tanh(x + bias) * scale + shift).T`` for a row-major ``x (rows, cols)``, as
a layer hands its activations to a GEMM that wants them K-major.

Eager PyTorch runs five passes (the add, the GELU, the scale, the shift, and the copy that
``.t().contiguous()`` makes), and the copy reads one side with a stride of a whole row. The work needs one read of
``x``, one of ``bias`` and one write of ``y``: :func:`traffic` counts that floor. A fused kernel
that walks ``x`` along rows must write ``y`` down its columns (or the other way round) unless
it moves a 2-D tile, which is the point of the exercise.
"""
from __future__ import annotations

import torch

from hwlab.core import tritonenv
from hwlab.core.measure import device_of


def make_inputs(n_rows: int, n_cols: int, dtype=torch.float16, device=None):
    """Fresh random ``x (rows, cols)`` and ``bias (cols,)``."""
    dev = device_of(device)
    tritonenv.check_dtype(dtype)
    return (torch.randn(n_rows, n_cols, device=dev, dtype=dtype),
            torch.randn(n_cols, device=dev, dtype=dtype))


#: the layer's scale and shift after the GELU
SCALE, SHIFT = 0.5, 0.125


def eager(x, bias, scale: float = SCALE, shift: float = SHIFT):
    """What a model writes: five kernels, four intermediates in DRAM, one strided copy."""
    return (torch.nn.functional.gelu(x + bias, approximate="tanh") * scale + shift).t().contiguous()


def reference(x, bias, scale: float = SCALE, shift: float = SHIFT):
    """float64 reference, ``(cols, rows)``, on the inputs' device."""
    return (torch.nn.functional.gelu(x.double() + bias.double(), approximate="tanh") * scale + shift).t()


def traffic(n_rows: int, n_cols: int, itemsize: int) -> dict[str, int]:
    """The floor: ``x`` and ``y`` once each, ``bias`` once."""
    return {"bytes_required": (2 * n_rows * n_cols + n_cols) * itemsize}
