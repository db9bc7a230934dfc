"""Record the dtype lever of one model, predicted against realised, on the machine it runs on (CPU or GPU).

    python tools/record_dtype_lever.py [--target examples/small_transformer.py:gpt2_small] --out DIR

* **Predicted.** ``hwlab examine TARGET --model --json`` (its own process, one torch thread on a CPU):
  the fp32 GEMM part's leaf, the ceiling it was judged against (TF32 on a GPU, bf16 on a CPU with
  native bf16), its share, and the whole call's predicted speed-up if that part reached its floor
  (the part's ``speedup``: an upper bound, the floor being the ceiling's) and, where the kit gives
  one, at the part's present efficiency (``lever_speedup``).
* **Realised.** In this process, the same model and inputs timed by the kit's own timer
  (:func:`hwlab.core.measure.time_fn`: CUDA events on a GPU, net of the run-queue wait on a CPU) in
  fp32 at PyTorch's default precision, then with the fix the walk names: TF32 matmuls on a GPU
  (``torch.backends.cuda.matmul.allow_tf32``), bf16 autocast on either. Each variant's output is
  checked against fp32's first (relative error under :data:`TOL` for its precision); its median and
  p10-p90 are recorded, and the realised speed-up is fp32's median over the variant's, with the
  range from the two timings' p10/p90 ends.
* **Read.** The prediction is within 1.3x of the realised gain, or it is labelled an upper bound
  (the part's floor at the ceiling) in the record; the record says which.

Written as JSON under ``--out``, named by UTC time and device; never over an earlier one.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: largest relative error of a variant's output against fp32's, per precision (bf16 keeps 8 bits of mantissa)
TOL = {"tf32": 2e-2, "bf16": 6e-2}
#: the issue's bar: a predicted gain within this factor of the realised one
WITHIN = 1.3


def predicted(target: str, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    rec = out.with_suffix(".examine.json")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "hwlab", "examine", target, "--model", "--json", "--out", str(rec)],
                       capture_output=True, text=True, env=env, timeout=900)
    d = json.loads(p.stdout)
    parts = d["parts"]["parts"]
    g = next((x for x in parts if x["name"].startswith("gemm float32")), None)
    keep = ("name", "share_pct", "t_ms", "leaf", "borderline", "alternatives", "ceiling_tflops", "tflops",
            "speedup", "lever_speedup", "lever_gain", "dtype_lever", "floor_source", "notes")
    return {"rc": p.returncode, "wall_s": time.perf_counter() - t0, "record": rec.name,
            "headline_leaf": d.get("leaf"), "gemm_part": {k: g.get(k) for k in keep} if g else None}


def _max_rel_err(out, ref) -> float:
    import torch
    o, r = out.float(), ref.float()
    return float((o - r).abs().max() / r.abs().max().clamp_min(1e-30))


def realised(target: str) -> dict:
    import torch

    from hwlab.core.measure import time_fn
    from hwlab.examine.target import load_model
    sys.path.insert(0, str(ROOT))
    module, args, make = load_model(target)
    args = make() if make else args
    gpu = torch.cuda.is_available()
    dev = torch.device("cuda" if gpu else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    def run_fp32(*a):
        return module(*a)

    def run_bf16(*a):
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            return module(*a)

    variants = {"fp32": run_fp32, "bf16": run_bf16}
    if gpu:
        variants["tf32"] = run_fp32  # the same call with TF32 switched on around it (below)
    out: dict = {"device": torch.cuda.get_device_name(0) if gpu else "cpu", "variants": {}}
    with torch.inference_mode():
        ref = module(*args)
        ref = ref[0] if isinstance(ref, (tuple, list)) else ref
        for name, fn in variants.items():
            torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
            torch.backends.cudnn.allow_tf32 = name == "tf32"
            got = fn(*args)
            got = got[0] if isinstance(got, (tuple, list)) else got
            err = _max_rel_err(got, ref)
            if name != "fp32" and err > TOL[name]:
                out["variants"][name] = {"refused": f"relative error {err:.3g} over {TOL[name]}"}
                continue
            t = time_fn(fn, [args], dev, n_warmup=3, n_rep=15 if not gpu else 50, max_total_s=120.0,
                        net_of_wait=not gpu)
            out["variants"][name] = {"median_ms": t.median_ms, "p10_ms": t.p10_ms, "p90_ms": t.p90_ms,
                                     "n": len(t.samples_ms), "timer": t.timer, "rel_err_vs_fp32": err}
        torch.backends.cuda.matmul.allow_tf32 = False
    base = out["variants"]["fp32"]
    for name, v in out["variants"].items():
        if name != "fp32" and "median_ms" in v:
            v["speedup"] = base["median_ms"] / v["median_ms"]
            v["speedup_range"] = [base["p10_ms"] / v["p90_ms"], base["p90_ms"] / v["p10_ms"]]
    return out


def read(pred: dict, real: dict) -> dict:
    """The prediction against the realised gain of the fix it names (TF32 on a GPU, bf16 on a CPU)."""
    g = pred.get("gemm_part") or {}
    fix = "tf32" if "tf32" in real["variants"] else "bf16"
    v = real["variants"].get(fix, {})
    out = {"fix": fix, "realised": v.get("speedup"), "realised_range": v.get("speedup_range")}
    for key in ("lever_speedup", "speedup"):
        p = g.get(key)
        if p and v.get("speedup"):
            ratio = max(p, v["speedup"]) / min(p, v["speedup"])
            out[key] = {"predicted": p, "ratio": ratio, f"within_{WITHIN}x": ratio <= WITHIN,
                        "label": "upper bound (the part at its floor on the ceiling)" if key == "speedup"
                        else "at the part's present efficiency"}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="examples/small_transformer.py:gpt2_small")
    ap.add_argument("--out", required=True, type=Path)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H%M%SZ", time.gmtime())
    import torch
    label = "gpu" if torch.cuda.is_available() else "cpu"
    dest = a.out / f"dtype-lever-{stamp}-{label}.json"
    if dest.exists():
        print(f"record_dtype_lever: {dest} exists; pass another --out", file=sys.stderr)
        return 2
    pred = predicted(a.target, dest)
    print(f"predicted: {json.dumps(pred)[:600]}", file=sys.stderr)
    real = realised(a.target)
    rec = {"kind": "dtype_lever", "target": a.target, "when_unix_s": int(time.time()), "predicted": pred,
           "realised": real, "read": read(pred, real),
           "load_1_5_15": list(os.getloadavg())}
    tmp = dest.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=1) + "\n")
    tmp.replace(dest)
    print(json.dumps(rec["read"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
