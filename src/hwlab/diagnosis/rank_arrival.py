"""Who arrived last at each collective of a rank set, how much waiting each rank caused, and what
the traces' content says about their host and clock (``hwlab ranks --traces``,
:mod:`hwlab.diagnosis.ranks_traces`).

* **Arrival** per matched collective: on one clock the last rank to *start* it is the last to
  arrive, and ranks whose starts lie within the clocks' jitter tolerance
  (:data:`hwlab.traces.rank_reading.CLOCK_JITTER_US`: processes of one host read their clocks tens
  of µs apart) of the last are tied for it; without one clock, the rank with the least time
  *inside* it (it waited least), ranks within :data:`ARRIVAL_TIE_US` of it tied (durations need no
  common clock, so only their resolution limits them).
* **The vote is weighed by the wait a late arrival causes**, not one vote per collective: each
  rank's wait is its time inside minus the shortest time inside, and the waits of the ranks that
  were not last go to the last arriver (split evenly between tied ones). A rank 3 ms late at two
  collectives holds the job more than one 50 µs late at ten, and the vote says so. The top two
  tie when their caused waits differ by less than the reading's spread: the tie tolerance (above)
  for every waiting rank at every collective either was last at, ``(n - 1) x tolerance x
  collectives``, the most that misreading each arrival by the tolerance could move. A tie is
  reported with its candidates, never given to the lowest rank.
* **One host from content**: file names may name a host per rank (or none); the traces' own
  content decides: one device per rank, all distinct, distinct process ids, overlapping steps,
  and matched collectives whose ends lie within :data:`ONE_HOST_END_SPREAD_US` of each other.
"""
from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from hwlab.traces import kineto
from hwlab.traces.rank_reading import CLOCK_JITTER_US, busbw_gbps as _busbw_gbps, match, shared_clock

#: on one clock, the ranks' ends of one collective lie within this of each other (a collective completes on
#: every rank once the last data lands: µs apart on one host, the clocks' offset apart across hosts); a
#: median spread under it, with one device per rank, all distinct, reads as one host whatever the file names say
ONE_HOST_END_SPREAD_US = 200.0
#: without a common clock, two ranks whose times inside one collective differ by less than this are tied
#: for it: the durations cannot order them (on one clock the starts are compared, to the clocks' jitter)
ARRIVAL_TIE_US = 1.0


def tie_us(one_clock: bool) -> float:
    """How close two arrivals may lie and still be told apart (module doc): the clocks' jitter
    tolerance on one clock (starts are compared), the durations' resolution otherwise."""
    return CLOCK_JITTER_US if one_clock else ARRIVAL_TIE_US


def arrivals(matched: list, how_by: list[str], ranks: list[int], one_clock: bool) -> tuple:
    """Per matched collective: who arrived last (module doc; ``tied`` where the timestamps cannot
    order them), each rank's wait (its time inside minus the shortest), the wait it caused (the
    others' waits, split between tied last arrivers), the link time (the shortest time inside),
    and on one clock whether start-time and time-inside orders agree."""
    colls_out, last_count, wait_ms = [], Counter(), {r: 0.0 for r in ranks}
    caused_ms = {r: 0.0 for r in ranks}
    caused_n: Counter = Counter()  # collectives each rank was (or tied for) last at
    agree = 0
    tol = tie_us(one_clock)
    for m, how in zip(matched, how_by):
        durs = {r: c.dur_us for r, c in m.items()}
        starts = {r: c.ts_us for r, c in m.items()}
        if one_clock:  # one clock: the last to start is the last to arrive
            last = max(starts, key=starts.get)
            tied = sorted(r for r in starts if starts[last] - starts[r] < tol)
        else:  # no common clock: the last arriver waits least inside
            last = min(durs, key=durs.get)
            tied = sorted(r for r in durs if durs[r] - durs[last] < tol)
        floor_us = min(durs.values())
        waits = {r: (d - floor_us) / 1e3 for r, d in durs.items()}
        caused = sum(w for r, w in waits.items() if r not in tied)
        for r in tied:
            caused_ms[r] += caused / len(tied)
            caused_n[r] += 1
        if len(tied) == 1:
            last_count[last] += 1
        else:  # the timestamps cannot order them: no count, the wait split between them
            last_count["tie"] += 1
        for r, w in waits.items():
            wait_ms[r] += w
        c0 = m[last]
        row = {"name": c0.name, "pg": c0.pg, "seq": c0.seq, "n_bytes": c0.n_bytes,
               "last": last if len(tied) == 1 else None, "tied": tied if len(tied) > 1 else None,
               "skew_ms": max(waits.values()), "caused_wait_ms": caused,
               "inside_ms": {str(r): d / 1e3 for r, d in durs.items()},
               "link_ms": floor_us / 1e3, "busbw_gbps": _busbw_gbps(c0, len(ranks), floor_us),
               "matched_by": how, "meta_source": c0.meta_source}
        if one_clock:
            row["last_by_start"] = max(starts, key=starts.get)
            row["last_by_time_inside"] = min(durs, key=durs.get)
            row["start_skew_ms"] = (max(starts.values()) - min(starts.values())) / 1e3
            agree += row["last_by_start"] == row["last_by_time_inside"]
        colls_out.append(row)
    return colls_out, last_count, wait_ms, agree, {"ms": caused_ms, "n": caused_n}


