"""Overlap of communication with compute, measured: the seed's rule 3c ("overlap did not
really happen").

The overlapped block splits the batch into ``micro`` micro-batches; after each one's partial
is computed its TP all-reduce is issued asynchronously (``dist.all_reduce(..., async_op=True)``)
and the next micro-batch computes while it travels; the step waits for all of them at the end.
The same launch also times the micro-batched compute alone and the same all-reduces alone
(blocking, one after another), round by round, so the three times share the machine's load. Defined once:

    hidden_pct = 100 * (t_comm_alone + t_compute_alone - t_overlapped) / min(t_comm_alone, t_compute_alone)

the time saved over what could hide: only the shorter of the two can hide under the other, so
100 means overlap saved all it could, 0 that it saved nothing. Measured against the
communication alone, a link so slow that its all-reduce outlasts the compute could never
reach 100 and would read as "overlap failed" when overlap did everything possible; against
what could hide, the walk can tell the two cases apart (the slow link is then the limiter).
Not clamped: a value outside 0..100 (overlapping cost time, or saved more than could hide)
is not a measurement of overlap, and the flowchart's validity check marks it invalid. Why it
overshoots (:func:`shown`): the three times are medians of separate rounds (per round the
pair's slower member), and over 100% means the overlapped step's median came out shorter than
the longer phase alone, which overlap cannot do. On a shaped link and a shared CPU the
all-reduces alone and the compute alone each vary from round to round by far more than that
overshoot (their p10-p90 over rounds, shown beside it), and the share divides the difference of
those noisy medians by the shorter one, so a few ms of noise reads as tens of percent.
"""
from __future__ import annotations

import statistics
from typing import Any

import torch
import torch.distributed as dist

from hwlab.core.measure import quantile
from hwlab.labs.crosslink.block import partial_fn

#: hidden share under which the walk notes that overlap did not really happen (rule 3c): less
#: than half the communication hidden leaves most of it on the step's critical path
OVERLAP_FAILED_PCT = 50.0


def _micro(x: torch.Tensor, micro: int) -> list[torch.Tensor]:
    if x.shape[0] % micro:
        raise ValueError(f"batch {x.shape[0]} must divide into {micro} micro-batches")
    return list(x.chunk(micro))


def compute_alone(x, shards, micro: int, kernel: str = "healthy") -> list[torch.Tensor]:
    fn = partial_fn(kernel)
    return [fn(xm, *shards) for xm in _micro(x, micro)]


def comm_alone(ys: list[torch.Tensor], group) -> None:
    """The micro-batches' all-reduces one after another, each finished before the next: what
    the step pays for them when nothing overlaps (issuing all at once is no cheaper on gloo:
    concurrent collectives on the same pair queue behind each other)."""
    for y in ys:
        dist.all_reduce(y, group=group)


def overlapped(x, shards, group, micro: int, kernel: str = "healthy") -> list[torch.Tensor]:
    """Compute micro-batch j+1 while micro-batch j's all-reduce is in flight; returns the
    all-reduced partials (their concatenation is the block's output)."""
    fn = partial_fn(kernel)
    ys, works = [], []
    for xm in _micro(x, micro):
        y = fn(xm, *shards)
        works.append(dist.all_reduce(y, group=group, async_op=True))
        ys.append(y)
    for w in works:
        w.wait()
    return ys


def hidden_pct(t_comm_alone_ms: float, t_compute_alone_ms: float, t_overlapped_ms: float) -> float:
    """Time saved by overlapping over what could hide, min(comm alone, compute alone), in %
    (module doc); not clamped."""
    if t_comm_alone_ms <= 0 or t_compute_alone_ms <= 0:
        raise ValueError("t_comm_alone_ms and t_compute_alone_ms must be positive")
    return 100.0 * (t_comm_alone_ms + t_compute_alone_ms - t_overlapped_ms) / min(t_comm_alone_ms, t_compute_alone_ms)


#: the three timed phases of an overlap launch, by report key
PHASE_OF = {"t_compute_alone_ms": "ovl_comp", "t_comm_alone_ms": "ovl_comm:{m}", "t_overlapped_ms": "ovl_both:{m}"}


