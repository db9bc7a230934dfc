"""From per-rank timings to findings: the straggler ranks and how late they finish, each
rank's communication wait, step-time spikes, and the flowchart evidence of a run.

The tail split and the spike rule are the core's (:mod:`hwlab.core.tails`: :data:`TAIL_JUMP`,
:data:`SPIKE_OVER_MEDIAN`, :data:`PERIODIC_CV`, with their reasons), shared with ``hwlab ranks``.
What this module adds, and why:

* a rank's own work is its compute + TP all-reduce per step, summarised by the lower quartile
  over steps (:data:`OWN_QUANTILE`, the core's one percentile :func:`hwlab.core.measure.quantile`):
  on a shared CPU scheduling delays only ever add time, at random, so the lower quartile is the
  rank's own cost with most of that noise trimmed; the tail split runs on it. A tail that small
  is near the limit of what a shared CPU can name rank by rank (the recorded sweep shows where
  it fails). The flowchart's rank-tail threshold (10%) then applies to how far the slowest rank
  sits above the other ranks;
* per rank, ``late_ms`` is the median over rounds of its own work minus the non-tail ranks'
  median in the same round, so load on the machine cancels round by round.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from hwlab.core.measure import quantile, spread_of
from hwlab.core.tails import spikes, tail_pct_of_step, tail_split

OWN_QUANTILE = 0.25


@dataclass
class StragglerReport:
    per_rank: dict[int, dict[str, float]]
    tail_ranks: list[int]
    tail_pct: float  # slowest rank's own work over the median of the non-tail ranks', in %
    tail_ms: float   # how much later the tail ranks finish their own work, per step (median)
    step_ms: float   # median step time (all ranks finish a step together at the DP sync)
    n_ranks: int
    step_series_ms: list[float]  # per round: the median rank's step
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"per_rank": self.per_rank, "tail_ranks": self.tail_ranks, "tail_pct": self.tail_pct,
                "tail_ms": self.tail_ms, "step_ms": self.step_ms, "n_ranks": self.n_ranks,
                "step_series_ms": self.step_series_ms, "spikes": spikes(self.step_series_ms),
                "notes": self.notes}


def straggler_report(results: list[dict[str, Any]]) -> StragglerReport:
    """Per-rank times; tail ranks split off by the largest jump in their own work (module doc);
    per rank ``late_ms`` (median over rounds of its own work minus the non-tail ranks' median
    in the same round) and ``comm_wait_ms`` (time inside collectives: TP all-reduce + DP sync)."""
    per: dict[int, dict[str, float]] = {}
    for r in results:
        own = r.get("own_ms") or [c + t for c, t in zip(r["compute_ms"], r["tp_allreduce_ms"])]
        med = {k: statistics.median(r[k]) for k in ("compute_ms", "tp_allreduce_ms", "dp_sync_ms", "step_ms")}
        med["own_ms"] = statistics.median(own)
        med["own_q_ms"] = quantile(own, OWN_QUANTILE)
        med["comm_wait_ms"] = statistics.median(t + d for t, d in zip(r["tp_allreduce_ms"], r["dp_sync_ms"]))
        med["step_p10_ms"], med["step_p90_ms"] = quantile(r["step_ms"], 0.1), quantile(r["step_ms"], 0.9)
        per[r["rank"]] = med
    tail, tail_pct = tail_split({k: v["own_q_ms"] for k, v in per.items()})
    rest = [k for k in per if k not in tail] or list(per)
    by_rank = {r["rank"]: (r.get("own_ms") or [c + t for c, t in zip(r["compute_ms"], r["tp_allreduce_ms"])])
               for r in results}
    n_rounds = min(len(v) for v in by_rank.values())
    for k in per:
        per[k]["late_ms"] = statistics.median(
            by_rank[k][s] - statistics.median(by_rank[j][s] for j in rest) for s in range(n_rounds))
    tail_ms = statistics.median(per[k]["late_ms"] for k in tail) if tail else 0.0
    series = [statistics.median(r["step_ms"][s] for r in results) for s in range(n_rounds)]
    notes = []
    if tail:
        notes.append(f"ranks {tail} finish their TP all-reduce {tail_ms:.1f} ms late per step (median); "
                     f"ranks {sorted(rest)} wait for them in the DP sync "
                     f"({statistics.median(per[k]['dp_sync_ms'] for k in rest):.1f} ms median)")
    step = statistics.median(v["step_ms"] for v in per.values())
    return StragglerReport(per, tail, tail_pct, tail_ms, step, len(per), series, notes)


def paired_ratios(num: list[dict], den: list[dict]) -> list[float]:
    """Per round, (median rank's step in ``num``) / (same in ``den``)."""
    n = min(len(num[0]["step_ms"]), len(den[0]["step_ms"]))
    a = [statistics.median(r["step_ms"][s] for r in num) for s in range(n)]
    b = [statistics.median(r["step_ms"][s] for r in den) for s in range(n)]
    return [x / y for x, y in zip(a, b)]


def paired_ratio(num: list[dict], den: list[dict]) -> float:
    """Median over rounds of (median rank's step in ``num``) / (same in ``den``): the two
    phases ran in the same rounds, so load on the machine cancels round by round."""
    return statistics.median(paired_ratios(num, den))


def rank_tail_pct(rep: StragglerReport | dict[str, Any]) -> float:
    """The flowchart's K figure for ``rep`` (a report, or its ``to_dict()`` as recorded): the slowest
    rank's own time (lower quartile over steps) minus the on-time ranks' median, in % of the median
    step (:func:`hwlab.core.tails.tail_pct_of_step`, the unit of K's threshold). The one figure to
    show for a rank tail: ``rep.tail_pct`` is the tail split's excess over the on-time ranks' own
    time, a ratio that grows without bound when they spend the step waiting."""
    if isinstance(rep, dict):  # a recorded report: JSON made the rank keys strings
        own = {int(k): v["own_q_ms"] for k, v in rep["per_rank"].items()}
        return tail_pct_of_step(own, [int(r) for r in rep["tail_ranks"]], rep["step_ms"])
    return tail_pct_of_step({k: v["own_q_ms"] for k, v in rep.per_rank.items()}, rep.tail_ranks, rep.step_ms)


#: rounds per block for K's spread: each block's figure is taken like the run's (a lower quartile per rank)
SPREAD_BLOCK_ROUNDS = 5


def rank_tail_pct_by_block(run: list[dict], block: int = SPREAD_BLOCK_ROUNDS) -> list[float]:
    """:func:`rank_tail_pct` of each block of ``block`` consecutive rounds, taken the way the run's
    figure is (each rank's lower quartile of compute + TP all-reduce over the block, the block's
    median step): the spread behind the run's figure. Single rounds would be untrimmed, and a
    spread from another estimator can sit entirely above the figure it is meant to bracket."""
    own = {r["rank"]: (r.get("own_ms") or [c + t for c, t in zip(r["compute_ms"], r["tp_allreduce_ms"])])
           for r in run}
    n = min(min(len(v) for v in own.values()), min(len(r["step_ms"]) for r in run))
    out = []
    for b0 in range(0, n - block + 1, block):
        vals = {k: quantile(v[b0:b0 + block], OWN_QUANTILE) for k, v in own.items()}
        step = statistics.median(statistics.median(r["step_ms"][b0:b0 + block]) for r in run)
        out.append(tail_pct_of_step(vals, tail_split(vals)[0], step))
    return out


def flowchart_evidence(baseline: dict[str, Any], run: list[dict], devices_alone: list[dict],
                       rep: StragglerReport, **extra: Any) -> dict[str, Any]:
    """B, D and K from measurements: ``slowdown_vs_floor`` (and the memory/GEMM figures the
    walk reads after a "yes") from ``baseline`` (:func:`~.block.single_device_baseline`),
    ``e2e_slowdown`` = the run's step over the devices-alone step of the same rounds,
    ``rank_tail_pct`` with ``n_ranks``; ``metric_sources`` says what measured each and
    ``metric_spreads`` the spread of each over rounds (B: the baseline's rounds; D: the per-round
    ratio; K: blocks of rounds, :func:`rank_tail_pct_by_block`), for the walk's borderline check.
    ``dram_pct_required_estimated``: the bytes the block must move (inputs, weights and output
    once) over its time, % of the copy rate; it stays valid where ``dram_pct_estimated`` (the
    bytes it does move) exceeds 100% because re-read weights came from the CPU's cache."""
    copy = (baseline.get("ceilings") or {}).get("copy_gbps")
    req = (100.0 * baseline["required_bytes"] / (baseline["t_ms"] * 1e-3) / 1e9 / copy
           if copy and baseline.get("required_bytes") and baseline.get("t_ms") else None)
    spreads = {k: v for k, v in {
        "slowdown_vs_floor": spread_of(baseline.get("slowdown_by_round") or [], "rounds of the block alone"),
        "e2e_slowdown": spread_of(paired_ratios(run, devices_alone), "paired rounds"),
        "rank_tail_pct": spread_of(rank_tail_pct_by_block(run), f"blocks of {SPREAD_BLOCK_ROUNDS} rounds")}.items() if v}
    ev = {"slowdown_vs_floor": baseline["slowdown_vs_floor"],
          "dram_pct_estimated": baseline["dram_pct_estimated"],
          "dram_pct_required_estimated": req,
          "tensor_pct_of_peak": baseline["tensor_pct_of_peak"],
          "e2e_slowdown": paired_ratio(run, devices_alone),
          "rank_tail_pct": rank_tail_pct(rep), "n_ranks": rep.n_ranks,
          "metric_sources": {
              "slowdown_vs_floor": f"one rank's block compute ({baseline['kernel']}) alone in one process, "
                                   f"{baseline['t_ms']:.1f} ms, over this machine's floor "
                                   f"{baseline['floor_ms']:.1f} ms (measured copy/GEMM ceilings, one thread)",
              "dram_pct_estimated": "the block's modelled bytes over its time alone, vs the measured copy rate "
                                    "(over 100% when re-read weights come from the CPU's cache)",
              "tensor_pct_of_peak": "the block's FLOP/s alone vs the measured fp32 GEMM rate",
              "e2e_slowdown": "median over rounds: the multi-rank step over the same rounds' devices-alone "
                              "step (every rank's compute, no collectives)",
              "dram_pct_required_estimated": "the block's required bytes (each input, weight and output once) "
                                             "over its time alone, vs the measured copy rate",
              "rank_tail_pct": "per rank, the lower quartile over steps of compute + TP all-reduce, same run: the "
                               "slowest rank's minus the on-time ranks' median, in % of the median step"},
          "metric_spreads": spreads}
    if req is None:
        del ev["dram_pct_required_estimated"], ev["metric_sources"]["dram_pct_required_estimated"]
    ev.update({k: v for k, v in extra.items() if v is not None})
    return ev


def signature_row(name: str, case: dict[str, Any]) -> dict[str, Any]:
    """The seed's signature, measured: rank tail, communication wait, single-device baseline."""
    rep, ev = case["report"], case["flowchart_evidence"]
    waits = [v["comm_wait_ms"] for v in rep["per_rank"].values()]
    return {"case": name, "rank_tail_pct": ev["rank_tail_pct"], "tail_ranks": rep["tail_ranks"],
            "tail_ms": rep["tail_ms"], "comm_wait_ms_median": statistics.median(waits),
            "comm_wait_ms_max": max(waits), "step_ms": rep["step_ms"],
            "slowdown_vs_floor": ev["slowdown_vs_floor"], "e2e_slowdown": ev["e2e_slowdown"],
            "n_ranks": ev["n_ranks"]}


def aware_walk_note(case: dict[str, Any], walk: Any) -> str:
    """What the topology-aware mapping's walk ``walk`` (a :class:`~hwlab.diagnosis.flowchart.Diagnosis`
    of ``case["aware"]``'s evidence) says about the fix, in words that follow the branch it took.

    On this CPU stand-in every rank is a gloo process on a few shared cores: the aware mapping still
    pays its TP all-reduce (over loopback, or inside the namespace) on top of the devices-alone step
    that D divides by, and that all-reduce costs far more of a CPU block's step than an NVLink one
    costs a GPU's. So an aware walk can cross D's line with no rank tail and land on M, whose causes
    (shape buckets, caches, fallbacks) this block does not have; the note says so with the figures."""
    ev, rep = case["aware"]["flowchart_evidence"], case["aware"]["report"]
    per = list(rep["per_rank"].values())
    ar = statistics.median(v["tp_allreduce_ms"] for v in per)
    comp = statistics.median(v["compute_ms"] for v in per)
    steps = {s.question: s for s in walk.steps}
    speed = case.get("speedup_aware_over_naive")
    lead = (f"The aware mapping delivers {speed:.2f}x the naive one's throughput" if speed else "The aware mapping")
    d = steps.get("D")
    d_line = (f"its step is {ev['e2e_slowdown']:.2f}x the devices-alone step (D's rule: {d.criterion})" if d else "")
    border = (f" D is BORDERLINE (spread {d.spread[0]:.2f}-{d.spread[1]:.2f}x, {d.spread_what}): a re-run may "
              f"take the other branch ({d.other_branch})." if d is not None and d.borderline and d.spread else "")
    cost = (f"what is left over the devices alone is the TP all-reduce itself, {ar:.1f} ms per step (median rank) "
            f"beside {comp:.1f} ms of compute, paid by every rank alike")
    if walk.leaf_id == "OK":
        return f"{lead}, and its walk reaches OK: {d_line}.{border}" + (
            f" Even so, {cost}." if d is not None and d.borderline else "")
    if walk.leaf_id == "M" and "K" in steps:
        return (f"{lead}, and no rank finishes late any more (K: {ev['rank_tail_pct']:.1f}% of the step, rule "
                f"{steps['K'].criterion}), yet {d_line}, so D answers YES and the chart, with no rank to name, lands "
                f"on M. M's causes (shape buckets, caches, fallbacks) are not in this block: {cost}. Gloo over "
                "loopback on a few shared CPU cores makes even the fast link's all-reduce that costly; D's line "
                "is drawn for NVLink-class all-reduces, so on this CPU stand-in a YES at D measures gloo, not the "
                f"mapping.{border}")
    if walk.leaf_id == "L":
        return (f"{lead}, but its walk still reaches L: ranks {rep['tail_ranks']} finish late (K: "
                f"{ev['rank_tail_pct']:.1f}% of the step) with no slow link inside their groups. On a shared CPU, "
                "scheduling can make a rank late on its own: re-run on a quieter machine before blaming the mapping.")
    return f"{lead}; its walk: {walk.compact()}."
