"""Where a function's time goes, part by part, what bounds each part, and what fixing it would win.

One aggregate number per flowchart question cannot say which part of a model to fix first: a
forward with GEMMs near their ceiling and an op-by-op activation chain averages into neither.
:func:`build_parts` splits the measured time by part and walks the flowchart once per part.

**Attribution.** Every timed item of the profiled calls (:func:`hwlab.core.profiling.trace_calls`:
each device kernel on a GPU, each aten op's self time on a CPU) is joined to the aten op that
launched it: the outermost op on its stack that the traffic model (a dispatch mode,
:mod:`hwlab.examine.estimate`) also saw, the k-th instance of that op in the call joined to the
k-th record of it. The op's record gives its bytes, FLOPs, dtypes and sector amplification.
Items are grouped by :func:`hwlab.core.profiling.part_class` (GEMM by dtype, attention,
elementwise/reduction, copy/concat, gather/scatter, quant/dequant, Triton/compiled,
communication). Added to them:

* on a GPU, **gpu idle**: the measured median minus the time kernels kept the GPU busy under
  the profiler (launch gaps, host work between launches);
* on a CPU, **host outside ops**: the profiled call's duration minus its aten ops' self time
  (Python between ops). On a CPU the parts are shares of the profiled call (CPU op self times),
  and a part's ms is its share of the measured median. The call is the profiled call of median
  duration: the first call under the profiler can carry the profiler's own start-up, and on a
  busy host one call can be preempted for a whole time slice; either would skew a mean.

Triton kernels and ``torch.compile``d graphs run outside aten ops: their part says its bytes
are not attributable (the traffic model did not see them), unless it is the whole function,
when the function's own required bytes are its floor.

**A part's floor** is the larger of its bytes over the measured copy ceiling and its FLOPs
over the measured GEMM ceiling at its dtype. Its bytes are counted *as if the part's ops were
fused*: every tensor it reads that none of its own ops wrote, once, and every tensor it writes
that an op outside it reads (or the caller gets), once. An op-by-op chain's intermediates are
free at its floor, so the floor shows what fusion would win; fusion only reaches across ops
that run back to back, so each run of consecutive ops of the part is floored on its own. **% of floor** is floor time over
measured time (100% = at the floor). **Expected gain**: the part's time minus its floor time,
and the whole function's speed-up if only that part reached its floor (Amdahl:
``t / (t - saved)``). The idle part's floor is zero: its gain is an upper bound.

On a CPU the profiler also inflates the call (its bookkeeping per op lands between ops): the
profiled call's excess over the unprofiled median is taken out of the time outside ops first
(it cannot be told apart from Python between ops), and the ops' parts share the rest of the
median. Rates above a measured ceiling raise it where the part's working set proves it low,
and moved over fused bytes of 2 or more answers F (:mod:`hwlab.examine.rates`).

**The walk per part.** Every part holding at least :data:`WALK_SHARE_PCT` of the time is walked
on its own metrics (slowdown over its floor, its estimated DRAM share, its sector
amplification, its tensor-core share when its FLOPs set its floor, its matmul FLOPs and
tensor-core kernels for H's applicability); the idle part answers F with no bytes moved and H
with its own idle share. The **headline** is the walked part with the largest expected gain;
the others follow in order of gain. The CPU's host-outside-ops part heads only by
:func:`host_headline_refusal`'s rule (more than its spread across profiled calls, and the
whole-function walk on J too).

**J, in detail** (:func:`j_detail`): a part landing on J is told which of launch, occupancy,
registers or memory latency it is, from measured figures: the idle share, the profiler's kernel
records (Kineto's estimated achieved occupancy, registers per thread, warps per SM) or Nsight
Compute's counted occupancy where ``--ncu`` ran, and the achieved bandwidth against the copy
ceiling. Thresholds (and why) are in :data:`J_RULES`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from hwlab.diagnosis.flowchart import LEAVES, Diagnosis, diagnose
from hwlab.core.profiling import part_class
from hwlab.examine.rates import settle_copy, settle_gemm, traffic_ratio

#: parts at or above this share of the step are walked (a part under a tenth cannot win more
#: than a tenth of the step, whatever its leaf)
WALK_SHARE_PCT = 10.0
#: a part is "the whole function" (its floor may be the function's) at this share of kernel time
WHOLE_PCT = 90.0
#: where the walked shares plus idle must land against the measured time
COVERAGE_TOL_PCT = 5.0
#: J's sub-causes: (name, rule, why). Checked in this order; the first that holds is named.
J_RULES = (
    ("launch", "idle share >= 50% of the step",
     "the GPU waits on the host for half the step or more: fewer, larger launches (CUDA graph, fusion)"),
    ("registers", "spills > 0, or >= 128 registers per thread",
     "at 128 registers per thread a Hopper/Ampere SM holds at most 16 of its 64 warps (65536 registers): "
     "too few to hide memory latency; spills add local-memory traffic on top"),
    ("occupancy", "achieved occupancy < 25% (counted by Nsight Compute where it ran, else Kineto's estimate)",
     "under a quarter of the SM's warp slots in use: too little parallel work in flight (small grid, "
     "large blocks, shared memory)"),
    ("memory latency", "occupancy >= 25% but achieved bandwidth < 30% of the copy ceiling",
     "warps are resident but each waits on scattered, short memory requests: random rows or indices; "
     "the bytes in flight are too few to fill the memory pipe"),
)
#: actions that fit a part better than the leaf's generic list, (part prefix, leaf) -> actions
PART_ACTIONS = {
    ("gather/scatter", "J"): (
        "sort (or bucket) the indices so neighbouring threads read neighbouring rows",
        "batch the lookups into one larger gather, so more requests are in flight per SM",
        "widen the rows (>= 128 bytes each: pack several fields or use a wider dtype per row) so each "
        "request fills whole cache lines"),
    ("gather/scatter", "G"): (
        "sort the indices so each warp reads contiguous rows (coalesced)",
        "widen the rows to whole 32-byte sectors (or 128-byte lines)"),
    ("elementwise/reduction", "G"): (
        "fuse the chain (torch.compile, or one Triton kernel) so each tensor crosses DRAM once",),
    ("copy/concat", "J"): (
        "grow the KV cache in place (a preallocated static cache written at the step's position) instead of "
        "concatenating a new copy of it every step",),
    ("copy/concat", "G"): (
        "write into a preallocated buffer instead of concatenating (a static KV cache), or fuse the copy "
        "into its producer",),
    ("gpu idle", "J"): (
        "capture the step in a CUDA graph (torch.compile mode='reduce-overhead') so launches cost nothing",
        "fuse small kernels (torch.compile) so there are fewer launches"),
    ("host outside ops", "J"): (
        "move the Python between ops out of the loop, or compile the function (torch.compile)",),
}


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
    #: moved over fused-floor bytes, where its working set is past the cache (examine.rates)
    traffic_ratio: float | None = None
    #: why this part may not be the headline (None: it may), :func:`host_headline_refusal`
    not_headline: str | None = None

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
                "not_headline": self.not_headline}


@dataclass
class Parts:
    """The parts of one examination, ranked by expected gain."""

    parts: list[Part]
    t_ms: float
    source: str
    coverage_pct: float | None
    notes: list[str] = field(default_factory=list)
    error: str | None = None

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
                "notes": self.notes, "error": self.error}

    def render(self) -> list[str]:
        if self.error:
            return [f"parts: not available ({self.error})"]
        lines = [f"parts of the step ({self.source}); shares add up to {self.coverage_pct:.1f}% of the "
                 f"measured time" if self.coverage_pct is not None else f"parts ({self.source})",
                 f"  {'part':24s} {'share':>6s} {'ms':>9s} {'% floor':>8s} {'achieved':>16s} "
                 f"{'gain ms':>9s} {'speed-up':>8s}  leaf"]
        for p in sorted(self.parts, key=lambda p: -p.t_ms):
            ach = (f"{p.tflops:,.1f} TFLOP/s" if p.tflops and p.flops and p.floor_source.startswith("FLOPs")
                   else f"{p.gbps:,.0f} GB/s" if p.gbps is not None else "-")
            lines.append(f"  {p.name:24s} {p.share_pct:5.1f}% {p.t_ms:9.4g} "
                         f"{(f'{p.pct_of_floor:.0f}%' if p.pct_of_floor is not None else 'n/a'):>8s} "
                         f"{ach:>16s} {(f'{p.saved_ms:.4g}' if p.saved_ms is not None else '-'):>9s} "
                         f"{(f'{p.speedup:.2f}x' if p.speedup else '-'):>8s}  "
                         + (p.leaf_id or (f"undecided at {p.walk.undecided.id}" if p.walk and p.walk.undecided
                                          else "not walked (under the walk share)")))
        h = self.headline
        if h is not None:
            sp = f"{h.speedup:.2f}x the whole function" if h.speedup else "the whole function's time"
            lines += ["", f"headline: {h.name} -> leaf {h.leaf_id} ({LEAVES[h.leaf_id].title}); fixing it "
                      f"could save {h.saved_ms:.4g} ms ({sp}){h.gain_bound}"]
        for i, p in enumerate(self.ranked, 1):
            gain = "no gain figure" if p.saved_ms is None else f"expected gain {p.saved_ms:.4g} ms"
            lines.append(f"  {i}. {p.name}: leaf {p.leaf_id or '?'}, {gain}"
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


def fused_floor_bytes(part_ops: list, all_ops: list, out_keys: set) -> int:
    """Bytes a group of ops must move if each run of consecutive ops in it were fused into one
    kernel (module doc). A run is a maximal stretch of the group's ops in call order with no
    other op between them (fusion cannot reach across another part's kernel). Per run: reads
    of storages the run did not write, once each, plus writes that an op outside the run reads,
    the caller gets (``out_keys``) or nothing reads at all, once each."""
    mine = {id(o) for o in part_ops}
    runs: list[list] = []
    prev = False
    for o in all_ops:
        inside = id(o) in mine
        if inside:
            if not prev:
                runs.append([])
            runs[-1].append(o)
        prev = inside
    read_anywhere = {k for o in all_ops for k, _ in o.reads}
    total = 0
    for run in runs:
        ids = {id(o) for o in run}
        written_here: set = set()
        reads: dict = {}
        for o in run:
            for k, b in o.reads:
                if k not in written_here:
                    reads[k] = max(reads.get(k, 0), b)
            written_here.update(k for k, _ in o.writes)
        read_elsewhere = {k for o in all_ops if id(o) not in ids for k, _ in o.reads}
        writes: dict = {}
        for o in run:
            for k, b in o.writes:
                if k in read_elsewhere or k in out_keys or k not in read_anywhere:
                    writes[k] = max(writes.get(k, 0), b)
        total += sum(reads.values()) + sum(writes.values())
    return int(total)


def _join(calls: list, traffic_ops: list) -> list[list[tuple[dict, int | None]]]:
    """Each timed item of each call with the index of its traffic record (None: not joined)."""
    by_name: dict[str, list[int]] = {}
    for i, o in enumerate(traffic_ops):
        by_name.setdefault(o.name, []).append(i)
    out = []
    for items in calls:
        seen: dict[str, list] = {}  # name -> op instance ids in order of first appearance
        joined = []
        for it in sorted(items, key=lambda x: x["ts"]):
            name, inst = None, None
            for n, oid in zip(reversed(it["stack"]), reversed(it["op_ids"])):  # outermost first
                if n in by_name:
                    name, inst = n, oid
                    break
            idx = None
            if name is not None:
                order = seen.setdefault(name, [])
                if inst not in order:
                    order.append(inst)
                k = order.index(inst)
                idx = by_name[name][k] if k < len(by_name[name]) else None
            joined.append((it, idx))
        out.append(joined)
    return out


def j_detail(part: Part, idle_pct: float | None, copy_gbps: float | None, n_spills: int | None,
             ncu: dict[str, Any] | None, kernel_args: list[tuple[float, dict]]) -> dict[str, Any]:
    """Which of :data:`J_RULES` a part on J meets, from measured figures (each with its source)."""
    figures: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def tw(key: str) -> float | None:
        pairs = [(us, float(a[key])) for us, a in kernel_args if isinstance(a.get(key), (int, float))]
        tot = sum(us for us, _ in pairs)
        return sum(us * v for us, v in pairs) / tot if tot else None

    occ, regs, warps = tw("est. achieved occupancy %"), tw("registers per thread"), tw("warps per SM")
    if occ is not None:
        figures["occupancy_pct_estimated"], sources["occupancy_pct_estimated"] = occ, \
            "Kineto kernel records: est. achieved occupancy % (time-weighted)"
    if regs is not None:
        figures["registers_per_thread"], sources["registers_per_thread"] = regs, "Kineto kernel records"
    if warps is not None:
        figures["warps_per_sm"], sources["warps_per_sm"] = warps, \
            "Kineto kernel records (the grid's warps over the SMs, not resident warps; time-weighted)"
    if ncu:
        if ncu.get("warps_active_pct") is not None:
            figures["occupancy_pct_counted"] = ncu["warps_active_pct"]
            sources["occupancy_pct_counted"] = "counted by Nsight Compute (sm__warps_active)"
        if ncu.get("registers_per_thread_max") is not None:
            figures["registers_per_thread"] = ncu["registers_per_thread_max"]
            sources["registers_per_thread"] = "counted by Nsight Compute (launch__registers_per_thread)"
    if idle_pct is not None:
        figures["idle_pct"], sources["idle_pct"] = idle_pct, "GPU idle share of the step (profiler)"
    if n_spills is not None:
        figures["n_spills"], sources["n_spills"] = n_spills, "Triton compiled-kernel metadata (ptxas)"
    bw_pct = 100.0 * part.gbps / copy_gbps if part.gbps is not None and copy_gbps else None
    if bw_pct is not None:
        figures["bandwidth_pct_of_copy"], sources["bandwidth_pct_of_copy"] = bw_pct, \
            "the part's moved bytes (traffic model) / its time vs the measured copy ceiling (estimated)"
    occ_any = figures.get("occupancy_pct_counted", figures.get("occupancy_pct_estimated"))
    checks = (
        ("launch", part.name in ("gpu idle", "host outside ops") or (idle_pct is not None and idle_pct >= 50)),
        ("registers", (n_spills or 0) > 0 or (figures.get("registers_per_thread") or 0) >= 128),
        ("occupancy", occ_any is not None and occ_any < 25.0),
        ("memory latency", (occ_any is None or occ_any >= 25.0) and bw_pct is not None and bw_pct < 30.0),
    )
    cause = next((n for n, ok in checks if ok), None)
    rule = {n: (r, w) for n, r, w in J_RULES}
    if cause is None:
        return {"cause": "not decided", "rule": "none of the J rules holds on the figures measured",
                "why": "read the compiler report (registers, spills) or run with --ncu",
                "figures": figures, "sources": sources}
    return {"cause": cause, "rule": rule[cause][0], "why": rule[cause][1], "figures": figures, "sources": sources}


def build_parts(*, prof, traffic, t_ms: float, gpu: bool, copy_gbps: float | None,
                gemm_tflops_for: Callable[[str | None], float | None], whole_floor_ms: float | None,
                whole_slowdown: float | None, e2e_slowdown: float | None, out_keys: set,
                e2e_spread: dict[str, Any] | None = None,
                ncu: dict[str, Any] | None = None, lab_for: Callable[[str], str] = lambda leaf: "",
                cache_bytes: int | None = None, whole_leaf: str | None = None) -> Parts:
    """The parts of one examination (module doc). ``gemm_tflops_for(dtype)`` is the measured
    GEMM ceiling a matmul of that input dtype is floored at."""
    src = ("GPU kernel times from the profiler's Chrome trace, joined to the aten ops that launched them"
           if gpu else "CPU: aten op self times from the profiler's Chrome trace (no device kernels); "
           "shares of the profiled call")
    calls, call_us = list(prof.calls or []), list(prof.call_us or [])
    outside_ms = ([(u - sum(i["us"] for i in c)) / 1e3 for c, u in zip(calls, call_us)]
                  if not gpu and len(call_us) == len(calls) else [])  # host time outside ops, per profiled call
    if not gpu and len(calls) > 1 and len(call_us) == len(calls):  # the call of median duration (module doc)
        k = sorted(range(len(calls)), key=lambda i: call_us[i])[len(calls) // 2]
        calls, call_us = [calls[k]], [call_us[k]]
    calls = [c for c in calls if c]
    if not calls or t_ms <= 0:
        return Parts([], t_ms, src, None, error=prof.error or "the profiler's trace had no timed call")
    n = len(calls)
    ops = traffic.ops
    groups: dict[str, dict[str, Any]] = {}
    for joined in _join(calls, ops):
        for it, idx in joined:
            rec = ops[idx] if idx is not None else None
            op = rec.name if rec else (it["stack"][-1] if it["stack"] else None)
            cls = part_class(op, it["kernel"], tuple(rec.in_dtypes) if rec else (), it["compiled"])
            if rec is not None and rec.kind in ("quant", "dequant"):
                cls = "quant/dequant"
            g = groups.setdefault(cls, {"us": 0.0, "n": 0, "recs": set(), "kernels": {}, "args": [],
                                        "unjoined_us": 0.0, "kernel_list": []})
            g["us"] += it["us"]
            g["n"] += 1
            if idx is not None:
                g["recs"].add(idx)
            else:
                g["unjoined_us"] += it["us"]
            label = it["kernel"] or (it["stack"][0] if it["stack"] else "?")
            g["kernels"][label] = g["kernels"].get(label, 0.0) + it["us"]
            if it["kernel"]:
                g["kernel_list"].append(it["kernel"])
            if it["args"]:
                g["args"].append((it["us"], it["args"]))
    gemms = sorted((c for c in groups if c.startswith("gemm ")), key=lambda c: -groups[c]["us"])
    if "gemm" in groups and gemms:  # composite matmul glue (aten::linear / matmul self time) joins its GEMM
        g, h = groups.pop("gemm"), groups[gemms[0]]
        for k in ("us", "n", "unjoined_us"):
            h[k] += g[k]
        h["kernel_list"] += g["kernel_list"]
        h["args"] += g["args"]
        for k, v in g["kernels"].items():
            h["kernels"][k] = h["kernels"].get(k, 0.0) + v
    notes: list[str] = []
    items_ms = {c: g["us"] / n / 1e3 for c, g in groups.items()}
    if gpu:
        busy_ms = prof.busy_ms_per_call
        rest_name, rest_ms = "gpu idle", max(0.0, t_ms - busy_ms)
        scale = 1.0
        total_ref = t_ms
    else:
        ops_ms = sum(items_ms.values())
        call_ms = sum(call_us) / len(call_us) / 1e3 if call_us else ops_ms
        rest_name = "host outside ops"
        rest_raw = max(0.0, call_ms - ops_ms)
        inflation_ms = max(0.0, call_ms - t_ms)  # what the profiler added to the call (module doc)
        rest_ms = max(0.0, rest_raw - inflation_ms)
        scale = (t_ms - rest_ms) / ops_ms if ops_ms > 0 else 1.0  # op shares of the rest of the median
        total_ref = t_ms
        notes.append(f"CPU: part times are the ops' shares of the profiled call ({call_ms:.4g} ms under the "
                     f"profiler) applied to the measured median ({t_ms:.4g} ms); time outside ops is counted net of "
                     f"the profiler's own {inflation_ms:.4g} ms over the median ({rest_raw:.4g} -> {rest_ms:.4g} ms)")
    kernel_total_ms = sum(items_ms.values())
    parts: list[Part] = []
    for cls, g in groups.items():
        t = items_ms[cls] * scale
        recs = [ops[i] for i in sorted(g["recs"])]
        # a record read from a trace without its input shapes (hwlab.traces.trace_shapes) has no bytes
        shapeless = [o for o in recs if getattr(o, "shapes", True) is False]
        p = Part(name=cls, t_ms=t, share_pct=100.0 * t / total_ref, n_items=g["n"] / n,
                 attributable=bool(recs) and not shapeless and cls != "triton/compiled",
                 top=[k[:120] for k, _ in sorted(g["kernels"].items(), key=lambda kv: -kv[1])[:3]])
        if gpu:
            p.n_tc = sum(1 for k in g["kernel_list"] if _is_tc(k)) / n
        if p.attributable:
            p.moved_bytes = int(sum(o.moved_bytes for o in recs))
            p.floor_bytes = fused_floor_bytes(recs, ops, out_keys)
            p.flops = int(sum(o.flops for o in recs))
            if g["unjoined_us"] > 0.05 * g["us"]:
                p.notes.append(f"{100 * g['unjoined_us'] / g['us']:.0f}% of this part's time ran in ops the "
                               "traffic model did not see (composite or host-only ops): their bytes are not counted")
            dtype = next((o.in_dtypes[0] for o in recs if o.kind == "matmul" and o.in_dtypes), None)
            est = [o for o in recs if o.amplification is not None and o.read_bytes]
            if est:
                p.sector_amplification = sum(o.read_bytes * o.amplification for o in est) / sum(
                    o.read_bytes for o in est)
            floor_part(p, dtype, copy_gbps, gemm_tflops_for(dtype) if p.flops else None, cache_bytes)
        elif cls == "triton/compiled" and kernel_total_ms > 0 and \
                100.0 * items_ms[cls] / kernel_total_ms >= WHOLE_PCT and whole_floor_ms:
            p.floor_ms = whole_floor_ms
            p.floor_source = "the function's floor: this part is the whole function's device time"
            p.notes.append("bytes inside Triton / compiled kernels are not attributable; this part holds "
                           f"at least {WHOLE_PCT:.0f}% of the kernel time, so the function's floor is its floor")
        elif shapeless:
            p.notes.append(f"no input shapes recorded for {len(shapeless)} of its ops (a trace without "
                           "record_shapes, or a tensor list): no floor; walked only on what the trace measures")
        else:
            p.notes.append("bytes not attributable: kernels ran outside aten ops (Triton / torch.compile); "
                           "with --ncu their DRAM traffic is counted")
        parts.append(p)
    rest = Part(name=rest_name, t_ms=rest_ms, share_pct=100.0 * rest_ms / total_ref, n_items=0.0,
                attributable=True, moved_bytes=0, floor_bytes=0, flops=0, floor_ms=0.0,
                floor_source="none: no work runs in it", gbps=0.0,
                gain_bound=" (an upper bound: launches never cost nothing)" if gpu else
                " (an upper bound: some host work always remains)")
    if not gpu:
        rest.not_headline = host_headline_refusal(rest_ms, outside_ms, whole_leaf)
    parts.append(rest)
    coverage = 100.0 * sum(p.t_ms for p in parts) / t_ms
    if gpu and abs(coverage - 100.0) > COVERAGE_TOL_PCT:
        notes.append(f"kernel times plus idle come to {coverage:.1f}% of the measured time (kernels overlap, "
                     "or the profiled calls ran differently from the timed ones)")
    idle_pct = 100.0 * rest.t_ms / t_ms
    for p in parts:
        _gain(p, t_ms)
        _evidence(p, rest, copy_gbps, gpu, whole_slowdown, e2e_slowdown, prof, ncu, e2e_spread)
        if p.share_pct >= WALK_SHARE_PCT:
            p.walk = diagnose({**p.evidence, "metric_sources": p.sources})
            leaf = p.leaf_id
            if leaf:
                fit = next((v for (pre, lf), v in PART_ACTIONS.items() if p.name.startswith(pre) and lf == leaf), ())
                p.actions = list(fit) + list(LEAVES[leaf].actions)
                p.lab = lab_for(leaf)
                if leaf == "J":
                    p.j = j_detail(p, idle_pct if gpu else None, copy_gbps,
                                   prof.n_spills if p.name == "triton/compiled" else None,
                                   ncu if _ncu_matches(p, ncu) else None, groups.get(p.name, {}).get("args", []))
    return Parts(parts, t_ms, src, coverage, notes)


def floor_part(p: Part, dtype: str | None, copy_gbps: float | None, gemm_tflops: float | None,
               cache_bytes: int | None) -> None:
    """An attributable part's rates, the ceilings it is judged against (raised where its rate proves
    the measured one low, :mod:`hwlab.examine.rates`), its traffic ratio and its floor."""
    t = p.t_ms
    p.gbps = p.moved_bytes / (t * 1e6) if t > 0 else None
    p.tflops = p.flops / (t * 1e9) if t > 0 and p.flops else None
    sc = settle_copy(p.gbps, copy_gbps, p.floor_bytes, cache_bytes, what=f"the part {p.name}")
    p.ceiling_gbps = sc.ceiling if copy_gbps else None
    sg = settle_gemm(p.tflops, gemm_tflops, dtype, what=f"the part {p.name}")
    tf = sg.ceiling if gemm_tflops else None
    p.ceilings_raised = [x.note for x in (sc, sg) if x.raised]
    p.notes += p.ceilings_raised
    p.traffic_ratio = traffic_ratio(p.moved_bytes, p.floor_bytes, p.floor_bytes, cache_bytes)
    byte_ms = p.floor_bytes / (p.ceiling_gbps * 1e6) if p.ceiling_gbps else None
    p.ceiling_tflops = tf
    flop_ms = p.flops / (tf * 1e9) if tf and p.flops else None
    if byte_ms is not None:
        if flop_ms is not None and flop_ms >= byte_ms:
            p.floor_ms, p.floor_source = flop_ms, f"FLOPs at the measured {dtype} GEMM ceiling"
        else:
            p.floor_ms, p.floor_source = byte_ms, "bytes (as if its ops were fused) at the copy ceiling"


def _gain(p: Part, t_ms: float) -> None:
    """% of floor, expected gain and the whole function's speed-up if this part reached its floor."""
    if p.floor_ms is not None and p.t_ms > 0:
        if p.floor_ms > p.t_ms * 1.0001 and p.floor_ms > 0:
            p.notes.append(f"measured faster than its floor ({p.t_ms:.4g} < {p.floor_ms:.4g} ms): the "
                           "counted bytes or FLOPs are too high for this part; no gain or verdict from them")
            p.pct_of_floor, p.saved_ms = None, None
        else:
            p.pct_of_floor = 100.0 * p.floor_ms / p.t_ms
            p.saved_ms = p.t_ms - p.floor_ms
            p.speedup = t_ms / (t_ms - p.saved_ms) if t_ms > p.saved_ms else None


