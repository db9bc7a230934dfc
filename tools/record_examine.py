"""Record ``hwlab examine`` on every function in ``examples/`` (through the API, and through
the CLI in a subprocess for the ones in CLI_TARGETS), as one evidence record.

    PYTHONPATH=src python3 tools/record_examine.py --out DIR [--only a,b] [--tiny]
    PYTHONPATH=src python3 tools/record_examine.py --out DIR --parts [--tiny]

Writes ``DIR/examine.json`` (kind ``examine``; never over an existing file): per function the
measurement, the evidence and where each metric came from, the walk, the leaf it landed on and
the leaf its cause predicts (``EXPECTED``, kept here, never shown to ``examine``). On a GPU the
examples run at their full sizes; on a CPU at their small ones (labelled CPU, leaves
indicative), which is how the tests run this script end to end. ``--tiny`` shortens every
timing (seconds per function) for a smoke run. A function that fails is recorded with its
error and the run goes on. Copy the GPU result to ``src/hwlab/recorded/h200/examine.json``.

``--parts`` records ``DIR/examine_parts.json`` instead (kind ``examine_parts``): the mixed model
of ``examples/small_transformer.py`` (full forward, GELU op by op) split into parts and walked
per part; the fix its headline part points at applied (``model_fused``: the one-kernel GELU,
same weights) and examined again, with the saving the first examination predicted for the
part beside the saving measured; the decode step; the random row gather
(``examples/row_gather.py``) through the API and the command line, with and without ``--ncu``;
the full forward through ``hwlab examine --model --out`` (the Chrome trace written beside).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

from hwlab.core import ceilings as ceilings_mod
from hwlab.core.evidence import Evidence, machine_info
from hwlab.examine import examine
from hwlab.examine.target import load
from hwlab.core.measure import device_of
from hwlab.core.store import check_destination
from hwlab.core.system import versions

ROOT = Path(__file__).resolve().parents[1]
#: example -> the leaf its cause predicts (what the recording is checked against)
EXPECTED = {
    "unfused_chain": "G",       # six passes over DRAM where one would do
    "shuffled_gather": "G",     # a sector per 4-byte value
    "gemm_fp32": "I",           # fp32 without TF32: no tensor cores
    "gemm_misaligned": "I",     # bf16 with K = 8191: off the aligned MMA kernels
    "tiny_kernels": "J",        # 128 tiny launches: the GPU waits on the host
    "triton_spill": "J",        # a 256x256 accumulator on 4 warps spills
    "gemm_bf16": "OK",          # cuBLAS bf16 at an aligned shape
    "compiled_chain": "OK",     # torch.compile fuses the chain into one pass
}
#: examples recorded by ``--parts`` (split by part; no single expected leaf: the parts are the record)
PARTS_EXAMPLES = ("small_transformer", "row_gather", "gemm_plus_chain", "hf_gpt2")
#: examples also examined through the command line (a subprocess, --json)
CLI_TARGETS = ("unfused_chain", "gemm_bf16")
#: ... and once more with --ncu where `ncu` exists (counted figures beside the estimates)
NCU_TARGETS = ("shuffled_gather",)


def _entry(name: str, ex) -> dict:
    d = ex.to_dict()
    return {"name": name, "target": f"examples/{name}.py:{name}", "expected_leaf": EXPECTED[name],
            "leaf": ex.leaf_id, "path": d["walk"]["path"], "undecided_at": d["walk"]["undecided_at"],
            "evidence": ex.evidence, "evidence_sources": ex.evidence_sources, "walk": d["walk"],
            "counts": d["counts"], "profile": d["profile"], "notes": ex.notes, "label": ex.label,
            "measurement": ex.measurement.name, "ncu": ex.ncu, "error": None}


def _cli(name: str, env: dict, *extra: str) -> dict:
    cmd = [sys.executable, "-c", "import sys; from hwlab.cli import main; sys.exit(main(sys.argv[1:]))",
           "examine", f"examples/{name}.py:{name}", "--json", *extra]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = {"command": "hwlab examine " + " ".join(cmd[4:]), "rc": r.returncode,
           "wall_s": time.perf_counter() - t0, "stderr_tail": r.stderr[-400:]}
    try:
        d = json.loads(r.stdout)
        out.update(leaf=d["walk"]["leaf"], path=d["walk"]["path"], evidence=d["evidence"],
                   evidence_sources=d["evidence_sources"], label=d["label"], ncu=d.get("ncu"),
                   notes=d.get("notes"))
    except (json.JSONDecodeError, KeyError) as e:
        out["error"] = f"no JSON examination on stdout ({e})"
    return out


def _parts_entry(name: str, ex) -> dict:
    d = ex.to_dict()
    return {"name": name, "leaf": ex.leaf_id, "whole_function_leaf": ex.diagnosis.leaf_id,
            "t_ms": ex.measurement.t_ms, "t_p10_ms": ex.measurement.t_p10_ms, "t_p90_ms": ex.measurement.t_p90_ms,
            "parts": d["parts"], "evidence": ex.evidence, "evidence_sources": ex.evidence_sources,
            "walk": d["walk"], "counts": {k: v for k, v in d["counts"].items() if k != "by_op"},
            "profile": {k: v for k, v in d["profile"].items() if k != "trace_path"},
            "ncu": ex.ncu, "notes": ex.notes, "label": ex.label, "error": None}


def _guarded(name: str, f) -> dict:
    t0 = time.perf_counter()
    try:
        e = f()
    except Exception as err:  # recorded with its traceback; the run goes on
        e = {"name": name, "leaf": None, "error": f"{type(err).__name__}: {' '.join(str(err).split())[:400]}",
             "traceback": traceback.format_exc()[-2000:]}
    e["wall_s"] = time.perf_counter() - t0
    print(f"{name:22s} leaf {e.get('leaf')!s:4s} ({e['wall_s']:.1f} s)" + (f"  ERROR {e['error']}" if e.get("error")
                                                                            else ""), flush=True)
    return e


def record_parts(out_dir: Path, tiny: bool, no_cli: bool) -> int:
    """The ``--parts`` recording (module doc)."""
    from hwlab.examine.target import load_model

    out_path = check_destination(out_dir / "examine_parts.json")
    dev = device_of(None)
    gpu = dev.type == "cuda"
    c = ceilings_mod.get(dev, quick=tiny or not gpu)  # full ceilings on a GPU: cached for the CLI runs
    budget = 2.0 if tiny else 4.0
    tf = ROOT / "examples" / "small_transformer.py"
    entries: dict = {}

    def model(factory: str):
        def run():
            mod, args, make = load_model(f"{tf}:{factory}")
            return _parts_entry(factory, examine(mod, *args, make_inputs=make, ceilings=c, name=factory,
                                                 max_total_s=budget))
        return run

    entries["model"] = _guarded("model", model("model"))
    entries["model_fused"] = _guarded("model_fused", model("model_fused"))
    entries["decode"] = _guarded("decode", model("decode"))

    def gather():
        fn, mod = load(f"{ROOT / 'examples' / 'row_gather.py'}:row_gather")
        return _parts_entry("row_gather", examine(fn, make_inputs=mod.inputs, ceilings=c, name="row_gather",
                                                  max_total_s=budget))
    entries["row_gather"] = _guarded("row_gather", gather)

    def compiled():  # a torch.compile'd chain: its Triton kernels are a part whose bytes are not attributable
        fn, mod = load(f"{ROOT / 'examples' / 'compiled_chain.py'}:compiled_chain")
        return _parts_entry("compiled_chain", examine(fn, make_inputs=mod.inputs, ceilings=c, name="compiled_chain",
                                                      max_total_s=budget))
    entries["compiled_chain"] = _guarded("compiled_chain", compiled)

    def composed(fname: str, pick):
        def run():
            fn, mod = load(f"{ROOT / 'examples' / 'gemm_plus_chain.py'}:{fname}")
            return _parts_entry(fname, examine(fn, make_inputs=lambda: pick(mod.inputs()), ceilings=c,
                                               name=fname, max_total_s=budget))
        return run
    entries["gemm_plus_chain"] = _guarded("gemm_plus_chain", composed("gemm_plus_chain", lambda a: a))
    entries["gemm_only"] = _guarded("gemm_only", composed("gemm_only", lambda a: a[:2]))
    entries["chain_only"] = _guarded("chain_only", composed("chain_only", lambda a: a[2:]))
    fix = {}
    a, b = entries["model"], entries["model_fused"]
    if not a.get("error") and not b.get("error") and a["parts"]:
        head = next((p for p in a["parts"]["parts"] if p["name"] == a["parts"]["headline"]), None)
        if head is not None:
            fix = {"headline": head["name"], "headline_leaf": head["leaf"], "predicted_saving_ms": head["saved_ms"],
                   "measured_saving_ms": a["t_ms"] - b["t_ms"],
                   "before_ms": [a["t_p10_ms"], a["t_ms"], a["t_p90_ms"]],
                   "after_ms": [b["t_p10_ms"], b["t_ms"], b["t_p90_ms"]],
                   "fix": "the one-kernel GELU (F.gelu approximate='tanh') in place of the op-by-op chain"}
            print(f"fix: predicted {fix['predicted_saving_ms']:.4g} ms, measured {fix['measured_saving_ms']:.4g} ms",
                  flush=True)
    cli: dict = {}
    if not no_cli:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
        runs = {"model_out": ["examples/small_transformer.py:model", "--model", "--json", "--out",
                              str(out_dir / "model_cli.json")]}
        if gpu and shutil.which("ncu"):
            runs["row_gather_ncu"] = ["examples/row_gather.py:row_gather", "--json", "--ncu"]
        for key, extra in runs.items():
            cmd = [sys.executable, "-c", "import sys; from hwlab.cli import main; sys.exit(main(sys.argv[1:]))",
                   "examine", *extra]
            t0 = time.perf_counter()
            r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
            o = {"command": "hwlab examine " + " ".join(extra), "rc": r.returncode,
                 "wall_s": time.perf_counter() - t0, "stderr_tail": r.stderr[-600:]}
            try:
                d = json.loads(r.stdout)
                o.update(leaf=d["leaf"], whole_function_leaf=d["walk"]["leaf"], parts=d["parts"],
                         evidence=d["evidence"], evidence_sources=d["evidence_sources"], ncu=d.get("ncu"),
                         notes=d.get("notes"), walk=d["walk"])
            except (json.JSONDecodeError, KeyError) as e:
                o["error"] = f"no JSON examination on stdout ({e})"
            if key == "model_out":
                tp = out_dir / "model_cli.trace.json"
                try:
                    tr = json.loads(tp.read_text())
                    o["trace"] = {"file": tp.name, "n_events": len(tr.get("traceEvents", [])),
                                  "kernel_events": sum(1 for e in tr["traceEvents"] if e.get("cat") == "kernel")}
                except Exception as e:
                    o["trace"] = {"error": f"{type(e).__name__}: {e}"[:200]}
            cli[key] = o
            print(f"CLI {key:18s} leaf {o.get('leaf')} rc {o['rc']} ({o['wall_s']:.0f} s)", flush=True)
    rec = Evidence(kind="examine_parts", machine=machine_info(dev), results=[], ceilings=c.to_dict(),
                   versions=versions(),
                   extra={"entries": entries, "fix": fix, "cli": cli, "tiny": tiny, "on_gpu": gpu,
                          "ceilings_label": c.label})
    rec.save(out_path)
    print(f"wrote {out_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for examine.json")
    p.add_argument("--only", help="comma-separated example names (default: all)")
    p.add_argument("--tiny", action="store_true", help="short timings (a smoke run)")
    p.add_argument("--no-cli", action="store_true", help="skip the command-line runs")
    p.add_argument("--parts", action="store_true", help="record examine_parts.json (see the module doc)")
    a = p.parse_args(argv)
    if a.parts:
        return record_parts(Path(a.out), a.tiny, a.no_cli)
    names = a.only.split(",") if a.only else list(EXPECTED)
    unknown = [n for n in names if n not in EXPECTED]
    if unknown:
        print(f"unknown example(s) {unknown}; choose from {', '.join(EXPECTED)}", file=sys.stderr)
        return 2
    out_path = check_destination(Path(a.out) / "examine.json")  # before measuring
    dev = device_of(None)
    gpu = dev.type == "cuda"
    print(f"ceilings on {machine_info(dev)['device']} ...", flush=True)
    c = ceilings_mod.get(dev, quick=a.tiny or not gpu)
    entries, results = [], []
    for name in names:
        t0 = time.perf_counter()
        try:
            fn, mod = load(f"{ROOT / 'examples' / (name + '.py')}:{name}")
            ex = examine(fn, make_inputs=mod.inputs, ceilings=c, name=name,
                         max_total_s=3.0 if a.tiny else 20.0)
            e = _entry(name, ex)
            results.append(ex.measurement)
        except Exception as err:  # recorded with its traceback; the run goes on to the next function
            e = {"name": name, "expected_leaf": EXPECTED[name], "leaf": None,
                 "error": f"{type(err).__name__}: {' '.join(str(err).split())[:400]}",
                 "traceback": traceback.format_exc()[-2000:]}
        e["wall_s"] = time.perf_counter() - t0
        entries.append(e)
        print(f"{name:18s} leaf {e['leaf']!s:4s} expected {EXPECTED[name]:3s} ({e['wall_s']:.1f} s)"
              + (f"  ERROR {e['error']}" if e.get("error") else ""), flush=True)
    cli_runs: dict = {}
    cli_ncu: dict = {}
    if not a.no_cli:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
        for name in (n for n in CLI_TARGETS if n in names):
            cli_runs[name] = _cli(name, env)
            print(f"{name:18s} CLI leaf {cli_runs[name].get('leaf')} rc {cli_runs[name]['rc']}", flush=True)
        if gpu and shutil.which("ncu"):
            for name in (n for n in NCU_TARGETS if n in names):
                cli_ncu[name] = _cli(name, env, "--ncu")
                print(f"{name:18s} CLI --ncu leaf {cli_ncu[name].get('leaf')} counters "
                      f"{(cli_ncu[name].get('ncu') or {}).get('evidence')}", flush=True)
    rec = Evidence(kind="examine", machine=machine_info(dev), results=results, ceilings=c.to_dict(),
                   versions=versions(),
                   extra={"entries": entries, "cli": cli_runs, "cli_ncu": cli_ncu, "tiny": a.tiny, "on_gpu": gpu,
                          "ceilings_label": c.label, "expected": EXPECTED})
    rec.save(out_path)
    ok = sum(1 for e in entries if e["leaf"] == e["expected_leaf"])
    print(f"wrote {out_path}: {ok}/{len(entries)} on their expected leaf "
          f"({'GPU' if gpu else 'CPU: indicative, not a GPU verdict'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
