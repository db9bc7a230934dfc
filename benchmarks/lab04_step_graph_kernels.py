"""Lab 4, round 11 (issue #19): the fixed decode step's kernels inside its CUDA graph, with the lab's
attention and with the lean loop at 8 positions per step: which kernels the lean loop makes slower.

    python benchmarks/lab04_step_graph_kernels.py OUT.json [--buckets 4096x16,32768x4] [--replays 20]

Round 11 measured the lean loop faster than the lab's alone at 32k and the step slower with it
(LAB04_NOTES.md round 11, item 2). Here both steps are captured as ``lab04_round10.py`` captures
them, replayed to sustained state (alternately), then ``--replays`` replays of each are recorded by
torch.profiler (kernels inside a graph replay are traced on the device); per kernel name, device time
per step. The attention's kernels are the rows whose name holds ``decode_attn``.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab04_round6 as r6  # noqa: E402
import lab04_round10 as r10  # noqa: E402
from lab04_round11 import KERNELS_11  # noqa: E402

from hwlab.labs import fp8 as lab  # noqa: E402
from hwlab.core.measure_graph import capture_graph  # noqa: E402
from hwlab.core.store import write_json_atomic  # noqa: E402

CHOICES = ("lab", "lean, 8 per step")


def kernels_per_step(cap, replays: int) -> dict:
    """Device time per step (us) of each kernel name over ``replays`` graph replays."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            cap.replay()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        if us > 0 and e.device_type.name == "CUDA":
            out[e.key] = {"us_per_step": us / replays, "count_per_step": e.count / replays}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--buckets", default="4096x16,32768x4")
    ap.add_argument("--replays", type=int, default=20)
    a = ap.parse_args()
    dev = torch.device("cuda")
    m = lab.Decoder(lab.H200_SIZE, "fixed")
    res = {"device": torch.cuda.get_device_name(), "triton": __import__("triton").__version__,
           "replays": a.replays, "rows": []}
    for spec in a.buckets.split(","):
        ctx, batch = (int(v) for v in spec.split("x"))
        decode, cache = r6.prefilled_decode(m, ctx, batch, dev)
        graphs = {}
        with torch.no_grad():
            for name in CHOICES:
                with r10.attention_as(KERNELS_11[name]):
                    graphs[name] = capture_graph(decode, dev)
            diff = r6.logits_diff_vs_lab(graphs)
            ms = r6.alternate(graphs, 3)  # sustained state, and a step time beside the profile
            row = {"ctx": ctx, "batch": batch, "logits_rel_diff_vs_lab": diff,
                   "step_ms_alternate": {k: sorted(v)[len(v) // 2] for k, v in ms.items()}, "kernels": {}}
            for name in CHOICES:
                row["kernels"][name] = kernels_per_step(graphs[name], a.replays)
        for name in CHOICES:
            ks = row["kernels"][name]
            attn = sum(v["us_per_step"] for k, v in ks.items() if "decode_attn" in k)
            total = sum(v["us_per_step"] for v in ks.values())
            row.setdefault("attention_us_per_step", {})[name] = attn
            row.setdefault("kernels_us_per_step", {})[name] = total
            print(f"{ctx} x{batch} {name}: step {row['step_ms_alternate'][name]:.4f} ms, kernels {total:.1f} us, "
                  f"attention {attn:.1f} us, other {total - attn:.1f} us", flush=True)
        res["rows"].append(row)
        del graphs, cache
        torch.cuda.empty_cache()
    write_json_atomic(a.out, res, overwrite=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
