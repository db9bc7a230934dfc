"""Lab 4, round 9 (issue #19): does the way a comparison is timed move the FP8 attention's share
of SDPA? The lab's comparison (:func:`hwlab.labs.fp8.run.attention_vs_sdpa`) times each way's CUDA
graph back to back in one sustained block (:func:`hwlab.core.measure.time_fn`); the round scripts' A/B
(:func:`lab04_round6.alternate`) synchronises after every replay and alternates the ways. On the
same code the two read the kit's kernel at 89-92% and 96-97% of SDPA at 32k (LAB04_NOTES round 9).

    python benchmarks/lab04_timing_method.py OUT.json

Per shape (4k x16, 32k x4, T = context, 8 layers' caches), the lab's kernel on the FP8 cache and
SDPA on the bf16 one, each way timed both methods, twice in alternating order, with the SM clock
(NVML) read at the end of each timed block.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab04_round6 as r6  # noqa: E402

from hwlab.labs import fp8 as lab  # noqa: E402
from hwlab.labs.fp8 import attention as A  # noqa: E402
from hwlab.core.measure import time_fn  # noqa: E402
from hwlab.core.measure_graph import capture_graph  # noqa: E402
from hwlab.core.store import write_json_atomic  # noqa: E402


def sm_clock_mhz() -> int | None:
    try:
        import pynvml
        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetClockInfo(pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.NVML_CLOCK_SM))
    except Exception:  # noqa: BLE001 - no NVML: the clock is not part of the result then
        return None


def main(out_path: str) -> None:
    dev = torch.device("cuda")
    cfg = lab.H200_SIZE
    n = cfg.n_layers
    rows = []
    t0 = time.time()
    for ctx, batch in ((4096, 16), (32768, 4)):
        kb, vb, q, s8, kf, vf, ref8, ref16 = r6.attn_inputs(cfg, batch, ctx, dev)
        with torch.no_grad():
            kit = capture_graph(lambda: [A.decode_attention(q, kf[i], vf[i], s8, ctx) for i in range(n)], dev)
            kit.replay()
            torch.cuda.synchronize()
            err = float((kit.out[0].float() - ref8).norm() / ref8.norm())
            sdpa, err16 = r6.sdpa_graph(q, kb, vb, ref16, dev)
        assert err < A.FP8_CACHE_MATH_REL and err16 < 1e-2, (err, err16)
        graphs = {"kit": kit, "sdpa": sdpa}
        bytes8 = 2 * kf[0].numel()
        res = {"ctx": ctx, "batch": batch, "rel_err": {"kit": err, "sdpa": err16}, "blocks": []}
        for order in (("kit", "sdpa"), ("sdpa", "kit")):
            for name in order:  # the lab's method: one sustained block per way
                t = time_fn(graphs[name].replay, [()], dev, n_rep=20)
                res["blocks"].append({"method": "sustained block", "way": name, "us_per_layer": t.median_ms * 1e3 / n,
                                      "sm_mhz_after": sm_clock_mhz()})
            ms = r6.alternate({k: graphs[k] for k in order}, 7)  # the A/B's method
            for name in order:
                res["blocks"].append({"method": "alternate, sync per replay", "way": name,
                                      "us_per_layer": statistics.median(ms[name]) * 1e3 / n,
                                      "sm_mhz_after": sm_clock_mhz()})
        for method in ("sustained block", "alternate, sync per replay"):
            us = {w: statistics.median(b["us_per_layer"] for b in res["blocks"] if b["method"] == method and b["way"] == w)
                  for w in ("kit", "sdpa")}
            res[method] = {"us_per_layer": us, "kit_over_sdpa_gbps": (bytes8 / us["kit"]) / (2 * bytes8 / us["sdpa"])}
            print(f"{ctx} x{batch} {method}: kit {us['kit']:.1f} us, sdpa {us['sdpa']:.1f} us, "
                  f"kit at {res[method]['kit_over_sdpa_gbps']:.1%} of SDPA's GB/s", flush=True)
        print("  clocks:", [(b["method"][:9], b["way"], b["sm_mhz_after"]) for b in res["blocks"]], flush=True)
        rows.append(res)
        del graphs, kit, sdpa, kb, vb, kf, vf
        torch.cuda.empty_cache()
    write_json_atomic(out_path, {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows,
                                 "elapsed_s": time.time() - t0}, overwrite=True)


if __name__ == "__main__":
    main(sys.argv[1])
