"""Lab 4, round 5c (issue #19): the attention launched as before round 5, with (batch x head) the
grid's fastest axis (:func:`bh_major`), for an A/B of the grid's order inside the decode step.

Round 5b timed the attention alone (split fastest: faster at 512 and 32k, equal at 4k); the
lab run that followed read the fixed path's 4k step 3% slower than the call before it, and 32k
3% faster, with the order changed in between and run-to-run spread of that size. The A/B that
settles it inside one process is ``lab04_round6.py``'s ``bh_major`` choice (this file first had a
driver of its own, written after round 5's device time was spent and never run; round 6's harness
replaced it). Its answer (benchmarks/LAB04_NOTES.md, round 6): the split-fastest order cost the 4k
step together with a last split of one position (1.964 against bh-major's 1.868 ms); with that
split folded into the one before it, 1.862.
"""
from __future__ import annotations

import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lab04_round5 import LOG2E, _attn_v2  # noqa: E402

from hwlab.labs.fp8.attention import DEFAULT_TILE, chunk_for, combine_splits  # noqa: E402


def bh_major(q, kc, vc, kv_scale, n_ctx, use_triton=None, tile=DEFAULT_TILE, out_scale=None):
    """The decode attention as launched before round 5: (batch x head) the grid's fastest axis."""
    B, H, T, D = kc.shape
    chunk = chunk_for(tile, B * H, n_ctx)
    n_splits = triton.cdiv(n_ctx, chunk)
    m = torch.empty((B * H, n_splits), dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    acc = torch.empty((B * H, n_splits, D), dtype=torch.float32, device=q.device)
    q = q if q.stride(3) == 1 else q.contiguous()
    _attn_v2[(B * H, n_splits)](q, kc, vc, kv_scale.reshape(1).float(), m, l, acc, n_ctx, T, n_splits,
                                LOG2E / D ** 0.5, H, q.stride(0), q.stride(1), D=D, CHUNK=chunk,
                                BLOCK_T=tile.block_t, PREFETCH=False, SPLIT_MAJOR=False,
                                num_warps=tile.num_warps, num_stages=tile.num_stages)
    return combine_splits(m, l, acc, q, out_scale)

