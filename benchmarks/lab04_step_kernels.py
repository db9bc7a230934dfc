"""Lab 4 (issue #19): every kernel of one fixed-path decode step, by name, with its count and
device time, per bucket: what the "other" and "quant/dequant" classes of the lab's breakdown
hold, so the next cut of small kernels is aimed at measured names.

    python benchmarks/lab04_step_kernels.py OUT.json [--buckets 512x16,4096x16]

One profiled step after a prefill and one unprofiled step (``profile._profile_decode_step``, the
lab's own), the H200-size fixed decoder; kernel times from torch.profiler's device events. The
committed run (results/round6/step_kernels_h200.*) predates the filter of the lab's record_function
ranges: its "hwlab::quant_fp8" row sums kernels listed on their own rows too.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from hwlab.labs import fp8 as lab
from hwlab.labs.fp8.profile import _profile_decode_step


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--buckets", default="512x16,4096x16")
    a = ap.parse_args()
    m = lab.Decoder(lab.H200_SIZE, "fixed")
    res = {"device": torch.cuda.get_device_name(), "rows": []}
    for spec in a.buckets.split(","):
        ctx, batch = (int(v) for v in spec.split("x"))
        prof = _profile_decode_step(m, batch, ctx)
        kernels = {}
        for e in prof.key_averages():
            us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            # a record_function range (the lab's "hwlab::..." marks) sums the kernels inside it: not a kernel
            if us > 0 and e.device_type.name == "CUDA" and not e.key.startswith("hwlab::"):
                kernels[e.key] = {"count": e.count, "us": us}
        rows = sorted(kernels.items(), key=lambda kv: -kv[1]["us"])
        res["rows"].append({"ctx": ctx, "batch": batch, "kernels": dict(rows),
                            "total_us": sum(v["us"] for v in kernels.values())})
        print(f"ctx {ctx} x{batch}: {sum(v['us'] for v in kernels.values()):.0f} us in "
              f"{sum(v['count'] for v in kernels.values())} kernels", flush=True)
        for name, v in rows:
            print(f"  {v['count']:3d} x {v['us'] / v['count']:8.1f} us = {v['us']:8.1f} us  {name[:110]}", flush=True)
        torch.cuda.empty_cache()
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=1)
    os.replace(tmp, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
