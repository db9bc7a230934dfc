"""Scratch buffers that Lab 4's kernels leave zeroed after every call: split-K sums and tile
counters (:mod:`.decode_gemm`), the attention's per-row counters (:mod:`.attention`).

Kept per (device, name) and grown as needed, so that calls, and CUDA-graph replays (which must
not allocate), reuse one zeroed buffer; the kernel that uses a buffer zeroes what it used before
it exits. Calls on one stream run one at a time, so one buffer per name is enough.
"""
from __future__ import annotations

import torch

_BUFFERS: dict[tuple[str, str], torch.Tensor] = {}
#: buffers replaced by a larger one, never freed: a CUDA graph captured before the growth still
#: reads and writes the old address, and freed memory would be handed to other tensors
_RETIRED: list[torch.Tensor] = []


def zeroed(device, name: str, n: int, dtype: torch.dtype) -> torch.Tensor:
    """A zeroed ``dtype`` buffer of at least ``n`` elements named ``name`` on ``device``; the same
    tensor on every call unless it must grow (RuntimeError if that happens inside a CUDA-graph
    capture: run the call once eagerly before capturing it). A grown buffer's old tensor is kept
    (:data:`_RETIRED`): graphs captured before still use it (a sweep whose graphs captured ever
    larger split-K slabs would otherwise replay on a freed one)."""
    key = (str(device), name)
    buf = _BUFFERS.get(key)
    if buf is None or buf.numel() < n:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"the {name} buffer was first needed inside a CUDA-graph capture: run the call once "
                               "eagerly before capturing it")
        if buf is not None:
            _RETIRED.append(buf)
        buf = torch.zeros(max(n, 0 if buf is None else buf.numel()), dtype=dtype, device=device)
        _BUFFERS[key] = buf
    return buf


def buffer(device, name: str) -> torch.Tensor | None:
    """The buffer ``name`` on ``device`` if a call made it (for tests: it must be zero again)."""
    return _BUFFERS.get((str(device), name))
