"""Run Triton kernels where there is no GPU: switch on the interpreter before kernels are defined.

``TRITON_INTERPRET=1`` makes ``@triton.jit`` kernels run in NumPy on CPU tensors. It is
read when a kernel is *decorated*, so every module that defines kernels imports this first.
Limits of the interpreter: fp32/fp16 are right, **bf16 is not** (use :func:`check_dtype`),
and it says nothing about GPU speed.
"""
from __future__ import annotations

import os
import sys

import torch

_triton_was_loaded = "triton" in sys.modules
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "0":
    if _triton_was_loaded and os.environ.get("TRITON_INTERPRET") != "1":
        # triton.language's own @jit helpers (tl.sigmoid, tl.cdiv, ...) were built for a GPU
        # when triton was imported; kernels calling them would fail in the interpreter.
        raise ImportError("no GPU here, and triton was imported before hwlab: import hwlab "
                          "(or set TRITON_INTERPRET=1) before `import triton`")
    os.environ["TRITON_INTERPRET"] = "1"
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def check_dtype(dtype: torch.dtype) -> None:
    """Refuse bf16 in the interpreter: it computes wrong answers there."""
    if INTERPRETED and dtype == torch.bfloat16:
        raise ValueError("bf16 gives wrong results in the Triton interpreter (no GPU here); "
                         "use float32 or float16 on CPU")
