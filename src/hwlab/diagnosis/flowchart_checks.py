"""The checks a flowchart step gets beside its rule: is the metric physically valid, is its
measured spread clear of the threshold, is it an estimate; and the lenses a walk adds after its leaf.

**Physical ranges** (:data:`PHYSICAL_RANGES`). A metric outside the range its definition allows
is not a measurement of what it names, so it cannot answer a question:

* a DRAM share above 100% of the copy rate this machine measured moved more bytes per second
  than DRAM can deliver: the bytes came from a cache (the data fits in L2 / the CPU's LLC), or
  the ceiling was measured low; either way it says nothing about DRAM;
* a sector amplification below 1 would mean fewer sectors than the bytes requested need: the
  counters were read from mismatched scopes;
* shares (hidden communication, tensor-pipe activity, launch gaps) live in 0-100%; times,
  slowdowns and rates are positive; counts are not negative.

**Borderline**. The evidence's ``metric_spreads`` (metric -> ``[lo, hi]`` or
``{"lo", "hi", "what"}``) is the measured spread of the value the rule compares: the p10-p90 over
steps or rounds, or the range of repeated runs. When the threshold lies inside it, a re-run can
land on the other side, so the step is marked borderline: a verdict that flips on a re-run is
not one to act on without more repeats. A range of fewer than :data:`FEW_REPEATS` repeats
understates the spread (the next repeat falls outside it as often as not), so there the step is
also borderline when the value sits within the range's own width of the threshold.

**Estimated**. A metric whose name ends in ``_estimated`` (bytes by a traffic model over a
measured time), that the evidence lists under ``metric_estimated``, or whose source says
"estimated..." is an estimate; walks say so.

**Lenses** (:func:`lenses`): after the leaf,

* *overlap against what could hide*: with ``overlap_hidden_pct`` and the two times alone
  (``overlap_comm_alone_ms``, ``overlap_compute_alone_ms``), the walk says whether overlap did
  not happen (under :data:`OVERLAP_DID_ITS_PART_PCT` of what could hide) or did what it could
  while the link, whose all-reduce outlasts the compute, stays the limiter; a share outside
  0-100% is invalid, with how far the overlapped step overshot;
* *fewer bytes*: a step within :data:`NEAR_FLOOR` of its own floor is "OK at its bytes"; with the
  floors of lower-byte alternatives (``alt_floors_us``: name -> µs, from a traffic model) and the
  step's kernel time (``kernel_us``), the walk reports each alternative's floor as a share of this
  step and what it would save.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

INF = math.inf

#: metric -> (lowest valid, highest valid, what a value outside means and what to re-measure)
PHYSICAL_RANGES: dict[str, tuple[float, float, str]] = {
    "dram_pct_estimated": (0.0, 100.0,
                           "more bytes per second than this machine's measured copy rate: they came from a cache, "
                           "not DRAM (the data fits in L2 / the CPU's LLC); enlarge the input past the cache, or "
                           "count only the bytes that must cross DRAM"),
    "dram_pct_of_peak": (0.0, 100.0, "a DRAM throughput above the theoretical peak: the counter was misread; "
                                     "re-run ncu with dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    "sector_amplification": (1.0, INF, "fewer sectors than the requested bytes need: sectors and requests were "
                                       "counted in different scopes; re-run ncu reading both from l1tex global loads"),
    "traffic_ratio_estimated": (1.0, INF, "fewer bytes moved than the work requires: the traffic model missed "
                                          "ops (Triton or compiled kernels); count the bytes with ncu"),
    "tensor_pipe_pct": (0.0, 100.0, "a pipe busier than every cycle: the counter was misread; re-run ncu"),
    "tensor_pct_of_peak": (0.0, INF, "a negative rate: the FLOP count or the time is wrong; re-measure"),
    "launch_gap_pct": (0.0, 100.0, "an idle share outside 0-100% of the step: the step and kernel times "
                                   "come from different runs; re-profile one step"),
    "overlap_hidden_pct": (0.0, 100.0, "a hidden share outside 0-100% of what could hide: the overlapped step "
                                       "finished sooner than the longer of the two alone (over 100%) or later "
                                       "than both one after the other (under 0%), which overlap cannot do. The "
                                       "three times are medians of separate rounds; the all-reduce over a "
                                       "loaded link and the compute on a shared host vary from round to round "
                                       "by more than that, and the share divides their difference by the "
                                       "shorter time, magnifying the noise; re-measure the three times with "
                                       "more rounds in one launch on a quieter machine"),
    "n_spills": (0.0, INF, "a negative spill count: the compiler report was misread"),
    "slowdown_vs_floor": (0.0, INF, "a non-positive time or floor: re-measure"),
    "e2e_slowdown": (0.0, INF, "a non-positive step time or prediction: re-measure"),
    "rank_tail_pct": (0.0, INF, "the slowest rank cannot finish before the median rank: re-read the step logs"),
}

#: below this many repeats a spread is their range, and a value within the range's width of the
#: threshold counts as borderline (module doc)
FEW_REPEATS = 5
#: a step within this factor of its own floor is "OK at its bytes": the flowchart's B threshold
NEAR_FLOOR = 1.5
#: share of what could hide under which overlap "did not really happen" (the seed's rule 3c):
#: less than half hidden leaves most of the hideable time on the step's critical path
OVERLAP_DID_ITS_PART_PCT = 50.0


@dataclass(frozen=True)
class Invalid:
    """A metric present in the evidence but outside its physical range: not used."""
    question: str
    metric: str
    value: float
    lo: float
    hi: float
    why: str

    def __str__(self) -> str:
        rng = f">= {self.lo:g}" if self.hi == INF else f"{self.lo:g}-{self.hi:g}"
        return (f"{self.question}. {self.metric} = {self.value:.4g} is outside its physical range ({rng}), "
                f"so it is NOT evidence: {self.why}")

    def to_dict(self) -> dict[str, Any]:
        return {"question": self.question, "metric": self.metric, "value": self.value, "lo": self.lo,
                "hi": None if self.hi == INF else self.hi, "why": self.why}


def check_range(question: str, metric: str, value: Any,
                spread: tuple[float, float] | None = None) -> Invalid | None:
    """An :class:`Invalid` when ``value`` is outside ``metric``'s physical range (or not a finite
    number), else None; a metric without a stated range is taken as given. With a measured
    ``spread`` that reaches into the range, a value just past a bound is that bound within its
    own noise (a share just past 100% whose repeats reach below it), not an invalid metric."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return Invalid(question, metric, float("nan"), -INF, INF, f"not a number ({value!r})")
    if metric not in PHYSICAL_RANGES:
        return None if math.isfinite(v) else Invalid(question, metric, v, -INF, INF, "not a finite number")
    lo, hi, why = PHYSICAL_RANGES[metric]
    if not math.isfinite(v) or v < lo or v > hi:
        if spread is not None and math.isfinite(v) and spread[0] <= hi and spread[1] >= lo:
            return None
        return Invalid(question, metric, v, lo, hi, why)
    return None


