"""Six public models examined three times each under a CPU burner, beside an independent profile and
the fp32-vs-bf16 speed they realise (issue 63's "Done when"). A research bench, not a test, not shipped.

    .venv/bin/python tools/six_models.py [--models gpt2,bert,...] [--runs 3] [--burners 1] [--label vm-cpu]

Needs ``transformers`` in the venv (not a project dependency: ``.venv/bin/pip install transformers``;
ResNet-50 is built in pure torch). Each model is built from its
config with random weights (nothing downloaded), small enough that one examination takes well under a
minute at rest, in fp32; the factories below are ``hwlab examine`` targets (``tools/six_models.py:gpt2``).

Per model, with ``--burners`` processes of ``python -c 'while 1: pass'`` running for the whole bench:

* ``--runs`` examinations, each its own process: ``python -m hwlab examine tools/six_models.py:NAME
  --model --json`` with one torch thread (``OMP_NUM_THREADS=1``); per run each part's leaf, BORDERLINE
  flag, alternatives, share and share range, the headline, the GEMM part's dtype lever and predicted
  whole-function speed-up at its floor.
* An **independent profile** in a fresh process of its own, before the runs: ``torch.profiler`` around 12 single
  calls (each its own session, in a ``record_function`` range, the thread's run-queue wait and page
  faults read around it, three unprofiled calls' faults just before it as the reference), every op's
  self time classed by :func:`hwlab.core.profiling.part_class` on its own name, or on
  the GEMM / attention op it runs inside (the same classification), time outside ops = the range's self
  time; per part the median share over the 5 least disturbed calls (wait plus faults beyond the
  reference, at the measured cost per fault) and their range.
* ``--malloc-fixed``: the whole bench (this process and every examination) runs with glibc's heap
  trim and mmap thresholds fixed (``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``), so no
  process returns freed tensor memory to the OS between calls. Without it a process may take
  thousands of page faults per call or none, by chance of its heap, which moves the shares of
  allocating ops between processes (the record keeps each side's faults per call either way).
* The **realised bf16 gain**: the model in fp32 and a copy in bf16 called alternately, each call's wall
  time net of this thread's run-queue wait (:mod:`hwlab.core.hostwait`); medians and p10-p90, and each
  side's median page faults per call (a process whose heap churns pays them in the fp32 calls more).

Read against the issue: **plain contradictions** (two runs of a model stating different leaves for the
same part, neither BORDERLINE), **one-sided BORDERLINE pairs** (one run BORDERLINE on a part, the other
plainly on a leaf: a reader of the plain one alone is not told), the **max share difference** of any
run's part from the independent median (at most 5 points; also how far outside the independent
calls' own range it lies), parts walked in one run and under the walk share in another,
GPT-2's and BERT's GEMM part on I with the bf16 lever, and the predicted speed-up within 1.3x of the
realised one (or labelled an upper bound).

The record is written under ``tools/results/examine/`` as JSON (``six-models-<UTC>-<label>.json``),
with the load average before and after each step; nothing earlier is overwritten.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
SELF = Path(__file__).resolve().relative_to(ROOT)
#: the issue's budgets (module doc)
SHARE_DIFF_PTS = 5.0
GAIN_TOL = 1.3
MODELS = ("gpt2", "bert", "t5", "resnet50", "llama", "vit")
CALL_MARK = "six_models::call"
#: ``--malloc-fixed``: no heap trimming, and tensors up to glibc's largest mmap threshold from the heap
MALLOC_FIXED = {"MALLOC_TRIM_THRESHOLD_": str(1 << 32), "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}


# --- the six models (``hwlab examine`` targets: each returns (module, inputs)) -------------------------

def _ids(vocab: int, batch: int, seq: int):
    import torch
    return lambda: (torch.randint(0, vocab, (batch, seq)),)


def gpt2():
    from transformers import GPT2Config, GPT2Model
    import torch
    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=256, n_layer=2, n_head=4, vocab_size=2048, n_positions=512, bos_token_id=0,
                     eos_token_id=0)
    return GPT2Model(cfg), _ids(cfg.vocab_size, 2, 128)


def bert():
    from transformers import BertConfig, BertModel
    import torch
    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024,
                     vocab_size=2048, max_position_embeddings=512)
    return BertModel(cfg), _ids(cfg.vocab_size, 2, 128)


def t5():
    from transformers import T5Config, T5Model
    import torch
    torch.manual_seed(0)
    cfg = T5Config(d_model=256, d_ff=1024, d_kv=64, num_heads=4, num_layers=2, num_decoder_layers=2,
                   vocab_size=2048)
    class EncDec(torch.nn.Module):  # positional (ids, decoder ids): the examine target takes tensors
        def __init__(self):
            super().__init__()
            self.t5 = T5Model(cfg)

        def forward(self, ids, dec_ids):
            return self.t5(input_ids=ids, decoder_input_ids=dec_ids).last_hidden_state

    return EncDec(), lambda: (torch.randint(0, cfg.vocab_size, (2, 64)), torch.randint(0, cfg.vocab_size, (2, 64)))


def resnet50():
    """ResNet-50 (torchvision's layout: bottlenecks [3, 4, 6, 3], widths 64-512, expansion 4) in pure
    torch: torchvision's PyPI wheel for this torch did not load its native ops on this machine."""
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, c_in, width, stride):
            super().__init__()
            c_out = 4 * width
            self.body = nn.Sequential(
                nn.Conv2d(c_in, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, c_out, 1, bias=False), nn.BatchNorm2d(c_out))
            self.down = (nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
                         if stride != 1 or c_in != c_out else nn.Identity())

        def forward(self, x):
            return torch.relu(self.body(x) + self.down(x))

    torch.manual_seed(0)
    layers: list = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                    nn.MaxPool2d(3, 2, 1)]
    c = 64
    for width, n, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for k in range(n):
            layers.append(Bottleneck(c, width, stride if k == 0 else 1))
            c = 4 * width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 1000)]
    return nn.Sequential(*layers), lambda: (torch.randn(1, 3, 64, 64),)


