"""A walk of repeated measurements: each examination measures in :data:`N_REPEATS` blocks, walks
every block on its own, and lets the blocks' disagreement speak.

**Blocks.** The timing (device events, single calls) and question D's back-to-back run are taken
in ``N_REPEATS`` interleaved blocks (:func:`hwlab.examine.timing_blocks.timed_blocks`): block *r*
times single calls, then runs back to back, so both halves of D's ratio see the same host load. The pooled samples give
the median the report shows; each block gives one repeat's median and e2e_slowdown. On a CPU each
repeat also reads its own profiled calls for the part shares (each op's median self time over
three of them, :func:`hwlab.examine.parts.op_medians`).

**Block size.** Each block takes as many calls as its median needs to settle, by the spread
measured so far (:mod:`hwlab.examine.timing_blocks`): a steady function gives its medians in few
calls, a noisy one samples up to a cap.

**Spreads.** Each repeat is walked on its own evidence (the whole function and every part). The
range of each metric over the repeats (and the pooled value) is that metric's spread
(:func:`spreads_over`): the walk's steps show it, and a threshold inside it marks the step
BORDERLINE (:func:`hwlab.diagnosis.flowchart_checks.straddles`; with fewer than
:data:`~hwlab.diagnosis.flowchart_checks.FEW_REPEATS` repeats the range is widened by its own
width, since the next repeat falls outside a range of three as often as not).

The ceilings the metrics are judged against have a spread of their own (their p10-p90, kept in
their ``bands``): a ceiling measured on a busy host and not cached is measured again by the next
run, anywhere in that band. Its p10-p90 comes from calls timed within milliseconds of each other,
one load phase; so on a CPU the copy and GEMM ceilings are also re-timed, a few calls each, before
every block and after the last (:class:`Retimer`), and the range of those re-timed rates over the
rate in use joins the band. A metric over a ceiling has its range widened by it
(:func:`ceiling_band`).

**Host load.** On a busy CPU host the timing thread waits for a core (the run queue) for a share
of every wall-clock interval that changes from second to second: the three blocks, taken back to
back, share one load phase, while the next examination meets another, so a range over the blocks
of wall-clock times under-states what a re-run sees (and a ceiling timed at one moment, a
function at another, gives a ratio that swings with both). On a CPU every timing here, the
ceilings' included, is therefore net of the thread's run-queue wait (:mod:`hwlab.core.hostwait`;
the report gives the wait's share); what the load leaves in (cache and memory contention from
neighbours) shows as spread between blocks, and a profiled call that waited inside an op does not
set that op's time: the parts take each op's median over the profiled calls
(:func:`hwlab.examine.parts.op_medians`).

**Run to run.** The blocks share one load phase, so their range can be narrower than what the next
examination meets; a metric read from a time (:data:`TIMED_METRICS`) has a spread of at least
:data:`RUN_TO_RUN` of its pooled value on each side, so a threshold that a re-run's medians can cross
marks the step BORDERLINE in every run, not only in the run whose blocks happened to straddle it.

**Alternatives.** A leaf is BORDERLINE, with its alternatives named (:func:`alternatives`), when a
repeat reached another leaf, or when the walk on some metric at either end of its spread (one at
a time, then all low, all high) reaches another one. A headline is also BORDERLINE when a repeat
heads with another part, by that part's own leaf and alternatives. Two identical runs then give
the same leaf, or both say which leaves a re-run may land on, instead of flipping between them
without warning.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from hwlab.diagnosis import flowchart_checks as checks
from hwlab.diagnosis.flowchart import QUESTIONS, Diagnosis, diagnose

#: measurement blocks (repeats) per examination: the profiler's calls, one per repeat
N_REPEATS = 3
#: metrics a repeat's spread is taken for: those the questions compare with a threshold
SPREAD_METRICS = tuple(dict.fromkeys(c.metric for q in QUESTIONS.values() for c in q.criteria))


@dataclass
class Blocks:
    """Timing and back-to-back samples of one examination, block by block (module doc)."""
    samples_ms: list[list[float]]  # per block, single calls
    chunks_ms: list[list[float]]  # per block, back-to-back ms per call
    timer: str
    #: per block, the share (0-1) of the single calls' wall time the thread waited for a CPU
    #: (taken out of the samples; None: wall clock or device events)
    wait_shares: list[float | None] = field(default_factory=list)
    #: ceiling ("copy", "gemm fp32") -> its rate re-timed before each block and after the last
    #: (:class:`Retimer`; a CPU only)
    ceiling_rates: dict[str, list[float]] = field(default_factory=dict)

    def wait_share(self) -> float | None:
        """The run-queue wait's share of all the blocks' wall time, or None unmeasured."""
        xs = [x for x in self.wait_shares if x is not None]
        return max(xs) if xs else None

    @property
    def pooled_samples_ms(self) -> list[float]:
        return [x for b in self.samples_ms for x in b]

    @property
    def pooled_chunks_ms(self) -> list[float]:
        return [x for b in self.chunks_ms for x in b]

    def medians_ms(self) -> list[float]:
        return [statistics.median(b) for b in self.samples_ms if b]

    def e2e(self) -> list[float | None]:
        """Each block's back-to-back median over its single-call median."""
        return [statistics.median(c) / statistics.median(s) if c and s and statistics.median(s) > 0 else None
                for s, c in zip(self.samples_ms, self.chunks_ms)]


