"""What ``hwlab ranks --traces`` names in a rank set: a late or slow rank, a tie, a link, or nothing
(:mod:`hwlab.diagnosis.ranks_traces` reads the traces; :mod:`hwlab.diagnosis.rank_arrival` weighs
who the others waited for). The rules and why:

* **The rank the others wait for** is the top of the wait-weighted arrival vote, named when, over
  at least :data:`MIN_MATCHED` matched collectives, the others wait for it at least
  :data:`RANK_TAIL_PCT` of the median step (``late_pct_of_step``: the wait it caused, per waiting
  rank and step; the flowchart's K unit, so a wait that would not make a rank tail names no one),
  and at least :data:`LAST_SHARE` of all the waiting in those collectives is for it, and
  :data:`CHANCE_MARGIN` times the share chance gives (1/n ranks: 75% with two ranks).
  Its own time (step minus exposed communication) then says which kind of late it is:
  - **slow rank**: its own time is :data:`RANK_TAIL_PCT` of the step or more over the others'
    median (``rank_tail_pct``): its own work is longer. It is checked against the single-device
    branch (B), the seed's counter-example: its busy time over the other ranks' at their p10 (the
    same code runs on every rank, so their median is the floor, an estimate from peers, not a
    roofline); a rank whose busy time is normal is slow for another reason (a host stall, a data
    loader, its placement).
  - **late rank**: its own time is not longer, so it *starts* late: on one clock, how long after
    the first rank it starts its steps is shown; what delays it lies before its recorded step
    (the previous step, its input, its host). The walk's K reads the named rank's own-time tail,
    under the threshold here: no rank's own work finishes late.
* **A tie**: the vote's top ranks lie within its spread (rank_arrival) and the others wait for
  them together at least :data:`RANK_TAIL_PCT` of the step: the candidates are named with their
  own times and caused waits, none is chosen.
* **A tail arrival does not confirm**: the longest own time is a tail, but no rank is named by
  the wait: said, no rank named.
* **Slow link**: no rank named, and the collectives take :data:`LINK_FLOOR_PCT` of the step even
  for the last rank to arrive (``collective_floor_pct``: every rank waits inside the
  collective, the arrival skew is small). Bus bandwidth (``2(n-1)/n x bytes / time`` for an
  all-reduce, ``(n-1)/n`` for all-gather/reduce-scatter, bytes/time otherwise) is set against
  ``link_gbps`` when given (the link's measured or rated bus bandwidth): under
  :data:`SLOW_LINK_FRACTION` of it, the link is slow; above, the job is communication-bound and
  the overlap figure says how much was hidden. Without ``link_gbps`` the two are not separated
  and the report says so. The link is named (backend, hosts, ranks), never a rank.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

RANK_TAIL_PCT = 10.0      # = the flowchart's K threshold on rank_tail_pct
LAST_SHARE = 0.5          # the named rank caused at least half the waiting
CHANCE_MARGIN = 1.5       # ... and at least 1.5x the share chance gives (1/n ranks): 75% with two ranks
MIN_MATCHED = 5           # ... over at least five matched collectives
LINK_FLOOR_PCT = 25.0     # = the flowchart's K criterion on collective_floor_pct
SLOW_LINK_FRACTION = 0.5  # bus bandwidth under half the link's: the link is slow
SINGLE_DEVICE_SLOW = 1.5  # = the flowchart's B threshold


def topology_link(folder: Path, ranks: list[int]) -> dict[str, Any] | None:
    """The slowest link between the ranks' GPUs from a startup capture (``hwlab.capture``) in the
    folder or its parent, and its bus bandwidth by the kit's link model -- an estimate (a lead per
    link class, :data:`hwlab.core.mapping.LINK_MODEL`), not a measurement. None without a capture, with
    ranks on several hosts, or with a rank's GPU unknown."""
    from hwlab.core.capture import Topology, load_run
    from hwlab.core.mapping import link_gbps_us
    for d in (folder, folder.parent):
        caps, nodes, _ = load_run(d)
        if not caps:
            continue
        by = {c["rank"]: c for c in caps}
        if not all(r in by and (by[r].get("device") or {}).get("gpu") for r in ranks):
            return None
        hosts = {by[r]["host"] for r in ranks}
        node = nodes.get(next(iter(hosts))) if len(hosts) == 1 else None
        if not node or not node.get("topology"):
            return None
        gpus = [by[r]["device"]["gpu"] for r in ranks]
        cell = Topology.from_dict(node["topology"]).slowest_link(gpus)
        gbps = link_gbps_us(cell)[0]
        if not gbps < float("inf"):
            return None
        return {"cell": cell, "gpus": gpus, "gbps": gbps,
                "source": f"estimate: the kit's link model for {cell} (hwlab.core.mapping.LINK_MODEL), from the capture in {d}"}
    return None


