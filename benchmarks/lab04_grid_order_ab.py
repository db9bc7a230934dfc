"""Lab 4, round 5c (issue #19): the attention grid's order inside the fixed path's decode step,
A/B in one process.

    python benchmarks/lab04_grid_order_ab.py OUT.json [--rounds 7]

Round 5b timed the attention alone (split fastest: faster at 512 and 32k, equal at 4k); the
lab run that followed read the fixed path's 4k step 3% slower than the call before it, and 32k
3% faster, with the order changed in between and run-to-run spread of that size. This settles it
inside one process: the fixed decoder (H200 size), one prefill per bucket, two CUDA graphs of the
same decode step (the lab's split-fastest kernel, and the round-5 copy of the kernel with the
(batch x head)-fastest grid it had before), checked against each other, then replayed in
alternation, ``--rounds`` rounds of 20 replays each, device events around each replay.

Not run as such: ``lab04_round6.py`` (round 6) imports :func:`bh_major` from here and times it in the
same decode-step A/B as its other choices. Its answer (benchmarks/LAB04_NOTES.md, round 6): the split-
fastest order cost the 4k step together with a last split of one position (1.964 against bh-major's
1.868 ms); with that split folded into the one before it, 1.862.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lab04_round5 import LOG2E, _attn_v2  # noqa: E402

from hwlab.labs import fp8 as lab  # noqa: E402
from hwlab.labs.fp8 import model  # noqa: E402
from hwlab.labs.fp8.attention import DEFAULT_TILE, chunk_for, combine_splits  # noqa: E402
from hwlab.measure_graph import capture_graph  # noqa: E402


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--buckets", default="4096x16,32768x4")
    a = ap.parse_args()
    dev = torch.device("cuda")
    res = {"device": torch.cuda.get_device_name(), "rows": []}
    m = lab.Decoder(lab.H200_SIZE, "fixed")
    lab_kernel = model.K.decode_attention
    for spec in a.buckets.split(","):
        ctx, batch = (int(v) for v in spec.split("x"))
        g = torch.Generator().manual_seed(2)
        toks = torch.randint(0, m.cfg.vocab, (batch, ctx + 1), generator=g).to(dev)
        cache = m.new_cache(batch, ctx + 1)
        with torch.no_grad():
            m(toks[:, :ctx], cache)

            def decode():
                cache.len = ctx
                return m(toks[:, ctx:ctx + 1], cache)

            caps = {}
            for name, fn in (("split fastest (lab)", lab_kernel), ("batch x head fastest (before)", bh_major)):
                model.K.decode_attention = fn
                try:
                    caps[name] = capture_graph(decode, dev)
                finally:
                    model.K.decode_attention = lab_kernel
            outs = []
            for c in caps.values():
                c.replay()
                torch.cuda.synchronize()
                outs.append(c.out.float().clone())
            diff = float((outs[0] - outs[1]).norm() / outs[1].norm())
            ms = {k: [] for k in caps}
            for _ in range(3):  # sustained state
                for c in caps.values():
                    for _ in range(20):
                        c.replay()
            torch.cuda.synchronize()
            for _ in range(a.rounds):
                for k, c in caps.items():
                    t = []
                    for _ in range(20):
                        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        e0.record()
                        c.replay()
                        e1.record()
                        e1.synchronize()
                        t.append(e0.elapsed_time(e1))
                    ms[k].append(statistics.median(t))
        row = {"ctx": ctx, "batch": batch, "logits_rel_diff": diff, "tpot_ms_per_round": ms,
               "tpot_ms": {k: statistics.median(v) for k, v in ms.items()}}
        res["rows"].append(row)
        print(f"ctx {ctx} x{batch}: " + ", ".join(f"{k} {v:.3f} ms ({min(ms[k]):.3f}-{max(ms[k]):.3f})"
                                                  for k, v in row["tpot_ms"].items()) + f"; logits differ {diff:.1e}",
              flush=True)
        del caps, cache
        torch.cuda.empty_cache()
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
