"""Who arrived last at each collective of a rank set, and what the traces' content says about
their host and clock (``hwlab ranks --traces``, :mod:`hwlab.diagnosis.ranks_traces`).

* **Arrival** per matched collective: on one clock the last rank to *start* it is the last to
  arrive; without one, the rank with the least time *inside* it (it waited least). Ranks within
  :data:`ARRIVAL_TIE_US` of the last are tied for that collective and it gives no vote; a vote
  whose top count is shared is reported as a tie with the candidates, never given to the lowest rank.
* **One host from content**: file names may name a host per rank (or none); the traces' own
  content decides: one device per rank, all distinct, distinct process ids, overlapping steps,
  and matched collectives whose ends lie within :data:`ONE_HOST_END_SPREAD_US` of each other.
"""
from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from hwlab.traces import kineto
from hwlab.traces.rank_reading import busbw_gbps as _busbw_gbps, match, shared_clock

#: on one clock, the ranks' ends of one collective lie within this of each other (a collective completes on
#: every rank once the last data lands: µs apart on one host, the clocks' offset apart across hosts); a
#: median spread under it, with one device per rank, all distinct, reads as one host whatever the file names say
ONE_HOST_END_SPREAD_US = 200.0
#: two ranks whose arrival (start on one clock, time inside otherwise) differ by less than this are tied
#: for that collective: the timestamps cannot order them
ARRIVAL_TIE_US = 1.0


def arrivals(matched: list, how_by: list[str], ranks: list[int], one_clock: bool) -> tuple:
    """Per matched collective: who arrived last (module doc; ``tied`` where the timestamps cannot
    order them), each rank's wait (its time inside minus the shortest), the link time (the shortest
    time inside), and on one clock whether start-time and time-inside orders agree."""
    colls_out, last_count, wait_ms = [], Counter(), {r: 0.0 for r in ranks}
    agree = 0
    for m, how in zip(matched, how_by):
        durs = {r: c.dur_us for r, c in m.items()}
        starts = {r: c.ts_us for r, c in m.items()}
        if one_clock:  # one clock: the last to start is the last to arrive
            last = max(starts, key=starts.get)
            tied = sorted(r for r in starts if starts[last] - starts[r] < ARRIVAL_TIE_US)
        else:  # no common clock: the last arriver waits least inside
            last = min(durs, key=durs.get)
            tied = sorted(r for r in durs if durs[r] - durs[last] < ARRIVAL_TIE_US)
        floor_us = min(durs.values())
        waits = {r: (d - floor_us) / 1e3 for r, d in durs.items()}
        if len(tied) == 1:
            last_count[last] += 1
        else:  # the timestamps cannot order them: no vote
            last_count["tie"] += 1
        for r, w in waits.items():
            wait_ms[r] += w
        c0 = m[last]
        row = {"name": c0.name, "pg": c0.pg, "seq": c0.seq, "n_bytes": c0.n_bytes,
               "last": last if len(tied) == 1 else None, "tied": tied if len(tied) > 1 else None,
               "skew_ms": max(waits.values()), "inside_ms": {str(r): d / 1e3 for r, d in durs.items()},
               "link_ms": floor_us / 1e3, "busbw_gbps": _busbw_gbps(c0, len(ranks), floor_us),
               "matched_by": how, "meta_source": c0.meta_source}
        if one_clock:
            row["last_by_start"] = max(starts, key=starts.get)
            row["last_by_time_inside"] = min(durs, key=durs.get)
            row["start_skew_ms"] = (max(starts.values()) - min(starts.values())) / 1e3
            agree += row["last_by_start"] == row["last_by_time_inside"]
        colls_out.append(row)
    return colls_out, last_count, wait_ms, agree


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


def last_arriver(last_count: Counter, n_m: int, one_clock: bool) -> dict[str, Any] | None:
    """The rank most often last to arrive (start time on one clock, else least time inside), or the
    tied ranks; reported whether or not it makes a finding."""
    votes = {r: v for r, v in last_count.items() if r != "tie"}
    if not n_m or not votes:
        return None
    top = max(votes.values())
    tied = sorted(r for r, v in votes.items() if v == top)
    return {"rank": tied[0] if len(tied) == 1 else None, "tied": tied if len(tied) > 1 else None,
            "arrived_last": top, "of": n_m, "ties_within_us": last_count.get("tie", 0),
            "by": "start time on one clock" if one_clock else "least time inside (no common clock)"}