def llama():
    from transformers import LlamaConfig, LlamaModel
    import torch
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, vocab_size=2048, max_position_embeddings=512)
    return LlamaModel(cfg), _ids(cfg.vocab_size, 2, 128)


def vit():
    from transformers import ViTConfig, ViTModel
    import torch
    torch.manual_seed(0)
    cfg = ViTConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024,
                    image_size=96, patch_size=16)
    return ViTModel(cfg, add_pooling_layer=False), lambda: (torch.randn(4, 3, 96, 96),)


# --- the independent profile and the realised bf16 gain -----------------------------------------------

def _cast_args(args: tuple, dtype) -> tuple:
    import torch
    return tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def _owner_class(e, dtype: str) -> str:
    """An op's part by its own name, or by the GEMM / attention op it runs inside (a convolution's or
    SDPA's inner ops are its work), by :func:`hwlab.core.profiling.part_class`."""
    from hwlab.core.profiling import part_class
    cls = part_class(e.name, None, (dtype,))
    p = e.cpu_parent
    while p is not None:
        if p.name != CALL_MARK:
            c = part_class(p.name, None, (dtype,))
            if c.startswith("gemm") or c == "attention":
                cls = c
        p = p.cpu_parent
    return cls


def independent_profile(name: str, n_calls: int = 12, n_least: int = 5) -> dict[str, Any]:
    """Per part: the median share over the ``n_least`` least disturbed of ``n_calls`` single-call
    profiles (each its own profiler session; a call's disturbance is its run-queue wait plus its page
    faults beyond the median of three unprofiled calls just before it, at this process's measured
    cost per fault), and their range (module doc)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function
    from hwlab.core.hostwait import fault_us, faults, wait_ns
    m, inputs = globals()[name]()
    m.eval()
    args = inputs()
    cost = fault_us() or 0.0
    per_call: list[tuple[float, dict[str, float]]] = []
    seen: list[dict[str, float]] = []
    with torch.no_grad():
        for _ in range(3):
            m(*args)
        for _ in range(n_calls):
            ref = []
            for _ in range(3):
                f0 = faults()
                m(*args)
                ref.append((faults() or 0) - (f0 or 0))
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                w0, f0 = wait_ns(), faults()
                with record_function(CALL_MARK):
                    m(*args)
                w1, f1 = wait_ns(), faults()
            evs = prof.events()
            call = next(e for e in evs if e.name == CALL_MARK)
            total = call.cpu_time_total
            parts: dict[str, float] = {"host outside ops": call.self_cpu_time_total}
            for e in evs:
                if e.name == CALL_MARK:
                    continue
                cls = _owner_class(e, "float32")
                parts[cls] = parts.get(cls, 0.0) + e.self_cpu_time_total
            wait_us = (w1 - w0) / 1e3 if w0 is not None and w1 is not None else 0.0
            n_faults = (f1 or 0) - (f0 or 0)
            excess_us = max(0.0, n_faults - statistics.median(ref)) * cost
            seen.append({"wait_us": round(wait_us, 1), "faults": n_faults, "ref_faults": statistics.median(ref),
                         "call_us": round(total, 1)})
            per_call.append((wait_us + excess_us, {k: 100.0 * v / total for k, v in parts.items()}))
    order = sorted(range(len(per_call)), key=lambda k: (per_call[k][0], k))[:n_least]
    use = [per_call[k][1] for k in order]
    names = sorted({k for c in use for k in c})
    out: dict[str, Any] = {k: {"median_pct": statistics.median(c.get(k, 0.0) for c in use),
                               "range_pct": [min(c.get(k, 0.0) for c in use), max(c.get(k, 0.0) for c in use)]}
                           for k in names}
    out["_calls_used"] = sorted(order)
    out["_calls"] = seen
    out["_fault_us"] = cost
    return out


def realised_bf16(name: str, n_calls: int = 15) -> dict[str, Any]:
    """fp32 against bf16 of the same weights, calls alternating, each net of the run-queue wait."""
    import torch
    from hwlab.core.hostwait import faults, net_ms, wait_ns
    m, inputs = globals()[name]()
    m.eval()
    mb = copy.deepcopy(m).to(torch.bfloat16)
    args = inputs()
    args_b = _cast_args(args, torch.bfloat16)
    t: dict[str, list[float]] = {"fp32": [], "bf16": []}
    flt: dict[str, list[int]] = {"fp32": [], "bf16": []}
    with torch.no_grad():
        for _ in range(3):
            m(*args), mb(*args_b)
        for _ in range(n_calls):
            for key, mod, a in (("fp32", m, args), ("bf16", mb, args_b)):
                f0, w0, c0 = faults(), wait_ns(), time.perf_counter_ns()
                mod(*a)
                c1, w1, f1 = time.perf_counter_ns(), wait_ns(), faults()
                flt[key].append((f1 or 0) - (f0 or 0))
                wall = (c1 - c0) / 1e6
                t[key].append(net_ms(wall, (w1 - w0) / 1e6 if w0 is not None and w1 is not None else None))

    def q(xs, f):
        s = sorted(xs)
        return s[min(len(s) - 1, int(f * (len(s) - 1) + 0.5))]

    out = {k: {"median_ms": statistics.median(v), "p10_ms": q(v, 0.1), "p90_ms": q(v, 0.9)} for k, v in t.items()}
    out["gain"] = out["fp32"]["median_ms"] / out["bf16"]["median_ms"]
    # the spread of the ratio: the two ends' worst pairings
    out["gain_range"] = [out["fp32"]["p10_ms"] / out["bf16"]["p90_ms"], out["fp32"]["p90_ms"] / out["bf16"]["p10_ms"]]
    out["net_of_wait"] = wait_ns() is not None
    out["faults_per_call_median"] = {k: statistics.median(v) for k, v in flt.items()}  # allocator churn, either side
    return out


def referee(name: str, timeout_s: float) -> dict[str, Any]:
    """The independent profile and the realised bf16 gain of ``name``, in a fresh process of their own
    (as each examination is): a bench process that has built and run the models before carries their
    memory and objects, which slowed a later model's calls in it against the same model in a fresh one."""
    env = {**os.environ, "PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--referee", name], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout_s)
    if p.returncode != 0:
        raise RuntimeError(f"referee of {name} failed: {p.stderr.strip().splitlines()[-1:]}")
    return json.loads(p.stdout)


