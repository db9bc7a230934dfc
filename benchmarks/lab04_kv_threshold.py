"""Lab 4 (issue #19), one question: does an FP8 KV cache pay at the short-context bucket now?

    python benchmarks/lab04_kv_threshold.py OUT.json

The fixed path keeps a bf16 KV cache below 4k context (``PATHS["fixed"]["kv_fp8_from_ctx"]``),
chosen when the FP8 attention read ~1.4 TB/s at 512 x16; exercise 04 grades the choice by bytes
(FP8 KV pays where the cache is at least half of a step's bytes). This times the fixed path's
decode step at 512 x16 both ways on this GPU (the lab's ``time_prefill_decode``: CUDA graph,
sustained state), so the notes can say whether the time now disagrees with the byte rule.
Research: nothing in the lab reads the result.
"""
from __future__ import annotations

import json
import sys

import torch

from hwlab.labs import fp8 as lab


def main(out_path: str) -> int:
    res = {"device": torch.cuda.get_device_name(), "bucket": [512, 16], "rows": []}
    for threshold in (4096, 512):
        m = lab.Decoder(lab.H200_SIZE, {**lab.PATHS["fixed"], "kv_fp8_from_ctx": threshold})
        t = lab.time_prefill_decode(m, 16, 512, n_rep=10)
        nb = lab.decode_bytes(m, 16, 512)
        res["rows"].append({"kv_fp8_from_ctx": threshold, "kv_fp8": t["kv_fp8"], "tpot_ms": t["tpot_ms"],
                            "decode_bytes": nb, "decode_gbps": nb / t["tpot_ms"] / 1e6})
        print(f"fixed, KV FP8 from {threshold}: KV {'FP8' if t['kv_fp8'] else 'bf16'}, TPOT {t['tpot_ms']:.3f} ms, "
              f"{nb / 1e9:.2f} GB, {nb / t['tpot_ms'] / 1e6:.0f} GB/s", flush=True)
        del m
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
