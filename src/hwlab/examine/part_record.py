"""A part of an examined step and the parts of one examination: what each measured, its floor,
its walk and what fixing it would win (:mod:`hwlab.examine.parts` builds them; the rules are there).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hwlab.diagnosis.flowchart import LEAVES, Diagnosis

#: parts at or above this share of the step are walked (a part under a tenth cannot win more
#: than a tenth of the step, whatever its leaf)
WALK_SHARE_PCT = 10.0


@dataclass
class Part:
    """One part of the step (see the module doc)."""

    name: str
    t_ms: float
    share_pct: float
    n_items: float  # kernels (GPU) or aten ops (CPU) per call
    attributable: bool
    moved_bytes: int | None = None
    floor_bytes: int | None = None
    flops: int | None = None
    floor_ms: float | None = None
    floor_source: str = ""
    pct_of_floor: float | None = None
    gbps: float | None = None
    tflops: float | None = None
    saved_ms: float | None = None
    speedup: float | None = None
    gain_bound: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    walk: Diagnosis | None = None
    actions: list[str] = field(default_factory=list)
    lab: str = ""
    j: dict[str, Any] | None = None
    top: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sector_amplification: float | None = None
    ceiling_tflops: float | None = None
    n_tc: float | None = None  # tensor-core GEMM kernels per call (GPU)
    #: the copy ceiling this part is judged against (raised where its rate proves the measured one low)
    ceiling_gbps: float | None = None
    ceilings_raised: list[str] = field(default_factory=list)
    #: DRAM bytes at least (moved - cache x op boundaries) over fused-floor bytes, where over 1 (examine.rates)
    traffic_ratio: float | None = None
    #: why this part may not be the headline (None: it may), :func:`host_headline_refusal`
    not_headline: str | None = None
    #: op records (traffic model) of the part per call: its op boundaries for the cache bound
    n_ops: int | None = None
    #: the walks of the repeats (:mod:`hwlab.examine.repeats`), and the leaves they reached
    repeat_leaves: list[str | None] = field(default_factory=list)
    #: leaves within the measured spread or reached by a repeat, other than ``leaf_id`` (BORDERLINE)
    alternatives: list[str] = field(default_factory=list)
    #: the part's share (%) over the repeats' profiled calls and the pooled calls: [lo, hi]
    share_range_pct: list[float] | None = None
    #: the faster precision this part's matmuls are judged against, as an action (dtype_lever), or None
    dtype_lever: str | None = None
    #: that precision's measured GEMM ceiling over the data's own (None: no lever)
    lever_gain: float | None = None
    #: the whole function's speed-up if this part ran at the faster precision at its present efficiency
    #: (its time over ``lever_gain``): an estimate (:func:`hwlab.examine.part_walk.gain`)
    lever_speedup: float | None = None

    @property
    def repeats_agreed(self) -> tuple[int, int]:
        """(repeats whose walk reached this part's leaf, repeats that walked it)."""
        walked = [x for x in self.repeat_leaves if x]
        name = self.leaf_id or (f"undecided at {self.walk.undecided.id}" if self.walk and self.walk.undecided
                                else "no leaf")
        return sum(1 for x in walked if x == name), len(walked)

    @property
    def borderline(self) -> bool:
        """The leaf is one re-run from another: a repeat or a spread end reaches another leaf."""
        return bool(self.alternatives)

    @property
    def leaf_id(self) -> str | None:
        return self.walk.leaf_id if self.walk else None

    def to_dict(self) -> dict[str, Any]:
        w = self.walk
        return {"name": self.name, "t_ms": self.t_ms, "share_pct": self.share_pct, "n_items": self.n_items,
                "attributable": self.attributable, "moved_bytes": self.moved_bytes,
                "floor_bytes": self.floor_bytes, "flops": self.flops, "floor_ms": self.floor_ms,
                "floor_source": self.floor_source, "pct_of_floor": self.pct_of_floor, "gbps": self.gbps,
                "tflops": self.tflops, "saved_ms": self.saved_ms, "speedup": self.speedup,
                "gain_bound": self.gain_bound, "evidence": self.evidence, "evidence_sources": self.sources,
                "walked": w is not None, "leaf": self.leaf_id, "path": w.path if w else None,
                "undecided_at": w.undecided.id if w and w.undecided else None,
                "walk": w.explain() if w else None, "actions": self.actions, "lab": self.lab,
                "j_detail": self.j, "top": self.top, "notes": self.notes,
                "sector_amplification": self.sector_amplification, "ceiling_tflops": self.ceiling_tflops,
                "tensor_core_kernels": self.n_tc, "ceiling_gbps": self.ceiling_gbps,
                "ceilings_raised": self.ceilings_raised, "traffic_ratio": self.traffic_ratio,
                "not_headline": self.not_headline, "n_ops": self.n_ops,
                "repeat_leaves": self.repeat_leaves, "alternatives": self.alternatives,
                "borderline": self.borderline, "share_range_pct": self.share_range_pct,
                "repeats_agreed": list(self.repeats_agreed), "dtype_lever": self.dtype_lever,
                "dtype_lever_gain": self.lever_gain, "dtype_lever_speedup": self.lever_speedup}


@dataclass
class Parts:
    """The parts of one examination, ranked by expected gain."""

    parts: list[Part]
    t_ms: float
    source: str
    coverage_pct: float | None
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    #: the same parts built on each repeat (:mod:`hwlab.examine.repeats`)
    repeats: list["Parts"] = field(default_factory=list)

    @property
    def repeat_headlines(self) -> list[tuple[str, str | None]]:
        """(part, leaf) each repeat would head with."""
        return [(h.name, h.leaf_id) for h in (r.headline for r in self.repeats) if h is not None]

    @property
    def headline_alternatives(self) -> list[str]:
        """Leaves other than the headline's that a repeat's headline, a repeat of the headline part,
        or an end of its spread reaches, and, for another part that heads a repeat, that part's own
        leaf and alternatives (a re-run may head with it): the headline is BORDERLINE when any
        (module doc of :mod:`hwlab.examine.repeats`)."""
        h = self.headline
        if h is None:
            return []
        other = {leaf for _, leaf in self.repeat_headlines if leaf} | set(h.alternatives)
        rivals = {name for name, _ in self.repeat_headlines if name != h.name}
        for p in self.parts:
            if p.name in rivals and p.walk is not None and p.leaf_id is not None:
                other |= {p.leaf_id, *p.alternatives}
        return sorted(other - {h.leaf_id})

    @property
    def headline_agreed(self) -> int:
        """Repeats that headed with the headline part on its leaf."""
        h = self.headline
        return sum(1 for n, lf in self.repeat_headlines if h is not None and n == h.name and lf == h.leaf_id)

    @property
    def walked(self) -> list[Part]:
        return [p for p in self.parts if p.walk is not None]

    @property
    def ranked(self) -> list[Part]:
        """Walked parts by expected gain, largest first (a part with no gain figure last)."""
        return sorted(self.walked, key=lambda p: (-(p.saved_ms if p.saved_ms is not None else -1.0),
                                                  -p.share_pct))

    @property
    def headline(self) -> Part | None:
        """The walked part with the largest expected gain that may head (:func:`host_headline_refusal`)."""
        r = [p for p in self.ranked if p.leaf_id is not None and not p.not_headline]
        return r[0] if r else None

    def to_dict(self) -> dict[str, Any]:
        h = self.headline
        return {"source": self.source, "t_ms": self.t_ms, "coverage_pct": self.coverage_pct,
                "walk_share_pct": WALK_SHARE_PCT, "headline": h.name if h else None,
                "headline_leaf": h.leaf_id if h else None,
                "ranked": [p.name for p in self.ranked], "parts": [p.to_dict() for p in self.parts],
                "notes": self.notes, "error": self.error,
                "headline_borderline": bool(self.headline_alternatives),
                "headline_alternatives": self.headline_alternatives,
                "headline_repeats_agreed": [self.headline_agreed, len(self.repeats)],
                "repeat_headlines": [{"part": n, "leaf": lf} for n, lf in self.repeat_headlines]}

    def render(self) -> list[str]:
        if self.error:
            return [f"parts: not available ({self.error})"]
        lines = [f"parts of the step ({self.source}); shares add up to {self.coverage_pct:.1f}% of the "
                 f"measured time" if self.coverage_pct is not None else f"parts ({self.source})",
                 f"  {'part':24s} {'share':>6s} {'ms':>9s} {'% floor':>8s} {'achieved':>16s} "
                 f"{'gain ms':>9s} {'speed-up':>8s}  leaf"]
        for p in sorted(self.parts, key=lambda p: -p.t_ms):
            rng = (f" ({p.share_range_pct[0]:.1f}-{p.share_range_pct[1]:.1f}% over the calls)"
                   if p.share_range_pct and p.share_range_pct[1] - p.share_range_pct[0] >= 0.1 else "")
            ach = (f"{p.tflops:,.1f} TFLOP/s" if p.tflops and p.flops and p.floor_source.startswith("FLOPs")
                   else f"{p.gbps:,.0f} GB/s" if p.gbps is not None else "-")
            lines.append(f"  {p.name:24s} {p.share_pct:5.1f}% {p.t_ms:9.4g} "
                         f"{(f'{p.pct_of_floor:.0f}%' if p.pct_of_floor is not None else 'n/a'):>8s} "
                         f"{ach:>16s} {(f'{p.saved_ms:.4g}' if p.saved_ms is not None else '-'):>9s} "
                         f"{(f'{p.speedup:.2f}x' if p.speedup else '-'):>8s}  "
                         + (p.leaf_id or (f"undecided at {p.walk.undecided.id}" if p.walk and p.walk.undecided
                                          else "not walked (under the walk share)")) + rng)
        h = self.headline
        if h is not None:
            sp = f"{h.speedup:.2f}x the whole function" if h.speedup else "the whole function's time"
            to = f" (to its floor: {h.floor_source})" if h.floor_source else ""
            agreed = (f"; {self.headline_agreed} of {len(self.repeats)} repeats headed with it on {h.leaf_id}"
                      if self.repeats else "")
            lines += ["", f"headline: {h.name} -> leaf {h.leaf_id} ({LEAVES[h.leaf_id].title}); reaching its "
                      f"floor could save {h.saved_ms:.4g} ms ({sp}){h.gain_bound}{to}{agreed}"]
            alt = self.headline_alternatives
            if alt:
                reps = ", ".join(f"{n} -> {lf}" for n, lf in self.repeat_headlines)
                lines.append(f"BORDERLINE headline: a re-run may land on {' or '.join(alt)} instead of {h.leaf_id} "
                             f"(the {len(self.repeats)} repeats headed: {reps or 'none'}; leaves within the measured "
                             "spread included): re-run with more repeats or a longer input before acting")
        for i, p in enumerate(self.ranked, 1):
            gain = "no gain figure" if p.saved_ms is None else f"expected gain {p.saved_ms:.4g} ms"
            lines.append(f"  {i}. {p.name}: leaf {p.leaf_id or '?'}"
                         + (f" BORDERLINE (or {', '.join(p.alternatives)})" if p.alternatives else "")
                         + (f" [{p.repeats_agreed[0]} of {p.repeats_agreed[1]} repeats agreed: "
                            f"{', '.join(x or '-' for x in p.repeat_leaves)}]" if p.repeat_leaves else "")
                         + f", {gain}"
                         + (f"; lab {p.lab}" if p.lab else "")
                         + (f"; NOT the headline: {p.not_headline}" if p.not_headline else ""))
            lines += [f"       {s}" for s in (p.walk.explain().splitlines() if p.walk else [])]
            generic = set(LEAVES[p.leaf_id].actions) if p.leaf_id else set()
            lines += [f"       fits this part: {a}" for a in p.actions if a not in generic]
            if p.j:
                lines.append(f"       J in detail: {p.j['cause']} ({p.j['rule']}): {p.j['why']}")
            lines += [f"       note: {n}" for n in p.notes]
        lines += [f"  note: {n}" for n in self.notes]
        return lines