def one_host_by_content(traces: dict[int, kineto.RankTrace], min_matched: int) -> str | None:
    """Why traces whose names say several hosts were recorded on one host and one clock, or None:
    each rank's kernels on one device, all distinct; distinct process ids; the steps overlap; and
    the matched collectives end within :data:`ONE_HOST_END_SPREAD_US` of each other (median)."""
    ids = [t.gpu_ids for t in traces.values()]
    if not all(len(i) == 1 for i in ids) or len({str(next(iter(i))) for i in ids}) != len(ids):
        return None
    pids = [t.pid for t in traces.values() if t.pid is not None]
    if len(set(pids)) != len(pids) or not shared_clock(traces):
        return None
    matched = [m for m, _ in match(traces, True)["matched"]]
    if len(matched) < min_matched:
        return None
    spread = statistics.median(max(c.ts_us + c.dur_us for c in m.values()) - min(c.ts_us + c.dur_us for c in m.values())
                               for m in matched)
    if spread > ONE_HOST_END_SPREAD_US:
        return None
    return (f"one device per rank, all distinct; distinct process ids; the steps overlap; {len(matched)} matched "
            f"collectives end within a median {spread:.3g} us of each other (under {ONE_HOST_END_SPREAD_US:g} us): "
            "one host and one clock")


def last_arriver(last_count: Counter, caused_by: dict[str, Any], n_m: int, one_clock: bool,
                 n_ranks: int) -> dict[str, Any] | None:
    """The rank whose late arrivals caused the most waiting (module doc), or the ranks tied with
    it within the reading's spread; reported whether or not it makes a finding. ``arrived_last``
    counts the collectives it was last at alone, beside its caused wait."""
    caused, n_by = caused_by["ms"], caused_by["n"]
    total = sum(caused.values())
    if not n_m or total <= 0:
        return None
    order = sorted(caused, key=lambda r: (-caused[r], r))
    top = order[0]
    tol_us = tie_us(one_clock)

    def spread_ms(a: int) -> float:
        return max(1, n_ranks - 1) * tol_us * (n_by[top] + n_by[a]) / 1e3
    tied = sorted(r for r in order if r == top or caused[top] - caused[r] < spread_ms(r))
    return {"rank": top if len(tied) == 1 else None, "tied": tied if len(tied) > 1 else None,
            "arrived_last": last_count.get(top, 0), "of": n_m, "ties_within_us": last_count.get("tie", 0),
            "caused_wait_ms": caused[top], "share_of_wait_pct": 100.0 * caused[top] / total,
            "total_wait_ms": total, "tie_spread_ms": max((spread_ms(r) for r in order[1:2]), default=0.0),
            "caused_wait_by_rank_ms": {str(r): caused[r] for r in sorted(caused)},
            "by": ("start time on one clock" if one_clock else "least time inside (no common clock)")
            + ", weighed by the wait each late arrival caused the other ranks"}


def step_start_lag_ms(traces: dict[int, kineto.RankTrace]) -> dict[int, float]:
    """On one clock: how long after the earliest rank each rank starts its steps (median over the
    step numbers every rank recorded), in ms. A late rank whose own step is no longer than the
    others' starts late: what delays it lies before its recorded step."""
    wins = {r: {n: ts for n, ts, _ in t.steps} for r, t in traces.items()}
    common = set.intersection(*(set(w) for w in wins.values())) if wins else set()
    if not common:
        return {}
    lags: dict[int, list[float]] = {r: [] for r in wins}
    for n in common:
        first = min(w[n] for w in wins.values())
        for r, w in wins.items():
            lags[r].append((w[n] - first) / 1e3)
    return {r: statistics.median(v) for r, v in lags.items()}