def rewalk(d: dict[str, Any], *, copy_gbps: float, gemm_tflops: float | None = None, cache_bytes: int | None,
           t_ms: float | None = None, e2e_slowdown: float | None = None, gpu: bool = True) -> Part:
    """A recorded part (``Part.to_dict()``, e.g. from ``examine_parts.json``) floored and walked again
    against the given ceilings and cache: the same rules as :func:`build_parts`, on recorded counts
    and times (``t_ms``: the whole function's time, default the part's)."""
    p = Part(name=d["name"], t_ms=d["t_ms"], share_pct=d["share_pct"], n_items=d.get("n_items", 0.0),
             attributable=d["attributable"], moved_bytes=d["moved_bytes"], floor_bytes=d["floor_bytes"],
             flops=d["flops"], sector_amplification=d.get("sector_amplification"),
             n_tc=d.get("tensor_core_kernels"))
    dtype = next((k.split()[-1] for k in [p.name] if k.startswith("gemm ")), None)
    floor_part(p, dtype, copy_gbps, gemm_tflops if p.flops else None, cache_bytes)
    _gain(p, t_ms or p.t_ms)
    rest = Part(name="rest", t_ms=0.0, share_pct=0.0, n_items=0.0, attributable=False)
    _evidence(p, rest, copy_gbps, gpu, None, e2e_slowdown, None, None)
    p.walk = diagnose({**p.evidence, "metric_sources": p.sources})
    return p