def spreads_of(evidence: dict[str, Any]) -> dict[str, tuple[tuple[float, float], str]]:
    """metric -> ((lo, hi), what) from the evidence's ``metric_spreads``; entries that are not two
    finite numbers are left out (then the step says "spread not recorded"). A spread of fewer
    than :data:`FEW_REPEATS` values (``n``) comes back widened by its own width on each side."""
    out = {}
    for k, v in (evidence.get("metric_spreads") or {}).items():
        what, n = "", None
        if isinstance(v, dict):
            what, n, v = str(v.get("what", "")), v.get("n"), (v.get("lo"), v.get("hi"))
        try:
            lo, hi = sorted(float(x) for x in v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(lo) and math.isfinite(hi):
            if n is not None and n < FEW_REPEATS:
                w = hi - lo
                lo, hi, what = lo - w, hi + w, f"{what} widened by its width: few repeats"
            out[k] = ((lo, hi), what)
    return out


def straddles(criterion, spread: tuple[float, float] | None) -> bool:
    """True when the rule gives different answers at the two ends of ``spread``: the threshold
    lies inside the measured spread."""
    if spread is None:
        return False
    lo, hi = spread
    return criterion.holds(lo) != criterion.holds(hi)


def estimated_metrics(evidence: dict[str, Any]) -> set[str]:
    """Metrics that are estimates: named ``*_estimated``, listed under ``metric_estimated``, or
    whose stated source (``metric_sources``) begins "estimated" (a traffic model's sector
    amplification is an estimate whatever its name)."""
    named = {k for k in evidence if k.endswith("_estimated")}
    by_source = {k for k, src in (evidence.get("metric_sources") or {}).items()
                 if isinstance(src, str) and src.strip().lower().startswith("estimated")}
    return named | set(evidence.get("metric_estimated") or ()) | by_source


def overlap_lens(evidence: dict[str, Any], leaf_id: str | None = None) -> list[str]:
    """What the hidden share says once it is measured against what could hide. A share outside
    0-100% is not evidence (:data:`PHYSICAL_RANGES`), even where its launches' spread reaches back
    inside: the lens says so, with how far the overlapped step overshot; what the two times alone
    still say (an all-reduce that outlasts the compute leaves the link the limiter) stays."""
    hid = evidence.get("overlap_hidden_pct")
    if hid is None:
        return []
    comm, comp = evidence.get("overlap_comm_alone_ms"), evidence.get("overlap_compute_alone_ms")
    sp = spreads_of(evidence).get("overlap_hidden_pct")
    bad = check_range("overlap", "overlap_hidden_pct", hid)
    if bad is not None:
        out = [f"OVERLAP: INVALID, not evidence: {str(bad).split('. ', 1)[1]}"]
        if comm is not None and comp is not None and math.isfinite(float(hid)):
            both = comm + comp - float(hid) / 100.0 * min(comm, comp)  # the overlapped step's median
            if hid > 100.0:
                out.append(f"   here the overlapped step ({both:.1f} ms) finished {max(comm, comp) - both:.1f} ms "
                           f"sooner than the {'all-reduces' if comm >= comp else 'compute'} alone "
                           f"({max(comm, comp):.1f} ms), against {min(comm, comp):.1f} ms that could hide")
            else:
                out.append(f"   here the overlapped step ({both:.1f} ms) took {both - comm - comp:.1f} ms longer "
                           f"than both alone one after the other ({comm + comp:.1f} ms)")
            if comm > comp:
                out.append(f"   whatever the share, the all-reduce alone outlasts the compute by {comm - comp:.1f} ms, "
                           "which no overlap can hide: the link is the limiter")
        return out
    spread = ""
    if sp is not None:
        (lo, hi), what = sp
        spread = f" (spread {lo:.0f}-{hi:.0f}%{', ' + what if what else ''}"
        spread += ("; BORDERLINE: the spread contains the 50% line, re-run with more repeats)"
                   if lo < OVERLAP_DID_ITS_PART_PCT <= hi else ")")
    else:
        spread = " (spread not recorded)"
    if comm is None or comp is None:
        return [f"OVERLAP: {hid:.0f}% hidden{spread}; the times alone are not in the evidence, so what "
                "could hide is unknown"]
    hideable = min(comm, comp)
    head = (f"OVERLAP: {hid:.0f}% of what could hide was hidden{spread}; hidden share = saved time / "
            f"min(comm alone {comm:.1f} ms, compute alone {comp:.1f} ms) = saved / {hideable:.1f} ms")
    if hid < OVERLAP_DID_ITS_PART_PCT:
        return [head, "   overlap did not really happen (rule 3c): most of what could hide stayed on the "
                      "critical path; check the all-reduce is issued asynchronously before the next compute"]
    if comm > comp:
        tail = ("the link is the limiter: move the traffic off it (regroup ranks, a faster link, fewer bytes "
                "per all-reduce)" if leaf_id == "L" else "what stays exposed is the link's own time")
        return [head, f"   overlap did what it could: the all-reduce alone outlasts the compute by "
                      f"{comm - comp:.1f} ms, which no overlap can hide; {tail}"]
    return [head, "   overlap hid the communication under compute; the link is not the limiter here"]


def overlap_verdict(evidence: dict[str, Any]) -> str | None:
    """:func:`overlap_lens` in a few words, for a walk shown on one line: the share and which case
    of rule 3c it is (same thresholds), or None without an overlap measurement."""
    hid = evidence.get("overlap_hidden_pct")
    if hid is None:
        return None
    comm, comp = evidence.get("overlap_comm_alone_ms"), evidence.get("overlap_compute_alone_ms")
    longer = comm is not None and comp is not None and comm > comp
    if check_range("overlap", "overlap_hidden_pct", hid) is not None:
        return "overlap share INVALID (not evidence)" + (
            "; the all-reduce alone outlasts the compute: the link is the limiter" if longer else "")
    if comm is None or comp is None:
        return f"overlap {hid:.0f}% hidden (what could hide unknown)"
    if hid < OVERLAP_DID_ITS_PART_PCT:
        return f"overlap {hid:.0f}% of what could hide: did not really happen (rule 3c)"
    if longer:
        return f"overlap {hid:.0f}% of what could hide: did what it could, the all-reduce alone outlasts the compute"
    return f"overlap {hid:.0f}% of what could hide: the link is not the limiter"


def fewer_bytes_lens(evidence: dict[str, Any]) -> list[str]:
    """Near its own floor, the floors of the lower-byte alternatives and what they would save."""
    slow, alts, kernel_us = (evidence.get("slowdown_vs_floor"), evidence.get("alt_floors_us"),
                             evidence.get("kernel_us"))
    if slow is None or not alts or not kernel_us or check_range("B", "slowdown_vs_floor", slow):
        return []
    if float(slow) >= NEAR_FLOOR:
        return []
    out = [f"FEWER BYTES: OK at its bytes ({float(slow):.2f}x its own floor); a path that moves fewer bytes has "
           "a lower floor (byte model at the measured copy rate):"]
    for name, floor_us in alts.items():
        pct = 100.0 * float(floor_us) / float(kernel_us)
        out.append(f"   {name}: floor {float(floor_us):.0f} us = {pct:.0f}% of this step's {float(kernel_us):.0f} us "
                   f"kernels (at most {float(kernel_us) - float(floor_us):.0f} us saved per step, estimated)")
    return out


#: what the lenses read beyond the questions' metrics
LENS_METRICS = ("overlap_comm_alone_ms", "overlap_compute_alone_ms", "kernel_us", "alt_floors_us")


def lenses(diagnosis, evidence: dict[str, Any]) -> list[str]:
    """Lines a walk adds after its leaf (module doc)."""
    return overlap_lens(evidence, diagnosis.leaf_id) + fewer_bytes_lens(evidence)
