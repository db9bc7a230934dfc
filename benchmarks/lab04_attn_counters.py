"""Lab 4, round 10 (issue #19): what the hardware counters say about the FP8 attention's gap to SDPA.

    ncu --clock-control none --target-processes all --csv --page raw \\
        --kernel-name regex:'decode_attn_partial|stream_kv|flash|fmha|attention' \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \\
        --section LaunchStats python benchmarks/lab04_attn_counters.py [--more] > OUT.csv

Round 10's A/B (``lab04_round10.py``) found the kit's kernel no faster with 38% fewer instructions
per byte (the lean loop) nor with 32 one-warp programs resident per SM instead of 28 (64 registers):
neither issue rate nor residency sets its speed. This runs one layer of the lab's comparison at 4k
x16 and 32k x4 (the lab's kernel on the FP8 cache, SDPA on the bf16 one, each checked against the
float32 reference first), a few launches each, for Nsight Compute to read DRAM throughput, the
warps' stall reasons and the achieved occupancy of both. ``--clock-control none`` leaves the GPU's
clocks as they are (Nsight Compute would otherwise lock them to base for the profile).

``--more`` (call 7, 4k only): also the load-only probe of the lab's access pattern
(:func:`hwlab.labs.fp8.research.stream_kv`, 1 warp, 16 positions per step, chunks of 256), which
read at SDPA's rate in call 6, and round 10's per-row loop through a 3-deep shared-memory pipeline.
"""
from __future__ import annotations

import dataclasses
import os
import sys

import torch
import torch.nn.functional as F

from hwlab.labs.fp8 import research as R

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab04_round6 as r6  # noqa: E402

from hwlab.labs import fp8 as lab  # noqa: E402
from hwlab.labs.fp8 import attention as A  # noqa: E402

LAUNCHES = 3


def main(more: bool = False) -> None:
    dev = torch.device("cuda")
    cfg = dataclasses.replace(lab.H200_SIZE, n_layers=1)  # one layer's caches: 0.5-1 GB, far past L2
    for ctx, batch in ((4096, 16),) if more else ((4096, 16), (32768, 4)):
        kb, vb, q, s8, kf, vf, ref8, ref16 = r6.attn_inputs(cfg, batch, ctx, dev)
        with torch.no_grad():
            out = A.decode_attention(q, kf[0], vf[0], s8, ctx)
            err = float((out.float() - ref8).norm() / ref8.norm())
            out16 = F.scaled_dot_product_attention(q, kb[0], vb[0])
            err16 = float((out16.float() - ref16).norm() / ref16.norm())
            assert err < A.FP8_CACHE_MATH_REL and err16 < 1e-2, (err, err16)
            for _ in range(LAUNCHES):
                A.decode_attention(q, kf[0], vf[0], s8, ctx)
            for _ in range(LAUNCHES):
                F.scaled_dot_product_attention(q, kb[0], vb[0])
            if more:
                want = R.stream_kv(kf[0], vf[0], 256, 16, use_triton=False)
                assert torch.equal(R.stream_kv(kf[0], vf[0], 256, 16), want)
                rows = R.decode_attention_lean(q, kf[0], vf[0], s8, ctx, rows=True, loop_stages=3,
                                               tile=A.AttnTile(num_stages=3))
                assert float((rows.float() - ref8).norm() / ref8.norm()) < A.FP8_CACHE_MATH_REL
                for _ in range(LAUNCHES):
                    R.stream_kv(kf[0], vf[0], 256, 16)
                    R.decode_attention_lean(q, kf[0], vf[0], s8, ctx, rows=True, loop_stages=3,
                                            tile=A.AttnTile(num_stages=3))
            torch.cuda.synchronize()
        print(f"{ctx} x{batch}: checked (kit {err:.1e}, sdpa {err16:.1e}), {LAUNCHES} launches each", flush=True)
        del kb, vb, kf, vf
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main("--more" in sys.argv[1:])