def _referee_main(name: str) -> int:
    sys.path.insert(0, str(SRC))
    import hwlab  # noqa: F401 (before torch / transformers: its Triton set-up)
    import torch
    torch.set_num_threads(1)
    print(json.dumps({"independent_profile": independent_profile(name), "bf16": realised_bf16(name)}))
    return 0


# --- the examinations -----------------------------------------------------------------------------------

def examine_run(name: str, timeout_s: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    load0 = os.getloadavg()
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "hwlab", "examine", f"{SELF}:{name}", "--model", "--json"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    total_s = time.monotonic() - t0
    try:
        d = json.loads(p.stdout) if p.stdout.strip() else {}
    except json.JSONDecodeError:
        d = {}
    parts = (d.get("parts") or {})
    rec: dict[str, Any] = {"rc": p.returncode, "total_s": total_s, "load_before": load0, "load_after": os.getloadavg(),
                           "stderr_tail": p.stderr.strip().splitlines()[-3:] if p.returncode not in (0, 1) else [],
                           "leaf": d.get("leaf"), "borderline": d.get("borderline"),
                           "alternatives": d.get("alternatives"), "headline": parts.get("headline"),
                           "headline_repeats_agreed": parts.get("headline_repeats_agreed"),
                           "t_ms": (d.get("measurement") or {}).get("t_ms"), "parts": {},
                           "faults": {k: (d.get("profile") or {}).get(k) for k in
                                      ("call_faults", "ref_faults", "fault_cost_us", "call_wait_us")}}
    for q in parts.get("parts") or []:
        rec["parts"][q["name"]] = {
            "share_pct": q["share_pct"], "share_range_pct": q.get("share_range_pct"), "walked": q["walked"],
            "leaf": q["leaf"], "undecided_at": q.get("undecided_at"), "borderline": q.get("borderline"),
            "alternatives": q.get("alternatives"), "repeat_leaves": q.get("repeat_leaves"),
            "repeats_agreed": q.get("repeats_agreed"), "speedup": q.get("speedup"), "saved_ms": q.get("saved_ms"),
            "gain_bound": q.get("gain_bound"), "dtype_lever": bool(q.get("dtype_lever")),
            "dtype_lever_gain": q.get("dtype_lever_gain"), "dtype_lever_speedup": q.get("dtype_lever_speedup"),
            "pct_of_floor": q.get("pct_of_floor"), "notes": q.get("notes")}
    return rec


def _stated(p: dict[str, Any] | None) -> str | None:
    """A part's stated leaf (None: not walked or undecided)."""
    if not p or not p.get("walked"):
        return None
    return p.get("leaf") or (f"undecided at {p['undecided_at']}" if p.get("undecided_at") else None)


def read_runs(runs: list[dict[str, Any]], indep: dict[str, Any], gain: dict[str, Any] | None) -> dict[str, Any]:
    """Contradictions, one-sided BORDERLINE pairs, share differences, the bf16 prediction (module doc)."""
    plain, one_sided, diffs, walked_in_one = [], [], [], []
    names = sorted({n for r in runs for n in r["parts"]})
    for n in names:
        for i in range(len(runs)):
            for j in range(i + 1, len(runs)):
                a, b = runs[i]["parts"].get(n), runs[j]["parts"].get(n)
                la, lb = _stated(a), _stated(b)
                if (la is None) != (lb is None) and a and b:
                    walked_in_one.append({"part": n, "runs": [i, j], "leaves": [la, lb],
                                          "shares_pct": [a["share_pct"], b["share_pct"]]})
                if la is None or lb is None:
                    continue
                ba, bb = bool(a.get("borderline")), bool(b.get("borderline"))
                if not ba and not bb and la != lb:
                    plain.append({"part": n, "runs": [i, j], "leaves": [la, lb]})
                elif ba != bb:
                    one_sided.append({"part": n, "runs": [i, j], "leaves": [la, lb],
                                      "borderline": [ba, bb], "alternatives": [a.get("alternatives"),
                                                                               b.get("alternatives")]})
    for k, r in enumerate(runs):
        for n, p in r["parts"].items():
            ref = indep.get(n, {}).get("median_pct", 0.0)
            lo, hi = indep.get(n, {}).get("range_pct", [0.0, 0.0])
            diffs.append({"run": k, "part": n, "kit_pct": p["share_pct"], "independent_pct": ref,
                          "independent_range_pct": [lo, hi], "diff_pts": abs(p["share_pct"] - ref),
                          "outside_independent_range_pts": max(0.0, lo - p["share_pct"], p["share_pct"] - hi)})
        for n, v in indep.items():
            if not n.startswith("_") and n not in r["parts"] and v["median_pct"] > 0:
                diffs.append({"run": k, "part": n, "kit_pct": 0.0, "independent_pct": v["median_pct"],
                              "diff_pts": v["median_pct"]})
    worst = max(diffs, key=lambda x: x["diff_pts"]) if diffs else None
    pred = []
    for r in runs:
        g = r["parts"].get("gemm float32")
        if g:
            pred.append({"leaf": g["leaf"], "borderline": g["borderline"], "alternatives": g["alternatives"],
                         "dtype_lever": g["dtype_lever"], "lever_gain": g.get("dtype_lever_gain"),
                         "predicted_speedup": g.get("dtype_lever_speedup") or g["speedup"],
                         "floor_speedup": g["speedup"],
                         "gain_bound": g["gain_bound"]})
    ratio = None
    if gain and pred and all(x["predicted_speedup"] for x in pred):
        ps = [x["predicted_speedup"] for x in pred]
        ratio = [max(p, gain["gain"]) / min(p, gain["gain"]) for p in ps]
    return {"plain_contradictions": plain, "one_sided_borderline": one_sided, "walked_in_one_run_only": walked_in_one,
            "n_share_diffs_over_budget": sum(1 for x in diffs if x["diff_pts"] > SHARE_DIFF_PTS),
            "n_share_diffs": len(diffs),
            "max_share_diff": worst, "n_pairs": len(runs) * (len(runs) - 1) // 2,
            "gemm_bf16": pred, "predicted_over_realised": ratio}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--burners", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--label", default="vm-cpu")
    ap.add_argument("--malloc-fixed", action="store_true", help="glibc heap thresholds fixed (module doc)")
    ap.add_argument("--out", default=str(ROOT / "tools" / "results" / "examine"))
    ap.add_argument("--referee", default=None, help=argparse.SUPPRESS)  # one model's referee (referee())
    a = ap.parse_args(argv)
    if a.referee:
        return _referee_main(a.referee)
    if a.malloc_fixed and any(k not in os.environ for k in MALLOC_FIXED):  # glibc reads them at start: again
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC_FIXED})
    names = [n for n in a.models.split(",") if n]
    bad = [n for n in names if n not in MODELS]
    if bad:
        print(f"six_models: unknown model {bad[0]!r}; pick from {','.join(MODELS)}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(SRC))
    import hwlab  # noqa: F401 (before torch / transformers: its Triton set-up)
    import torch
    torch.set_num_threads(1)
    when = datetime.now(timezone.utc)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    out = Path(a.out) / f"six-models-{when.strftime('%Y-%m-%dT%H%M%SZ')}-{a.label}.json"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    rec: dict[str, Any] = {"kind": "six_models", "when": when.isoformat(timespec="seconds"), "commit": commit,
                           "label": a.label, "device": "CPU (no GPU on this machine)", "cores": os.cpu_count(),
                           "cpu": platform.processor(), "burners": a.burners, "torch_threads": 1,
                           "malloc": {k: os.environ.get(k) for k in MALLOC_FIXED},
                           "models": {}}
    burners = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(a.burners)]
    try:
        for n in names:
            t0 = time.monotonic()
            m: dict[str, Any] = {"load_before": os.getloadavg()}
            m.update(referee(n, a.timeout))
            m["runs"] = [examine_run(n, a.timeout) for _ in range(a.runs)]
            m["reading"] = read_runs(m["runs"], m["independent_profile"], m["bf16"])
            m["load_after"], m["bench_s"] = os.getloadavg(), time.monotonic() - t0
            rec["models"][n] = m
            r = m["reading"]
            heads = [x["headline"] + "->" + str(x["leaf"]) if x["headline"] else x["leaf"] for x in m["runs"]]
            worst = r["max_share_diff"] or {"diff_pts": float("nan"), "part": None}
            print(f"{n}: runs {heads}"
                  f" plain {len(r['plain_contradictions'])} one-sided {len(r['one_sided_borderline'])} max share diff "
                  f"{worst['diff_pts']:.1f} ({worst['part']}) "
                  f"bf16 realised {m['bf16']['gain']:.2f}x predicted "
                  f"{[x['predicted_speedup'] for x in r['gemm_bf16']]} {[x['leaf'] for x in r['gemm_bf16']]} "
                  f"({m['bench_s']:.0f} s, load {m['load_before'][0]:.1f}->{m['load_after'][0]:.1f})", flush=True)
            out.write_text(json.dumps(rec, indent=1) + "\n")
    finally:
        for b in burners:
            b.kill()
            b.wait()
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
