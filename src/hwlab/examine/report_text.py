"""The text report of an :class:`hwlab.examine.Examination`: what was measured (labelled GPU
or CPU), the counts and where each came from, the profile, the evidence with its source, the
walk, the seed's actions for the leaf, the lab that teaches it, and the notes."""
from __future__ import annotations

from typing import Any

from hwlab.diagnosis.flowchart_checks import check_range


def _b(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= f:
            return f"{n / f:,.2f} {unit}"
    return f"{n:,.0f} B"


def _v(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def render(ex) -> str:
    m, c, p = ex.measurement, ex.counts, ex.profile
    lines = [f"hwlab examine: {ex.name}", f"  {ex.label}",
             f"  ceilings: {ex.ceilings.get('label')}: copy {ex.ceilings['copy_gbps']:,.0f} GB/s, GEMM "
             + ", ".join(f"{k} {v:,.1f}" for k, v in ex.ceilings.get("gemm_tflops", {}).items()) + " TFLOP/s",
             "", "measurement", f"  {m.summary()}",
             f"  {m.n_rep} timed calls, {m.params.get('n_rotating_sets')} input set(s); first call "
             f"{c['first_call_s']:.3g} s (compile/autotune, not timed); back to back "
             f"{m.params.get('wall_ms_per_call', 0):.4g} ms per call",
             "", "counts",
             f"  required bytes {_b(c['n_bytes'])} ({c['n_bytes_source']})",
             f"  FLOPs {c['n_flops']:,} ({c['n_flops_source']})",
             f"  moved bytes {_b(c.get('moved_bytes'))} ({c.get('moved_bytes_source')})"]
    if c.get("sector_amplification_estimated") is not None:
        lines.append(f"  sector amplification {c['sector_amplification_estimated']:.2f}x (estimated from strides "
                     "and index values)")
    o = c["ops"]
    lines.append(f"  aten ops {o['ops']}: matmul {o['matmul']} (fp8 {o['fp8_matmul']}, on dequantized data "
                 f"{o['matmul_on_dequantized']}), quant {o['quant']}, dequant {o['dequant']}, gather {o['gather']}")
    what = "kernels" if p.on_gpu else "aten ops (CPU)"
    lines += ["", f"profile ({p.source})",
              f"  {what} per call {p.kernels_per_call:.1f}; busy {p.busy_ms_per_call:.4g} ms per call"
              + (f"; GEMM kernels {p.gemm_kernels} (tensor-core {p.tensor_core_gemm_kernels}, fp8 "
                 f"{p.fp8_gemm_kernels})" if p.on_gpu else "")
              + ("; compiled region" if p.compiled_region else "")]
    for k in p.top:
        tc = {True: ", tensor-core", False: ", CUDA cores (no MMA)", None: ""}[k["tensor_core"]]
        dts = f" [{', '.join(k['dtypes'])}]" if k.get("dtypes") else ""
        lines.append(f"  {k['share_pct']:5.1f}%  {k['per_call']:.0f}x/call  {k['class']}{tc}{dts}  {k['name'][:90]}")
    for t in p.triton:
        lines.append(f"  triton {t['name']}: " + (f"{t['n_regs']} registers, {t['n_spills']} spill slots"
                                                  if "n_regs" in t else t.get("error", "")))
    if ex.ncu:
        lines += ["", f"Nsight Compute ({ex.ncu['n_kernels']} kernels, counted)"]
        lines += [f"  {k} = {_v(v)}" for k, v in ex.ncu["evidence"].items()]
    lines += ["", "evidence (measured, or estimated where the source says so; source of each)"]
    lines += [f"  {k} = {_v(v)}   [{ex.evidence_sources.get(k, '?')}]" for k, v in ex.evidence.items()
              if k != "metric_spreads"]  # the walk shows each spread beside its step
    lines += ["", "walk (the whole function, aggregate metrics)"] + \
        ["  " + s for s in ex.diagnosis.explain().splitlines()]
    if ex.parts is not None:
        lines += [""] + ex.parts.render()
    if ex.lab:
        lines.append(f"  lab that teaches the headline leaf ({ex.leaf_id}): notebooks/{ex.lab}")
    if ex.notes:
        lines += ["", "notes"] + [f"  - {n}" for n in ex.notes]
    return "\n".join(lines)


def table(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per recorded examination (``examine.json``'s entries): the leaf beside the one its
    cause predicts, and the measured figures the walk turned on."""
    rows = []
    for e in entries:
        ev = e.get("evidence") or {}
        rows.append({"function": e["name"], "leaf": e.get("leaf"), "expected": e.get("expected_leaf"),
                     "path": " > ".join(e.get("path") or []),
                     "slowdown_vs_floor": ev.get("slowdown_vs_floor"),
                     "dram_pct_estimated": ev.get("dram_pct_estimated"),
                     "sector_amplification": ev.get("sector_amplification"),
                     "tensor_pct_of_peak": ev.get("tensor_pct_of_peak"),
                     "launch_gap_pct": ev.get("launch_gap_pct"), "n_spills": ev.get("n_spills"),
                     "error": e.get("error")})
    return rows


def plot_slowdowns(rows: list[dict[str, Any]], source: str, ax=None):
    """Bars of slowdown over the roofline floor per function (log scale), labelled by leaf, with
    the flowchart's 1.5x line."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.4))
    rows = [r for r in rows if r.get("slowdown_vs_floor")]
    names = [r["function"] for r in rows]
    vals = [r["slowdown_vs_floor"] for r in rows]
    bars = ax.bar(names, vals, color=["tab:green" if r["leaf"] == "OK" else "tab:orange" for r in rows])
    for b, r in zip(bars, rows):
        ax.annotate(f"{r['leaf'] or '?'}", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.axhline(1.5, ls="--", color="r", lw=0.8, label="B: slow at >= 1.5x the floor")
    ax.set_yscale("log")
    ax.set_ylabel("measured time / roofline floor")
    ax.set_title(f"hwlab examine: time over each function's floor, leaf on top\n({source})", fontsize=9)
    ax.legend(fontsize=7)
    ax.tick_params(axis="x", labelrotation=20, labelsize=7)
    return ax


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows of :func:`table` as fixed-width text; '-' where a metric was not measured, 'invalid'
    where it is outside its physical range (not evidence: :mod:`hwlab.diagnosis.flowchart_checks`)."""
    def f(v: Any, spec: str, unit: str = "", metric: str = "") -> str:
        if v is None:
            return "-"
        return "invalid" if metric and check_range("", metric, v) is not None else f"{v:{spec}}{unit}"

    head = (f"{'function':16s} {'leaf':4s} {'expected':8s} {'path':14s} {'slowdown':>9s} {'dram est':>9s} "
            f"{'sectors':>8s} {'tensor':>7s} {'gap':>6s} {'spills':>6s}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['function']:16s} {r['leaf'] or '?':4s} {r['expected'] or '':8s} {r['path']:14s} "
                     f"{f(r['slowdown_vs_floor'], '9.2f', 'x'):>10s} {f(r['dram_pct_estimated'], '7.1f', '%', 'dram_pct_estimated'):>9s} "
                     f"{f(r['sector_amplification'], '6.1f', 'x', 'sector_amplification'):>8s} {f(r['tensor_pct_of_peak'], '5.1f', '%'):>7s} "
                     f"{f(r['launch_gap_pct'], '4.1f', '%'):>6s} {f(r['n_spills'], 'd'):>6s}"
                     + (f"  ERROR {r['error']}" if r.get("error") else ""))
    return "\n".join(lines)


def plot_parts(parts: dict[str, Any], title: str, ax=None):
    """A bar of time per part (``Parts.to_dict()`` or its recorded copy), each labelled with its %
    of floor, its leaf and its expected gain; the headline part drawn in orange."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.2))
    rows = sorted(parts["parts"], key=lambda p: p["t_ms"])
    names = [p["name"] for p in rows]
    bars = ax.barh(names, [p["t_ms"] for p in rows],
                   color=["tab:orange" if p["name"] == parts.get("headline") else "tab:blue" for p in rows])
    for b, p in zip(bars, rows):
        pct = "n/a" if p["pct_of_floor"] is None else f"{p['pct_of_floor']:.0f}% of floor"
        gain = "" if p["saved_ms"] is None else f", gain {p['saved_ms']:.3g} ms"
        ax.annotate(f" {p['share_pct']:.0f}% of step, {pct}, leaf {p['leaf'] or '-'}{gain}",
                    (b.get_width(), b.get_y() + b.get_height() / 2), va="center", fontsize=7)
    ax.set_xlabel("ms per call")
    ax.set_title(title, fontsize=9)
    ax.set_xlim(0, max(p["t_ms"] for p in rows) * 2.2 if rows else 1)
    return ax


def fix_summary(before: dict[str, Any], after_t_ms: float, before_t_ms: float) -> dict[str, Any]:
    """The headline part's predicted saving (its time minus its floor) beside the saving measured
    after the fix (before minus after), and their ratio."""
    head = next((p for p in before["parts"] if p["name"] == before.get("headline")), None)
    if head is None or head["saved_ms"] is None:
        return {"headline": None}
    measured = before_t_ms - after_t_ms
    return {"headline": head["name"], "leaf": head["leaf"], "predicted_saving_ms": head["saved_ms"],
            "measured_saving_ms": measured,
            "measured_over_predicted": measured / head["saved_ms"] if head["saved_ms"] else None}


def _route(leaf: str) -> dict[str, str]:
    """Question -> the answer ("yes"/"no") the chart's one path to ``leaf`` takes there."""
    from hwlab.diagnosis import flowchart as F

    def walk(node: str) -> dict[str, str] | None:
        if node == leaf:
            return {}
        q = F.QUESTIONS.get(node)
        if q is None:
            return None
        for ans, nxt in (("yes", q.yes), ("no", q.no)):
            rest = walk(nxt)
            if rest is not None:
                return {node: ans, **rest}
        return None

    return walk(F.START) or {}


def against_prediction(walk, predicted_leaf: str) -> str:
    """Where a walk (a :class:`~hwlab.diagnosis.flowchart.Diagnosis`) meets or leaves the path to
    ``predicted_leaf``: "as predicted", the first question it answered the other way (metric, value,
    rule), and the question where it stopped for want of a measurement, if it did."""
    from hwlab.diagnosis.flowchart import _fmt

    if walk.leaf_id == predicted_leaf:
        return f"lands on **{predicted_leaf}**, as predicted"
    route = _route(predicted_leaf)
    left = next((s for s in walk.steps if route.get(s.question) not in (None, s.answer)), None)
    where = (f"it leaves that path at {left.question}, answered {left.answer.upper()} ({left.metric} = "
             f"{_fmt(left.value)}, rule {left.criterion})" if left else "")
    if walk.undecided is not None:
        q = walk.undecided
        return (f"stops at **{q.id}** ({q.text}), short of the predicted {predicted_leaf}: nothing here measures "
                f"it for one function in one process ({q.probe})" + (f"; {where}" if where else ""))
    return f"lands on **{walk.leaf_id}**, not the predicted {predicted_leaf}" + (f": {where}" if where else "")


def repeats_disagree(repeat_leaves: list, what: str = "the walk") -> str:
    """A verdict the timing blocks do not agree on, said as such: "" when every block's own walk of
    ``what`` reached the same end (a block that did not walk it, ``None``, is left out), else a
    sentence that the verdict is not supported on this machine, with each block's end. One block
    that disagrees is enough: a verdict that flips between blocks taken seconds apart is not one a
    re-run would repeat (:mod:`hwlab.examine.repeats`)."""
    ends = [x for x in repeat_leaves if x]
    if len(set(ends)) < 2:
        return ""
    return (f"**Not supported on this machine:** the {len(ends)} timing blocks each walked {what} on their own "
            f"and reached different ends (block by block: {', '.join(ends)}), so the verdict flips between blocks "
            "here; read it as no verdict on this machine, and re-run on a quieter one (or with a larger input) "
            "before acting on it.")
