"""Topology-aware rank mapping: which GPUs form each tensor-parallel (TP) group.

TP all-reduces run every layer, so a TP group is only as fast as its slowest link. The
chooser partitions the GPUs into groups of ``tp`` so that, in order:

1. the slowest link class inside any group is as fast as possible (never SYS when a
   group inside one socket or NVLink island exists),
2. the number of groups that need that slowest class is as small as possible,
3. the fewest groups span more than one NUMA node (host-side traffic, CPU affinity),
4. the predicted all-reduce time summed over groups is smallest (tie-break).

Cost model (a simple latency-bandwidth model per link class; the per-class figures are
leads, listed with their basis in :data:`LINK_MODEL`): a ring all-reduce of S bytes over n
ranks sends ``2(n-1)/n * S`` bytes through its slowest link and pays ``2(n-1)`` latencies.
``algbw = S / t`` and ``busbw = algbw * 2(n-1)/n``, as nccl-tests defines them.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Iterable

from hwlab.core.topology import Topology, link_class, link_rank

#: per-direction GB/s and latency (us) per link class. NV#: ~25 GB/s per NVLink (NVLink 3/4
#: per-link per-direction rate; V100's NVLink 2 is also 25); PIX/PXB: a PCIe Gen4 x16 switch
#: path (~25 GB/s nominal, ~22 achievable); PHB/NODE: through the CPU root complex; SYS: across
#: the socket link, where PCIe peer traffic is often bounced through host memory (~10 GB/s seen
#: in practice). Leads, not measurements: hwlab's P2P probe replaces them on a real machine.
LINK_MODEL = {
    "NV": (25.0, 2.0),
    "PIX": (22.0, 4.0),
    "PXB": (20.0, 5.0),
    "PHB": (16.0, 6.0),
    "NODE": (14.0, 7.0),
    "SYS": (10.0, 10.0),
}


def link_gbps_us(cell: str) -> tuple[float, float]:
    c = link_class(cell)
    if c.startswith("NV"):
        per, lat = LINK_MODEL["NV"]
        return per * int(c[2:]), lat
    if c == "X":
        return float("inf"), 0.0
    return LINK_MODEL[c]


def allreduce_us(n_bytes: int, n_ranks: int, slowest: str) -> float:
    """Predicted ring all-reduce time in microseconds through the slowest link class."""
    if n_ranks <= 1:
        return 0.0
    gbps, lat = link_gbps_us(slowest)
    return 2 * (n_ranks - 1) / n_ranks * n_bytes / (gbps * 1e3) + 2 * (n_ranks - 1) * lat


def algbw_busbw(n_bytes: int, n_ranks: int, t_us: float) -> tuple[float, float]:
    """nccl-tests' definitions for all-reduce: algbw = S/t, busbw = algbw * 2(n-1)/n (GB/s)."""
    algbw = n_bytes / (t_us * 1e-6) / 1e9 if t_us > 0 else float("inf")
    return algbw, algbw * 2 * (n_ranks - 1) / n_ranks


@dataclass
class MappingReport:
    groups: list[list[str]]
    slowest: list[str]  # per group
    crossings: list[tuple[str, str, str]]  # pairs inside a group on a link slower than the best possible
    predicted_us: list[float]

    @property
    def worst(self) -> str:
        return max(self.slowest, key=link_rank)

    @property
    def step_us(self) -> float:
        """TP groups run in parallel; a step waits for the slowest group."""
        return max(self.predicted_us)

    def to_dict(self) -> dict:
        return {"groups": self.groups, "slowest": self.slowest, "worst": self.worst,
                "crossings": [list(c) for c in self.crossings], "predicted_us": self.predicted_us}


def evaluate(topo: Topology, groups: Iterable[Iterable[str | int]], n_bytes: int = 32 << 20) -> MappingReport:
    """Slowest link per group, pairs crossing slow links, and predicted all-reduce cost."""
    gs = [[topo._name(g) for g in grp] for grp in groups]
    seen = [g for grp in gs for g in grp]
    if sorted(seen) != sorted(set(seen)) or any(g not in topo.gpus for g in seen):
        raise ValueError(f"groups {gs} must name distinct GPUs of {topo.gpus}")
    best = _best_possible(topo, len(gs[0])) if gs else "X"
    slowest = [topo.slowest_link(grp) for grp in gs]
    cross = [(a, b, topo.links[(a, b)]) for grp in gs for a, b in combinations(grp, 2)
             if link_rank(topo.links[(a, b)]) > link_rank(best)]
    pred = [allreduce_us(n_bytes, len(grp), s) for grp, s in zip(gs, slowest)]
    return MappingReport(gs, slowest, cross, pred)


def _best_possible(topo: Topology, tp: int) -> str:
    """The fastest class some group of ``tp`` GPUs can have as its slowest link."""
    return min((topo.slowest_link(c) for c in combinations(topo.gpus, tp)), key=link_rank)


def naive_groups(topo: Topology, tp: int, order: list[str | int] | None = None) -> list[list[str]]:
    """Topology-unaware: consecutive ranks in ``order`` (default: ordinal order) form a group."""
    names = [topo._name(g) for g in (order or topo.gpus)]
    return [names[i:i + tp] for i in range(0, len(names), tp)]


def choose_tp_groups(topo: Topology, tp: int, n_bytes: int = 32 << 20) -> list[list[str]]:
    """Partition the GPUs into groups of ``tp``, slowest intra-group link first (see module doc).

    Exact search over partitions (fine up to 16 GPUs, what one node holds), pruned by the
    best slowest-link class found so far.
    """
    gpus = list(topo.gpus)
    if tp <= 0 or len(gpus) % tp:
        raise ValueError(f"{len(gpus)} GPUs cannot be split into TP groups of {tp}")
    if tp == 1:
        return [[g] for g in gpus]
    best: tuple | None = None
    best_groups: list[list[str]] = []

    def key(groups):
        slow = [topo.slowest_link(g) for g in groups]
        worst = max(slow, key=link_rank)
        n_worst = sum(1 for s in slow if link_rank(s) == link_rank(worst))
        cost = sum(allreduce_us(n_bytes, tp, s) for s in slow)
        numa_split = sum(1 for g in groups if len({topo.numa_affinity.get(x) for x in g}) > 1)
        return (link_rank(worst), n_worst, numa_split, cost)

    def rec(remaining: list[str], acc: list[list[str]], worst_so_far):
        nonlocal best, best_groups
        if best is not None and worst_so_far > best[0]:
            return
        if not remaining:
            k = key(acc)
            if best is None or k < best:
                best, best_groups = k, [list(g) for g in acc]
            return
        first, rest = remaining[0], remaining[1:]
        for others in combinations(rest, tp - 1):
            grp = [first, *others]
            w = link_rank(topo.slowest_link(grp))
            left = [g for g in rest if g not in others]
            rec(left, acc + [grp], max(worst_so_far, w))

    rec(gpus, [], (0, 0))
    return best_groups