#: single calls per re-timing of a ceiling (:class:`Retimer`): a glimpse of its rate now, not a
#: measurement of it; the median of these few
RETIME_REPS = 3


class Retimer:
    """A CPU's copy and fp32 GEMM ceilings re-timed at the sizes their bands record (module doc,
    :func:`ceiling_band`): the same work as the cached probe, a few calls, net of the run-queue
    wait, so a ceiling cached in another load phase (or another run's) is seen beside this
    examination's. Buffers are made once; a ceiling without a recorded size is not re-timed."""

    def __init__(self, bands: dict[str, dict[str, Any]], dev) -> None:
        import torch

        self.dev, self.jobs = dev, {}
        cp = ((bands.get("copy") or {}).get("params") or {})
        if isinstance(cp.get("size_mib"), int) and 0 < cp["size_mib"] <= 1024:
            n = cp["size_mib"] * 2**20 // 4
            src, dst = torch.randn(n), torch.empty(n)
            self.jobs["copy"] = (lambda: dst.copy_(src), 2 * n * 4 / 1e9)  # GB per call
        gp = ((bands.get("gemm fp32") or {}).get("params") or {})
        if all(isinstance(gp.get(k), int) and 0 < gp[k] <= 4096 for k in ("m", "n", "k")):
            a, b = torch.randn(gp["m"], gp["k"]), torch.randn(gp["k"], gp["n"])
            self.jobs["gemm fp32"] = (lambda: a @ b, 2 * gp["m"] * gp["n"] * gp["k"] / 1e12)  # TFLOP per call

    def __call__(self) -> dict[str, float]:
        from hwlab.core.measure import time_fn

        out = {}
        for k, (fn, work) in self.jobs.items():
            t = time_fn(fn, [()], self.dev, n_warmup=1, n_rep=RETIME_REPS, net_of_wait=True)
            out[k] = work / (t.median_ms * 1e-3)
        return out


#: metrics read from a time this run measured (a median over a timing or profiled call's shares):
#: their spread is at least :data:`RUN_TO_RUN` of the pooled value on each side
TIMED_METRICS = ("slowdown_vs_floor", "dram_pct_estimated", "dram_pct_required_estimated", "tensor_pct_of_peak",
                 "e2e_slowdown")
#: the least relative spread of a timed metric (module doc, "Run to run"): what medians net of the
#: run-queue wait still move by from one load phase of a busy host to the next (cache and memory
#: contention from neighbours stays in them); a range over blocks taken in one phase is narrower
RUN_TO_RUN = 0.15


#: metrics judged against a measured ceiling: +1 grows with the ceiling (time over a floor of
#: work / ceiling), -1 shrinks with it (a rate over the ceiling)
CEILING_METRICS = {"slowdown_vs_floor": 1, "dram_pct_estimated": -1, "dram_pct_required_estimated": -1,
                   "tensor_pct_of_peak": -1}


def ceiling_band(bands: dict[str, dict[str, Any]], keys: tuple[str, ...],
                 retimed: dict[str, list[float]] | None = None,
                 values: dict[str, float | None] | None = None) -> tuple[float, float] | None:
    """The ceilings' own spread as factors on their value, ``(lo, hi)``: a ceiling is a rate, so its
    p10-p90 runs from median/p90 to median/p10 of its timing; with the ceiling re-timed during the
    examination (``retimed``: key -> rates, :class:`Retimer`; ``values``: key -> the rate in use),
    also from the lowest to the highest re-timed rate over the one in use: what the ceiling reads
    in another load phase, as the next run's own measurement may. Over several ceilings, the widest."""
    lo, hi = 1.0, 1.0
    for k in keys:
        b = bands.get(k) or {}
        t, p10, p90 = b.get("t_ms"), b.get("t_p10_ms"), b.get("t_p90_ms")
        if all(isinstance(x, (int, float)) and x > 0 for x in (t, p10, p90)):
            lo, hi = min(lo, t / p90), max(hi, t / p10)
        v, rs = (values or {}).get(k), [r for r in (retimed or {}).get(k, []) if r > 0]
        if v and rs:
            lo, hi = min(lo, min(rs) / v), max(hi, max(rs) / v)
    return (lo, hi) if (lo, hi) != (1.0, 1.0) else None