def _device_branch(ratio: float | None) -> str:
    if ratio is None:
        return "busy time not measured"
    if ratio >= SINGLE_DEVICE_SLOW:
        return (f"its busy time is {ratio:.2f}x the ranks' median (>= {SINGLE_DEVICE_SLOW}): its own device or "
                "kernels are slow -- take the single-device branch (B yes)")
    return (f"its busy time is {ratio:.2f}x the ranks' median (< {SINGLE_DEVICE_SLOW}): not its device -- "
            "something outside its kernels delays it (host stall, data loading, placement): the counter-example holds")


def rank_finding(per_rank: dict[str, dict[str, Any]], ranks: list[int], own: dict[int, float], step_med: float,
                 vote: dict[str, Any] | None, n_m: int, n_steps: int, lag_ms: dict[int, float]) -> tuple:
    """A slow or late rank, a tie, a tail arrival does not confirm, or clean (module doc); with
    the own-time tail the walk's K reads (of the named rank, else of the longest own time), that
    rank, and the peer floor the walk's B uses."""
    finding: dict[str, Any] = {"kind": "clean", "names": None}
    busy_p10 = {r: per_rank[str(r)]["busy_p10_ms"] for r in ranks}
    peer_floor = statistics.median(busy_p10.values())

    def tail_of(r: int) -> float:
        others = [v for k, v in own.items() if k != r]
        return 100.0 * (own[r] - statistics.median(others)) / step_med if others and step_med > 0 else 0.0

    caused = {int(k): v for k, v in (vote or {}).get("caused_wait_by_rank_ms", {}).items()}
    n_wait = max(1, len(ranks) - 1) * max(1, n_steps)

    def late_pct(r: int) -> float:
        return 100.0 * caused.get(r, 0.0) / n_wait / step_med if step_med > 0 else 0.0

    subject = max(own, key=own.get)
    need_share = max(LAST_SHARE, CHANCE_MARGIN / len(ranks))
    enough = vote is not None and n_m >= MIN_MATCHED
    if enough and vote["tied"] and sum(late_pct(r) for r in vote["tied"]) >= RANK_TAIL_PCT:
        top = sorted(vote["tied"], key=lambda r: -caused[r])[:20]
        finding = {"kind": "arrival_tie", "names": None, "tied": [
            {"rank": r, "caused_wait_ms": caused[r], "own_ms": own[r]} for r in top],
            "why": f"the arrival vote ties: ranks {', '.join(map(str, top))} caused "
                   + ", ".join(f"{caused[r]:.3g}" for r in top) + f" ms of the others' wait over {n_m} matched "
                   f"collectives, within the reading's spread ({vote['tie_spread_ms']:.3g} ms); own times "
                   + ", ".join(f"rank {r} {own[r]:.3g} ms" for r in top)
                   + ": record more steps, or one rank's trace with its straggling cause, to tell them apart"}
    elif enough and vote["rank"] is not None and late_pct(vote["rank"]) >= RANK_TAIL_PCT \
            and vote["share_of_wait_pct"] >= 100.0 * need_share:
        r = subject = vote["rank"]
        ratio = busy_p10[r] / peer_floor if peer_floor > 0 else None
        tail = tail_of(r)
        slow = tail >= RANK_TAIL_PCT
        measured = (f"the other ranks wait {late_pct(r):.0f}% of the median step for it "
                    f"({caused[r] / n_wait:.3g} ms each per step, {vote['share_of_wait_pct']:.0f}% of all the waiting "
                    f"in {n_m} matched collectives; last alone at {vote['arrived_last']} of them)")
        finding = {"kind": "slow_rank" if slow else "late_rank", "names": f"rank {r}", "rank": r,
                   "pct_arrived_last": 100.0 * vote["arrived_last"] / n_m, "busy_over_peers": ratio,
                   "late_pct_of_step": late_pct(r), "share_of_wait_pct": vote["share_of_wait_pct"],
                   "own_tail_pct": tail, "start_lag_ms": lag_ms.get(r),
                   "single_device_branch": _device_branch(ratio), "measured": measured}
        if not slow:
            lag = lag_ms.get(r)
            finding["why"] = (
                f"its own time is {tail:.0f}% of the step over the others' (under {RANK_TAIL_PCT:g}): its own work "
                "is not longer, it starts late"
                + (f": it starts its steps {lag:.3g} ms after the first rank (median over the steps every rank "
                   "recorded, one clock), so what delays it lies before its recorded step (the previous step, its "
                   "input, its host)" if lag is not None else
                   ": what delays it lies outside its recorded steps (no common clock to say how late it starts)")
                + f"; profile several steps of rank {r} with its host side (CPU ops, DataLoader) to see what it is")
    elif tail_of(subject) >= RANK_TAIL_PCT:
        top = vote["rank"] if vote else None
        share = vote["share_of_wait_pct"] if vote else 0.0
        finding = {"kind": "tail_unconfirmed", "names": None,
                   "why": (f"rank {subject} has the longest own time ({tail_of(subject):.0f}% of the step over the "
                           "others') " + (f"and caused {share:.0f}% of the waiting in {n_m} matched collectives, "
                                          if top == subject else
                                          f"but the rank the others waited for most is {top} ({share:.0f}% of "
                                          f"the waiting in {n_m} matched collectives), " if top is not None else
                                          "but no rank's late arrival stands out of the vote's spread, ")
                           + f"a rank is named when the others wait >= {RANK_TAIL_PCT:g}% of the step for it, "
                           f">= {100 * need_share:.0f}% of all the waiting, over at least {MIN_MATCHED} collectives")}
    return finding, tail_of(subject), subject, busy_p10, peer_floor


