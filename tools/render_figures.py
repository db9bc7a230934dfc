"""Render the run figures quoted in README.md and docs/*.md from their records.

    python tools/render_figures.py            # re-render every marked span in place
    python tools/render_figures.py --check    # exit 1 and list the spans that are stale

A run figure in the docs sits in a marked span, ``<!-- fig:NAME -->text<!-- /fig -->``; NAME is
one of :data:`FIGURES`, a function that reads the record (``src/hwlab/recorded/``, the executed
copies' time table ``docs/notebook_times.json``) through the library where the library derives it
(the flowchart walk, Lab 4's service TPOT and seed signature, the range check of a share), so a
span says what the notebook shows from the same record. ``tests/test_figures.py`` re-renders and
compares: a re-recorded run that changes a figure fails the test until this tool is run. The
README's download figure has its own marker and tool (``tools/install_size.py``).

Gains are written one way, "x% faster" / "x% slower" (:mod:`hwlab.core.gains`), as the notebooks print them.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

REC = ROOT / "src" / "hwlab" / "recorded"
SPAN = re.compile(r"<!-- fig:([\w.-]+) -->(.*?)<!-- /fig -->", re.S)
FIGURES: dict[str, Callable[[], str]] = {}


def docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def figure(name: str):
    def add(fn):
        FIGURES[name] = fn
        return fn
    return add


def _rec(rel: str) -> dict:
    return json.loads((REC / rel).read_text())


def _by_name(rec: dict) -> dict[str, dict]:
    return {r["name"]: r for r in rec["results"]}


def _faster(pct: float) -> str:
    """A gain in %, said the way it reads: a negative gain is slower, not "-x% faster"
    (:func:`hwlab.core.gains.faster`, the one formatter the notebooks use)."""
    from hwlab.core.gains import faster

    return faster(pct)


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return "none"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}–{ranks[-1]}"
    return ", ".join(map(str, ranks))


def _share(value: float, repeats: list[float] | None, metric: str = "overlap_hidden_pct") -> str:
    """A share with the library's range verdict: outside its physical range (and its spread not
    reaching back in) it is named invalid, as the walks name it."""
    from hwlab.diagnosis.flowchart_checks import check_range

    spread = (min(repeats), max(repeats)) if repeats else None
    bad = check_range("figure", metric, value, spread)
    text = f"{value:.0f}%"
    if bad is not None:
        return f"{text} (outside {bad.lo:.0f}–{bad.hi:.0f}%: not a valid share)"
    if not 0.0 <= value <= 100.0:
        return f"{text} (past 100%, within the spread of its launches, {spread[0]:.0f}–{spread[1]:.0f}%)"
    return text


# ---------------------------------------------------------------- H200 records
@figure("h200.ceilings")
def _ceilings() -> str:
    c = _rec("h200/doctor.json")["ceilings"]
    g = c["gemm_tflops"]
    return (f"copy ≈ {c['copy_gbps'] / 1000:.2f} TB/s (read + written), GEMM fp32 ≈ {g['fp32']:.0f}, "
            f"tf32 ≈ {g['tf32']:.0f}, bf16 ≈ {g['bf16']:.0f}, fp8 ≈ {g['fp8']:.0f} TFLOP/s, pinned "
            f"host→device ≈ {c['host_link_gbps']:.0f} GB/s (`recorded/h200/doctor.json`, {c['measured_at'][:10]})")


@figure("h200.burst")
def _burst() -> str:
    r = _by_name(_rec("h200/probe_vs_torch_burst.json"))["gemm[bf16]"]
    return f"bf16 ≈ {r['derived']['tflops']:.0f}"


@figure("h200.probe_vs_torch")
def _probe_vs_torch() -> str:
    copy, gemm = _rec("h200/probe_vs_torch.json")["extra"]["comparisons"]
    return (f"copy probe {100 * copy['ratio_probe_over_torch']:.0f}% of torch `copy_`; bf16 GEMM probe "
            f"{gemm['ratio_probe_over_torch']:.3f}x of")


@figure("h200.lab01")
def _lab01() -> str:
    r = _by_name(_rec("h200/lab01_bandwidth.json"))
    return (f"fused chain {r['unfused']['t_ms'] / r['fused']['t_ms']:.1f}x faster than unfused, at "
            f"{r['fused']['derived']['pct_of_bw_ceiling']:.0f}% of the copy ceiling; coalesced "
            f"{r['strided']['t_ms'] / r['coalesced']['t_ms']:.0f}x faster than strided")


@figure("h200.lab01_walks")
def _lab01_walks() -> str:
    from hwlab.diagnosis import flowchart

    fe = _rec("h200/lab01_bandwidth.json")["extra"]["flowchart_evidence"]
    return "; ".join(f"{k} walks {' → '.join(flowchart.diagnose(v).path)}" for k, v in fe.items())


@figure("h200.lab02")
def _lab02() -> str:
    rec = _rec("h200/lab02_registers.json")
    ex, r = rec["extra"], _by_name(rec)
    best = next(c for c in ex["configs"] if c["report"]["config"] == ex["best"])
    spill = max(ex["configs"], key=lambda c: c["report"]["n_spills"] or 0)
    bc, sc = best["report"]["config"], spill["report"]["config"]
    ln = ex["launch"]
    return (f"best Triton tile ({bc}) at {best['measurement']['derived']['pct_of_flops_ceiling']:.0f}% of "
            f"cuBLAS bf16 in the same run; the most-spilling tile ({sc}, {spill['report']['n_spills']} spill "
            f"slots) {spill['measurement']['t_ms'] / best['measurement']['t_ms']:.1f}x slower than the best; "
            f"softmax fused into the GEMM spills and runs "
            f"{r['over-fused gemm+softmax']['t_ms'] / r['split gemm, softmax']['t_ms']:.1f}x slower than split; "
            f"a {ln['n_kernels']}-kernel decode-like step {ln['speedup']:.1f}x faster as a CUDA graph "
            f"(≈ {ln['us_per_launch_eager']:.0f} µs per eager launch, GPU idle ≈ {ln['gpu_idle_pct_eager']:.0f}%, "
            f"an estimate: 1 − graph / eager)")


@figure("h200.lab03_staged")
def _lab03_staged() -> str:
    ex = _rec("h200/lab03_crosslink.json")["extra"]
    return (f"{ex['step_ratio_staged_over_device']:.2f}x the step of the device-memory all-reduce (host link "
            f"{ex['host_link_gbps']['h2d']:.0f} GB/s host→device, {ex['host_link_gbps']['d2h']:.0f} GB/s back, same run)")


@figure("h200.scenarios")
def _scenarios() -> str:
    rec = _rec("h200/scenarios.json")
    tf = {r["name"]: r["derived"]["tflops"] for r in reversed(rec["results"])}  # first of a name wins
    w = rec["extra"]["workload"]
    return (f"the same 8192³ GEMM at {tf['gemm[fp32]']:.0f} (fp32), {tf['gemm[tf32]']:.0f} (tf32), "
            f"{tf['gemm[bf16]']:.0f} (bf16) TFLOP/s, and {tf['gemm[bf16, K not a multiple of 8]']:.0f} TFLOP/s "
            f"in bf16 with K = 8191 (off the MMA-friendly alignment); a decode+prefill step "
            f"{w['measured_step_ms'] / w['predicted_from_tuned_ms']:.2f}x slower than one tuned shape predicts")


def _lab04():
    from hwlab.labs.fp8.report import performance_report, seed_signature, service_tpot

    ex = _rec("h200/lab04_fp8.json")["extra"]
    run = ex["run"]
    svc = {p: service_tpot(run["stream"], p) for p in run["stream"]["paths"]}
    return ex, seed_signature(run), svc, {p: performance_report(run["stream"], p) for p in ("mixed", "fixed")}


def _gain(svc, path, q):
    return 100 * (1 - svc[path][f"tpot_ms_{q}"] / svc["bf16"][f"tpot_ms_{q}"])


def _leaves(path: str) -> str:
    """The leaves the flowchart walks to on the record's evidence for ``path``'s buckets, with the
    steps whose value sits inside its own spread of the threshold (borderline)."""
    from hwlab.diagnosis import flowchart

    from hwlab.labs.fp8 import flowchart_evidence

    rec = _rec("h200/lab04_fp8.json")  # the evidence as notebooks 04 and 06 derive it from the run
    got, flags = set(), []
    for k, v in flowchart_evidence(rec["extra"]["run"]["stream"], rec["ceilings"]["copy_gbps"]).items():
        if k.startswith(path + " "):
            d = flowchart.diagnose(v)
            got.add(d.leaf_id)
            flags += [f"{s.question} ({s.metric}) in {k[len(path) + 1:]}" for s in d.borderline]
    return " and ".join(sorted(got)) + (f", borderline at {'; '.join(flags)}" if flags else "")


@figure("h200.lab04")
def _lab04_readme() -> str:
    ex, sig, svc, rep = _lab04()
    hits = {f"{b['ctx']}": b["fp8_hit_pct"] for b in rep["mixed"]["buckets"]}
    short, long_ = min(hits, key=int), max(hits, key=int)
    fb = sum(b["fallback_gemms"] for b in rep["fixed"]["buckets"])
    bl = f" (borderline: {', '.join(sig['borderline'])})" if sig["borderline"] else ""
    from hwlab.core.gains import less_more

    return (f"`mixed` path holds {less_more(sig['memory_change_pct'])} weight memory than bf16 and its service "
            f"TPOT is {_faster(sig['gain_p50_pct'])} at p50 and {_faster(sig['gain_p99_pct'])} at p99{bl}; its "
            f"FP8 hit rate is {hits[short]:.0f}% in the short bucket (ctx {short}) and {hits[long_]:.0f}% in the "
            f"long one (ctx {long_}); its walks land on {_leaves('mixed')}. With the seed's fixes, `fixed` is "
            f"{_faster(_gain(svc, 'fixed', 'p50'))} at p50 and {_faster(_gain(svc, 'fixed', 'p99'))} at p99, with "
            f"{fb or 'no'} fallback GEMMs and its walks on {_leaves('fixed')}")


@figure("h200.lab04_instructor")
def _lab04_instructor() -> str:
    ex, sig, svc, rep = _lab04()
    by_ctx = sorted(rep["fixed"]["buckets"], key=lambda b: b["ctx"])
    from hwlab.core.gains import faster_from_change

    gains = ", ".join(f"{faster_from_change(b['tpot_p50_change_pct'], 0)} at ctx {b['ctx']}" for b in by_ctx)
    return (f"the seed's mixed path cuts weight memory by {-sig['memory_change_pct']:.1f}% while its service TPOT "
            f"is {_faster(sig['gain_p50_pct'])} at p50 (the seed's \"small gain\", 0-6%: "
            f"{'yes' if sig['p50_gain_small'] else 'no'}) and {_faster(sig['gain_p99_pct'])} at p99; the fixed "
            f"path has {sum(b['fallback_gemms'] for b in rep['fixed']['buckets']) or 'no'} fallback GEMMs and its "
            f"per-bucket TPOT p50 is {gains} against bf16")


@figure("h200.baseline")
def _baseline() -> str:
    rec = _rec("h200/baseline.json")
    rp = rec["extra"]["runtime_path"]
    return (f"{len(rec['results'])} probes + runtime path (FP8 hit rate {rp['hit_rate_pct']:.0f}% on the "
            f"decode-shaped step: {rp['fp8_hits']} of {rp['gemm_calls']} GEMMs")


@figure("h200.examine")
def _examine() -> str:
    """Each example's leaf, walked now on its recorded evidence, against the leaf its cause predicts."""
    from hwlab.diagnosis import flowchart

    entries = _rec("h200/examine.json")["extra"]["entries"]
    leaf = {e["name"]: flowchart.diagnose(e["evidence"]).leaf_id for e in entries}
    hit = sum(leaf[e["name"]] == e["expected_leaf"] for e in entries)
    by_leaf: dict[str, list[str]] = {}
    for e in entries:
        by_leaf.setdefault(leaf[e["name"]], []).append(e["name"])
    return (f"{hit} of {len(entries)} land on the leaf their cause predicts ("
            + "; ".join(f"{', '.join(n)} → {leaf}" for leaf, n in sorted(by_leaf.items())) + ")")