def spreads_over(repeat_evidence: list[dict[str, Any]], pooled: dict[str, Any],
                 band: tuple[float, float] | None = None,
                 run_to_run: float = RUN_TO_RUN) -> dict[str, dict[str, Any]]:
    """metric -> ``{"lo", "hi", "n", "what"}``: the range of each thresholded metric over the
    repeats and the pooled evidence (module doc), widened, for a metric judged against a measured
    ceiling, by that ceiling's own spread (``band``, :func:`ceiling_band`): the next run may meet
    the ceiling anywhere in it. A metric seen once, with no ceiling spread, has none.
    ``run_to_run``: the least relative spread of a timed metric, :data:`RUN_TO_RUN` or more (a part's
    own profiled calls may disagree by more: :func:`hwlab.examine.parts.call_share_spread`)."""
    out = {}
    for k in SPREAD_METRICS:
        vals = [float(e[k]) for e in [*repeat_evidence, pooled] if isinstance(e.get(k), (int, float))
                and not isinstance(e.get(k), bool)]
        if k not in pooled or not vals:
            continue
        lo, hi, what = min(vals), max(vals), f"range over {len(vals) - 1} repeats and the pooled run"
        n = len(vals)
        if repeat_evidence and k in TIMED_METRICS and isinstance(pooled.get(k), (int, float)):  # run to run
            v = float(pooled[k])
            r2r = max(RUN_TO_RUN, run_to_run)
            f_lo, f_hi = v * (1 - r2r), v * (1 + r2r)
            w = hi - lo if n < checks.FEW_REPEATS else 0.0  # as the walk will widen a few repeats' range
            if f_lo < lo - w or f_hi > hi + w:  # narrower than the floor: widened here, not again
                lo, hi = min(_clamp(k, lo - w), f_lo), max(hi + w, f_hi)
                what += f", at least +-{100 * r2r:.0f}% of its value (run to run)"
                n = max(n, checks.FEW_REPEATS)
        if band is not None and k in CEILING_METRICS:
            if n < checks.FEW_REPEATS:  # widened as flowchart_checks widens a few repeats' range
                w = hi - lo
                lo, hi, what = _clamp(k, lo - w), hi + w, what + " widened by its width (few repeats)"
            f_lo, f_hi = band if CEILING_METRICS[k] > 0 else (1 / band[1], 1 / band[0])
            out[k] = {"lo": lo * f_lo, "hi": hi * f_hi, "what": what + ", times the ceiling's own p10-p90"}
        elif n >= 2:
            out[k] = {"lo": lo, "hi": hi, "n": n, "what": what}
    return out


def merge_spreads(*spread_sets: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Several ``metric_spreads`` of the same metrics (the repeats' ranges, a run's own p10-p90) as
    one: per metric the union of the ranges, each first widened as the walk would widen it
    (:func:`hwlab.diagnosis.flowchart_checks.spreads_of`) and held in the metric's physical range,
    so the union is not widened again."""
    out: dict[str, dict[str, Any]] = {}
    for sp in spread_sets:
        for k, ((lo, hi), what) in checks.spreads_of({"metric_spreads": sp or {}}).items():
            lo, hi = _clamp(k, lo), _clamp(k, hi)
            if k in out:
                o = out[k]
                out[k] = {"lo": min(o["lo"], lo), "hi": max(o["hi"], hi), "what": f"{o['what']}; {what}"}
            else:
                out[k] = {"lo": lo, "hi": hi, "what": what}
    return out


def alternatives(evidence: dict[str, Any], walk: Diagnosis, repeat_leaves: list[str | None]) -> list[str]:
    """Leaves other than ``walk``'s that a repeat reached, or that the walk reaches with a metric at
    an end of its (widened) spread (module doc). ``"undecided at X"`` stands for a walk with no leaf."""
    def name(d: Diagnosis) -> str:
        return d.leaf_id or (f"undecided at {d.undecided.id}" if d.undecided else "no leaf")

    seen = {name(walk)}
    found = [x for x in repeat_leaves if x]  # None: the repeat did not walk it (under the walk share)
    spreads = checks.spreads_of(evidence)
    base = {k: v for k, v in evidence.items() if k != "metric_spreads"}
    variants = []
    # a widened spread's ends are held inside the metric's physical range: no re-run measures past it
    ends = {k: [x for x in (_clamp(k, lo), _clamp(k, hi)) if checks.check_range("", k, x) is None]
            for k, ((lo, hi), _what) in spreads.items() if k in base}
    for k, xs in ends.items():
        variants += [{**base, k: x} for x in xs]
    ks = [k for k, xs in ends.items() if len(xs) == 2]
    if len(ks) > 1:
        variants += [{**base, **{k: ends[k][0] for k in ks}}, {**base, **{k: ends[k][1] for k in ks}}]
    found += [name(diagnose(v)) for v in variants]
    return sorted({x for x in found if x not in seen})


def _clamp(metric: str, v: float) -> float:
    """A widened spread's end held inside the metric's physical range (a slowdown is not negative)."""
    lo, hi, _why = checks.PHYSICAL_RANGES.get(metric, (-checks.INF, checks.INF, ""))
    return min(max(v, lo), hi)


def leaf_name(leaf: str | None, undecided: str | None = None) -> str:
    """A walk's end as the repeats name it."""
    return leaf or (f"undecided at {undecided}" if undecided else "no leaf")