def round_series(results: list[dict[str, Any]], mapping: str, ranks: list[int]) -> dict[str, list[float]]:
    """Per round, each phase's time of the group's slower member (a collective binds its members)."""
    sel = [r for r in results if r["rank"] in ranks]
    names = {k: ph.format(m=mapping) for k, ph in PHASE_OF.items()}
    n = min(len(r["phases"]["ovl_comp"]["own_ms"]) for r in sel)
    return {k: [max(r["phases"][ph]["own_ms"][s] for r in sel) for s in range(n)] for k, ph in names.items()}


def shown(side: dict[str, Any]) -> dict[str, Any]:
    """How a side of :func:`overlap_report` (with its ``ranks_raw``) is shown to a learner:
    ``valid`` (the share within 0-100%), ``text`` (the share, or INVALID with why it overshot:
    by how many ms the overlapped step beat the longer phase alone, against each phase's p10-p90
    over rounds; module doc), and those figures."""
    hid = side["hidden_pct"]
    comm, comp, both = side["t_comm_alone_ms"], side["t_compute_alone_ms"], side["t_overlapped_ms"]
    out: dict[str, Any] = {"hidden_pct": hid, "valid": 0.0 <= hid <= 100.0}
    bands = {}
    if side.get("ranks_raw"):
        ser = round_series(side["ranks_raw"], side.get("mapping", "pair"), side.get("ranks", [0, 1]))
        bands = {k: (quantile(v, 0.1), quantile(v, 0.9)) for k, v in ser.items()}
    out["p10_p90_ms"] = bands
    if out["valid"]:
        out["text"] = f"hidden {hid:.0f}% of what could hide"
        return out
    band = "; ".join(f"{name} varies {lo:.1f}-{hi:.1f} ms (p10-p90 over rounds)" for name, (lo, hi) in
                     ((n, bands[k]) for n, k in (("comm alone", "t_comm_alone_ms"),
                                                 ("compute alone", "t_compute_alone_ms")) if k in bands))
    if hid > 100.0:
        out["overshoot_ms"] = max(comm, comp) - both
        what = (f"the overlapped step ({both:.1f} ms) finished {out['overshoot_ms']:.1f} ms sooner than the "
                f"longer phase alone ({max(comm, comp):.1f} ms), which overlap cannot do")
    else:
        out["overshoot_ms"] = both - (comm + comp)
        what = (f"the overlapped step ({both:.1f} ms) took {out['overshoot_ms']:.1f} ms longer than both phases "
                f"one after the other ({comm + comp:.1f} ms)")
    widths = [hi - lo for k, (lo, hi) in bands.items() if k != "t_overlapped_ms"]
    widest = max(widths) if len(widths) == 2 else None
    if widest is None:
        why = "the phases' round-to-round spread is not recorded"
    elif widest > abs(out["overshoot_ms"]):
        why = (f"{band}: more than that, so the share (their difference over the shorter, "
               f"{min(comm, comp):.1f} ms) measured round-to-round noise")
    else:
        why = f"{band}: less than that, so noise does not explain it; re-measure"
    out["text"] = f"hidden share INVALID ({hid:.0f}%, outside 0-100%), not evidence: {what}; {why}"
    return out


def overlap_report(results: list[dict[str, Any]], mapping: str, ranks: list[int]) -> dict[str, Any]:
    """``hidden_pct`` of the group ``ranks``: per round, each of the three timings is the
    slowest member's (a collective binds its members, so the group is done when its last
    member is), then medians over rounds; per rank the same from its own medians, for display."""
    def series(r, phase):
        return r["phases"][phase]["own_ms"]

    sel = [r for r in results if r["rank"] in ranks]
    names = {"t_compute_alone_ms": "ovl_comp", "t_comm_alone_ms": f"ovl_comm:{mapping}",
             "t_overlapped_ms": f"ovl_both:{mapping}"}
    n = min(len(series(r, "ovl_comp")) for r in sel)
    group = {k: statistics.median(max(series(r, ph)[s] for r in sel) for s in range(n)) for k, ph in names.items()}
    per = {}
    for r in results:
        t = {k: statistics.median(series(r, ph)) for k, ph in names.items()}
        per[r["rank"]] = {**t, "hidden_pct": hidden_pct(t["t_comm_alone_ms"], t["t_compute_alone_ms"],
                                                         t["t_overlapped_ms"])}
    return {"mapping": mapping, "ranks": sorted(ranks), "per_rank": per, **group,
            "hidden_pct": hidden_pct(group["t_comm_alone_ms"], group["t_compute_alone_ms"],
                                     group["t_overlapped_ms"])}
