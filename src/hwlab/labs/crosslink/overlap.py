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
is noise rather than a measurement of overlap, and the flowchart's validity check says so.
"""
from __future__ import annotations

import statistics
from typing import Any

import torch
import torch.distributed as dist

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