@figure("h200.drills_first_run")
def _drills_first() -> str:
    d = json.loads((ROOT / "tests" / "data" / "drill_undecided_fix" / "drills_call2_first_run.json").read_text())
    r = next(x for x in d["extra"]["drills"] if x["fault"] == "strided_layout")
    return f"{r['right']['fix_evidence']['slowdown_vs_floor']:.2f}x"


# ---------------------------------------------------------------- CPU records (Lab 3's link)
def _cpu_lab03():
    return _rec("cpu/lab03_slowlink.json"), _rec("cpu/lab03_linksweep.json")


@figure("cpu.lab03_mapping")
def _lab03_mapping() -> str:
    from hwlab.diagnosis import flowchart

    e = _cpu_lab03()[0]["extra"]["experiment"]
    walk = lambda ev: " → ".join(flowchart.diagnose(ev).path)  # noqa: E731
    return (f"at {e['rate_mbit']} Mbit/s the reordered mapping runs at {e['throughput_naive_over_aware']:.2f}x "
            f"of the chooser's, ranks {_ranks(e['naive']['report']['tail_ranks'])} the tail, "
            f"{e['naive']['report']['tail_ms']:.0f} ms late per step (walk {walk(e['naive']['flowchart_evidence'])}); "
            f"the chooser's mapping walks {walk(e['aware']['flowchart_evidence'])}")


