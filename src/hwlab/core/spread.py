"""Is a change between two timed runs beyond what each run's own spread allows?

Core floor (imports nothing from hwlab). Every timed result in the kit is a median with its
p10-p90 band over ``n_rep`` repeats; a comparison of two such results (a node against its
baseline, a fresh ceiling against its cache) asks this module, one rule for all. Rules, and why:

* **Under the tolerance** (the caller's ``tol_pct``, e.g. 10% for a rate): no deviation.
* **Too few repeats**: fewer than :data:`MIN_REPEATS` (10) in either run. The p10 and p90 of
  fewer than ten samples are interpolated between the two or three extreme samples, so the
  band says little about the spread; such a change is borderline, never a failure.
* **Noisy run**: either band wider than :data:`NOISY_SPREAD_PCT` (50%) of its median. A run
  whose own repeats differ that much measured the load on the host (preemption, frequency
  changes, other tenants), which moves between runs at least as much as within one; a shift
  of such a probe is borderline. Device probes on an idle GPU stay far below this width.
* **Overlapping bands**: the slower run's p10 is not above the faster run's p90. A re-run may
  then put the two in the other order, so the change is *within spread (borderline)*.
* Otherwise the change is **beyond spread**: even the slower run's fastest tenth is slower
  than the faster run's slowest tenth, in runs with enough repeats and sane bands.

The first two rules also judge one run on its own (:func:`unstable`): a run with too few
repeats or a noisy band is not a steady rate, so it is never kept as a reference (the
ceiling cache keeps its previous value instead, :func:`hwlab.core.ceilings.to_cache`).
"""
from __future__ import annotations

from dataclasses import dataclass

MIN_REPEATS = 10
NOISY_SPREAD_PCT = 50.0

OK, BORDERLINE, BEYOND = "ok", "borderline", "beyond spread"


@dataclass(frozen=True)
class Band:
    """A median and its p10-p90 band (any one unit; times in ms for a probe), over ``n`` repeats."""
    median: float
    p10: float
    p90: float
    n: int

    @property
    def spread_pct(self) -> float:
        return 100.0 * (self.p90 - self.p10) / self.median if self.median > 0 else float("inf")

    def text(self, unit: str = "ms") -> str:
        return f"{self.median:.4g} {unit} (p10-p90 {self.p10:.4g}-{self.p90:.4g}, n={self.n})"


@dataclass(frozen=True)
class Judgement:
    status: str  # OK | BORDERLINE | BEYOND
    change_pct: float  # (now / base - 1) in percent, of the medians
    reason: str


def unstable(band: Band) -> str | None:
    """Why one run's own spread says it measured no steady rate (too few repeats, or a p10-p90
    band wider than :data:`NOISY_SPREAD_PCT` of its median), or None when it is stable."""
    if band.n < MIN_REPEATS:
        return (f"{band.n} repeats, fewer than {MIN_REPEATS}, give no usable p10-p90 band")
    if not band.spread_pct <= NOISY_SPREAD_PCT:
        return (f"its p10-p90 band is {band.spread_pct:.0f}% of its median (> {NOISY_SPREAD_PCT:g}%): it "
                "measured host load, not a steady rate; re-record on an idle machine")
    return None


def judge_rise(base: Band, now: Band, tol_pct: float) -> Judgement:
    """Judge a *rise* of ``now`` over ``base`` (a longer time, a higher latency) by the rules in
    the module docstring. A fall is not judged here (a faster run is no deviation): OK."""
    change = 100.0 * (now.median / base.median - 1.0) if base.median > 0 else float("inf")
    if change <= tol_pct:
        return Judgement(OK, change, f"rise {change:+.1f}% is within the {tol_pct:g}% tolerance")
    few = min(base.n, now.n)
    if few < MIN_REPEATS:
        return Judgement(BORDERLINE, change, f"within spread (borderline): {few} repeats, fewer than "
                         f"{MIN_REPEATS}, give no usable p10-p90 band; re-run with more repeats")
    wide = max(base.spread_pct, now.spread_pct)
    if wide > NOISY_SPREAD_PCT:
        return Judgement(BORDERLINE, change, f"within spread (borderline): a p10-p90 band {wide:.0f}% "
                         f"of its median (> {NOISY_SPREAD_PCT:g}%) measured host load, not a steady rate; "
                         "re-record both on an idle machine")
    if now.p10 <= base.p90:
        return Judgement(BORDERLINE, change, f"within spread (borderline): the p10-p90 bands overlap "
                         f"(now p10 {now.p10:.4g} <= baseline p90 {base.p90:.4g}); a re-run may flip it")
    return Judgement(BEYOND, change, f"rise {change:+.1f}% > {tol_pct:g}% and beyond both runs' "
                     f"p10-p90 (now p10 {now.p10:.4g} > baseline p90 {base.p90:.4g}, n={few}+)")