def link_finding(finding: dict[str, Any], folder: Path, ranks: list[int], link_gbps: float | None,
                 floor_pct: float | None, colls_out: list, backends: list[str], hosts: list[str],
                 per_rank: dict[str, dict[str, Any]]) -> tuple:
    """No rank named and the collectives hold a quarter of the step even for the last arriver: the
    link, named, set against its rate where one is given or a capture models it (module doc)."""
    link_src = "given (--link-gbps)" if link_gbps else None
    topo_link = topology_link(folder, ranks) if not link_gbps else None
    if topo_link:
        link_gbps, link_src = topo_link["gbps"], topo_link["source"]
    if floor_pct is not None and floor_pct >= LINK_FLOOR_PCT and finding["kind"] == "clean":
        bws = [c["busbw_gbps"] for c in colls_out if c["busbw_gbps"]]
        bw = statistics.median(bws) if bws else None
        skews = [c["skew_ms"] for c in colls_out]
        link_name = (f"the {'/'.join(backends) or 'collective'} link between ranks {ranks[0]}-{ranks[-1]} on "
                     + (f"host {hosts[0]}" if len(hosts) == 1 else f"hosts {', '.join(hosts)}")
                     + (f" (slowest topology link {topo_link['cell']} between GPUs {topo_link['gpus']})"
                        if topo_link else ""))
        if link_gbps and bw is not None:
            slow = bw < SLOW_LINK_FRACTION * link_gbps
            verdict = ("slow link" if slow else "communication-bound (the link runs near its rate)")
            why = (f"bus bandwidth {bw:.3g} GB/s = {100 * bw / link_gbps:.0f}% of the link's {link_gbps:g} GB/s "
                   f"[{link_src}]")
        else:
            verdict = "link-bound: slow link or payload too large, not separated"
            why = (f"bus bandwidth {bw:.3g} GB/s" if bw else "collective sizes not recorded (profile with "
                   "record_shapes=True)") + "; no link rate given (--link-gbps) to set it against"
        finding = {"kind": "slow_link", "names": link_name, "verdict": verdict, "why": why,
                   "busbw_gbps": bw, "collective_floor_pct": floor_pct,
                   "median_skew_ms": statistics.median(skews) if skews else None,
                   "overlap_hidden_pct": statistics.median(
                       [per_rank[str(r)]["overlap_hidden_pct"] or 0.0 for r in ranks])}
    return finding, link_gbps, link_src