@figure("cpu.lab03")
def _lab03_cpu() -> str:
    from hwlab.diagnosis import flowchart

    first, sw = _cpu_lab03()
    e, cal = first["extra"]["experiment"], sw["extra"]["calibrated"]
    walk = lambda ev: " → ".join(flowchart.diagnose(ev).path)  # noqa: E731
    rates = [p["rate_mbit"] for p in sw["extra"]["sweep"]]
    slow = next(r for r in cal["signature"] if r["case"].startswith("slow link"))
    reg = next(r for r in cal["signature"] if r["case"].startswith("regressed"))
    ov, oc = e["overlap"], cal["overlap"]["slow"]
    return (f"at {e['rate_mbit']} Mbit/s the reordered mapping runs at {e['throughput_naive_over_aware']:.2f}x "
            f"of the topology-aware one with ranks {_ranks(e['naive']['report']['tail_ranks'])} as the tail "
            f"(walk {walk(e['naive']['flowchart_evidence'])}, aware {walk(e['aware']['flowchart_evidence'])}); "
            f"a link-rate sweep ({min(rates):.0f}–{max(rates):.0f} Mbit/s) calibrates the seed's "
            f"{sw['extra']['seed_ratio']}x: at {cal['rate_mbit']} Mbit/s the naive mapping runs at "
            f"{cal['throughput_naive_over_aware']:.2f}x with ranks {_ranks(slow['tail_ranks'])} finishing "
            f"{slow['tail_ms']:.1f} ms late per step. Overlapping the all-reduces with compute hides "
            f"{_share(ov['fast']['hidden_pct'], ov['fast'].get('hidden_pct_repeats'))} of what could hide on the "
            f"{ov['fast']['link']}, {_share(ov['slow']['hidden_pct'], ov['slow'].get('hidden_pct_repeats'))} on the "
            f"{ov['slow']['link']} and {_share(oc['hidden_pct'], oc.get('hidden_pct_repeats'))} at the calibrated "
            f"rate (median of the launches; notebook 03 §5 reads each against rule 3c). The seed's "
            f"counter-example (a kernel regressed on every rank, same launch): single-device slowdown "
            f"{reg['slowdown_vs_floor']:.1f}x, tail ranks {_ranks(reg['tail_ranks'])}, walk "
            f"{walk(cal['regressed']['flowchart_evidence'])}")