def host_headline_refusal(net_ms: float, outside_ms_per_call: list[float], whole_leaf: str | None) -> str | None:
    """Why the CPU's host-outside-ops part may not head the report, or None when it may.

    Rule: it heads only when (1) its time, net of the profiler's own inflation of the call, is
    larger than the spread (max - min) of the time outside ops across the profiled calls: a share
    inside its own spread is noise, and time the profiler added is an artefact of measuring; and
    (2) the whole-function walk, from the unprofiled median, lands on J too: a function whose
    measured time walks elsewhere is not host-bound, whatever a profiled call shows."""
    spread = (max(outside_ms_per_call) - min(outside_ms_per_call)) if len(outside_ms_per_call) > 1 else None
    if spread is not None and net_ms <= spread:
        return (f"its {net_ms:.4g} ms (net of the profiler's inflation of the call) is inside its own spread "
                f"across the profiled calls ({spread:.4g} ms): profiler or host noise, not a finding")
    if whole_leaf != "J":
        return (f"the whole function, walked on its unprofiled median, lands on {whole_leaf or 'no leaf'}, not J: "
                "the time outside ops is not what bounds it")
    return None


def _ncu_matches(p: Part, ncu: dict[str, Any] | None) -> bool:
    """Counted figures are per examination; they describe a part when its kernels were counted."""
    if not ncu:
        return False
    names = " ".join(ncu.get("kernels") or [])
    return any(_base(k) and _base(k) in names for k in p.top if k)


