"""Rank tails and step spikes: the straggler maths shared by Lab 3's report
(:mod:`hwlab.labs.crosslink.report`) and ``hwlab ranks`` (:mod:`hwlab.diagnosis.ranks`).

Thresholds, and why:

* **Tail split** (:func:`tail_split`): sort the ranks by a per-rank time; the ranks above the
  largest jump between neighbours are the tail when that jump is at least :data:`TAIL_JUMP`
  (1.15x). Healthy ranks differ by scheduling noise only once each rank's figure is trimmed
  (Lab 3 takes a lower quartile over steps, ``hwlab ranks`` a median), while a tail that explains
  the seed's 0.72x throughput is 0.39 of a step, at most ~1.4x between on-time and tail ranks
  (less when ranks also wait for each other); 1.15x sits between. The tail % is the slowest
  rank's figure over the median of the ranks below the jump. The flowchart's rank-tail
  threshold (10% of the median step) applies to :func:`tail_pct_of_step`: the same excess over
  the median step, not over the on-time ranks' own time.
* **Spikes** (:func:`spikes`): a step over :data:`SPIKE_OVER_MEDIAN` (1.5x) the series' median,
  beyond what CPU scheduling noise gives a healthy step; spikes are *periodic* when there are
  at least three and their spacing varies by under :data:`PERIODIC_CV` (25%, the coefficient of
  variation of the gaps): a checkpoint, GC or data-loader rhythm rather than random preemption.
  Spikes are judged against the series' own spread: a busy shared host preempts a step now and
  then, and such uneven excursions are the series' own tail, already visible in its p90. They
  *recur* (``recurring``, what a report calls spikes) when they are periodic, or on more than
  :data:`OWN_TAIL_FRAC` (a quarter) of the steps, where they lift the series' upper quartile
  itself over the threshold: then they are its usual behaviour, not its tail (:func:`recurring`).
"""
from __future__ import annotations

import statistics
from typing import Any

TAIL_JUMP = 1.15
SPIKE_OVER_MEDIAN = 1.5
PERIODIC_CV = 0.25
OWN_TAIL_FRAC = 0.25


def recurring(n_spikes: int, n_steps: int, periodic: bool) -> bool:
    """True when ``n_spikes`` over ``n_steps`` are a pattern rather than the series' own tail:
    periodic, or more than :data:`OWN_TAIL_FRAC` of the steps (module docstring)."""
    return n_spikes > 0 and (periodic or n_spikes > OWN_TAIL_FRAC * n_steps)


def tail_split(values: dict[int, float]) -> tuple[list[int], float]:
    """(tail ranks, tail %) of per-rank ``values`` (ms) by the largest jump (module docstring);
    without a jump of :data:`TAIL_JUMP` no rank is in the tail and the % is over the median."""
    order = sorted(values, key=values.get)
    vals = [values[k] for k in order]
    base, tail = statistics.median(vals), []
    jumps = [(vals[i + 1] / vals[i] if vals[i] > 0 else 1.0, i) for i in range(len(vals) - 1)]
    if jumps:
        ratio, i = max(jumps)
        if ratio >= TAIL_JUMP:
            tail, base = sorted(order[i + 1:]), statistics.median(vals[:i + 1])
    return tail, (100.0 * (max(vals) - base) / base if base > 0 else 0.0)


def tail_pct_of_step(values: dict[int, float], tail: list[int], step_ms: float) -> float:
    """The tail in the flowchart's K unit, % of the median step: the slowest rank's ``values`` (ms)
    minus the median of the ranks outside ``tail`` (all ranks when there is no tail), over
    ``step_ms``. A ratio of per-rank times would explode when the on-time ranks' own time is small
    (they spend the step waiting for the slow one); the step is what the job pays."""
    if not values or step_ms <= 0:
        return 0.0
    rest = [v for r, v in values.items() if r not in tail] or list(values.values())
    return 100.0 * (max(values.values()) - statistics.median(rest)) / step_ms


def spikes(series_ms: list[float]) -> dict[str, Any]:
    """Steps over :data:`SPIKE_OVER_MEDIAN` x the median step, whether they recur periodically
    (``at``: their indices in ``series_ms``; ``period_steps``: the median gap when periodic) and
    whether they are a pattern at all (``recurring``, :func:`recurring`)."""
    if not series_ms:
        return {"n": 0, "at": [], "periodic": False, "period_steps": None, "recurring": False}
    med = statistics.median(series_ms)
    at = [i for i, v in enumerate(series_ms) if v > SPIKE_OVER_MEDIAN * med]
    gaps = [b - a for a, b in zip(at, at[1:])]
    periodic = len(at) >= 3 and statistics.mean(gaps) > 1 and \
        statistics.pstdev(gaps) / statistics.mean(gaps) < PERIODIC_CV
    return {"n": len(at), "at": at, "periodic": periodic,
            "period_steps": statistics.median(gaps) if periodic else None,
            "recurring": recurring(len(at), len(series_ms), periodic),
            "threshold_ms": SPIKE_OVER_MEDIAN * med}