# ---------------------------------------------------------------- executed copies
@figure("h200.time.lab04")
def _time_lab04() -> str:
    t = json.loads((ROOT / "docs" / "notebook_times.json").read_text())["h200"]["runs"]
    return f"{t['notebooks/04_fp8_dequant_fallback.ipynb']['seconds']:.0f} s"


# ---------------------------------------------------------------- the renderer
def render(text: str) -> tuple[str, list[str]]:
    """``text`` with every marked span re-rendered; and the names no figure knows."""
    unknown = []

    def one(m):
        name = m.group(1)
        if name not in FIGURES:
            unknown.append(name)
            return m.group(0)
        return f"<!-- fig:{name} -->{FIGURES[name]()}<!-- /fig -->"

    return SPAN.sub(one, text), unknown


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def stale(paths: list[Path] | None = None) -> list[str]:
    """One line per span whose text differs from its record's rendering (or names no figure)."""
    out = []
    for p in paths or docs():
        text = p.read_text()
        new, unknown = render(text)
        out += [f"{_rel(p)}: no figure named {u!r}" for u in unknown]
        for m_old, m_new in zip(SPAN.finditer(text), SPAN.finditer(new)):
            if m_old.group(2) != m_new.group(2):
                out.append(f"{_rel(p)}: fig:{m_old.group(1)} is stale: {m_old.group(2)!r} -> {m_new.group(2)!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="list stale spans, write nothing (exit 1 if any)")
    a = ap.parse_args(argv)
    if a.check:
        bad = stale()
        print("\n".join(bad) or "every marked figure matches its record")
        return 1 if bad else 0
    for p in docs():
        text = p.read_text()
        new, unknown = render(text)
        if unknown:
            print(f"{_rel(p)}: no figure named {', '.join(unknown)}", file=sys.stderr)
            return 2
        if new != text:
            p.write_text(new)
            print(f"re-rendered {_rel(p)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