def _base(kernel: str) -> str:
    """``void at::native::foo<16, long>(char*, ...)`` -> ``foo`` (ncu names kernels without namespaces)."""
    return kernel.split("(")[0].split("<")[0].strip().split(" ")[-1].split("::")[-1][:60]


def _evidence(p: Part, rest: Part, copy_gbps: float | None, gpu: bool, whole_slowdown: float | None,
              e2e: float | None, prof, ncu: dict[str, Any] | None, e2e_spread: dict[str, Any] | None = None) -> None:
    ev, src = p.evidence, p.sources
    if p is rest:
        if whole_slowdown is not None:
            ev["slowdown_vs_floor"] = whole_slowdown
            src["slowdown_vs_floor"] = "the whole function's measured time over its floor (idle has no floor)"
        ev["dram_pct_estimated"] = 0.0
        src["dram_pct_estimated"] = "no kernel runs in this part: it moves no bytes"
        if gpu:
            ev["launch_gap_pct"] = 100.0
            src["launch_gap_pct"] = "this part is the GPU's idle time between launches (profiler vs measured)"
        else:
            ev["launch_gap_pct"] = 100.0
            src["launch_gap_pct"] = "this part is host time outside aten ops (CPU profile)"
    else:
        below_floor = bool(p.floor_ms) and p.floor_ms > p.t_ms
        if p.floor_ms and not below_floor:
            ev["slowdown_vs_floor"] = p.t_ms / p.floor_ms
            src["slowdown_vs_floor"] = f"part time / its floor ({p.floor_source})"
        ceiling = p.ceiling_gbps or copy_gbps
        if p.moved_bytes is not None and ceiling and p.t_ms > 0:
            pct = 100.0 * p.moved_bytes / (p.t_ms * 1e6) / ceiling
            if pct <= 100.0:
                ev["dram_pct_estimated"] = pct
                src["dram_pct_estimated"] = "the part's moved bytes (traffic model) / its time vs the copy ceiling"
            else:
                p.notes.append(f"estimated DRAM share {pct:.0f}% is above the measured copy ceiling: either the data "
                               "was served from cache, not DRAM (enlarge the inputs), or the ceiling was measured "
                               "low (re-measure it: hwlab doctor --remeasure); not used as evidence")
        if p.sector_amplification is not None:
            ev["sector_amplification"] = p.sector_amplification
            src["sector_amplification"] = "estimated from the part's ops' strides and index values"
        if p.traffic_ratio is not None:
            ev["traffic_ratio_estimated"] = p.traffic_ratio
            src["traffic_ratio_estimated"] = ("the part's moved bytes (traffic model) / its bytes as if fused, "
                                              "working set past the cache")
        if p.floor_source.startswith("FLOPs") and p.tflops is not None and p.ceiling_tflops and not below_floor:
            ev["tensor_pct_of_peak"] = 100.0 * p.tflops / p.ceiling_tflops
            src["tensor_pct_of_peak"] = "part FLOPs / its time vs the measured GEMM ceiling at its dtype"
        if below_floor:
            p.notes.append("its slowdown and rates are not evidence (above the measured ceilings): the walk "
                           "cannot answer B for this part until the ceilings are re-measured")
        if p.flops is not None and p.attributable:
            ev["matmul_flops"] = p.flops
            src["matmul_flops"] = "torch.utils.flop_counter formulas over the part's ops (counted)"
        if gpu and p.n_tc is not None and p.name != "triton/compiled":
            ev["tensor_core_kernels"] = p.n_tc
            src["tensor_core_kernels"] = "tensor-core GEMM kernels per call among the part's kernels (profiler names)"
        elif not gpu and p.flops == 0:
            ev["tensor_core_kernels"] = 0
            src["tensor_core_kernels"] = "CPU: no tensor cores; no matmul op in the part"
        if p.name == "triton/compiled" and prof.n_spills is not None:
            ev["n_spills"] = prof.n_spills
            src["n_spills"] = "Triton compiled-kernel metadata (ptxas)"
        if ncu and _ncu_matches(p, ncu):
            for k, v in (ncu.get("evidence") or {}).items():
                if k == "tensor_pipe_pct" and not p.floor_source.startswith("FLOPs"):
                    continue
                ev[k] = v
                src[k] = f"counted by Nsight Compute ({k}, the examination's counted kernels)"
    if e2e is not None:
        ev["e2e_slowdown"] = e2e
        src["e2e_slowdown"] = "the whole function: wall-clock per call back to back / device-event median"
        if e2e_spread:
            ev.setdefault("metric_spreads", {})["e2e_slowdown"] = e2e_spread


def _is_tc(name: str) -> bool:
    from hwlab.core.profiling import kernel_class
    c, tc = kernel_class(name)
    return bool(tc) and c in ("gemm", "fp8-gemm")

